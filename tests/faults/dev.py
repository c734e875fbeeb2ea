"""A private `sbxd dev` deployment for the fault-injection history test,
and the host-side clean-up every deployment of the test shares.

Everything it starts or creates is recorded on the object and undone by
:meth:`DevDeployment.stop` (SIGCONT of stopped shards, SIGTERM then SIGKILL of
the daemon's process group by pid, processes left in the deployment's
cgroups killed by pid, its cgroups removed, the tmpfs unmounted, the temp
directory removed).
"""

from __future__ import annotations

import glob
import os
import random
import shutil
import signal
import string
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "sdk", "python"))

from sbx_sandbox import SbxClient  # noqa: E402


def sbx_bin(name: str) -> str:
    """Path of binary ``name`` in ``$SBX_BIN`` (default <repo>/bin)."""
    return os.path.join(os.environ.get("SBX_BIN") or os.path.join(REPO, "bin"), name)


def children(ppid: int) -> List[int]:
    """Pids whose parent is ``ppid`` (read from /proc)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                st = f.read()
        except OSError:
            continue
        fields = st[st.rfind(b")") + 2:].split()
        if int(fields[1]) == ppid:
            out.append(int(d))
    return out


def cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def sweep_name(name: str) -> int:
    """Kill (by pid) every process still in a cgroup of deployment ``name``
    or carrying its shard name on the command line, then remove its cgroups.
    Returns how many processes were left (a figure of the run: a shard's
    children must die with it)."""
    tag_cg = f"/{name}-s".encode()
    tag_cmd = f"--name={name}-s".encode()
    tag_arg = f"\0{name}-s".encode()  # `--name NAME-sN` as two arguments
    me = os.getpid()
    left = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        pid = int(d)
        try:
            with open(f"/proc/{pid}/cgroup", "rb") as f:
                cg = f.read()
        except OSError:
            continue
        cl = cmdline(pid)
        if tag_cg in cg or tag_cmd in cl or tag_arg in cl:
            left.append(pid)
    for pid in left:
        try:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    for pid in left:
        while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
            time.sleep(0.05)
    # cgroups of the deployment, deepest first
    dirs = []
    for base in glob.glob("/sys/fs/cgroup/*/sbx") + glob.glob("/sys/fs/cgroup/sbx"):
        for top in glob.glob(os.path.join(base, f"{name}-s*")):
            for root, subdirs, _ in os.walk(top):
                dirs.append(root)
    for d in sorted(dirs, key=len, reverse=True):
        try:
            os.rmdir(d)
        except OSError:
            pass
    return len(left)


class DevDeployment:
    """`sbxd dev` with ``shards`` shards in a temp directory; with
    ``tmpfs_mb`` its data directory is a tmpfs of that size (for the
    "data directory fills up" fault).  Raises RuntimeError if it does not
    start within 30 s."""

    kind = "dev"

    def __init__(self, shards: int = 2, tmpfs_mb: int = 0, log=print) -> None:
        self.log = log
        self.name = "fx" + "".join(random.choice(string.ascii_lowercase) for _ in range(8))
        self.root = tempfile.mkdtemp(prefix="sbx-fx-", dir="/tmp")
        self.data = os.path.join(self.root, "data")
        os.mkdir(self.data)
        self.mounted = False
        self.stopped: set = set()  # pids we sent SIGSTOP and not yet SIGCONT
        self.proc: Optional[subprocess.Popen] = None
        self.logf = open(os.path.join(self.root, "sbxd.log"), "wb")
        try:
            if tmpfs_mb:
                subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={tmpfs_mb}m,mode=0755",
                                "sbx-fx", self.data], check=True)
                self.mounted = True
            self.proc = subprocess.Popen(
                [sbx_bin("sbxd"), "dev", "--data", self.data, "--listen",
                 f"ipc://{self.root}/gw.sock", "--name", self.name, "--http", "127.0.0.1:0",
                 "--shards", str(shards), "--pool", "1"],
                stdout=self.logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
            self.url = self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> str:
        deadline = time.monotonic() + 30
        addr = ""
        path = os.path.join(self.data, "http.addr")
        while time.monotonic() < deadline and self.proc.poll() is None and not addr:
            try:
                with open(path) as f:
                    addr = f.read().strip()
            except FileNotFoundError:
                time.sleep(0.05)
        if not addr:
            raise RuntimeError(f"sbxd dev did not start (exit {self.proc.poll()}); "
                               f"log: {self.tail()}")
        url = f"http://{addr}"
        c = SbxClient(url, timeout=5, retries=0)
        try:
            while time.monotonic() < deadline:
                try:
                    if c.health().get("ok"):
                        return url
                except Exception:
                    time.sleep(0.1)
        finally:
            c.close()
        raise RuntimeError("sbxd dev does not answer health")

    def tail(self, n: int = 3000) -> str:
        try:
            with open(os.path.join(self.root, "sbxd.log"), "rb") as f:
                return f.read()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def shard_pids(self) -> List[int]:
        """The live shard processes (children of the dev supervisor)."""
        if not self.alive():
            return []
        return [p for p in children(self.proc.pid) if b"shard" in cmdline(p)]

    # -- faults ----------------------------------------------------------------------

    def kill_shard(self, rng: random.Random) -> Optional[str]:
        pids = self.shard_pids()
        if not pids:
            return None
        pid = rng.choice(pids)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return None
        return f"kill -9 shard pid {pid}"

    def stop_shard(self, rng: random.Random, seconds: float) -> Optional[str]:
        pids = self.shard_pids()
        if not pids:
            return None
        pid = rng.choice(pids)
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            return None
        self.stopped.add(pid)
        time.sleep(seconds)
        self.cont(pid)
        return f"SIGSTOP shard pid {pid} for {seconds:.1f} s"

    def cont(self, pid: int) -> None:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        self.stopped.discard(pid)

    def fill_data(self, seconds: float) -> Optional[str]:
        """Fill the data tmpfs with a ballast file for ``seconds``, then
        remove it."""
        if not self.mounted:
            return None
        path = os.path.join(self.data, "ballast")
        n = 0
        try:
            with open(path, "wb") as f:
                chunk = b"\0" * (1 << 20)
                while True:
                    f.write(chunk)
                    n += 1
                    f.flush()
        except OSError:
            pass
        time.sleep(seconds)
        try:
            os.unlink(path)
        except OSError:
            pass
        return f"data directory full ({n} MiB ballast) for {seconds:.1f} s"

    # -- clean-up --------------------------------------------------------------------

    def stop(self) -> int:
        """Stop everything; returns the number of processes of the deployment
        that were still alive after its supervisor exited."""
        for pid in list(self.stopped):
            self.cont(pid)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.log(f"sbxd dev (pid {self.proc.pid}) ignored SIGTERM for 40 s; SIGKILL")
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)  # the group Popen created
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=10)
        left = sweep_name(self.name)
        self.logf.close()
        if self.mounted:
            for _ in range(20):
                if subprocess.run(["umount", self.data]).returncode == 0:
                    self.mounted = False
                    break
                time.sleep(0.5)
            if self.mounted:
                subprocess.run(["umount", "-l", self.data])
                self.mounted = False
        if os.environ.get("SBX_FAULTS_KEEP"):
            self.log(f"deployment files kept in {self.root}")
        else:
            shutil.rmtree(self.root, ignore_errors=True)
        return left
