"""Backups through the Python client (docs/persistence.md, "Backups"):
``create_backup`` in one sandbox, ``restore_backup`` into another (the
backup's own dir, and a dir named at restore), identical content there;
``list_backups`` shows it; ``delete_backup`` removes it, after which a
restore raises BackupNotFound; a dir outside the sandbox's paths is
ValidationFailed and a missing one FileNotFound.  With ``gitignore=True``
what the tree's .gitignore names is left out (a non-boolean is
ValidationFailed).
"""

import pytest

from sbx_sandbox import errors, get_sandbox

from conftest import new_id

TREE = ("mkdir -p /workspace/bk/src && cd /workspace/bk && echo 'print(1)' > src/main.py && "
        "head -c 200000 /dev/urandom > data.bin && ln -s src/main.py link")
SUMS = "cd {0} && find . -printf '%y %p %l\\n' | sort && find . -type f | sort | xargs sha256sum"


def test_backup_restore_list_delete(client):
    a = get_sandbox(client, new_id("bka"))
    b = get_sandbox(client, new_id("bkb"))
    try:
        a.exec(TREE)
        want = a.exec(SUMS.format("/workspace/bk")).stdout
        assert "l ./link src/main.py" in want
        bk = a.create_backup("/workspace/bk", name="py", ttl=600)
        assert bk["dir"] == "/workspace/bk" and bk["digest"].startswith("sha256:") and bk["size"] > 0

        b.exec("mkdir -p /workspace/bk && echo stale > /workspace/bk/stale")
        assert b.restore_backup(bk)["success"] is True
        assert b.exec(SUMS.format("/workspace/bk")).stdout == want
        b.restore_backup(bk, dir="/tmp/elsewhere")
        assert b.exec(SUMS.format("/tmp/elsewhere")).stdout == want

        listed = [x for x in client.list_backups() if x["id"] == bk["id"]]
        assert len(listed) == 1 and listed[0]["name"] == "py" and listed[0]["digest"] == bk["digest"]

        a.exec("printf '*.bin\\n' > /workspace/bk/.gitignore")
        gi = a.create_backup("/workspace/bk", gitignore=True)
        b.restore_backup(gi, dir="/tmp/gi")
        assert b.exec("cd /tmp/gi && ls -A").stdout == ".gitignore\nlink\nsrc\n"
        with pytest.raises(errors.ValidationFailed):
            a.create_backup("/workspace/bk", gitignore="yes")
        client.delete_backup(gi["id"])

        client.delete_backup(bk["id"])
        with pytest.raises(errors.BackupNotFound):
            b.restore_backup(bk)
        with pytest.raises(errors.BackupNotFound):
            client.delete_backup(bk["id"])
        with pytest.raises(errors.ValidationFailed):
            a.create_backup("../..")
        with pytest.raises(errors.FileNotFound):
            a.create_backup("/workspace/none")
    finally:
        a.destroy()
        b.destroy()
