"""A real client/server namespace pair joined by a veth pair, for the shaping and wire tests.

Names: ``zw-test-<pid>-<n>-c`` / ``-s`` namespaces, ``zw-t<pid><n>c`` / ``s`` veth ends (pid
shortened); addresses 198.19.250.1 (client) and 198.19.250.2 (server), /30. Always removed,
also when a test fails.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

CLIENT_ADDR = "198.19.250.1"
SERVER_ADDR = "198.19.250.2"
_counter = itertools.count()


def skip_without_net_admin() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs CAP_NET_ADMIN (root) to create network namespaces")
    if shutil.which("ip") is None:
        pytest.skip("needs the ip command (iproute2)")


@dataclass(frozen=True)
class NsPair:
    client_ns: str
    server_ns: str
    client_if: str
    server_if: str
    client_addr: str = CLIENT_ADDR
    server_addr: str = SERVER_ADDR


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextmanager
def ns_pair() -> Iterator[NsPair]:
    skip_without_net_admin()
    n = next(_counter)
    pid = os.getpid()
    short = f"{pid % 100000}{n}"[-8:]
    pair = NsPair(f"zw-test-{pid}-{n}-c", f"zw-test-{pid}-{n}-s", f"zw-t{short}c", f"zw-t{short}s")
    try:
        _ip("netns", "add", pair.client_ns)
        _ip("netns", "add", pair.server_ns)
        _ip("link", "add", pair.client_if, "netns", pair.client_ns, "type", "veth",
            "peer", "name", pair.server_if, "netns", pair.server_ns)
        for ns, ifname, addr in ((pair.client_ns, pair.client_if, CLIENT_ADDR),
                                 (pair.server_ns, pair.server_if, SERVER_ADDR)):
            _ip("-n", ns, "addr", "add", f"{addr}/30", "dev", ifname)
            _ip("-n", ns, "link", "set", ifname, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield pair
    finally:
        for ns in (pair.client_ns, pair.server_ns):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
