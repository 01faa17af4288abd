"""The machines a fabric is spread over, reached by ssh: one multiplexed connection each,
and what each must have before anything is built (`testbed doctor --servers`).

    orchestrator ── ssh (ControlMaster: one connection per server, reused by every
    command) ──▶ server: root or passwordless sudo, python3 with mininet, kernel vxlan,
    an underlay whose MTU carries a full RoCE packet in VXLAN (fabric.vxlan)

Commands sent to a server are fixed strings of this module; a server's name is only ever
an argument of ssh or a line on a command's standard input, never part of a command
line. Which servers and how to reach them comes from ssh's own configuration
(~/.ssh/config: users, keys, ports, jump hosts), or from a file given as `ssh_config`.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fabric import netns
from fabric.doctor import Check
from fabric.vxlan import ROCE_IP_BYTES, VXLAN_OVERHEAD_BYTES, inner_mtu

CONNECT_TIMEOUT_S = 5
# What each check runs on the server (through sudo -n unless the login is root); each
# prints one line the check reads.
PROBES = {
    "sudo": "if [ \"$(id -u)\" = 0 ]; then echo root; else sudo -n true && echo sudo; fi",
    # the system's Python (python3 on PATH may be another: pyenv, /usr/local), as setup.sh
    "mininet": "for py in /usr/bin/python3 python3; do \"$py\" -c 'import mininet.net, sys; "
               "print(sys.executable, sys.version.split()[0])' 2>/dev/null && exit 0; done; "
               "echo 'no python3 imports mininet' >&2; exit 1",
    # a vxlan device in a scratch network namespace: the server's own interfaces untouched
    "vxlan": "unshare -n sh -c 'ip link add aftvx type vxlan id 42 dstport 4789 "
             "local 127.0.0.1 && ip -o -d link show aftvx' | grep -o 'vxlan id 42'",
}


class ServerError(Exception):
    """A server that cannot be reached or used: one line, exit 2."""


@dataclass
class Ssh:
    """ssh to `server` through one master connection (opened by the first command, closed
    by close()). `netns`: run the client inside that network namespace (the test servers'
    underlay is reachable only from there)."""

    server: str
    ssh_config: str | None = None
    netns: str | None = None
    _dir: tempfile.TemporaryDirectory | None = None

    def options(self) -> list[str]:
        """ssh's options for this server's master connection."""
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="aft-ssh-")
        return [*(["-F", self.ssh_config] if self.ssh_config else []),
                "-o", f"ControlPath={self._dir.name}/%C"]

    def argv(self, command: str) -> list[str]:
        return ["ssh", *self.options(), "-o", "BatchMode=yes",
                "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}", "-o", "ControlMaster=auto",
                "-o", "ControlPersist=60", "--", self.server, command]

    def _where(self):
        return netns.entered(self.netns) if self.netns else contextlib.nullcontext()

    def run(self, command: str, timeout_s: float = 60,
            stdin: str | None = None) -> subprocess.CompletedProcess:
        """`command` on the server; `stdin` its standard input (else none)."""
        with self._where():
            return subprocess.run(self.argv(command), capture_output=True, text=True,
                                  timeout=timeout_s, input=stdin,
                                  stdin=None if stdin is not None else subprocess.DEVNULL)

    def popen(self, command: str, **kwargs) -> subprocess.Popen:
        """`command` on the server, running on: pipes as `kwargs` ask (Popen's)."""
        with self._where():
            return subprocess.Popen(self.argv(command), **kwargs)

    def hostname(self) -> str:
        """The host ssh reaches for this server (`ssh -G`: its HostName, else the name)."""
        out = subprocess.run(["ssh", *self.options(), "-G", "--", self.server],
                             capture_output=True, text=True, timeout=10,
                             stdin=subprocess.DEVNULL)
        for line in out.stdout.splitlines():
            key, _, value = line.partition(" ")
            if key == "hostname":
                return value.strip()
        return self.server

    def close(self) -> None:
        if self._dir is None:
            return
        with contextlib.suppress(subprocess.SubprocessError, OSError), self._where():
            subprocess.run(["ssh", *self.options(), "-O", "exit", "--", self.server],
                           capture_output=True, timeout=10, stdin=subprocess.DEVNULL)
        self._dir.cleanup()
        self._dir = None


def reach(ssh: Ssh) -> None:
    """ServerError (one line) unless the server answers over ssh."""
    try:
        out = ssh.run("true", timeout_s=CONNECT_TIMEOUT_S + 10)
    except subprocess.TimeoutExpired:
        raise ServerError(f"server {ssh.server}: ssh did not answer in "
                          f"{CONNECT_TIMEOUT_S + 10} s") from None
    if out.returncode != 0:
        why = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
        raise ServerError(f"server {ssh.server}: ssh: {why}")


# the peer's name comes on stdin, never inside the command line
MTU_PROBE = ("read -r peer; addr=$(getent ahostsv4 \"$peer\" | head -1 | cut -d' ' -f1); "
             "dev=$(ip -o route get \"$addr\" | sed -n 's/.* dev \\([^ ]*\\).*/\\1/p' "
             "| head -1); echo \"$dev $(ip -o link show dev \"$dev\" "
             "| sed -n 's/.* mtu \\([0-9]*\\).*/\\1/p')\"")


def underlay_mtu(ssh: Ssh, peer: str) -> tuple[str, int]:
    """The interface and MTU of the server's route toward `peer` (an address or name)."""
    out = ssh.run(MTU_PROBE, stdin=peer + "\n")
    parts = out.stdout.split()
    if out.returncode != 0 or len(parts) != 2 or not parts[1].isdigit():
        raise ServerError(f"server {ssh.server}: no route toward {peer} "
                          f"({out.stderr.strip() or out.stdout.strip() or 'nothing printed'})")
    return parts[0], int(parts[1])


def check_server(ssh: Ssh, peers: list[str]) -> list[Check]:
    """What `ssh.server` has, as the doctor's checks (reach() first)."""
    checks = []
    for name, disables in (("sudo", "building its namespaces (root or passwordless sudo)"),
                           ("mininet", "its nodes (apt install mininet python3)"),
                           ("vxlan", "its cut links (a kernel with vxlan)")):
        out = ssh.run(PROBES[name])
        line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
        ok = out.returncode == 0 and bool(line)
        detail = line if ok else (out.stderr.strip().splitlines() or ["failed"])[-1]
        checks.append(Check(f"{ssh.server}: {name}", ok, detail[:120], disables))
    for peer in peers:
        try:
            dev, mtu = underlay_mtu(ssh, peer)
        except ServerError as exc:
            checks.append(Check(f"{ssh.server}: underlay to {peer}", False, str(exc),
                                "VXLAN links to that server"))
            continue
        fits = inner_mtu(mtu) >= ROCE_IP_BYTES
        checks.append(Check(
            f"{ssh.server}: underlay to {peer}", fits,
            f"{dev} MTU {mtu} carries {inner_mtu(mtu)} B in VXLAN" + ("" if fits else
            f"; a RoCE packet needs {ROCE_IP_BYTES + VXLAN_OVERHEAD_BYTES}"),
            "VXLAN links to that server (raise the underlay's MTU)"))
    return checks


def check_servers(servers: list[str], ssh_config: str | None = None,
                  via_netns: str | None = None) -> list[Check]:
    """Every server reached first (ServerError on the first that is not: nothing has been
    built, nothing is left), then each one's checks against the others."""
    conns = [Ssh(s, ssh_config, via_netns) for s in servers]
    try:
        for c in conns:
            reach(c)
        return [chk for c in conns
                for chk in check_server(c, [s for s in servers if s != c.server])]
    finally:
        for c in conns:
            c.close()


def ssh_config_from_env() -> str | None:
    """AFT_SSH_CONFIG: an ssh_config file for the servers (else ssh's own)."""
    path = os.environ.get("AFT_SSH_CONFIG")
    if path and not Path(path).is_file():
        raise ServerError(f"AFT_SSH_CONFIG: no file {path}")
    return path or None
