"""Linearizability checker for the fault-injection history test (tests/faults).

A history is a list of :class:`Op`: one operation of one client on one key,
with its invoke and complete wall-clock times (seconds) and its outcome:

* ``ok``      -- the operation was acknowledged; it took effect exactly once,
                 at some instant between invoke and complete, and its output
                 is what the sequential model gives at that instant;
* ``fail``    -- a definite error: it took no effect (dropped from the check);
* ``unknown`` -- a timeout, ``SHARD_UNAVAILABLE``, a lost connection: it may
                 have taken effect at any instant after its invoke, or never.

The model (:func:`step`) is one register per key (a sandbox) that is either
absent (``None``) or holds a value:

==============  ===========================  ================================
op              effect                       output checked
==============  ===========================  ================================
``write v``     state := v                   -- (``sandbox.configure``)
``read``        --                           the value, ``None`` if absent
``destroy``     state := None                ``destroyed`` == existed before
``create``      state := DEFAULT if absent   ``created`` == was absent
``touch``       state := DEFAULT if absent   -- (``exec``: creates on first use)
==============  ===========================  ================================

Algorithm: J. M. Wing and C. Gong, "Testing and verifying concurrent
objects", Journal of Parallel and Distributed Computing 17(1-2):164-182,
1993 -- a depth-first search over the call/return list that linearizes a
minimal pending call, backtracking when a return is reached whose call is not
linearized -- with G. Lowe's memoization of (linearized set, model state)
pairs ("Testing for linearizability", Concurrency and Computation: Practice
and Experience 29(4), 2017), as Knossos and Porcupine do.  Keys are checked
separately (linearizability is local: M. Herlihy and J. Wing, TOPLAS 1990).
Unknown operations get a return event at +infinity, so the search may place
them anywhere after their invoke or leave them out.

A key whose history is not linearizable is classified by its shortest
non-linearizable prefix (cut at a completion time) and the operation that
completes there (:func:`classify`): ``lost_write``, ``stale_read``,
``resurrection``, ``failed_write_visible`` or ``not_linearizable``.  :func:`double_executions` checks
the exec observations: a request id seen running more than once.

Standard library only; ``python3 -m unittest tests/faults/test_checker.py``
tests it on small hand-written histories.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple

DEFAULT = "D"  # the value of a sandbox created by create/exec (its default sleepAfter)
INF = math.inf

OK, FAIL, UNKNOWN = "ok", "fail", "unknown"


@dataclass
class Op:
    """One operation.  ``out`` is the output (read: value or None; destroy:
    destroyed flag; create: created flag; others: None).  Owned by the
    history list that holds it; the checker never modifies it."""
    key: str
    client: int
    f: str                 # write | read | destroy | create | touch
    arg: Any = None        # write: the value
    out: Any = None
    status: str = OK
    invoke: float = 0.0
    complete: float = INF
    note: str = ""         # error code or other detail, for reports
    idx: int = field(default=-1, compare=False)


def step(state: Any, op: Op) -> Tuple[bool, Any]:
    """The sequential model: (output matches, new state).  Unknown ops'
    outputs are not checked."""
    check = op.status == OK
    if op.f == "write":
        return True, op.arg
    if op.f == "read":
        return (not check or op.out == state), state
    if op.f == "destroy":
        return (not check or op.out is None or bool(op.out) == (state is not None)), None
    if op.f == "create":
        ok = not check or op.out is None or bool(op.out) == (state is None)
        return ok, (DEFAULT if state is None else state)
    if op.f == "touch":
        return True, (DEFAULT if state is None else state)
    raise ValueError(f"unknown op {op.f!r}")


class Budget(Exception):
    """The search took more than its step budget (the result is undecided)."""


def linearizable(ops: List[Op], init: Any = None, budget: int = 2_000_000) -> bool:
    """Whether ``ops`` (one key's history) is linearizable w.r.t. :func:`step`
    from state ``init``.  ``fail`` ops are ignored; ``unknown`` ops and reads
    are treated as above.  Raises :class:`Budget` after ``budget`` search
    steps."""
    hist = [o for o in ops if o.status != FAIL and not (o.status == UNKNOWN and o.f == "read")]
    n = len(hist)
    if n == 0:
        return True
    # Events: (time, kind, i); kind 0 = call, 1 = return.  At equal times a
    # return sorts before a call (intervals are closed at the ack: an op
    # invoked at the instant another returned may follow it).
    ev = []
    for i, o in enumerate(hist):
        ev.append((o.invoke, 1, i))
        ev.append((INF if o.status == UNKNOWN else o.complete, 0, i))
    ev.sort(key=lambda e: (e[0], e[1]))
    # Doubly linked list over the events (index m is the head sentinel).
    m = len(ev)
    nxt = list(range(1, m + 1)) + [0]
    prv = [m] + list(range(0, m))
    is_call = [e[1] == 1 for e in ev]
    op_of = [e[2] for e in ev]
    ret_at = [0] * n
    call_at = [0] * n
    for k, e in enumerate(ev):
        if e[1] == 1:
            call_at[e[2]] = k
        else:
            ret_at[e[2]] = k
    infinite = [hist[i].status == UNKNOWN for i in range(n)]

    def lift(i: int) -> None:
        for k in (call_at[i], ret_at[i]):
            nxt[prv[k]] = nxt[k]
            prv[nxt[k]] = prv[k]

    def unlift(i: int) -> None:
        for k in (ret_at[i], call_at[i]):
            nxt[prv[k]] = k
            prv[nxt[k]] = k

    state = init
    linearized = 0
    cache = {(0, init)}
    stack: List[Tuple[int, Any]] = []  # (op index, state before it)
    entry = nxt[m]
    steps = 0
    while True:
        steps += 1
        if steps > budget:
            raise Budget(f"{steps} steps")
        if entry == m or (not is_call[entry] and infinite[op_of[entry]]):
            return True  # every acknowledged op is linearized
        if is_call[entry]:
            i = op_of[entry]
            good, new = step(state, hist[i])
            if good:
                lin2 = linearized | (1 << i)
                if (lin2, new) not in cache:
                    cache.add((lin2, new))
                    stack.append((i, state))
                    state, linearized = new, lin2
                    lift(i)
                    entry = nxt[m]
                    continue
            entry = nxt[entry]
        else:
            # the return of an op that is not linearized: backtrack
            if not stack:
                return False
            i, state = stack.pop()
            linearized &= ~(1 << i)
            unlift(i)
            entry = nxt[call_at[i]]


def _prefix(ops: List[Op], t: float) -> List[Op]:
    """The history as seen at time ``t``: ops completed by then keep their
    outcome, ops pending at ``t`` become unknown, later ones are dropped."""
    out = []
    for o in ops:
        if o.invoke > t or o.status == FAIL:  # failed ops are left out anyway
            continue
        if o.status == UNKNOWN or o.complete <= t:
            out.append(o)
        else:
            c = Op(o.key, o.client, o.f, o.arg, None, UNKNOWN, o.invoke, INF, o.note, o.idx)
            out.append(c)
    return out


def first_violation(ops: List[Op], init: Any = None, budget: int = 2_000_000) -> Optional[Op]:
    """The op whose completion first makes the history non-linearizable
    (binary search over completion times), or None if it is linearizable."""
    if linearizable(ops, init, budget):
        return None
    done = sorted({o.complete for o in ops if o.status == OK})
    lo, hi = 0, len(done) - 1  # invariant: prefix at done[hi] fails
    while lo < hi:
        mid = (lo + hi) // 2
        if linearizable(_prefix(ops, done[mid]), init, budget):
            lo = mid + 1
        else:
            hi = mid
    t = done[hi]
    cands = [o for o in ops if o.status == OK and o.complete == t]
    return cands[0] if cands else None


def classify(ops: List[Op], bad: Op) -> str:
    """A name for a violation whose first non-linearizable completion is
    ``bad`` (see the module doc)."""
    if bad.f != "read":
        return "not_linearizable"
    if bad.out is not None and any(o.f == "write" and o.arg == bad.out and o.status == FAIL
                                   for o in ops):
        return "failed_write_visible"
    before = [o for o in ops if o.status == OK and o.complete < bad.invoke and o.f != "read"]
    last = max(before, key=lambda o: o.complete) if before else None
    # a value written wholly before an acknowledged destroy that ended before the read
    if bad.out not in (None, DEFAULT):
        w = [o for o in ops if o.f == "write" and o.arg == bad.out]
        if w and any(d.f == "destroy" and d.status == OK and w[0].status == OK
                     and w[0].complete < d.invoke and d.complete < bad.invoke for d in ops):
            return "resurrection"
    if bad.out is not None and last is not None and last.f == "destroy":
        if not any(o.f in ("write", "create", "touch") and o.status != FAIL
                   and o.invoke > last.invoke for o in ops if o is not bad):
            return "resurrection"
    if last is not None and last.f in ("write", "create", "touch"):
        if bad.out is None:
            return "lost_write"
        want = last.arg if last.f == "write" else DEFAULT
        later_reads = [o for o in ops if o.f == "read" and o.status == OK
                       and o.invoke > bad.complete]
        if not any(r.out == want for r in later_reads) and last.f == "write":
            return "lost_write"
        return "stale_read"
    return "not_linearizable"


def check(history: Iterable[Op], budget: int = 2_000_000) -> Dict[str, Any]:
    """Check every key.  Returns ``{"keys": n, "violations": [{"kind", "key",
    "op", "ops"}], "undecided": [key, ...]}`` where ``ops`` is the key's
    history (for the report)."""
    by_key: Dict[str, List[Op]] = {}
    for o in history:
        by_key.setdefault(o.key, []).append(o)
    res: Dict[str, Any] = {"keys": len(by_key), "violations": [], "undecided": []}
    for key, ops in sorted(by_key.items()):
        try:
            bad = first_violation(ops, None, budget)
        except Budget:
            res["undecided"].append(key)
            continue
        if bad is not None:
            res["violations"].append({"kind": classify(ops, bad), "key": key, "op": bad,
                                      "ops": ops})
    return res


def double_executions(observed: Dict[str, List[Any]]) -> List[Tuple[str, List[Any]]]:
    """Request ids observed running more than once: ``observed`` maps a
    request id to the distinct executions seen (e.g. (pid, start time))."""
    return [(r, ex) for r, ex in sorted(observed.items()) if len(set(ex)) > 1]


def format_op(o: Op) -> str:
    """One line for a report."""
    arg = "" if o.arg is None else f" {o.arg}"
    out = "" if o.status != OK or o.f in ("write", "touch") else f" -> {o.out!r}"
    end = "inf" if o.complete == INF else f"{o.complete:.3f}"
    note = f" [{o.note}]" if o.note else ""
    return f"c{o.client} {o.f}{arg}{out} {o.status} [{o.invoke:.3f}, {end}]{note}"
