"""The address a server is dialled at from another machine."""

from __future__ import annotations

import pytest

from rollyard.core import net


def test_an_explicit_advertise_wins_and_a_wildcard_bind_advertises_this_hosts_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert net.advertised_url("0.0.0.0", 8000, "gw.internal") == "http://gw.internal:8000"
    assert net.advertised_url("0.0.0.0", 8000, "https://gw.internal:443/") == "https://gw.internal:443"
    assert net.advertised_url("::", 8000, "fd00::2") == "http://[fd00::2]:8000"
    assert net.advertised_url("10.1.2.3", 8000) == "http://10.1.2.3:8000"
    monkeypatch.setattr(net, "interface_addresses", lambda: {"lo": "127.0.0.1", "veth0": "10.77.0.1"})
    assert net.advertised_url("0.0.0.0", 8000) == "http://10.77.0.1:8000"
    monkeypatch.setattr(net, "interface_addresses", lambda: {"lo": "127.0.0.1"})
    assert net.advertised_url("0.0.0.0", 8000) == "http://127.0.0.1:8000"  # nothing else to give


def test_this_hosts_interfaces_include_loopback() -> None:
    assert net.interface_addresses().get("lo") == "127.0.0.1"
    assert net.is_loopback("127.0.0.2") and net.is_loopback("localhost") and not net.is_loopback("0.0.0.0")
