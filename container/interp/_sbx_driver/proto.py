"""The driver's fixed points: the file descriptors of the protocol, the
limits of stream events, the matplotlib backends, and which code is the
driver's own (its frames are cut from users' tracebacks)."""

import os
import sys


REQ_FD = 3
EV_FD = 4
FLUSH_INTERVAL = 0.025      # max age of buffered stream text
NEWLINE_GAP = 0.010         # a newline flushes at once if the last flush is older
CHUNK_CHARS = 8192          # buffered stream text is flushed at this size
STREAM_EVENT_CHARS = 1 << 16    # one huge write is split into events this big
MAX_EVENT_BYTES = 32 << 20  # the agent declares a driver dead at a 64 MiB line
INLINE_IPYTHON = "module://matplotlib_inline.backend_inline"
INLINE_STDLIB = "module://_sbx_mpl_inline"
# This package's directory, and driver.py, its entry point beside it (see
# is_driver_file).  Both are absolute: the agent starts /opt/sbx/driver.py.
PKG_DIR = os.path.dirname(os.path.abspath(__file__))
INSTALL_DIR = os.path.dirname(PKG_DIR)
SCRIPT = os.path.join(INSTALL_DIR, "driver.py")


def is_driver_file(filename):
    """Whether a code object's file is the driver's own: driver.py or a
    module of this package (the driver's frames are cut from tracebacks)."""
    return filename == SCRIPT or os.path.dirname(filename) == PKG_DIR


def _version():
    return "%d.%d.%d" % sys.version_info[:3]
