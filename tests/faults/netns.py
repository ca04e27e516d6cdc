"""Worker hosts in network namespaces of the test's own: a bridge, veth pairs, and a switch to cut one off.

The partition rig needs hosts whose packets to PostgreSQL can be made to vanish without a trace (no reset, no
"unreachable"), as a dead switch or a silently dropping firewall does. Each host is a network namespace with one
veth leg on a bridge in the root namespace; the root namespace holds the bridge's address, where the private
PostgreSQL listens. A cut is an nftables table inside the host's namespace dropping everything to and from that
address; healing deletes the table. Only the namespace's own network is separate: the hosts share the
filesystem, so far-system ledgers in FAR_DIR are common to all, as a shared far system would be.

Everything lives in a private range that exists only inside this sandbox (10.213.N.0/24, N from the test's
process id so that a leftover from a killed run does not collide), and `teardown` removes all of it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

CUT_TABLE = "durableruns_cut"


def require_tools() -> None:
    """Fail (not skip) with what to install: CI is root and has them once `bin/setup --services` ran."""
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    assert not missing, (f"the partition rig needs {' and '.join(missing)}: `bin/setup --services` installs "
                         "iproute2 and nftables")


def sh(*command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if check:
        assert done.returncode == 0, f"{' '.join(command)}: {done.stderr.strip()}"
    return done


@dataclass(frozen=True)
class Host:
    """One worker host: a namespace with its address on the bridge."""

    namespace: str
    address: str

    def command(self, *argv: str) -> list[str]:
        """`argv` run inside this host's network namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def cut_from(self, address: str) -> None:
        """Drop, silently, every packet between this host and `address`, both ways."""
        script = (
            f"add table inet {CUT_TABLE}\n"
            f"add chain inet {CUT_TABLE} out {{ type filter hook output priority 0; policy accept; }}\n"
            f"add chain inet {CUT_TABLE} in {{ type filter hook input priority 0; policy accept; }}\n"
            f"add rule inet {CUT_TABLE} out ip daddr {address} drop\n"
            f"add rule inet {CUT_TABLE} in ip saddr {address} drop\n"
        )
        done = subprocess.run(self.command("nft", "-f", "-"), input=script, capture_output=True, text=True,
                              timeout=30)
        assert done.returncode == 0, f"nft in {self.namespace}: {done.stderr.strip()}"

    def heal(self) -> None:
        sh(*self.command("nft", "delete", "table", "inet", CUT_TABLE))

    def is_cut(self) -> bool:
        return sh(*self.command("nft", "list", "tables")).stdout.count(CUT_TABLE) > 0


@dataclass
class Network:
    """A bridge in the root namespace and the hosts attached to it."""

    bridge: str
    subnet: int  # N of 10.213.N.0/24
    hosts: list[Host] = field(default_factory=list)
    _veths: list[str] = field(default_factory=list)

    @property
    def gateway(self) -> str:
        """The bridge's own address, in the root namespace: where the private PostgreSQL listens."""
        return f"10.213.{self.subnet}.1"

    @property
    def cidr(self) -> str:
        return f"10.213.{self.subnet}.0/24"

    def add_host(self, name: str) -> Host:
        index = len(self.hosts) + 1
        host = Host(namespace=f"{self.bridge}-{name}", address=f"10.213.{self.subnet}.{10 + index}")
        outside, inside = f"{self.bridge}v{index}", f"{self.bridge}p{index}"
        sh("ip", "netns", "add", host.namespace)
        self.hosts.append(host)
        sh("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
        self._veths.append(outside)
        sh("ip", "link", "set", inside, "netns", host.namespace)
        sh("ip", "link", "set", outside, "master", self.bridge)
        sh("ip", "link", "set", outside, "up")
        sh("ip", "-n", host.namespace, "link", "set", inside, "name", "eth0")
        sh("ip", "-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
        sh("ip", "-n", host.namespace, "link", "set", "eth0", "up")
        sh("ip", "-n", host.namespace, "link", "set", "lo", "up")
        return host

    def teardown(self) -> None:
        """Remove the namespaces (their veth legs go with them), any leg left outside, and the bridge."""
        for host in self.hosts:
            sh("ip", "netns", "delete", host.namespace, check=False)
        for veth in self._veths:
            sh("ip", "link", "delete", veth, check=False)
        sh("ip", "link", "delete", self.bridge, check=False)


@contextmanager
def network(host_names: Sequence[str]) -> Iterator[Network]:
    """A bridge with one namespace per name in `host_names`, removed afterwards whatever happens."""
    require_tools()
    pid = os.getpid()
    net = Network(bridge=f"drb{pid % 100000}", subnet=20 + pid % 230)
    assert sh("ip", "-o", "addr", "show", "to", net.cidr).stdout.strip() == "", (
        f"{net.cidr} is already in use on this machine: {sh('ip', '-o', 'addr').stdout}")
    try:
        sh("ip", "link", "add", net.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{net.gateway}/24", "dev", net.bridge)
        sh("ip", "link", "set", net.bridge, "up")
        for name in host_names:
            net.add_host(name)
        yield net
    finally:
        net.teardown()
