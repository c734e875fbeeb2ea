"""A 3-node sbx cluster on loopback for the fault-injection history test:
a 3-member etcd, an etcd proxy (etcdproxy.py) in front of each member that
the shards use (the gateway talks to etcd directly), three `sbxd shard --etcd` and one `sbxd gateway`, each a
process of its own (no network namespaces: every address is 127.0.0.1 with
its own port).  Same interface as dev.DevDeployment.

Faults (:meth:`ClusterDeployment.fault` and the shared kill/stop):
  kill        kill -9 of a shard, restarted 0.2-1 s later with the same data
  stop        SIGSTOP of a shard for a while, then SIGCONT
  etcd-stop   SIGSTOP of one etcd member (1-4 s)
  etcd-leader kill -9 of the etcd leader, restarted 1-2 s later
  proxy       for 2-6 s the proxy delays, drops and duplicates requests and
              drops replies (etcdproxy.Proxy)
  drain       `sbx cluster drain` of a shard, `undrain` 2-6 s later
  fill        (with tmpfs_mb: every shard's data directory is a tmpfs) the
              shards' data directories full for 0.5-3 s (a ballast file each)
Everything started is stopped by pid in :meth:`stop`; the tmpfs mounts are
unmounted there.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import signal
import socket
import string
import subprocess
import tempfile
import time
import urllib.request
from typing import Dict, List, Optional

from dev import SbxClient, sbx_bin, sweep_name
from etcdproxy import Proxy

LEASE_TTL = "2s"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ClusterDeployment:
    kind = "cluster"

    def __init__(self, shards: int = 3, tmpfs_mb: int = 0, log=print) -> None:
        if not os.access("/usr/bin/etcd", os.X_OK):
            raise RuntimeError("/usr/bin/etcd is missing (tools/deps.sh installs etcd-server)")
        self.log = log
        self.name = "fx" + "".join(random.choice(string.ascii_lowercase) for _ in range(8))
        self.cluster = self.name
        self.root = tempfile.mkdtemp(prefix="sbx-fxc-", dir="/tmp")
        self.data = self.root
        self.mounted = False
        # tmpfs_mb: each shard's data directory is a tmpfs of that size (the
        # "data directory fills up" fault); the ones mounted, for stop()
        self.tmpfs_mb = tmpfs_mb
        self.mounts: List[str] = []
        self.secret = secrets.token_hex(16)
        self.stopped: set = set()
        self.procs: Dict[str, subprocess.Popen] = {}
        self.logs: List = []
        h = 1469598103934665603  # uid range picked from the name, as `sbxd dev` does
        for ch in self.name.encode():
            h = ((h ^ ch) * 1099511628211) % (1 << 64)
        self.uid_base = 1000000000 + (h % 4096) * 4 * 65536
        self.etcd_ports = [(free_port(), free_port()) for _ in range(3)]
        self.etcd_urls = [f"http://127.0.0.1:{c}" for c, _ in self.etcd_ports]
        # one proxy per member: a shard whose request failed moves on to the
        # next endpoint, and with a single proxy it would stay off it
        self.proxies = [Proxy("127.0.0.1", c) for c, _ in self.etcd_ports]
        for p in self.proxies:
            p.start()
        self.shard_ports = [(free_port(), free_port()) for _ in range(shards)]
        self.gw_port, self.http_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.http_port}"
        self.gw_url = f"tcp://127.0.0.1:{self.gw_port}"
        self.drained: set = set()
        try:
            for i in range(3):
                self.start_etcd(i)
            self.wait_etcd()
            for i in range(shards):
                self.start_shard(i)
            self.start_gateway()
            self.wait_ready(60)
        except BaseException:
            self.stop()
            raise

    # -- processes -------------------------------------------------------------------

    def spawn(self, key: str, argv: List[str]) -> None:
        f = open(os.path.join(self.root, f"{key}.log"), "ab")
        self.logs.append(f)
        self.procs[key] = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, start_new_session=True)

    def start_etcd(self, i: int) -> None:
        init = ",".join(f"m{j}=http://127.0.0.1:{p}" for j, (_, p) in enumerate(self.etcd_ports))
        c, p = self.etcd_ports[i]
        self.spawn(f"etcd{i}", [
            "/usr/bin/etcd", "--name", f"m{i}", "--data-dir", os.path.join(self.root, f"etcd{i}"),
            "--listen-client-urls", f"http://127.0.0.1:{c}",
            "--advertise-client-urls", f"http://127.0.0.1:{c}",
            "--listen-peer-urls", f"http://127.0.0.1:{p}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{p}",
            "--initial-cluster", init, "--initial-cluster-state", "new",
            "--initial-cluster-token", self.name])

    def wait_etcd(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.etcd_urls[0] + "/health", timeout=2) as r:
                    if json.load(r).get("health") == "true":
                        return
            except Exception:  # noqa: BLE001
                time.sleep(0.2)
        raise RuntimeError("etcd did not come up")

    def start_shard(self, i: int) -> None:
        c, r = self.shard_ports[i]
        d = os.path.join(self.root, f"s{i}")
        os.makedirs(d, exist_ok=True)
        if self.tmpfs_mb and d not in self.mounts:
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.tmpfs_mb}m,mode=0700",
                            "sbx-fxc", d], check=True)
            self.mounts.append(d)
        # each shard starts at another member (through its proxy)
        urls = [f"http://127.0.0.1:{p.port}" for p in self.proxies]
        etcd = ",".join(urls[i % 3:] + urls[:i % 3])
        self.spawn(f"s{i}", [
            sbx_bin("sbxd"), "shard", "--name", f"{self.name}-s{i}",
            "--listen", f"tcp://127.0.0.1:{c}", "--data", d,
            "--uid-base", str(self.uid_base + i * 65536), "--etcd", etcd,
            "--cluster", self.cluster, "--lease-ttl", LEASE_TTL,
            "--relay", f"tcp:127.0.0.1:{r}", "--relay-secret", self.secret,
            "--pool", "1", "--memory", "256M", "--pids", "128", "--disk", "64M"])

    def start_gateway(self) -> None:
        self.spawn("g0", [
            sbx_bin("sbxd"), "gateway", "--name", f"{self.name}-g0", "--listen", self.gw_url,
            "--etcd", ",".join(self.etcd_urls), "--cluster", self.cluster,
            "--http", f"127.0.0.1:{self.http_port}", "--relay-secret", self.secret])

    def wait_ready(self, seconds: float) -> None:
        cli = SbxClient(self.url, timeout=5, retries=0)
        deadline = time.monotonic() + seconds
        try:
            while time.monotonic() < deadline:
                try:
                    st = cli.cluster_status()
                    sh = st.get("shards") or []
                    if len(sh) == len(self.shard_ports) and \
                            all(s.get("health") == "ok" for s in sh) and \
                            st.get("gateway", {}).get("partitions", 0) >= 4096:
                        return
                except Exception:  # noqa: BLE001
                    pass
                time.sleep(0.3)
        finally:
            cli.close()
        raise RuntimeError(f"the cluster did not become ready in {seconds} s:\n{self.tail()}")

    def tail(self, n: int = 1500) -> str:
        out = []
        for key in sorted(self.procs):
            try:
                with open(os.path.join(self.root, f"{key}.log"), "rb") as f:
                    out.append(f"--- {key}\n" + f.read()[-n:].decode("utf-8", "replace"))
            except OSError:
                pass
        return "\n".join(out)

    def alive(self) -> bool:
        g = self.procs.get("g0")
        return g is not None and g.poll() is None

    def shard_pids(self) -> List[int]:
        return [p.pid for k, p in self.procs.items() if k.startswith("s") and p.poll() is None]

    # -- faults ----------------------------------------------------------------------

    def _shard(self, rng: random.Random) -> Optional[str]:
        live = [k for k, p in self.procs.items() if k.startswith("s") and p.poll() is None]
        return rng.choice(live) if live else None

    def kill_shard(self, rng: random.Random) -> Optional[str]:
        k = self._shard(rng)
        if k is None:
            return None
        p = self.procs[k]
        p.kill()
        p.wait()
        time.sleep(rng.uniform(0.2, 1.0))
        self.start_shard(int(k[1:]))
        return f"kill -9 shard {k} pid {p.pid}, restarted as pid {self.procs[k].pid}"

    def stop_shard(self, rng: random.Random, seconds: float) -> Optional[str]:
        k = self._shard(rng)
        if k is None:
            return None
        pid = self.procs[k].pid
        self._stop_for(pid, seconds)
        return f"SIGSTOP shard {k} pid {pid} for {seconds:.1f} s"

    def _stop_for(self, pid: int, seconds: float) -> None:
        os.kill(pid, signal.SIGSTOP)
        self.stopped.add(pid)
        time.sleep(seconds)
        self.cont(pid)

    def cont(self, pid: int) -> None:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        self.stopped.discard(pid)

    def fill_data(self, seconds: float) -> Optional[str]:
        """Fill every shard's data tmpfs with a ballast file for ``seconds``,
        then remove them: writes answer STORAGE_FULL meanwhile, and one
        refused must never show later, on any owner (its replication to etcd
        must not happen)."""
        if not self.mounts:
            return None
        paths = [os.path.join(d, "ballast") for d in self.mounts]
        n = 0
        for path in paths:
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
        for path in paths:
            try:
                os.unlink(path)
            except OSError:
                pass
        return f"data directories of {len(paths)} shards full ({n} MiB ballast) for {seconds:.1f} s"

    def etcd_leader(self) -> Optional[int]:
        for i, u in enumerate(self.etcd_urls):
            try:
                req = urllib.request.Request(u + "/v3/maintenance/status", data=b"{}",
                                             method="POST")
                with urllib.request.urlopen(req, timeout=2) as r:
                    st = json.load(r)
                if st.get("leader") and st.get("leader") == st.get("header", {}).get("member_id"):
                    return i
            except Exception:  # noqa: BLE001
                continue
        return None

    def fault(self, kind: str, rng: random.Random) -> Optional[str]:
        if kind == "etcd-stop":
            i = rng.randrange(3)
            p = self.procs[f"etcd{i}"]
            if p.poll() is not None:
                return None
            s = rng.uniform(1.0, 4.0)
            self._stop_for(p.pid, s)
            return f"SIGSTOP etcd member m{i} pid {p.pid} for {s:.1f} s"
        if kind == "etcd-leader":
            i = self.etcd_leader()
            if i is None:
                return None
            p = self.procs[f"etcd{i}"]
            p.kill()
            p.wait()
            time.sleep(rng.uniform(1.0, 2.0))
            self.start_etcd(i)
            return f"kill -9 etcd leader m{i} pid {p.pid}, restarted"
        if kind == "proxy":
            s = rng.uniform(2.0, 6.0)
            for p in self.proxies:
                p.set_faults(delay=0.3, drop_request=0.1, drop_reply=0.1, duplicate=0.2)
            time.sleep(s)
            for p in self.proxies:
                p.set_faults()
            return f"etcd proxy delays/drops/duplicates for {s:.1f} s"
        if kind == "drain":
            live = [i for i in range(len(self.shard_ports))]
            i = rng.choice(live)
            name = f"{self.name}-s{i}"
            r = subprocess.run([sbx_bin("sbx"), "--gateway", self.gw_url, "cluster", "drain",
                                name], capture_output=True, timeout=60)
            self.drained.add(name)
            time.sleep(rng.uniform(2.0, 6.0))
            u = subprocess.run([sbx_bin("sbx"), "--gateway", self.gw_url, "cluster", "undrain",
                                name], capture_output=True, timeout=60)
            if u.returncode == 0:
                self.drained.discard(name)
            return f"drain {name} (exit {r.returncode}), undrain (exit {u.returncode})"
        return None

    # -- clean-up --------------------------------------------------------------------

    def stop(self) -> int:
        for pid in list(self.stopped):
            self.cont(pid)
        for p in self.proxies:
            p.close()
        order = ["g0"] + sorted(k for k in self.procs if k.startswith("s")) + \
            sorted(k for k in self.procs if k.startswith("etcd"))
        for k in order:
            p = self.procs[k]
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.log(f"{k} (pid {p.pid}) ignored SIGTERM for 30 s; SIGKILL")
                    p.kill()
                    p.wait(timeout=10)
        left = sweep_name(self.name)
        for f in self.logs:
            f.close()
        for d in self.mounts:
            for _ in range(20):
                if subprocess.run(["umount", d]).returncode == 0:
                    break
                time.sleep(0.5)
            else:
                subprocess.run(["umount", "-l", d])
        self.mounts = []
        if os.environ.get("SBX_FAULTS_KEEP"):
            self.log(f"deployment files kept in {self.root}")
        else:
            shutil.rmtree(self.root, ignore_errors=True)
        return left
