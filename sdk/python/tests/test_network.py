import pytest

from sbx_sandbox import errors, get_sandbox

from conftest import new_id


def test_create_with_host_names_and_bandwidth(client):
    """Host-name rules and a bandwidth limit (docs/network.md) go through
    create and show in status; a bad name is named in ValidationFailed."""
    sb = get_sandbox(client, new_id("net"))
    r = sb.create(network="egress", allow=["example.org:443", "*.example.net"],
                  deny=["ads.example.org"], bandwidth=50)
    net = r["sandbox"]["network"]
    assert net["mode"] == "egress"
    assert net["allow"] == ["example.org:443", "*.example.net"]
    assert net["deny"] == ["ads.example.org"]
    assert net["bandwidth"] == 50
    sb.configure(network={"mode": "egress", "allow": ["example.org"]})
    net = sb.status()["network"]
    assert net["allow"] == ["example.org"] and "bandwidth" not in net
    with pytest.raises(errors.ValidationFailed) as e:
        sb.create(network="egress", allow=["bad..name"])
    assert "bad..name" in str(e.value)
    with pytest.raises(errors.ValidationFailed):
        sb.create(network="egress", bandwidth=0)
    sb.destroy()
