"""Images through the Python client (docs/images.md): an OCI layout built
here with the standard library (tarfile, gzip, hashlib: the host's bash and
its libraries plus busybox-static, two layers, a whiteout in the second),
imported with ``import_image`` (a path of this machine, which is the
server's), a sandbox from it with ``get_sandbox(..., image=...)``, then
list / inspect / remove, and the errors of an unknown and a tampered image;
a template (``build_template``) and a failing build step.
"""

import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile

import pytest

from sbx_sandbox import errors, get_sandbox

from conftest import new_id

LIBS = ["/lib/x86_64-linux-gnu/libtinfo.so.6", "/lib/x86_64-linux-gnu/libc.so.6",
        "/lib64/ld-linux-x86-64.so.2"]


def _tar(entries):
    """A tar (bytes) of (path, kind, data) entries: kind 'd', 'f' (bytes), 'F'
    (a host file), 'l' (symlink target)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for path, kind, data in entries:
            ti = tarfile.TarInfo(path)
            ti.mtime = 1700000000
            if kind == "d":
                ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                t.addfile(ti)
            elif kind == "l":
                ti.type, ti.linkname = tarfile.SYMTYPE, data
                t.addfile(ti)
            else:
                if kind == "F":
                    with open(os.path.realpath(data), "rb") as f:
                        data = f.read()
                ti.size, ti.mode = len(data), 0o755
                t.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def _blob(layout, data):
    d = hashlib.sha256(data).hexdigest()
    with open(os.path.join(layout, "blobs", "sha256", d), "wb") as f:
        f.write(data)
    return "sha256:" + d, len(data)


def _layout(layout, layers, env):
    os.makedirs(os.path.join(layout, "blobs", "sha256"))
    with open(os.path.join(layout, "oci-layout"), "w") as f:
        f.write('{"imageLayoutVersion":"1.0.0"}')
    descs, diffs = [], []
    for tar in layers:
        diffs.append("sha256:" + hashlib.sha256(tar).hexdigest())
        d, n = _blob(layout, gzip.compress(tar, mtime=0))
        descs.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                      "digest": d, "size": n})
    cfg = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Env": env},
                      "rootfs": {"type": "layers", "diff_ids": diffs}}).encode()
    cd, cn = _blob(layout, cfg)
    man = json.dumps({"schemaVersion": 2,
                      "mediaType": "application/vnd.oci.image.manifest.v1+json",
                      "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                 "digest": cd, "size": cn},
                      "layers": descs}).encode()
    md, mn = _blob(layout, man)
    with open(os.path.join(layout, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md,
             "size": mn}]}, f)
    return md


@pytest.fixture
def layout():
    if not os.access("/bin/busybox", os.X_OK) or not all(os.path.exists(p) for p in LIBS):
        pytest.skip("needs busybox-static and the host's bash libraries")
    work = tempfile.mkdtemp(prefix="sbx-pyimg-")
    os.chmod(work, 0o755)
    base = [("bin", "d", None), ("lib", "d", None), ("lib/x86_64-linux-gnu", "d", None),
            ("lib64", "d", None), ("etc", "d", None), ("usr", "d", None),
            ("bin/busybox", "F", "/bin/busybox"), ("bin/bash", "F", "/bin/bash"),
            ("etc/os-release", "f", b"ID=base\n"), ("gone", "f", b"x\n")]
    base += [("bin/" + a, "l", "busybox") for a in ("sh", "cat", "ls", "echo", "true")]
    base += [(p[1:], "F", p) for p in LIBS]
    top = [("etc", "d", None), ("etc/os-release", "f", b"ID=pyimage\n"), (".wh.gone", "f", b"")]
    digest = _layout(os.path.join(work, "img"), [_tar(base), _tar(top)],
                     ["PATH=/usr/bin:/bin", "PYIMG=1"])
    yield os.path.join(work, "img"), digest
    shutil.rmtree(work, ignore_errors=True)


def test_sandbox_from_an_imported_image(client, layout):
    path, digest = layout
    name = f"pytest/{os.getpid()}:1"
    r = client.import_image(path, name)
    assert r["digest"] == digest
    assert name in [n for i in client.list_images() for n in i["names"]]
    assert client.inspect_image(name)["image"]["config"]["env"][1] == "PYIMG=1"

    sb = get_sandbox(client, new_id("img"), image=name)
    assert sb.status()["image"] == digest
    r = sb.exec("cat /etc/os-release; echo $PYIMG; ls /gone 2>/dev/null || echo gone")
    assert r.stdout == "ID=pyimage\n1\ngone\n"
    sb.destroy()
    assert client.remove_image(name)["removed"] == 1
    with pytest.raises(errors.ImageNotFound):
        client.inspect_image(name)


def test_unknown_and_tampered_images(client, layout):
    with pytest.raises(errors.ImageNotFound):
        get_sandbox(client, new_id("img"), image="no/such:image")
    path, _ = layout
    blobs = os.path.join(path, "blobs", "sha256")
    big = max(os.listdir(blobs), key=lambda b: os.path.getsize(os.path.join(blobs, b)))
    with open(os.path.join(blobs, big), "r+b") as f:
        f.seek(1000)
        f.write(b"Z")
    with pytest.raises(errors.ImageInvalid):
        client.import_image(path, f"pytest/{os.getpid()}:bad")


def test_template_build(client, layout):
    """build_template: a sandbox of the template sees its steps' changes; a
    failing step raises TemplateBuildFailed with its output, adds nothing."""
    path, digest = layout
    base, tpl = f"pytest/{os.getpid()}:tplbase", f"pytest/{os.getpid()}:tpl"
    client.import_image(path, base)
    r = client.build_template(tpl, base, ["echo baked > /etc/baked", "rm /etc/os-release"])
    assert r["digest"] != digest and r["image"]["layers"] == 3
    sb = get_sandbox(client, new_id("tpl"), image=tpl)
    r = sb.exec("cat /etc/baked; cat /etc/os-release 2>/dev/null || echo removed")
    assert r.stdout == "baked\nremoved\n"
    sb.destroy()
    with pytest.raises(errors.TemplateBuildFailed) as ei:
        client.build_template(tpl + "-bad", base, ["echo why >&2; exit 4"])
    assert "exited with 4" in str(ei.value) and "why" in str(ei.value)
    with pytest.raises(errors.ImageNotFound):
        client.inspect_image(tpl + "-bad")
    assert client.remove_image(tpl)["removed"] == 1
    assert client.remove_image(base)["removed"] == 1
