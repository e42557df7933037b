"""IPv4 helpers shared by the settings rules, the link step and the rank specs."""

from __future__ import annotations


def ip_of(address: str) -> str:
    """"192.168.100.1/24" -> "192.168.100.1"."""
    return address.split("/", 1)[0]
