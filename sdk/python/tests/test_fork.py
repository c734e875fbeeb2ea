"""Fork through the Python client (docs/persistence.md, "Fork"):
``fork(ids)`` of a persistent sandbox gives new sandboxes holding its
files, independent afterwards; a fork into an existing sandbox raises
SandboxExists.  The test daemon runs two shards: of four forks, some land
on the source's shard and some on the other (staged and adopted).
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

        ids = [new_id("fkf") for _ in range(4)]
        r = src.fork(ids)
        assert r["ids"] == ids
        made.extend(get_sandbox(client, i) for i in ids)
        for s in made:
            assert s.exec(sums).stdout == want
        fork_id = ids[0]
        fork = made[0]

        fork.exec("echo mine > /workspace/p/only-fork")
        assert src.exec("ls /workspace/p").stdout == "a\nb\n"

        with pytest.raises(errors.SandboxExists):
            src.fork([fork_id])
    finally:
        for s in made:
            s.destroy()
        src.destroy()
