"""Output of a cell: sys.stdout/sys.stderr replaced by writers that buffer
text and flush it as `stream` events (OutputHub), streams always flushed
before any other event."""

import io
import os
import threading
import time

from .proto import CHUNK_CHARS, FLUSH_INTERVAL, NEWLINE_GAP, STREAM_EVENT_CHARS
from .interrupts import INTR


class OutputHub:
    """Buffers print() output of both streams and turns it into events.

    Flushing every write would make a million-line loop a million events;
    instead text is coalesced: a write containing a newline flushes at once
    unless the previous flush is younger than NEWLINE_GAP, 8 KiB flushes at
    once, and a daemon thread flushes whatever is left after FLUSH_INTERVAL,
    so a line is never held back longer than that while the cell computes.
    """

    def __init__(self, channel):
        self.channel = channel
        self.lock = threading.Lock()
        self.name = None
        self.parts = []
        self.size = 0
        self.last_flush = 0.0
        self.wake = threading.Event()
        self.thread = None
        self.passthrough = False    # forked child: write straight to fd 1/2

    def write(self, name, text):
        if self.passthrough:
            os.write(1 if name == "stdout" else 2, text.encode("utf-8", "replace"))
            return
        # The hot path of print(): keep it to a lock, an append and a compare.
        with self.lock:
            if self.parts and name != self.name:
                self._flush_locked()
            self.name = name
            self.parts.append(text)
            self.size += len(text)
            if self.size >= CHUNK_CHARS or (
                    "\n" in text and time.monotonic() - self.last_flush >= NEWLINE_GAP):
                self._flush_locked()
            elif len(self.parts) == 1:
                self._start_timer()

    def flush(self):
        if self.passthrough or not self.parts:
            return
        with self.lock:
            self._flush_locked()

    def _flush_locked(self):
        if not self.parts:
            return
        # Critical: a KeyboardInterrupt between taking the text out of the
        # buffer and writing it would silently drop output.
        INTR.enter()
        try:
            text = "".join(self.parts)
            self.parts = []
            self.size = 0
            self.last_flush = time.monotonic()
            for start in range(0, len(text), STREAM_EVENT_CHARS):
                self.channel.send({"type": "stream", "name": self.name,
                                   "text": text[start:start + STREAM_EVENT_CHARS]})
        finally:
            INTR.leave()

    def _start_timer(self):
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="sbx-stream-flush", daemon=True)
            self.thread.start()
        if not self.wake.is_set():
            self.wake.set()

    def _run(self):
        while True:
            self.wake.wait()
            time.sleep(FLUSH_INTERVAL)
            with self.lock:
                self.wake.clear()
                try:
                    self._flush_locked()
                except Exception:   # keep the timer alive whatever happens
                    pass

    def before_fork(self):
        self.flush()

    def after_fork_child(self):
        self.lock = threading.Lock()
        self.parts = []
        self.size = 0
        self.thread = None
        self.wake = threading.Event()
        self.passthrough = True


class _BinaryStream(io.RawIOBase):
    """sys.stdout.buffer: bytes are decoded (UTF-8) and sent as text."""

    def __init__(self, text_stream):
        import codecs
        self._text = text_stream
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def writable(self):
        return True

    def write(self, b):
        data = bytes(b)
        text = self._decoder.decode(data)
        if text:
            self._text.write(text)
        return len(data)

    def flush(self):
        self._text.flush()

    def fileno(self):
        return self._text.fileno()


class StreamWriter(io.TextIOBase):
    """Replacement for sys.stdout / sys.stderr that emits stream events.

    fileno() still answers the real fd 1/2, so code that needs a descriptor
    (faulthandler, subprocess with stdout=sys.stdout) writes to the agent's
    fd-level pipe, as on a terminal.
    """

    encoding = "utf-8"
    errors = "strict"
    line_buffering = False

    def __init__(self, hub, name, fd):
        self._hub = hub
        self._name = name
        self._fd = fd
        self._buffer = None

    @property
    def name(self):
        return "<%s>" % self._name

    @property
    def buffer(self):
        if self._buffer is None:
            self._buffer = _BinaryStream(self)
        return self._buffer

    def writable(self):
        return True

    def isatty(self):
        return False

    def fileno(self):
        return self._fd

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError("write() argument must be str, not %s" % type(s).__name__)
        if s:
            self._hub.write(self._name, s)
        return len(s)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        self._hub.flush()

    def close(self):            # keep the stream usable: it is shared by all cells
        self.flush()
