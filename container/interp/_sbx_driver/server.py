"""The driver process (Driver: fd 3 requests in order, one `done` each) and
the fork server (driver.py --fork-server) that forks ready drivers."""

import json
import os
import signal
import sys
import threading

from .proto import EV_FD, INSTALL_DIR, REQ_FD, _version
from .interrupts import INTR
from .channel import Channel
from .output import OutputHub, StreamWriter
from .mplhooks import HOOKS
from .errors import _safe_str, stdlib_error_event
from .runner import StdlibRunner
from .ipython import IPythonRunner, _HiddenModule, _import_ipython


class Driver:
    def __init__(self):
        self.pid = os.getpid()
        self.channel = Channel(EV_FD)
        self.hub = OutputHub(self.channel)
        self.runner = None

    def start(self):
        self.prepare()
        self.go_live()

    def prepare(self):
        """What every context needs and no context owns: the runner (IPython
        imported, its shell built) and the import hooks.  A fork server does
        this once; its forks only go_live()."""
        signal.signal(signal.SIGINT, INTR.handler)
        if sys.path and sys.path[0] == INSTALL_DIR:
            # Imports resolve from the context's cwd (as in the REPL), not
            # from the driver's installation directory.
            sys.path[0] = ""
        self.runner = self._make_runner()
        sys.meta_path.insert(0, HOOKS)

    def go_live(self):
        """Take fd 3/4 and 1/2 as this context's and say ready."""
        self.pid = os.getpid()
        try:
            for fd in (REQ_FD, EV_FD):
                os.set_inheritable(fd, False)   # never leak the protocol to children
        except OSError:
            sys.exit("driver.py: fd 3 (requests) and fd 4 (events) must be open pipes; "
                     "see the protocol in this file's header")
        sys.stdout = StreamWriter(self.hub, "stdout", 1)
        sys.stderr = StreamWriter(self.hub, "stderr", 2)
        os.register_at_fork(before=self.hub.before_fork, after_in_child=self._after_fork_child)
        self.channel.send({"type": "ready", "pid": self.pid, "language": "python",
                           "mode": self.runner.mode, "version": _version()}, stamp=False)

    def _make_runner(self):
        mode = os.environ.get("SBX_PY_MODE", "").strip().lower()
        if mode != "stdlib":
            # IPython imports jedi (~100 ms, a third of the start-up) only to
            # offer completions, which this protocol has no request for:
            # hidden, IPython uses its own completer; user code can still
            # import jedi later.
            try:
                with _HiddenModule("jedi"):
                    return IPythonRunner(self.channel, self.hub, _import_ipython())
            except Exception as e:
                if mode == "ipython":
                    os.write(2, ("sbx: IPython unavailable (%r), using stdlib mode\n" % e).encode())
        return StdlibRunner(self.channel, self.hub)

    def _after_fork_child(self):
        self.channel.after_fork_child()
        self.hub.after_fork_child()
        for fd in (REQ_FD, EV_FD):
            try:
                os.close(fd)
            except OSError:
                pass

    def serve(self):
        requests = open(REQ_FD, "rb", buffering=1 << 16, closefd=False)
        while True:
            line = requests.readline()
            if not line:
                break
            if line.strip():
                try:
                    self.handle_line(line)
                except KeyboardInterrupt:   # belt and braces: never die of SIGINT
                    pass
            if os.getpid() != self.pid:     # a fork that fell out of a cell
                os._exit(0)
        self.exit()

    def handle_line(self, line):
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("request is not an object")
        except ValueError as e:
            os.write(2, ("sbx: bad request line: %s\n" % e).encode())
            return
        self.channel.request_id = request.get("id")
        kind = request.get("type")
        if kind == "execute":
            self.execute(request.get("code") or "")
        elif kind == "init":
            self.init(request)
        else:
            self.channel.send({"type": "error", "ename": "ValueError",
                               "evalue": "unknown request type %r" % (kind,), "traceback": []})
            self.channel.send({"type": "done", "status": "error"})

    def execute(self, code):
        # This frame is shielded (see Interrupts): no KeyboardInterrupt can be
        # raised here, only inside runner.run(), so `done` is always sent.
        status, failure = "error", None
        errors_before = self.runner.errors_emitted
        INTR.arm()
        try:
            status = self.runner.run(code)
        except BaseException as e:  # noqa: B902 - whatever escapes, the context lives on
            failure = e
        INTR.disarm()
        if signal.getsignal(signal.SIGINT) != INTR.handler:
            # The cell installed its own SIGINT handler; ipykernel also
            # restores its own after every cell.  Idle SIGINTs must not kill.
            signal.signal(signal.SIGINT, INTR.handler)
        if failure is not None or (status == "error" and self.runner.errors_emitted == errors_before):
            # Escaped the runner's own reporting (e.g. a second interrupt
            # while the first was being reported): every failed cell still
            # gets an error event.
            if failure is None:
                failure = self.runner.last_exception or KeyboardInterrupt()
            self.runner.emit(stdlib_error_event(failure))
            status = "error"
        self.runner.emit({"type": "done", "status": status,
                          "execution_count": self.runner.cell_count})

    def init(self, request):
        status = "ok"
        try:
            for key, value in (request.get("env") or {}).items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[str(key)] = str(value)
            if request.get("cwd"):
                os.chdir(request["cwd"])
        except Exception as e:
            status = "error"
            self.channel.send({"type": "error", "ename": type(e).__name__,
                               "evalue": _safe_str(e), "traceback": []})
        self.channel.send({"type": "done", "status": status})

    def exit(self):
        """EOF on fd 3: run atexit handlers (they may print), exit 0.

        os._exit, not sys.exit: a user's non-daemon thread must not keep a
        context whose agent has gone away alive.
        """
        import atexit
        try:
            atexit._run_exitfuncs()
        except BaseException:  # noqa: B902
            pass
        self.hub.flush()
        os._exit(0)


