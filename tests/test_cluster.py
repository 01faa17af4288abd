"""The machines a fabric is spread over (fabric.cluster, `testbed doctor --servers`), on
test servers that behave as machines do (tests/servers.py): each its own namespaces and
sshd, reached only by ssh. This proves the wiring, not capacity."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fabric import cluster, netns

from .servers import servers_up

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.root


@pytest.fixture
def servers(tmp_path, host_untouched):
    with servers_up("clt", 2, tmp_path) as got:
        yield got
    assert not netns.named("clt")


def test_each_server_is_a_machine_of_its_own_reached_by_one_ssh_connection(servers):
    hosts, pid_ns, netns_lists = [], [], []
    for i in range(2):
        ssh = servers.ssh(i)
        try:
            hosts.append(ssh.run("hostname").stdout.strip())
            pid_ns.append(ssh.run("readlink /proc/self/ns/pid").stdout.strip())
            netns_lists.append(ssh.run("ip netns list").stdout.strip())
            for _ in range(20):                      # many commands, one TCP connection
                assert ssh.run("true").returncode == 0
            conns = ssh.run("ss -Htn state established '( sport = :22 )'").stdout
            assert len(conns.strip().splitlines()) == 1, conns
        finally:
            ssh.close()
    assert hosts == ["srv0", "srv1"]
    own = os.readlink("/proc/self/ns/pid")
    assert len(set(pid_ns)) == 2 and own not in pid_ns
    # each server's /run is its own: the machine's namespaces (the servers' own
    # included) are not listed there
    assert netns_lists == ["", ""]


def test_doctor_checks_every_server_and_the_underlay_between_them(servers):
    checks = cluster.check_servers(servers.addresses, str(servers.ssh_config), servers.orch)
    by_name = {c.name: c for c in checks}
    a, b = servers.addresses
    for host, peer in ((a, b), (b, a)):
        assert by_name[f"{host}: sudo"].detail == "root"
        assert by_name[f"{host}: mininet"].available
        assert by_name[f"{host}: vxlan"].detail == "vxlan id 42"
        under = by_name[f"{host}: underlay to {peer}"]
        assert under.available and under.detail == "ul0 MTU 9050 carries 9000 B in VXLAN"
    assert all(c.available for c in checks)
    # the MTU check refuses an underlay too small for a RoCE packet in VXLAN
    ssh = servers.ssh(0)
    try:
        assert ssh.run("ip link set ul0 mtu 1500").returncode == 0
        low = {c.name: c for c in cluster.check_server(ssh, [b])}[f"{a}: underlay to {b}"]
    finally:
        ssh.close()
    assert not low.available and "MTU 1500 carries 1450 B" in low.detail
    assert "a RoCE packet needs 4206" in low.detail


def test_a_server_whose_sshd_is_down_is_one_line_and_exit_2_before_anything(servers):
    servers.stop(1)
    env = {**os.environ, "AFT_SSH_CONFIG": str(servers.ssh_config),
           "AFT_SSH_NETNS": servers.orch}
    out = subprocess.run([sys.executable, "-m", "testbed", "doctor", "--servers",
                          ",".join(servers.addresses)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stdout == "", out.stdout + out.stderr
    assert out.stderr.count("\n") == 1
    assert re.match(rf"testbed doctor: server {re.escape(servers.addresses[1])}: ssh: .*"
                    r"(refused|timed out)", out.stderr), out.stderr
    # the reachable one is fine, and says so through the same command
    ok = subprocess.run([sys.executable, "-m", "testbed", "doctor", "--servers",
                         servers.addresses[0], "--format", "json"], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert '"available": true' in ok.stdout and '"available": false' not in ok.stdout
