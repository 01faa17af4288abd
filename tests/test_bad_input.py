"""Bad input never gives a traceback: exit 2, one line naming the field, nothing built.

Each case once gave exit 1 and a traceback (some only after the fabric was built). A run's
cases are checked as root too: no namespace made, no results folder, host untouched.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fabric import netns
from fabric.clean import leftovers
from topologies import files
from topologies.files import INPUT_MAX_BYTES
from topologies.spec import MAX_LINKS, MAX_NODES, SpecError

from .test_cli import ROOT, run_cli

TOPOLOGY_CASES = [
    (["rail_optimized", "--set", "servers=100000"], "servers", f"{MAX_NODES}"),
    (["rail_optimized", "--set", "servers=20000", "--set", "gpus_per_server=1"], "servers",
     f"{MAX_LINKS}"),
    (["full_mesh", "--set", "nodes=300"], "nodes", f"{MAX_LINKS}"),
    (["leaf_spine", "--set", "rate_mbps=inf"], "rate_mbps", "finite"),
    (["leaf_spine", "--set", "rate_mbps=nan"], "rate_mbps", "finite"),
    (["leaf_spine", "--set", "uplink_rate_mbps=1e9"], "uplink_rate_mbps", "maximum"),
    (["leaf_spine", "--set", f"queue_bytes={10**12}"], "queue_bytes", "maximum"),
    (["one_tier", "--set", "scale_factor=inf"], "scale_factor", "finite"),
    (["leaf_spine", "--set", "rate_mbps=1e-9"], "rate_mbps", "minimum 0.1, maximum 32000"),
    (["leaf_spine", "--set", "rate_mbps=0"], "rate_mbps", "minimum 0.1"),
    (["leaf_spine", "--set", "uplink_rate_mbps=0.05"], "uplink_rate_mbps", "minimum 0.1"),
]
HANG_TIMEOUT_S = 20     # a FIFO or a device read as input would hang: fail instead


def one_line_naming(out, field: str, words: str = "") -> bool:
    lines = out.stderr.strip().splitlines()
    return (out.returncode == 2 and len(lines) == 1 and f": {field}: " in lines[0]
            and words in lines[0] and "Traceback" not in out.stderr)


@pytest.mark.parametrize(("args", "field", "words"), TOPOLOGY_CASES)
def test_validate_refuses_what_deploy_cannot_build(args, field, words):
    out = run_cli("validate", *args)
    assert one_line_naming(out, field, words), out.stderr


def test_sizes_at_the_limit_are_accepted_without_building_the_graph_twice():
    # 181 nodes of a full mesh is 16290 links: inside the address plan
    topo = files.build("full_mesh", {"nodes": 181})
    assert topo.graph.number_of_edges() == 181 * 180 // 2 <= MAX_LINKS
    with pytest.raises(SpecError, match="links"):
        files.build("full_mesh", {"nodes": 257})   # 32896 links


def test_a_directory_is_no_topology_or_experiment_file(tmp_path):
    out = run_cli("validate", str(tmp_path))
    assert one_line_naming(out, "topology", "is a directory"), out.stderr
    out = run_cli("run", str(tmp_path), "--results", str(tmp_path / "res"))
    assert one_line_naming(out, "experiment", "is a directory"), out.stderr
    assert not (tmp_path / "res").exists()


def test_report_on_a_plain_file_or_an_incomplete_folder(tmp_path):
    plain = tmp_path / "metrics.json"
    plain.write_text("{}")
    out = run_cli("report", str(plain))
    assert one_line_naming(out, "folder", "not a results folder"), out.stderr
    out = run_cli("report", str(tmp_path))
    assert one_line_naming(out, "folder", "not a complete results folder"), out.stderr


def test_deploy_refuses_a_rate_htb_cannot_shape_before_building():
    out = run_cli("deploy", "leaf_spine", "--set", "rate_mbps=1e-9", timeout=HANG_TIMEOUT_S)
    assert one_line_naming(out, "rate_mbps", "minimum 0.1"), out.stderr


def _special_inputs(tmp_path) -> dict[str, str]:
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    big = tmp_path / "big.toml"
    big.write_text("#" * (INPUT_MAX_BYTES + 1))
    return {"fifo": str(fifo), "zero": "/dev/zero", "big": str(big)}


@pytest.mark.parametrize(("verb", "args", "field"), [
    ("deploy", ["{fifo}"], "topology"), ("deploy", ["{zero}"], "topology"),
    ("validate", ["{zero}"], "topology"), ("validate", ["{fifo}"], "topology"),
    ("validate", ["{big}"], "topology"), ("run", ["{zero}"], "experiment"),
    ("run", ["{big}"], "experiment"),
    ("run", ["--topology", "{fifo}", "--workload", "p2p"], "topology"),
])
def test_a_fifo_a_device_or_a_huge_file_is_no_input(tmp_path, verb, args, field):
    paths = _special_inputs(tmp_path)
    argv = [a.format(**paths) for a in args]
    out = run_cli(verb, *argv, "--results", str(tmp_path / "res"), timeout=HANG_TIMEOUT_S) \
        if verb == "run" else run_cli(verb, *argv, timeout=HANG_TIMEOUT_S)
    words = "larger than" if "{big}" in args else "not a regular file"
    assert one_line_naming(out, field, words), out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.toml", "fifo.toml"]


def test_an_experiment_file_that_sets_nothing_is_refused(tmp_path):
    for text in ("", "# nothing\n", "[experiment]\n"):
        empty = tmp_path / "e.toml"
        empty.write_text(text)
        out = run_cli("run", str(empty), "--results", str(tmp_path / "res"))
        assert one_line_naming(out, "experiment", "sets nothing"), out.stderr
    assert not (tmp_path / "res").exists()


RUN_CASES = [
    (["--message-bytes", str(10**15)], "experiment.message_bytes", "largest message"),
    (["--pcap", "nosuch-eth9"], "experiment.pcap", "not a port of one_tier"),
    (["--pcap", "cpu0-eth0;reboot"], "experiment.pcap", "not a port name"),
    (["--set", "rate_mbps=inf"], "rate_mbps", "finite"),
    (["--set", f"queue_bytes={10**12}"], "queue_bytes", "maximum"),
    (["--transport", "tcp"], "", "invalid choice"),
    (["--rate", "1e-9"], "experiment.rate", "minimum 0.1, maximum 32000"),
    (["--rate", "nan"], "experiment.rate", "finite"),
    (["--iterations", "100000"], "experiment.iterations", "[1, 4096]"),
    (["--workload", "allreduce", "--ranks", "1"], "experiment.ranks", "fewer than the 2"),
    (["--workload", "p2p", "--ranks", "1"], "experiment.ranks", "fewer than the 2"),
    (["--ranks", "0"], "experiment.ranks", "omit --ranks for every endpoint"),
    (["--ranks", "3"], "experiment.ranks", "only 2 endpoints"),
    (["--workload", "p2p", "--pairs", "cpu0>cpu0"], "experiment.pairs", "itself"),
    (["--pfc", "on", "--pfc-xoff", "999999999"], "experiment.pfc_xoff_bytes",
     "smallest queue of one_tier (131072 bytes per port)"),
    (["--pfc", "off", "--pfc-xoff", "131072"], "experiment.pfc_xoff_bytes",
     "smallest queue"),
    (["--pfc", "on", "--pfc-xoff", "65536", "--pfc-headroom", "70000"],
     "experiment.pfc_headroom_bytes", "XOFF 65536 + headroom 70000"),
]


def run_cli_pid(*args: str) -> tuple[subprocess.CompletedProcess, int]:
    """run_cli that also says the pid, which names a run's lab (testbed.run: run<pid>)."""
    proc = subprocess.Popen([sys.executable, "-m", "testbed", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), proc.pid


def _namespaces_of(pid: int) -> list[str]:
    return netns.named(f"run{pid}")


@pytest.mark.parametrize(("args", "field", "words"), RUN_CASES)
def test_run_refuses_bad_settings_before_building(tmp_path, args, field, words):
    out, pid = run_cli_pid("run", "--topology", "one_tier", "--set", "nodes=2",
                           "--results", str(tmp_path / "res"), *args)
    if field:
        assert one_line_naming(out, field, words), out.stderr
    else:   # argparse's own refusal: exit 2, usage and one error line naming the flag
        assert out.returncode == 2 and words in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "res").exists()
    assert _namespaces_of(pid) == []