INTR.shield(Driver.execute, Driver.handle_line, Driver.serve)


# --------------------------------------------------------------------------
# Fork server
# --------------------------------------------------------------------------

PR_SET_CHILD_SUBREAPER = 36


def fork_server():
    """`driver.py --fork-server`: prepare once, then fork a driver per request.

    Starting a driver costs the IPython import (a quarter of a second, more
    under load); a fork of a process that has done it costs a few
    milliseconds, and the forks share the imported modules' memory
    copy-on-write (gc.freeze() keeps the collector from touching, hence
    copying, them).  The agent starts one fork server per sandbox
    environment and asks it for drivers.

    fd 3 is a SOCK_SEQPACKET unix socket to the agent (fd 0-2: /dev/null);
    every message is one JSON object.  The server sends
    {"type":"ready","pid","mode","version"} once it is prepared (or
    {"type":"error","evalue"} and exits).  Each message the agent sends
    carries four descriptors (SCM_RIGHTS): the new driver's requests (read
    end), events (write end), stdout and stderr (write ends).  The server
    forks; the child becomes a session leader and a child subreaper (as the
    agent starts drivers), puts the four descriptors at 3, 4, 1 and 2 and
    goes on exactly like a driver the agent started itself: "ready" with its
    own pid on fd 4, then requests.  When a driver exits the server reaps it
    and sends {"type":"exit","pid","status"} (the raw wait status), which the
    agent reads as it would read its own child's.  EOF on fd 3 ends the
    server; its drivers live on, and PID 1 (the agent) reaps them.
    """
    import gc
    import socket
    ctl = socket.socket(fileno=REQ_FD)
    driver = Driver()
    try:
        driver.prepare()
        driver.runner.warm_up()
        import ctypes
        import fcntl
        libc = ctypes.CDLL(None, use_errno=True)
        if not hasattr(socket, "recv_fds"):
            raise RuntimeError("socket.recv_fds needs Python 3.9")
        if threading.active_count() != 1:
            raise RuntimeError("threads were started; forking would copy their locks")
    except BaseException as e:  # noqa: B902 - the agent starts drivers itself then
        ctl.send(json.dumps({"type": "error", "evalue": _safe_str(e)}).encode())
        os._exit(1)

    def reap(signum, frame):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            try:
                ctl.send(json.dumps({"type": "exit", "pid": pid, "status": status}).encode())
            except OSError:
                pass

    gc.collect()
    gc.freeze()
    signal.signal(signal.SIGCHLD, reap)
    ctl.send(json.dumps({"type": "ready", "pid": os.getpid(), "mode": driver.runner.mode,
                         "version": _version()}).encode())
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(ctl, 256, 4)
        except OSError:
            os._exit(0)
        if not msg and not fds:
            os._exit(0)
        if len(fds) != 4:
            for fd in fds:
                os.close(fd)
            continue
        if os.fork() == 0:
            _become_driver(driver, ctl, fds, libc, fcntl)   # never returns
        for fd in fds:
            os.close(fd)


def _become_driver(driver, ctl, fds, libc, fcntl):
    """In a child of the fork server: become the driver of a new context."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        ctl.detach()        # fd 3 is about to be the request pipe
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in fds]
        for fd in fds:
            os.close(fd)
        for target, fd in zip((REQ_FD, EV_FD, 1, 2), high):
            os.dup2(fd, target)
            os.close(fd)
        # The pages a cell touches are still the server's: copying them
        # (~20 ms of page faults) belongs here, before "ready" (warm drivers
        # do it while they wait), not in the context's first cell.
        driver.runner.warm_up()
        driver.go_live()
        driver.serve()      # exits the process
    except BaseException as e:  # noqa: B902
        try:
            os.write(2, ("sbx: forked driver failed: %r\n" % (e,)).encode())
        except OSError:
            pass
    finally:
        os._exit(70)


def main():
    if sys.argv[1:] == ["--fork-server"]:
        fork_server()
    driver = Driver()
    driver.start()
    driver.serve()
