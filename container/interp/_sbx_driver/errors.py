"""Errors: the driver's frames cut from tracebacks, the stdlib mode's error
event, ANSI colours stripped."""

import os
import sys

from .proto import is_driver_file


def _is_driver_frame(tb):
    filename = tb.tb_frame.f_code.co_filename
    if is_driver_file(filename):
        return True
    asyncio = sys.modules.get("asyncio")
    return asyncio is not None and filename.startswith(os.path.dirname(asyncio.__file__))


def strip_driver_frames(tb):
    """Drop the driver's (and the event loop's) frames around user code.

    Leading frames are the driver calling exec/run_until_complete; a
    trailing frame is the SIGINT handler that raised KeyboardInterrupt.
    Traceback objects are linked lists with a writable tb_next (3.7+).
    """
    head = tb
    while head is not None and _is_driver_frame(head):
        head = head.tb_next
    if head is None:            # raised by the driver itself: no user frames
        return None
    node = head
    while node.tb_next is not None:
        if is_driver_file(node.tb_next.tb_frame.f_code.co_filename):
            node.tb_next = None
            break
        node = node.tb_next
    return head


def _safe_str(obj):
    try:
        return str(obj)
    except Exception:
        return "<unprintable %s object>" % type(obj).__name__


def _split_lines(chunks):
    lines = []
    for chunk in chunks:
        lines.extend(chunk.rstrip("\n").split("\n"))
    return lines


def stdlib_error_event(exc, exception_only=False):
    import traceback
    etype = type(exc)
    if exception_only or isinstance(exc, SyntaxError):
        chunks = traceback.format_exception_only(etype, exc)
    else:
        tb = strip_driver_frames(exc.__traceback__)
        chunks = traceback.format_exception(etype, exc, tb)
    return {"type": "error", "ename": etype.__name__, "evalue": _safe_str(exc),
            "traceback": _split_lines(chunks)}


_ANSI = None


def strip_ansi(text):
    global _ANSI
    if _ANSI is None:
        import re
        _ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
    return _ANSI.sub("", text)
