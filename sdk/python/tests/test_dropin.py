"""Issue 19: Cloudflare SDK behaviours a ported program relies on (the TS
suite's test/dropin.test.mjs has the same items)."""
import re

import pytest

from sbx_sandbox import errors

VERSION = re.compile(r"^watch-\d+-\d+:\d+$")


def test_check_changes(fresh_sandbox):
    sb = fresh_sandbox
    sb.mkdir("/workspace/pc", recursive=True)
    first = sb.check_changes("/workspace/pc")
    assert first["status"] == "unchanged" and VERSION.match(first["version"])
    assert sb.check_changes("/workspace/pc", since=first["version"])["status"] == "unchanged"
    sb.write_file("/workspace/pc/a.txt", "x")
    changed = sb.check_changes("/workspace/pc", since=first["version"])
    assert changed["status"] == "changed" and changed["version"] != first["version"]
    with pytest.raises(errors.ValidationFailed):
        sb.check_changes("/workspace/pc", since="bogus")
    sb.exec("rm -r /workspace/pc && mkdir /workspace/pc")
    r = sb.check_changes("/workspace/pc", since=changed["version"])
    assert (r["status"], r["reason"]) == ("resync", "expired")


def test_is_port_exposed_and_custom_domains(fresh_sandbox):
    sb = fresh_sandbox
    assert sb.is_port_exposed(3000) is False
    with pytest.raises(errors.SandboxNotFound):
        sb.status()  # is_port_exposed did not create it
    assert sb.expose_port(3000).port == 3000  # no control plane on 3000 in sbx
    assert sb.is_port_exposed(3000) is True
    assert sb.is_port_exposed(3001) is False
    with pytest.raises(errors.CustomDomainRequired) as e:
        sb.expose_port(8080, hostname="x.workers.dev")
    assert e.value.code == "CUSTOM_DOMAIN_REQUIRED" and e.value.http_status == 400
    assert sb.is_port_exposed(8080) is False
