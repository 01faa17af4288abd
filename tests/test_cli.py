"""The `testbed` command as a user runs it: exit codes, messages, deploy/destroy, clean."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fabric import netns
from fabric.clean import leftovers

from .conftest import root_snapshot, sigint_as_in_a_terminal, wait_for

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_help_for_every_verb():
    out = run_cli("--help")
    assert out.returncode == 0
    for verb in ("deploy", "destroy", "inspect", "graph", "doctor", "clean", "validate"):
        assert verb in out.stdout
        assert run_cli(verb, "--help").returncode == 0


@pytest.mark.parametrize(("args", "field"), [
    (["validate", "rail_optimized", "--set", "servers=0"], "servers"),
    (["validate", "one_tier", "--set", "planes=-2"], "planes"),
    (["validate", "leaf_spine", "--set", "rate_mbps=0"], "rate_mbps"),
    (["validate", "no_such_kind"], "topology"),
    (["validate", "full_mesh", "--set", "wings=2"], "params.wings"),
    (["graph", "full_mesh", "--set", "nodes=1", "-o", "/tmp/aft-never.png"], "nodes"),
])
def test_bad_topology_input_exits_2_naming_the_field(args, field):
    out = run_cli(*args)
    assert out.returncode == 2
    assert f": {field}: " in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not Path("/tmp/aft-never.png").exists()


def test_bad_file_exits_2(tmp_path):
    bad = tmp_path / "t.toml"
    bad.write_text('name = "has space"\nkind = "full_mesh"\n')
    out = run_cli("validate", str(bad))
    assert out.returncode == 2 and "name: 'has space' is not a plain identifier" in out.stderr
    bad.write_text("kind = [unclosed\n")
    out = run_cli("validate", str(bad))
    assert out.returncode == 2 and "does not parse" in out.stderr


def test_validate_and_graph_without_root(tmp_path):
    out = run_cli("validate", "rail_only", "--format", "json")
    assert out.returncode == 0 and json.loads(out.stdout)["roles"]["gpu"] == 16
    png = tmp_path / "t.png"
    out = run_cli("graph", "leaf_spine", "-o", str(png))
    assert out.returncode == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.root
def test_bad_input_to_deploy_builds_nothing(default_lab_free):
    out = run_cli("deploy", "rail_only", "--set", "servers=-1")
    assert out.returncode == 2 and "servers" in out.stderr
    assert netns.ours("") == []


@pytest.mark.root
def test_deploy_inspect_destroy(default_lab_free):
    out = run_cli("deploy", "full_mesh", "--set", "nodes=3", "--check")
    assert out.returncode == 0, out.stderr
    assert "reachability: 6/6" in out.stdout and "all checks passed" in out.stdout
    try:
        assert netns.ours("") == ["aft-cpu0", "aft-cpu1", "aft-cpu2"]
        for topo in ("full_mesh", "leaf_spine"):   # the same nodes, or other ones
            again = run_cli("deploy", topo)
            assert again.returncode == 2, again.stderr
            (line,) = again.stderr.strip().splitlines()
            assert line.startswith("testbed deploy: full_mesh is already deployed "
                                   "(3 namespaces, since ")
            assert line.endswith("remove it with 'testbed destroy' first")
        assert netns.ours("") == ["aft-cpu0", "aft-cpu1", "aft-cpu2"]
        nosuch = run_cli("inspect", "--node", "nosuch")
        assert nosuch.returncode == 2 and nosuch.stderr.count("\n") == 1, nosuch.stderr
        assert "node: 'nosuch' is not a node of the deployed full_mesh" in nosuch.stderr
        data = json.loads(run_cli("inspect", "--format", "json", "--routes").stdout)
        assert [n["name"] for n in data["nodes"]] == ["cpu0", "cpu1", "cpu2"]
        port = data["nodes"][0]["ports"][0]
        assert port["state"] == "UP" and port["mtu"] == 9000 and port["rate_mbps"] == 100
        table = run_cli("inspect").stdout
        assert "aft-cpu1" in table and "198.19.0.2" in table
    finally:
        out = run_cli("destroy")
    assert out.returncode == 0 and "3 namespaces" in out.stdout
    assert run_cli("destroy").stdout.strip() == "nothing deployed"
    assert run_cli("inspect").returncode == 2


@pytest.mark.root
def test_a_name_held_by_a_namespace_not_ours_is_refused_and_left_alone(default_lab_free):
    netns_add = ["ip", "netns", "add", "aft-cpu1"]      # a user's own, with our name
    subprocess.run(netns_add, check=True)
    try:
        out = run_cli("deploy", "full_mesh", "--set", "nodes=3")
        assert out.returncode == 2, out.stderr
        assert out.stderr.strip().splitlines() == [
            "testbed deploy: the name aft-cpu1 is taken by a namespace the testbed did not "
            "create (1 such); the testbed will not remove it: rename or delete it yourself "
            "(ip netns delete aft-cpu1)"]
        assert netns.named("") == ["aft-cpu1"]        # nothing built beside it
        assert run_cli("clean").returncode == 0
        assert netns.named("") == ["aft-cpu1"]        # clean spares it, as it says
    finally:
        subprocess.run(["ip", "netns", "delete", "aft-cpu1"], check=False)


@pytest.mark.root
def test_a_rate_far_beyond_the_calibration_is_refused_unless_forced(tmp_path,
                                                                    default_lab_free):
    """A calibration of a slow machine (500 us per packet): 100 Mbit/s on an 8-rank
    all-to-all is many times what it carries, so the run is refused before anything is
    built; the calibration is this test's own file (AFT_CALIBRATION), not the machine's."""
    from testbed.rate import MODEL, agents_engine, machine_key
    cal = tmp_path / "calibration.json"
    cal.write_text(json.dumps({
        "machine": machine_key(), "model": MODEL, "t": time.time(), "engine": agents_engine(),
        "date_utc": "2026-01-01T00:00:00Z", "cost_us_per_packet": 500.0,
        "cost_us_per_hop": 0.0, "budget_pps_direct": 2000, "runs": {}}))
    argv = [sys.executable, "-m", "testbed", "run", "--topology", "leaf_spine",
            "--workload", "alltoall", "--rate", "100", "--results", str(tmp_path / "res")]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "AFT_CALIBRATION": str(cal)})
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("testbed run: experiment.rate: 100 Mbit/s is ")
    assert "--rate auto or a lower rate, or --force" in line
    assert not (tmp_path / "res").exists() and netns.named(None) == []


@pytest.mark.root
def test_mininet_cli_pings_by_node_name(default_lab_free):
    out = subprocess.run([sys.executable, "-m", "testbed", "deploy", "full_mesh", "--set",
                          "nodes=3", "--cli"], cwd=ROOT, input="cpu0 ping -c1 -W2 cpu2\nexit\n",
                         capture_output=True, text=True, timeout=120)
    try:
        assert out.returncode == 0, out.stderr
        said = out.stdout + out.stderr                  # Mininet's CLI prints via its logger
        assert "PING 198.19.0.3" in said                # node name -> its loopback
        assert "1 packets transmitted, 1 received" in said
    finally:
        run_cli("destroy")


@pytest.mark.root
def test_doctor_reports_what_is_missing():
    out = run_cli("doctor", "--format", "json")
    assert out.returncode == 0
    checks = {c["name"]: c for c in json.loads(out.stdout)["checks"]}
    assert checks["htb"]["available"] and checks["bfifo"]["available"]
    for name in ("netem", "red", "prio", "fq", "openvswitch", "nftables", "tcpdump", "tshark"):
        assert name in checks
        if not checks[name]["available"]:
            assert checks[name]["disables"]
    assert "netem" in run_cli("doctor").stdout


BUILD_AND_HANG = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from fabric.core import Fabric
    from topologies import resolve
    fab = Fabric(resolve({topo!r})).start()
    fab.popen("{node}", ["sleep", "600"])   # a process inside the fabric, as agents are
    print("ready", flush=True)
    time.sleep(600)
""")


