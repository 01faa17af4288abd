"""Test "servers" on one machine, that behave as machines do for the cluster code: each its
own network, mount, PID and UTS namespaces, running its own sshd (Debian's openssh-server),
joined by a veth underlay (a bridge in a namespace of its own) with addresses from
198.19.254.0/24, which the fabric's address plan never reaches. The orchestrator's ssh
runs in a namespace on the same underlay: the root namespace gets no address or route.

    aft-<lab>.orch ─┐
    aft-<lab>.srv0 ─┼─ br0 in aft-<lab>.ul (MTU 9050)
    aft-<lab>.srv1 ─┘

Each server's sshd runs under `unshare --mount --pid --uts --fork --mount-proc` with /run
a tmpfs of its own (its own /run/netns, /run/testbed, /run/sshd), its own /sys (showing
its own network namespace's interfaces), hostname srvN, and takes only the test's key, as
root.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from pyroute2 import IPRoute

from fabric import netns
from fabric.cluster import Ssh

UNDERLAY_PREFIX = "198.19.254."
ORCH_ADDRESS = UNDERLAY_PREFIX + "1"
UNDERLAY_MTU = 9050
SERVER_SCRIPT = ("hostname \"$1\" && mount -t sysfs sysfs /sys && mount -t tmpfs tmpfs /run "
                 "&& mkdir -p /run/sshd /run/netns && exec /usr/sbin/sshd -D -e -f \"$2\"")


@dataclass
class Servers:
    lab: str
    orch: str                         # the orchestrator's namespace
    addresses: list[str]
    ssh_config: Path
    procs: list[subprocess.Popen] = field(default_factory=list)

    def ssh(self, i: int) -> Ssh:
        return Ssh(self.addresses[i], str(self.ssh_config), self.orch)

    def stop(self, i: int) -> None:
        """Take server i's sshd down (its namespaces stay)."""
        proc = self.procs[i]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)


def _veth_to_bridge(ul: str, ns: str, port: str, ifname: str, address: str | None) -> None:
    """A veth from the bridge (its end `port`) to `ns` (its end `ifname`, `address`/24)."""
    fd = os.open(str(netns.RUN_DIR / ns), os.O_RDONLY)
    try:
        with netns.entered(ul):
            ipr = IPRoute()
        with ipr:
            ipr.link("add", ifname=port, kind="veth", mtu=UNDERLAY_MTU,
                     peer={"ifname": ifname, "net_ns_fd": fd, "mtu": UNDERLAY_MTU})
            ipr.link("set", index=ipr.link_lookup(ifname=port)[0],
                     master=ipr.link_lookup(ifname="br0")[0], state="up")
    finally:
        os.close(fd)
    with netns.entered(ns):
        ipr = IPRoute()
    with ipr:
        idx = ipr.link_lookup(ifname=ifname)[0]
        if address:
            ipr.addr("add", index=idx, address=address, prefixlen=24)
        ipr.link("set", index=idx, state="up")
        ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
                   check=True, capture_output=True)
    return (path.with_suffix(".pub")).read_text().strip()


def _wait_for_sshd(ssh: Ssh, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        out = ssh.run("true", timeout_s=10)
        if out.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"test server {ssh.server}: sshd not answering: {out.stderr}")
        time.sleep(0.2)


@contextlib.contextmanager
def servers_up(lab: str, count: int, folder: Path):
    """`count` servers (see the module docstring); everything removed on the way out."""
    ul, orch = netns.name_of("ul", lab), netns.name_of("orch", lab)
    names = [netns.name_of(f"srv{i}", lab) for i in range(count)]
    made: list[str] = []
    servers = Servers(lab, orch, [f"{UNDERLAY_PREFIX}{10 + i}" for i in range(count)],
                      folder / "ssh_config")
    try:
        for name in (ul, orch, *names):
            netns.create(name)
            made.append(name)
        with netns.entered(ul):
            ipr = IPRoute()
        with ipr:
            ipr.link("add", ifname="br0", kind="bridge", mtu=UNDERLAY_MTU)
            ipr.link("set", index=ipr.link_lookup(ifname="br0")[0], state="up")
        _veth_to_bridge(ul, orch, "p-orch", "ul0", ORCH_ADDRESS)
        for i, (name, addr) in enumerate(zip(names, servers.addresses, strict=True)):
            _veth_to_bridge(ul, name, f"p-srv{i}", "ul0", addr)
        client = folder / "id_test"
        (folder / "authorized_keys").write_text(_keygen(client) + "\n")
        known = []
        for i, addr in enumerate(servers.addresses):
            host_key = folder / f"host_{i}"
            known.append(f"{addr} {_keygen(host_key)}")
            (folder / f"sshd_{i}").write_text(
                f"ListenAddress {addr}\nHostKey {host_key}\n"
                f"AuthorizedKeysFile {folder / 'authorized_keys'}\n"
                "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                f"PidFile {folder / f'sshd_{i}.pid'}\nMaxSessions 100\n")
        (folder / "known_hosts").write_text("\n".join(known) + "\n")
        servers.ssh_config.write_text(
            f"Host {UNDERLAY_PREFIX}*\n  User root\n  IdentityFile {client}\n"
            f"  IdentitiesOnly yes\n  UserKnownHostsFile {folder / 'known_hosts'}\n"
            "  StrictHostKeyChecking yes\n  LogLevel ERROR\n")
        for i, name in enumerate(names):
            with netns.entered(name):
                servers.procs.append(subprocess.Popen(
                    ["unshare", "--mount", "--pid", "--uts", "--fork", "--mount-proc",
                     "sh", "-c", SERVER_SCRIPT, "sh", f"srv{i}", str(folder / f"sshd_{i}")],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=open(folder / f"sshd_{i}.log", "w"),  # noqa: SIM115
                    start_new_session=True))
        for i in range(count):
            conn = servers.ssh(i)
            try:
                _wait_for_sshd(conn)
            finally:
                conn.close()
        yield servers
    finally:
        for proc in servers.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        for name in made:
            netns.remove(name)
