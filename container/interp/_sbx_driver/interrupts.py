"""SIGINT handling: KeyboardInterrupt in a running cell, ignored while idle
(INTR, one per process)."""

import threading
import time


class Interrupts:
    """SIGINT policy: ignored while idle, KeyboardInterrupt while a cell runs.

    The main thread also writes protocol events; a KeyboardInterrupt raised
    in the middle of os.write() would leave half a JSON line on fd 4, or a
    lock held forever.  Such sections run with `critical` > 0: a SIGINT that
    arrives then is remembered and raised as soon as the section ends.

    The request loop's own functions are `shielded`: a SIGINT that finds one
    of them running (just before or after the cell) is dropped, so the loop
    itself never sees a KeyboardInterrupt.  A second SIGINT within DEBOUNCE
    seconds of a KeyboardInterrupt is dropped too: it would only land in the
    middle of reporting the first one.
    """

    DEBOUNCE = 0.2

    def __init__(self):
        self.armed = False
        self.critical = 0
        self.pending = False
        self.main = threading.get_ident()
        self.shielded = set()
        self.last_raised = -1.0

    def shield(self, *functions):
        self.shielded.update(f.__code__ for f in functions)

    def handler(self, signum, frame):
        if not self.armed or (frame is not None and frame.f_code in self.shielded):
            return
        if self.critical:
            self.pending = True
            return
        self._raise()

    def _raise(self):
        now = time.monotonic()
        if now - self.last_raised < self.DEBOUNCE:
            return
        self.last_raised = now
        raise KeyboardInterrupt

    def enter(self):
        if threading.get_ident() == self.main:
            self.critical += 1

    def leave(self):
        if threading.get_ident() != self.main:
            return
        self.critical -= 1
        if not self.critical and self.pending:
            self.pending = False
            if self.armed:
                self._raise()

    def arm(self):
        self.pending = False
        self.armed = True

    def disarm(self):
        self.armed = False
        self.pending = False


INTR = Interrupts()
