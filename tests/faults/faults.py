#!/usr/bin/env python3
"""Fault-injection history test (issue 11; docs/cluster.md, "Fault-injection
history test").

    tests/faults/faults.py [--events N] [--faults kill,stop,fill] [--clients C]
                           [--keys K] [--seed S] [--history FILE]

Starts a private deployment (`sbxd dev` from $SBX_BIN), runs C client
threads against it that record every operation as invoke -> ok / fail /
unknown with wall-clock times, injects N fault events one after another,
lets the deployment recover, reads every key a last time, stops everything
it started, and checks the history (checker.py: Wing & Gong with Lowe's
memoization, per key).  Prints its figures; exit status 0 only if there was
no violation (1: violations, 2: the run itself failed).

Workload, per key (a sandbox named fx-<run>-<slot>-<generation>):
  write   sandbox.configure {sleepAfter: v}, v unique per key (seconds)
  read    status -> sleepAfter (SANDBOX_NOT_FOUND: absent)
  create  create -> created flag;  destroy -> destroyed flag
  exec    a sessionless exec with request id R (the Idempotency-Key):
          a process whose command line carries R and which waits (<= 5 s)
          until the test has seen it (see ExecWatch); execs create the
          sandbox on first use, so they are `touch` ops of the register.
Outcomes: HTTP < 400 ok; SHARD_UNAVAILABLE, timeouts, lost connections,
INTERNAL_ERROR, OPERATION_INTERRUPTED unknown; other codes fail (for exec:
unknown as far as the register goes, it may have created the sandbox).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import signal
import sys
import threading
import time
import uuid
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import checker  # noqa: E402
from checker import DEFAULT, FAIL, INF, OK, UNKNOWN, Op  # noqa: E402
from dev import DevDeployment  # noqa: E402
from sbx_sandbox import SbxClient, errors  # noqa: E402

UNKNOWN_CODES = {"REQUEST_TIMEOUT", "SHARD_UNAVAILABLE", "GATEWAY_UNAVAILABLE",
                 "INVALID_RESPONSE", "INTERNAL_ERROR", "OPERATION_INTERRUPTED"}
RESEND_CODES = {"REQUEST_TIMEOUT", "SHARD_UNAVAILABLE", "GATEWAY_UNAVAILABLE",
                "INVALID_RESPONSE", "INTERNAL_ERROR", "RemoteDisconnected", "TimeoutError"}
DEFAULT_SLEEP_MS = 600000  # a new sandbox's sleepAfter (protocol.md, configure)
KEY_OPS = 40               # ops on a key before its slot moves to a new key
MARK = re.compile(rb"fxR-([0-9a-f]{32})")


def say(*a) -> None:
    print(f"[faults {time.strftime('%H:%M:%S')}]", *a, flush=True)


class Interrupted(BaseException):
    """SIGTERM or the run's time limit (a BaseException: the client code's
    ``except Exception`` must not take it for a failed operation and go on)."""


class ExecWatch(threading.Thread):
    """Sees every execution of the test's exec commands on this host.

    Each exec runs ``/bin/bash -c 'exec -a fxR-<R> sleep 5'`` in the
    sandbox: one process, no fork, whose command line carries R before and
    after its exec (a shell loop would fork children that carry the shell's
    command line until they exec, and an orphaned one looks like a second
    run).  This thread scans /proc every 50 ms for such processes, records
    each (host pid, start time) under R, and sends it SIGUSR1 so it ends at
    once (exit status 138: still an acknowledged exec).  Two executions of
    one R are a request id run twice.  A log inside the sandbox would not
    do: /workspace and /tmp die with the container, and the interesting
    double executions are the retries after a shard (and its containers)
    restarted; the host sees every execution, whichever container ran it.
    """

    def __init__(self, ids: set) -> None:
        super().__init__(daemon=True)
        self.ids = ids  # request ids this run issued (read only here)
        self.seen: Dict[str, set] = collections.defaultdict(set)
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.05):
            self.scan()

    def scan(self) -> None:
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    cl = f.read()
            except OSError:
                continue
            if not (cl.startswith(b"fxR-") or cl.startswith(b"/bin/bash\0-c\0exec -a fxR-")):
                continue
            m = MARK.search(cl)
            if not m:
                continue
            r = m.group(1).decode()
            if r not in self.ids:
                continue
            try:
                with open(f"/proc/{d}/stat", "rb") as f:
                    st = f.read()
                start = int(st[st.rfind(b")") + 2:].split()[19])
            except (OSError, ValueError, IndexError):
                continue
            with self.lock:
                self.seen[r].add((int(d), start))
            try:
                os.kill(int(d), signal.SIGUSR1)
            except OSError:
                pass


# Upper bounds of write, read, create and destroy in [0, 1); the rest is exec.
MIXES = {"default": (0.38, 0.78, 0.83, 0.88), "lifecycle": (0.10, 0.30, 0.65, 1.0)}


class Run:
    """Shared state of the client threads (the history, keys, counters)."""

    def __init__(self, url: str, nkeys: int, seed: int,
                 mix: Tuple[float, ...] = (0.38, 0.78, 0.83, 0.88)) -> None:
        self.url = url
        self.mix = mix  # upper bounds of write, read, create, destroy; the rest exec
        self.tag = uuid.uuid4().hex[:6]
        self.lock = threading.Lock()
        self.history: List[Op] = []
        self.slots = [{"gen": 0, "ops": 0} for _ in range(nkeys)]
        self.vals: Dict[str, int] = {}  # key -> last value handed out
        self.keys: set = set()
        self.exec_ids: set = set()
        self.retry: List[tuple] = []  # (key, request id) of execs that ended unknown
        self.stop = threading.Event()
        self.seed = seed
        self.t0 = time.time()

    def key_for(self, slot: int) -> str:
        with self.lock:
            s = self.slots[slot]
            s["ops"] += 1
            if s["ops"] > KEY_OPS:
                s["gen"] += 1
                s["ops"] = 1
            k = f"fx-{self.tag}-{slot}-{s['gen']}"
            self.keys.add(k)
            return k

    def next_value(self, key: str) -> int:
        """A value never written to ``key`` before: seconds 2, 3, ... (small:
        it is the sandbox's sleepAfter; never the default)."""
        with self.lock:
            v = self.vals.get(key, 1) + 1
            if v * 1000 == DEFAULT_SLEEP_MS:
                v += 1
            self.vals[key] = v
            return v

    def record(self, op: Op) -> None:
        with self.lock:
            op.idx = len(self.history)
            self.history.append(op)


def outcome(e: Exception) -> tuple:
    if isinstance(e, errors.SandboxError):
        return (UNKNOWN if e.code in UNKNOWN_CODES else FAIL), e.code
    return UNKNOWN, type(e).__name__


def do_op(run: Run, cli: SbxClient, client: int, key: str, f: str, value=None,
          rid: Optional[str] = None, again: bool = False) -> Op:
    """Run one operation and record it (``again``: an exec re-sent with the
    request id of one whose outcome was unknown, marked as a retry)."""
    t = cli._t
    op = Op(key, client, f, value, None, OK, time.time() - run.t0, INF)
    path = t.path("v1", "sandboxes", key)
    try:
        if f == "write":
            t.send("POST", path + "/sandbox.configure",
                   json.dumps({"sleepAfter": value}).encode(), operation="sandbox.configure")
        elif f == "read":
            try:
                r = t.send("POST", path + "/status", b"{}", operation="status").json()
                ms = r["sandbox"]["sleepAfter"]
                op.out = DEFAULT if ms == DEFAULT_SLEEP_MS else ms // 1000
            except errors.SandboxError as e:
                if e.code != "SANDBOX_NOT_FOUND":
                    raise
                op.out = None
        elif f == "create":
            op.out = bool(t.send("POST", path + "/create", b"{}", operation="create")
                          .json().get("created"))
        elif f == "destroy":
            op.out = bool(t.send("DELETE", path, operation="destroy").json().get("destroyed"))
        elif f == "touch":
            t.send("POST", path + "/exec",
                   json.dumps({"argv": ["/bin/bash", "-c", f"exec -a fxR-{rid} sleep 5"],
                               "sessionless": True,
                               "timeout": 20000}).encode(), operation="exec", key=rid,
                   retry=again)
            op.arg = rid
        op.complete = time.time() - run.t0
    except Exception as e:  # noqa: BLE001 - every failure is an outcome
        op.status, op.note = outcome(e)
        op.complete = time.time() - run.t0  # (INF again below if unknown)
        if f == "touch":
            op.arg = rid
            if op.status == FAIL:
                op.status, op.note = UNKNOWN, op.note + " (exec: may have created)"
    if op.status == UNKNOWN:
        op.complete = INF
    op.note = op.note or ""
    run.record(op)
    return op


def client_loop(run: Run, client: int, nslots: int) -> None:
    rng = random.Random(run.seed * 1000 + client)
    cli = SbxClient(run.url, timeout=30, retries=3, backoff=0.1, backoff_max=1.0)
    my = [client % nslots, (client + 1) % nslots]
    try:
        while not run.stop.is_set():
            slot = rng.choice(my)
            key = run.key_for(slot)
            x = rng.random()
            w, r, c, d = run.mix
            if x < w:
                do_op(run, cli, client, key, "write", run.next_value(key))
            elif x < r:
                do_op(run, cli, client, key, "read")
            elif x < c:
                do_op(run, cli, client, key, "create")
            elif x < d:
                do_op(run, cli, client, key, "destroy")
            else:
                with run.lock:
                    again = run.retry.pop() if run.retry and rng.random() < 0.5 else None
                if again:  # the same request id once more, later (after a restart)
                    key, rid = again
                else:
                    rid = uuid.uuid4().hex
                with run.lock:
                    run.exec_ids.add(rid)
                op = do_op(run, cli, client, key, "touch", rid=rid, again=again is not None)
                # re-sent only when the outcome is truly unknown (not after a
                # definite OPERATION_INTERRUPTED: a destroy ended it)
                if op.status == UNKNOWN and op.note in RESEND_CODES and not again:
                    with run.lock:
                        run.retry.append((key, rid))
    finally:
        cli.close()


def wait_healthy(url: str, seconds: float) -> Optional[str]:
    """None once every shard the gateway knows answers health ``ok`` within
    ``seconds``; else what the last cluster.status said (for the report)."""
    cli = SbxClient(url, timeout=5, retries=0)
    deadline = time.monotonic() + seconds
    last = "no answer"
    try:
        while time.monotonic() < deadline:
            try:
                st = cli.cluster_status()
                shards = st.get("shards") or []
                if shards and all(s.get("health") == "ok" for s in shards):
                    return None
                last = "; ".join(f"{s.get('name')}: {s.get('health')} {s.get('error') or ''}"
                                 for s in shards) or "no shards"
            except Exception as e:  # noqa: BLE001
                last = str(e)
            time.sleep(0.2)
        return last
    finally:
        cli.close()


def inject(dep, kinds: List[str], events: int, rng: random.Random,
           counts: collections.Counter, stop: threading.Event) -> None:
    n = 0
    while n < events:  # a fault with no target (a shard restarting) is tried again
        if stop.is_set() or not dep.alive():
            return
        time.sleep(rng.uniform(0.3, 1.2))
        kind = rng.choice(kinds)
        if kind == "kill":
            what = dep.kill_shard(rng)
        elif kind == "stop":
            what = dep.stop_shard(rng, rng.uniform(0.3, 3.0))
        elif kind == "none":  # a control run: the same pacing, no fault
            what = "no fault"
        elif kind == "fill":
            what = dep.fill_data(rng.uniform(0.5, 3.0))
        else:
            what = dep.fault(kind, rng) if hasattr(dep, "fault") else None
        if what:
            n += 1
            counts[kind] += 1
            say(f"fault {n}/{events}: {what}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=40)
    ap.add_argument("--cluster", action="store_true",
                    help="a 3-node cluster with a 3-member etcd (cluster.py) instead of sbxd dev")
    ap.add_argument("--faults", default=None,
                    help="comma-separated fault kinds (default dev: kill,stop; cluster: "
                         "kill,stop,etcd-stop,etcd-leader,proxy,drain)")
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--keys", type=int, default=6)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--shards", type=int, default=0, help="default dev 2, cluster 3")
    ap.add_argument("--tmpfs-mb", type=int, default=0,
                    help="data directory on a tmpfs of this size (needed by the fill fault)")
    ap.add_argument("--mix", choices=sorted(MIXES), default="default",
                    help="the operations' shares: default (38%% write, 40%% read, 5%% create, "
                         "5%% destroy, 12%% exec) or lifecycle (10%% write, 20%% read, 35%% "
                         "create, 35%% destroy: the answers whose retry must not run again)")
    ap.add_argument("--history", help="write the history (JSON lines) here")
    ap.add_argument("--max-seconds", type=int, default=0,
                    help="end the run (exit 2, after cleaning up) after this long "
                         "(default: 12 s per event + 180 s)")
    a = ap.parse_args(argv)

    def interrupted(signum, frame):
        raise Interrupted(f"signal {signum}")
    # SIGTERM (an outer timeout), SIGINT and the run's own limit still clean up
    # (SIGCONT, umount, kill by pid) through the finally below.
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGALRM, interrupted)
    signal.alarm(a.max_seconds or a.events * 12 + 180)
    if a.faults is None:
        a.faults = "kill,stop,etcd-stop,etcd-leader,proxy,drain" if a.cluster else "kill,stop"
    kinds = a.faults.split(",")
    a.shards = a.shards or (3 if a.cluster else 2)
    if "fill" in kinds and not a.tmpfs_mb:
        a.tmpfs_mb = 96
    rng = random.Random(a.seed)
    say(f"seed {a.seed}; {a.events} fault events of {kinds}; {a.clients} clients on "
        f"{a.keys} key slots")
    dep = None
    watch = None
    counts: collections.Counter = collections.Counter()
    run = None
    threads: List[threading.Thread] = []
    died = None
    leftovers = 0
    counts_proxy: collections.Counter = collections.Counter()
    try:
        if a.cluster:
            from cluster import ClusterDeployment
            dep = ClusterDeployment(shards=a.shards, tmpfs_mb=a.tmpfs_mb, log=say)
            say(f"cluster {dep.name}: 3 etcd members, {a.shards} shards, gateway {dep.url}, "
                f"files {dep.root}")
        else:
            dep = DevDeployment(shards=a.shards, tmpfs_mb=a.tmpfs_mb, log=say)
            say(f"sbxd dev {dep.name} at {dep.url}, data {dep.data}")
        run = Run(dep.url, a.keys, a.seed, MIXES[a.mix])
        watch = ExecWatch(run.exec_ids)
        watch.start()
        for c in range(a.clients):
            th = threading.Thread(target=client_loop, args=(run, c, a.keys), daemon=True)
            th.start()
            threads.append(th)
        inject(dep, kinds, a.events, rng, counts, run.stop)
        if not dep.alive():
            died = f"the deployment's front ended during the faults"
            say(died)
            say("log tail:\n" + dep.tail())
        else:
            for pid in list(dep.stopped):
                dep.cont(pid)
            why = wait_healthy(dep.url, 30)
            if why is not None:
                died = f"the deployment did not come back within 30 s after the last fault ({why})"
                say(died)
            time.sleep(2)
        run.stop.set()
        for th in threads:
            th.join(timeout=90)
        # A last read of every key, once nothing is in flight, by a client of its own
        # (not when a shard stayed down: each read of its keys would wait its whole
        # timeout, for hours, and tell nothing new).
        if dep.alive() and died is None:
            cli = SbxClient(dep.url, timeout=30, retries=3, backoff=0.2)
            for k in sorted(run.keys):
                do_op(run, cli, a.clients, k, "read")
            cli.close()
        time.sleep(0.3)
    except (RuntimeError, Interrupted, KeyboardInterrupt) as e:
        say(f"run failed: {type(e).__name__}: {e}")
        return 2
    finally:
        if run is not None:
            run.stop.set()
        if watch is not None:
            watch.stop.set()
        signal.alarm(0)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # let the clean-up finish
        if dep is not None:
            # stopping the deployment ends its sandboxes' containers too
            leftovers = dep.stop()
            for p in getattr(dep, "proxies", []):
                counts_proxy.update(p.counts)
    return report(run, watch, counts, died, leftovers, a, counts_proxy)


