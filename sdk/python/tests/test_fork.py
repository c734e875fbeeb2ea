"""Fork through the Python client (docs/persistence.md, "Fork"):
``fork(ids)`` of a persistent sandbox gives new sandboxes holding its
files, independent afterwards; a fork into an existing sandbox raises
SandboxExists.  The test daemon runs two shards: an ID owned by the other
shard raises ForkCrossShard, and the test then takes the next ID.
"""

import pytest

from sbx_sandbox import errors, get_sandbox

from conftest import new_id


def test_fork_copies_and_is_independent(client):
    src = get_sandbox(client, new_id("fks"))
    made = []
    try:
        src._call("create", {"workspace": "persistent"})
        src.exec("mkdir -p /workspace/p && echo hello > /workspace/p/a && "
                 "head -c 100000 /dev/urandom > /workspace/p/b")
        sums = "sha256sum /workspace/p/a /workspace/p/b"
        want = src.exec(sums).stdout

        fork_id = None
        for _ in range(40):
            fid = new_id("fkf")
            try:
                r = src.fork([fid])
            except errors.ForkCrossShard:
                continue
            assert r["ids"] == [fid]
            fork_id = fid
            break
        assert fork_id, "no ID of the source's shard in 40 tries"
        fork = get_sandbox(client, fork_id)
        made.append(fork)
        assert fork.exec(sums).stdout == want

        fork.exec("echo mine > /workspace/p/only-fork")
        assert src.exec("ls /workspace/p").stdout == "a\nb\n"

        with pytest.raises(errors.SandboxExists):
            src.fork([fork_id])
    finally:
        for s in made:
            s.destroy()
        src.destroy()
