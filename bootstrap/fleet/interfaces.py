"""This host's network interfaces: the one that holds an address (a member registers it; the head
gives horovodrun the same name, bootstrap/head/elastic.py)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

Run = Callable[..., subprocess.CompletedProcess]


def addresses(run: Run = subprocess.run) -> list[tuple[str, str]]:
    """(interface name, IPv4 address) of this host (`ip -o -4 addr show`: one line per address,
    `2: ens5    inet 10.0.0.7/24 ...`)."""
    listing = run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True)
    found = []
    for line in listing.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "inet":
            found.append((fields[1].rstrip(":"), fields[3].split("/")[0]))
    return found


def interface_of(ip: str, run: Run = subprocess.run) -> str | None:
    """The name of this host's interface that holds `ip`, or None."""
    return next((name for name, address in addresses(run) if address == ip), None)