def report(run: Run, watch: ExecWatch, counts, died, leftovers, a, proxy) -> int:
    h = run.history
    if a.history:
        with open(a.history, "w") as f:
            for o in h:
                f.write(json.dumps({"key": o.key, "client": o.client, "f": o.f, "arg": o.arg,
                                    "out": o.out, "status": o.status, "invoke": o.invoke,
                                    "complete": None if o.complete == INF else o.complete,
                                    "note": o.note}) + "\n")
    res = checker.check(h)
    dbl = checker.double_executions({r: sorted(s) for r, s in watch.seen.items()})
    by = collections.Counter((o.f, o.status) for o in h)
    ok_exec = {o.arg for o in h if o.f == "touch" and o.status == OK}
    unobserved = len([r for r in ok_exec if r not in watch.seen])
    kinds = collections.Counter(v["kind"] for v in res["violations"])
    kinds["double_execution"] = len(dbl)
    print()
    print("fault-injection history test: figures")
    print(f"  seed {a.seed}, {len(run.keys)} keys, {len(h)} ops in {time.time() - run.t0:.0f} s")
    tot = collections.Counter(o.status for o in h)
    print(f"  ops: {tot[OK]} ok, {tot[FAIL]} fail, {tot[UNKNOWN]} unknown")
    for f in ("write", "read", "create", "destroy", "touch"):
        name = "exec" if f == "touch" else f
        print(f"    {name:8} {by[(f, OK)]:6} ok {by[(f, FAIL)]:5} fail {by[(f, UNKNOWN)]:5} unknown")
    codes = collections.Counter(o.note for o in h if o.status != OK)
    if codes:
        print("  errors: " + ", ".join(f"{c} {n}" for c, n in codes.most_common()))
    print(f"  fault events: {sum(counts.values())} (" +
          ", ".join(f"{k} {n}" for k, n in sorted(counts.items())) + ")")
    if proxy:
        print("  etcd proxy: " + ", ".join(f"{k} {n}" for k, n in sorted(proxy.items())))
    print(f"  execs: {len(ok_exec)} acknowledged request ids, {len(watch.seen)} seen running, "
          f"{unobserved} acknowledged but not seen")
    print(f"  violations: lost_write {kinds['lost_write']}, stale_read {kinds['stale_read']}, "
          f"resurrection {kinds['resurrection']}, "
          f"failed_write_visible {kinds['failed_write_visible']}, "
          f"double_execution {kinds['double_execution']}, "
          f"not_linearizable {kinds['not_linearizable']}")
    print(f"  undecided keys (search budget): {len(res['undecided'])}"
          + (f" ({', '.join(res['undecided'][:10])})" if res["undecided"] else ""))
    print(f"  deployment down: {died or 'no'}")
    print(f"  processes of the deployment left after it stopped: {leftovers}")
    for v in res["violations"]:
        print(f"\nVIOLATION {v['kind']} on key {v['key']} at: {checker.format_op(v['op'])}")
        for o in sorted(v["ops"], key=lambda o: o.invoke):
            print("    " + checker.format_op(o))
    for r, ex in dbl:
        ops = [o for o in h if o.f == "touch" and o.arg == r]
        first = sorted(ops, key=lambda o: o.invoke)[0] if ops else None
        print(f"\nVIOLATION double_execution: request id {r} ran {len(ex)} times "
              f"(first attempt: {first.status if first else '?'} {first.note if first else ''}) "
              f"(host pid, start ticks) {ex} on key {ops[0].key if ops else '?'}")
        for o in ops:
            print("    " + checker.format_op(o))
    bad = sum(kinds.values()) + (1 if died else 0)
    print(f"\nresult: {'FAIL' if bad else 'PASS'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