@pytest.mark.root
def test_clean_after_kill_9_restores_the_host(default_lab_free):
    before = root_snapshot()
    code = BUILD_AND_HANG.format(root=str(ROOT), topo="leaf_spine", node="l0h0")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert len(netns.ours("")) == 8 and leftovers("") > 0   # what a crash leaves behind
    finally:
        out = run_cli("clean")
    assert out.returncode == 0
    assert "8 namespaces" in out.stdout
    assert netns.ours("") == [] and leftovers("") == 0
    assert root_snapshot() == before
    again = run_cli("clean")
    assert again.returncode == 0 and "removed 0 processes, 0 namespaces" in again.stdout


@pytest.mark.root
def test_ctrl_c_during_build_leaves_nothing(default_lab_free):
    proc = subprocess.Popen([sys.executable, "-m", "testbed", "deploy", "rail128"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_as_in_a_terminal)
    try:
        assert wait_for(lambda: len(netns.ours("")) > 10, timeout_s=30)   # mid-build
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        if proc.returncode != 130:   # it finished building: leave no fabric to later tests
            run_cli("destroy")
    assert proc.returncode == 130, err
    assert netns.ours("") == [] and leftovers("") == 0


@pytest.mark.root
def test_deploy_as_non_root_exits_2():
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                          sys.executable, "-m", "testbed", "deploy", "full_mesh"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert out.returncode == 2 and "needs root" in out.stderr, out.stderr
    assert netns.ours("") == []