@pytest.mark.root
def test_bad_run_input_as_root_leaves_nothing(tmp_path, host_untouched):
    toml = tmp_path / "e.toml"
    toml.write_text('[experiment]\nmessage_bytes = 1_000_000_000_000_000\n'
                    '[topology]\nkind = "one_tier"\n[topology.params]\nnodes = 2\n')
    out, pid = run_cli_pid("run", str(toml), "--results", str(tmp_path / "res"))
    assert one_line_naming(out, "experiment.message_bytes", "largest message"), out.stderr
    assert _namespaces_of(pid) == [] and leftovers(f"run{pid}") == 0
    out, pid = run_cli_pid("run", "--topology", "one_tier", "--set", "nodes=2", "--pcap",
                           "plane0-eth7", "--results", str(tmp_path / "res"))
    assert one_line_naming(out, "experiment.pcap", "not a port"), out.stderr
    assert _namespaces_of(pid) == [] and leftovers(f"run{pid}") == 0
    assert not (tmp_path / "res").exists()


def test_iterations_past_what_the_agents_hold_are_refused_before_building():
    """Within the wire's 4096 iterations, the flows the agents would build are bounded:
    128 ranks all-to-all is 32512 flows an iteration, so 30 iterations fit, 31 do not."""
    from testbed.experiment import from_toml
    from testbed.run import check_flows, pick_ranks
    from traffic.launch import MAX_RUN_FLOWS, flow_count
    from traffic.workloads import build_schedule
    exp = from_toml(None, {"workload": "alltoall", "iterations": 30, "topology": "rail128"})
    schedule = build_schedule("alltoall", pick_ranks(exp, exp.resolve_topology()),
                              exp.message_bytes, seed=1)
    assert flow_count(schedule, 1) == 128 * 127 * 2
    check_flows(exp, schedule)
    exp.iterations = 31
    with pytest.raises(SpecError, match="at most 30 iterations here") as err:
        check_flows(exp, schedule)
    assert err.value.field == "experiment.iterations" and f"{MAX_RUN_FLOWS}" in str(err.value)


@pytest.mark.parametrize(("script", "args", "field"), [
    ("transport_under_loss.py", ["--loss", "0", "--rto-ms", "-1"], "experiment.rto_ms"),
    ("pfc_hol.py", ["--window", "0"], "window_packets"),
])
def test_a_script_with_a_bad_setting_says_which_and_leaves_no_folder(tmp_path, script, args,
                                                                    field):
    out = subprocess.run([sys.executable, f"scripts/{script}", *args, "--results",
                          str(tmp_path / "res")], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2, out.stderr
    assert field in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not any((tmp_path / "res").iterdir())


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1"])
def test_nscc_target_must_be_a_positive_number_whatever_cc_is(tmp_path, value):
    out = subprocess.run([sys.executable, "scripts/topology_compare.py", "--nscc-target-us",
                          value, "--results", str(tmp_path / "res")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--nscc-target-us" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "res").exists()
