"""The event channel (fd 4): JSON Lines, with values that JSON cannot carry
encoded or cleaned, and events over MAX_EVENT_BYTES shrunk."""

import json
import os
import threading

from .proto import MAX_EVENT_BYTES
from .interrupts import INTR


def _b64(data):
    import base64
    return base64.b64encode(bytes(data)).decode("ascii")


def _json_default(obj):
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return _b64(obj)
    if isinstance(obj, (set, frozenset)):
        return list(obj)
    if hasattr(obj, "isoformat"):           # datetime, date, time
        return obj.isoformat()
    if hasattr(obj, "tolist"):              # numpy scalars and arrays
        return obj.tolist()
    return repr(obj)


def _json_clean(obj, depth=0):
    """Slow path for values json.dumps refuses (NaN, odd keys, cycles)."""
    if depth > 64:
        return repr(obj)
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else repr(obj)
    if isinstance(obj, (str, int, bool)) or obj is None:
        return obj
    if isinstance(obj, dict):
        return {k if isinstance(k, str) else str(k): _json_clean(v, depth + 1)
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_json_clean(v, depth + 1) for v in obj]
    return _json_clean(_json_default(obj), depth + 1)


def _encode(event):
    try:
        text = json.dumps(event, ensure_ascii=False, separators=(",", ":"),
                          allow_nan=False, default=_json_default)
    except (TypeError, ValueError, RecursionError):
        text = json.dumps(_json_clean(event), ensure_ascii=False, separators=(",", ":"))
    try:
        return (text + "\n").encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates (e.g. from os.fsdecode) cannot be UTF-8: pair what
        # can be paired, replace the rest with U+FFFD.
        fixed = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return (fixed + "\n").encode("utf-8")


def _shrink(event, size):
    """Stand-in for an event too large for the agent to accept."""
    if event["type"] == "error":
        return dict(event, evalue=event["evalue"][:1 << 20],
                    traceback=[line[:1 << 16] for line in event["traceback"][-200:]])
    note = "sbx: %s of %.1f MiB not sent (limit: %d MiB per output)\n" % (
        event["type"], size / 1048576.0, MAX_EVENT_BYTES >> 20)
    return {"type": "stream", "id": event.get("id"), "name": "stderr", "text": note}


class Channel:
    """Serialises events onto fd 4; safe from any thread."""

    def __init__(self, fd):
        self.fd = fd
        self.lock = threading.Lock()
        self.request_id = None      # id stamped on every event
        self.enabled = True         # False in forked children

    def send(self, event, stamp=True):
        if not self.enabled:
            return
        if stamp:
            event["id"] = self.request_id
        data = _encode(event)
        if len(data) > MAX_EVENT_BYTES:
            data = _encode(_shrink(event, len(data)))
        self.send_raw(data)

    def send_raw(self, data):
        INTR.enter()
        try:
            with self.lock:
                view = memoryview(data)
                while view:
                    view = view[os.write(self.fd, view):]
        except BrokenPipeError:
            os._exit(0)             # the agent is gone
        finally:
            INTR.leave()

    def after_fork_child(self):
        self.lock = threading.Lock()
        self.enabled = False
