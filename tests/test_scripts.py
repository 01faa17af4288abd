"""Smoke test of every script in scripts/ at a reduced size."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fabric import netns
from testbed import kernel_split
from testbed.fidelity import CPU_DEGRADED_PERCENT, VERDICTS
from traffic.launch import process_count

ROOT = Path(__file__).resolve().parent.parent


def assert_tables(summary: str) -> None:
    """Every markdown table of a summary has as many cells in each row as in its header:
    a cell past the header's (a run's verdict appended to its row) is not rendered."""
    table: list[str] = []
    for line in summary.splitlines() + [""]:
        if line.startswith("|"):
            table.append(line)
            continue
        for row in table[1:]:
            assert row.count("|") == table[0].count("|"), (table[0], row)
        table = []


def assert_png(path: Path) -> None:
    """A real, non-trivial PNG (a blank figure is a few kB)."""
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000, path


@pytest.mark.root
def test_bench_fabric_smoke(tmp_path, host_untouched):
    out_json = tmp_path / "bench.json"
    out_json.write_text(json.dumps({"some_other_metric": 1.5}))
    out = subprocess.run([sys.executable, "scripts/bench_fabric.py", "--topology", "leaf_spine",
                          "--rounds", "1", "--out", str(out_json)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    data = json.loads(out_json.read_text())
    assert data["some_other_metric"] == 1.5                 # merged, not overwritten
    assert data["fabric_build_vs_mininet"] > 0
    assert data["teardown_leftovers"] == 0
    assert "fabric_build_vs_mininet" in out.stdout
    assert netns.ours("") == []


@pytest.mark.root
def test_bench_allreduce_smoke(tmp_path, host_untouched):
    out_json = tmp_path / "bench.json"
    out = subprocess.run([sys.executable, "scripts/bench_allreduce.py", "--ranks", "4",
                          "--message-bytes", str(256 * 1024), "--iterations", "1",
                          "--out", str(out_json)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    data = json.loads(out_json.read_text())
    assert data["allreduce4_jct_over_ideal"] > 0.5          # measured, not ideal by fiat
    assert 0 < data["allreduce4_busbw_over_link"] < 1.5
    assert data["allreduce4_link_mbps"] == 100.0
    # one iteration: busbw / B = (factor * S / JCT) / B and JCT / ideal = JCT / (factor * S / B)
    assert data["allreduce4_busbw_over_link"] == pytest.approx(
        1 / data["allreduce4_jct_over_ideal"], rel=1e-3)
    assert data["allreduce4_fidelity"] in VERDICTS
    if data["allreduce4_cpu_mean_percent"] >= CPU_DEGRADED_PERCENT:
        assert data["allreduce4_fidelity"] != "faithful"      # a saturated machine
    # the table's row is the record's figures
    (row,) = [line.split() for line in out.stdout.splitlines() if line.split()[:1] == ["4"]]
    assert "JCT/ideal" in out.stdout and row[-1] == data["allreduce4_fidelity"]
    assert float(row[3]) == pytest.approx(data["allreduce4_jct_over_ideal"], abs=6e-4)
    assert float(row[4]) == pytest.approx(data["allreduce4_busbw_over_link"], abs=6e-4)
    assert float(row[5]) == pytest.approx(data["allreduce4_cpu_mean_percent"], abs=0.06)


@pytest.mark.root
def test_bench_dcqcn_smoke(tmp_path, host_untouched):
    out = subprocess.run([sys.executable, "scripts/bench_dcqcn.py", "--message-bytes",
                          "1000000", "--out", str(tmp_path / "bench.json")], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads((tmp_path / "bench.json").read_text())
    for name in ("dcqcn", "nocc"):
        assert 0 < got[f"{name}_incast_jain"] <= 1
        # 8 senders into one port: a queue builds there, unless the agents could not send
        # at their links' rate, which the verdict says
        fidelity = got[f"{name}_incast_fidelity"]
        assert got[f"{name}_incast_queue_over_kmax"] > 0 or fidelity != "faithful"
        assert set(fidelity.split(", ")) <= set(VERDICTS)
    assert "calibration" in json.dumps(got) and "queue / kmax" in out.stdout
    # the senders were cut (8 at line rate into one port): their rates' share of the link
    assert 0 < got["dcqcn_incast_cc_share"] <= 1
    assert "alone that predicts JCT/ideal" in out.stdout
    # beside it, the paper's parameters at the paper's own rate for the same bytes
    assert got["dcqcn_incast_model_jct_over_ideal"] > 1
    assert got["dcqcn_incast_jct_over_model"] > 0
    assert "the paper's parameters at the paper's 40 Gb/s" in out.stdout


@pytest.mark.root
def test_bench_permutation_smoke(tmp_path, host_untouched):
    out = subprocess.run([sys.executable, "scripts/bench_permutation.py", "--seeds", "1",
                          "--leaves", "2", "--spines", "2", "--hosts-per-leaf", "2",
                          "--message-bytes", "300000", "--out", str(tmp_path / "bench.json")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads((tmp_path / "bench.json").read_text())
    for mode in ("pfc", "deep", "spray"):
        assert got[f"permutation_{mode}_jct_over_model"] > 0
        assert set(got[f"permutation_{mode}_fidelity"].split(", ")) <= set(VERDICTS)
    assert got["permutation_last_flow_unexplained_fraction"] >= 0
    # the slow share comes from flows.csv (times to the microsecond), the largest from the
    # unrounded split: the two agree to the CSV's rounding
    assert (got["permutation_unexplained_fraction"]
            >= got["permutation_slow_unexplained_fraction"] - 1e-3)
    assert got["permutation_unexplained_fraction"] >= 0
    assert "collision model" in out.stdout and "calibration" in json.dumps(got)
    # every run was at the rate --rate auto picked: each verdict counts toward the share
    auto = got["rate_auto_verdicts"]["bench_permutation"]
    assert len(auto) == 3 and set(auto) <= set(VERDICTS)
    assert got["rate_auto_faithful_fraction"] == round(auto.count("faithful") / 3, 3)


@pytest.mark.root
def test_bench_dlb_smoke(tmp_path, host_untouched):
    out = subprocess.run([sys.executable, "scripts/bench_dlb.py", "--seeds", "1",
                          "--message-bytes", "300000", "--out", str(tmp_path / "bench.json")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads((tmp_path / "bench.json").read_text())
    for mode in ("dlb", "ecmp"):
        assert got[f"{mode}_uplink_max_over_mean"] >= 1.0
        assert got[f"{mode}_jct_over_ideal"] > 0 and got[f"{mode}_fidelity"]
    assert "uplink max/mean" in out.stdout


@pytest.mark.root
def test_bench_rail128_smoke(tmp_path, host_untouched):
    """The script on a small rail-optimized fabric (the same builder), at the rate a
    calibration file picks (written here: no calibration run)."""
    from testbed import rate
    topo = tmp_path / "rail8.toml"
    topo.write_text('name = "rail8"\nkind = "rail_optimized"\nscale_factor = 4000\n'
                    "[params]\nservers = 2\ngpus_per_server = 4\nspines = 1\n"
                    "rate_mbps = 100\n")
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"machine": rate.machine_key(), "model": rate.MODEL,
                               "engine": rate.agents_engine(),
                               "t": time.time(), "date_utc": "now",
                               "cost_us_per_packet": 10.0, "cost_us_per_hop": 2.0,
                               "budget_pps_direct": 100000, "runs": {}}))
    out_json = tmp_path / "bench.json"
    out = subprocess.run([sys.executable, "scripts/bench_rail128.py", "--topology", str(topo),
                          "--message-bytes", str(256 * 1024), "--out", str(out_json)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "AFT_CALIBRATION": str(cal)})
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out_json.read_text())
    assert got["rail128_allreduce_rate_mbps"] in rate.RATE_LADDER_MBPS
    assert "calibration run" not in out.stdout + out.stderr      # the file's, not a new one
    assert got["rail128_allreduce_rate_mbps"] <= got["rail128_allreduce_predicted_max_mbps"]
    assert got["rail128_allreduce_jct_over_ideal"] > 0.5 and got["rail128_allreduce_ranks"] == 8
    assert got["rail128_allreduce_fidelity"] in out.stdout and "rate chosen" in out.stdout
    # NCCL's rail-aligned ring: the hop between the two servers is one leaf (s0g3 -> s1g3),
    # so physics' floor pays one frame of store-and-forward a step
    assert got["rail128_allreduce_ring_order"] == "rails" and "ring order rails" in out.stdout
    assert got["rail128_allreduce_floor_over_ideal"] > 1.0 and "physics: floor" in out.stdout
    assert got["rail128_allreduce_jct_over_floor"] == pytest.approx(
        got["rail128_allreduce_jct_over_ideal"] / got["rail128_allreduce_floor_over_ideal"],
        abs=0.001)


@pytest.mark.root
def test_bench_scale_smoke(tmp_path, host_untouched):
    # 3 x 0.5 s of all-reduce: long enough for the CPU sampler to measure its CPU
    out = subprocess.run([sys.executable, "scripts/bench_scale.py", "--ranks", "4",
                          "--message-bytes", "4194304", "--iterations", "3", "--out",
                          str(tmp_path / "bench.json")], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads((tmp_path / "bench.json").read_text())
    assert got["allreduce_max_faithful_ranks_100mbps"] in (0, 4)
    assert got["allreduce_max_faithful_ranks_100mbps_before"] in (0, 4)
    assert got["cpu_us_per_packet"] > 0 and got["cpu_us_per_packet_ranks"] == 4
    assert got["cpu_us_per_packet_before"] > 0 and got["cpu_us_per_packet_engine"] == "compiled"
    assert got["cpu_us_per_packet_over_before"] == pytest.approx(
        got["cpu_us_per_packet"] / got["cpu_us_per_packet_before"], abs=0.002)
    assert got["allreduce4_scale_fidelity"] and got["allreduce4_scale_fidelity_before"]
    assert "CPU per delivered packet" in out.stdout and " interpreted " in out.stdout
    assert "goal: the compiled engine's faithful ranks" in out.stdout
    # physics' floor is above the ideal: JCT over it is below JCT over the ideal
    assert 0 < got["allreduce4_scale_jct_over_floor"] < got["allreduce4_scale_jct_over_ideal"]
    assert "floor/ideal" in out.stdout
    # the shaped ports' timers, measured in the kernel (a share of their busy time)
    assert 0 <= got["allreduce4_scale_timers_lost"] < 1 and "timers lost" in out.stdout
    # each engine's busiest agent process, a share of its core
    assert 0 < got["allreduce4_scale_process_busy"] <= 1.05 and "proc busy" in out.stdout
    assert 0 < got["allreduce4_scale_process_busy_before"] <= 1.05
    cal = got["allreduce4_scale_calibrated_max_mbps"]          # None: nothing calibrated
    assert (cal is None) == ("calibration" in got) and (cal is None or cal > 0)


@pytest.mark.root
@pytest.mark.skipif(shutil.which("perf") is None, reason="needs perf")
def test_profile_packet_smoke(tmp_path, host_untouched):
    # 0.75 s of all-reduce: perf samples each core every ~1 ms, and a 60 ms workload
    # (256 KiB x 2) held no sample of the compiled agents' user time in one run
    out_json = tmp_path / "profile.json"
    mounts = Path("/proc/self/mounts").read_text()
    out = subprocess.run([sys.executable, "scripts/profile_packet.py", "--ranks", "4",
                          "--message-bytes", "2097152", "--iterations", "3", "--cprofile",
                          "--results-dir", str(tmp_path), "--out", str(out_json)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out_json.read_text())
    for key in ("parts_us_per_packet", "total_us_per_packet", "packets", "hops_per_packet",
                "kernel_us_per_packet_hop", "wakeups_per_packet", "window_s", "proc",
                "perf", "machine", "cprofile", "fidelity"):
        assert key in got, key
    parts = got["parts_us_per_packet"]
    assert set(parts) == {"agents_user", "agents_sys", "kernel_softirq_irq",
                          "pfc_controller", "run_process", "profiler", "rest"}
    assert all(v >= 0 for v in parts.values()), parts
    assert got["total_us_per_packet"] > 0
    assert sum(parts.values()) == pytest.approx(got["total_us_per_packet"], rel=0.03)
    assert parts["agents_user"] > 0 and parts["kernel_softirq_irq"] > 0
    assert got["packets"] > 0 and got["hops_per_packet"] == 2.0      # host-switch-host
    assert got["wakeups_per_packet"] > 0
    assert got["proc"]["agent_processes_seen"] == process_count(None, 4)
    assert got["cprofile"] and got["cprofile"][0]["cumtime_s"] > 0
    assert "us/packet" in out.stdout and "calibration" in out.stdout
    # the kernel's share named: the parts add up to the agents' syscalls and softirq
    named = got["kernel_parts_us_per_packet"]
    assert set(named) == set(kernel_split.PARTS) and all(v >= 0 for v in named.values())
    assert sum(named.values()) == pytest.approx(got["kernel_us_per_packet"], rel=0.02,
                                                abs=0.02)
    assert got["kernel_us_per_packet"] == pytest.approx(
        parts["agents_sys"] + parts["kernel_softirq_irq"], abs=0.01)
    assert named["qdisc"] > 0 and named["forwarding"] > 0      # shaped ports, one switch
    assert got["events_per_packet"]["syscalls"] > 0 and got["experiment"]["layout"] == "shaped"
    assert got["qdisc_watchdog_firings_per_packet"] >= 0
    assert "named (testbed.kernel_split)" in out.stdout
    # perf's tracepoints mount tracefs where none is: never on this machine's mounts
    assert Path("/proc/self/mounts").read_text() == mounts


@pytest.mark.root
@pytest.mark.skipif(shutil.which("perf") is None, reason="needs perf")
def test_profile_packet_plain_layout(tmp_path, host_untouched):
    """--layout plain: no qdisc on any port (the kernel's floor), so none of the
    kernel's share is the qdiscs'; with --pfc it is refused before anything is built."""
    out_json = tmp_path / "profile.json"
    out = subprocess.run([sys.executable, "scripts/profile_packet.py", "--ranks", "4",
                          "--message-bytes", "2097152", "--iterations", "3", "--layout",
                          "plain", "--results-dir", str(tmp_path), "--out", str(out_json)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out_json.read_text())
    assert got["experiment"]["layout"] == "plain" and got["packets"] > 0
    assert got["kernel_parts_us_per_packet"]["qdisc"] == 0.0
    assert got["qdisc_watchdog_firings_per_packet"] == 0.0
    assert got["kernel_parts_us_per_packet"]["forwarding"] > 0
    bad = subprocess.run([sys.executable, "scripts/profile_packet.py", "--layout", "plain",
                          "--pfc", "--results-dir", str(tmp_path / "none")], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--pfc needs the shaped layout" in bad.stderr
    assert not (tmp_path / "none").exists()


def test_bench_scale_cpu_needs_a_long_enough_workload():
    """/proc/stat counts in ticks, read every 0.25 s: a 32 ms workload's CPU is not
    measured (it read 0.0 % on one run, 8 % on the next), a 1.5 s one is."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_scale import run_cpu_s
    cpu = {"work_mean_percent": 40.0, "cores": 2, "period_s": 0.25}
    assert run_cpu_s({"workload_window_s": [0.79, 0.82], "cpu": cpu}) is None
    assert run_cpu_s({"workload_window_s": [1.0, 1.45], "cpu": cpu}) is None
    assert run_cpu_s({"workload_window_s": None, "cpu": cpu}) is None
    assert run_cpu_s({"workload_window_s": [1.0, 1.6], "cpu": cpu}) == pytest.approx(0.48)
    assert run_cpu_s({"workload_window_s": [1.0, 2.5], "cpu": cpu}) == pytest.approx(1.2)


def test_bench_scale_judges_a_size_against_its_own_floor():
    """A size counts when faithful and within 1.05x of physics' floor for that size: 48
    ranks at 1.14x ideal is a perfect run when the floor itself is 1.11x ideal."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_scale import FAITHFUL_JCT_OVER_FLOOR, largest_faithful
    assert FAITHFUL_JCT_OVER_FLOOR == 1.05
    rows = {16: {"fidelity": "faithful", "jct_over_ideal": 1.08, "jct_over_floor": 1.03},
            48: {"fidelity": "faithful", "jct_over_ideal": 1.14, "jct_over_floor": 1.027}}
    assert largest_faithful(rows) == 48
    rows[48]["fidelity"] = "degraded"
    assert largest_faithful(rows) == 16
    rows[16]["jct_over_floor"] = 1.06
    assert largest_faithful(rows) == 0


def test_bench_report_tables_bench_json_into_the_page(tmp_path):
    """The page keeps everything outside its markers; the table has every figure once,
    under the calibration; a page without markers or an unreadable file is refused."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_report import BEGIN, END, main
    bench, page = tmp_path / "bench.json", tmp_path / "page.md"
    bench.write_text(json.dumps({"calibration_budget_pps_direct": 99123,
                                 "calibration_utc": "2026-12-04T19:54:07Z",
                                 "sender_pps_vs_scapy": 150.25, "dlb_fidelity": "faithful",
                                 "cpu_us_per_packet": None}))
    page.write_text(f"# Benchmarks\n\nintro\n\n{BEGIN}\nold table\n{END}\n\nafter\n")
    assert main(["--bench", str(bench), "--page", str(page)]) == 0
    text = page.read_text()
    assert text.startswith("# Benchmarks\n\nintro\n\n") and text.endswith(f"{END}\n\nafter\n")
    assert "old table" not in text and text.count(BEGIN) == 1
    assert "calibration_budget_pps_direct 99123" in text.split("| figure")[0]
    assert "| `sender_pps_vs_scapy` | 150.2 |" in text and "| `dlb_fidelity` | faithful |" in text
    assert "| `cpu_us_per_packet` | n/a |" in text and "| `calibration_utc`" not in text
    page.write_text("no markers\n")
    assert main(["--bench", str(bench), "--page", str(page)]) == 2
    assert page.read_text() == "no markers\n"
    assert main(["--bench", str(tmp_path / "none.json"), "--page", str(page)]) == 2


def test_rate_auto_verdicts_merge_across_benchmarks(tmp_path):
    """Each benchmark's runs at the rate --rate auto picked replace its own earlier list
    and keep the others'; the faithful share counts every run listed."""
    from testbed.benchmarks import rate_auto, update_bench_json
    out = tmp_path / "bench.json"
    update_bench_json(out, {"x": 1, **rate_auto("bench_train", ["faithful", "degraded"])})
    update_bench_json(out, rate_auto("bench_cluster", ["faithful"] * 4 + ["unfaithful"]))
    got = json.loads(out.read_text())
    assert got["rate_auto_runs"] == 7 and got["rate_auto_faithful_fraction"] == 0.714
    update_bench_json(out, rate_auto("bench_train", ["faithful"] * 2))
    got = json.loads(out.read_text())
    assert got["rate_auto_verdicts"] == {"bench_train": ["faithful"] * 2,
                                         "bench_cluster": ["faithful"] * 4 + ["unfaithful"]}
    assert got["rate_auto_runs"] == 7 and got["rate_auto_faithful_fraction"] == 0.857
    update_bench_json(out, {"y": 2})                                  # nothing auto: kept
    assert json.loads(out.read_text())["rate_auto_faithful_fraction"] == 0.857


def test_bench_floor_arithmetic():
    """The goal is a third of the kernel's median share; the kernel's share at 32 ranks of
    100 Mbit/s (3,009 frames/s each, 4,154-byte frames) on 2 cores."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_floor import floor_verdict
    v = floor_verdict([30.0, 33.0], [6.0, 8.0, 7.0], [20.0, 22.0, 24.0], 32, 100.0, 2)
    assert v["cpu_us_per_packet_agents"] == 7.0 and v["cpu_us_per_packet_agents_max"] == 8.0
    assert v["cpu_us_per_packet_agents_before"] == 31.5
    assert v["cpu_floor_kernel_us_per_packet"] == 22.0
    assert v["cpu_us_per_packet_agents_goal"] == pytest.approx(22.0 / 3, abs=0.01)
    assert v["cpu_us_per_packet_agents_goal_met"] == 1                   # 7 <= 7.33
    assert v["cpu_floor_kernel_load_goal_ranks"] == pytest.approx(
        32 * 100e6 / (4154 * 8) * 22.0 / 2e6, abs=1e-3)
    assert v["cpu_floor_max_ranks_kernel_only"] == int(2e6 / (100e6 / (4154 * 8) * 22.0))
    assert v["cpu_floor_agents_budget_us"] == pytest.approx(
        2e6 / (32 * 100e6 / (4154 * 8)) - 22.0, abs=0.01)            # 20.77 - 22
    assert floor_verdict([30.0], [8.0], [21.0], 32, 100.0, 2)[
        "cpu_us_per_packet_agents_goal_met"] == 0                        # 8 > 7


@pytest.mark.root
@pytest.mark.skipif(shutil.which("perf") is None, reason="needs perf")
def test_bench_floor_smoke(tmp_path, host_untouched):
    out_json = tmp_path / "bench.json"
    out = subprocess.run([sys.executable, "scripts/bench_floor.py", "--ranks", "4",
                          "--message-bytes", "1048576", "--iterations", "2", "--rounds", "1",
                          "--out", str(out_json)], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out_json.read_text())
    assert got["cpu_floor_ranks"] == 4 and len(got["cpu_floor_fidelity"]) == 3
    assert [v.split(":")[0] for v in got["cpu_floor_fidelity"]] == [
        "interpreted/shaped", "compiled/shaped", "compiled/plain"]
    assert got["cpu_floor_fidelity"][2] == "compiled/plain:unfaithful"   # nothing emulated
    plain = got["cpu_floor_kernel_us_per_packet_plain"]
    assert plain > 0 and got["kernel_share_over_plain_forwarding"] == pytest.approx(
        got["cpu_floor_kernel_us_per_packet"] / plain, abs=0.01)
    assert got["kernel_share_over_plain_forwarding_goal_met"] == int(
        got["kernel_share_over_plain_forwarding"] <= 1.5)
    assert got["cpu_floor_kernel_parts_us_plain"]["qdisc"] == 0.0
    assert got["cpu_floor_kernel_parts_us"]["qdisc"] > 0
    assert "the kernel's share over its floor" in out.stdout
    assert 0 < got["cpu_floor_kernel_us_per_packet"] <= got["cpu_floor_compiled_total_us"]
    assert 0 < got["cpu_us_per_packet_agents"] <= got["cpu_floor_compiled_total_us"]
    assert 0 < got["cpu_us_per_packet_agents_before"] <= got["cpu_floor_interpreted_total_us"]
    assert got["cpu_us_per_packet_agents_goal"] == pytest.approx(
        got["cpu_floor_kernel_us_per_packet"] / 3, abs=0.01)
    assert got["cpu_us_per_packet_agents_goal_met"] == int(
        got["cpu_us_per_packet_agents"] <= got["cpu_us_per_packet_agents_goal"])
    assert got["cpu_floor_max_ranks_kernel_only"] >= 1
    assert "kernel share alone at 32 ranks" in out.stdout and "calibration" in out.stdout
    assert "the agents' own CPU at 32 ranks" in out.stdout
    assert "goal: a third of the kernel's share" in out.stdout
    bad = subprocess.run([sys.executable, "scripts/bench_floor.py", "--rounds", "0",
                          "--out", str(tmp_path / "none.json")], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--rounds" in bad.stderr
    assert not (tmp_path / "none.json").exists()


@pytest.mark.root
def test_bench_moderation_smoke(tmp_path, host_untouched):
    out_json = tmp_path / "bench.json"
    out = subprocess.run([sys.executable, "scripts/bench_moderation.py", "--rounds", "1",
                          "--bytes", "1000000", "--out", str(out_json)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    data = json.loads(out_json.read_text())
    assert data["moderation_transfer_ratio"] > 0            # measured, either way
    assert 0 < data["moderation_wakeups_per_packet"] < 0.5   # batched: ~1 per 3 frames
    assert "moderation_transfer_ratio" in out.stdout
    assert netns.ours() == [] or all(not n.startswith("aft-bmod") for n in netns.ours())


@pytest.mark.root
def test_ecmp_vs_spray_smoke(tmp_path, host_untouched):
    out = subprocess.run([sys.executable, "scripts/ecmp_vs_spray.py", "--rate", "100",
                          "--server-count", "2",
                          "--gpus", "2", "--spines", "2", "--message-bytes", str(512 * 1024),
                          "--iterations", "1", "--results", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "deprecated" not in out.stderr
    (folder,) = tmp_path.glob("ecmp_vs_spray-*")
    for name in ("spine_load_heatmap.png", "jct_per_mode.png", "latency_cdf.png"):
        assert_png(folder / "plots" / name)
    numbers = json.loads((folder / "metrics.json").read_text())
    summary = (folder / "summary.md").read_text()
    assert_tables(summary)
    for mode in ("ecmp", "flowlet", "spray"):      # the summary's numbers are the metrics'
        assert f"| {mode} | {numbers[mode]['elephants_jct_s']:.3f} |" in summary
    assert numbers["spray"]["uplink_max_over_mean"] < 1.25    # spraying evens spine load
    # deep queues hold every colliding window: ECMP and spraying lose nothing, so the
    # comparison is load balancing alone; the shallow row shows the loss collapse apart
    assert numbers["ecmp"]["drops"] == 0 and numbers["spray"]["drops"] == 0
    assert "ecmp, shallow" in numbers and "Loss collapse" in summary
    assert "## Expected vs measured" in summary and len(numbers["expected"]) == 7
    ecmp = next(e for e in numbers["expected"] if e["what"] == "elephants, ecmp")
    assert ecmp["low"] == ecmp["high"] > 0 and ecmp["verdict"] in summary
    assert len(list(folder.glob("*-*/metrics.json"))) == 7
    assert netns.ours() == [] or all(not n.startswith("aft-run") for n in netns.ours())


@pytest.mark.root
def test_scale_sweep_smoke(tmp_path, host_untouched):
    out = subprocess.run([sys.executable, "scripts/scale_sweep.py", "--ranks", "2", "4",
                          "--message-bytes", str(256 * 1024), "--iterations", "1",
                          "--results", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    (folder,) = tmp_path.glob("scale_sweep-*")
    assert_png(folder / "plots" / "fidelity_vs_ranks.png")
    data = json.loads((folder / "metrics.json").read_text())
    rows = data["runs"]
    assert [(r["ranks"], r["layout"]) for r in rows] == [
        (2, "per-rank"), (2, "per-core"), (4, "per-rank"), (4, "per-core")]   # side by side
    summary = (folder / "summary.md").read_text()
    assert_tables(summary)
    assert "- per-rank: " in summary and "- per-core: " in summary
    for r, e in zip(rows, data["expected"], strict=True):
        assert (f"| {r['ranks']} | {r['layout']} | {r['jct_s']:.3f} | {r['ideal_s']:.3f} |"
                in summary)
        assert r["jct_over_ideal"] > 0.5 and 0 <= r["cpu_mean_percent"] <= 100
        assert (e["low"], e["measured"]) == (r["ideal_s"], r["jct_s"])
        assert e["verdict"] in summary


@pytest.mark.root
def test_topology_compare_smoke(tmp_path, host_untouched):
    """With the flags' old spellings (--rate-mbps, --servers N): they still work, and each
    says once which name to use."""
    out = subprocess.run([sys.executable, "scripts/topology_compare.py", "--rate-mbps", "100",
                          "--servers", "2",
                          "--gpus", "2", "--message-bytes", str(128 * 1024), "--iterations",
                          "1", "--results", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    warned = [line for line in out.stderr.splitlines() if "deprecated" in line]
    assert warned == ["topology_compare.py: --rate-mbps is deprecated, use --rate",
                      "topology_compare.py: --servers is deprecated, use --server-count"]
    (folder,) = tmp_path.glob("topology_compare-*")
    assert_png(folder / "plots" / "jct_per_topology.png")
    m = json.loads((folder / "metrics.json").read_text())
    summary = (folder / "summary.md").read_text()
    assert_tables(summary)
    assert f"{m['rail_only_alltoall_overhead_percent']:+.1f}%" in summary
    assert "8.2" in summary and "11.2" in summary            # beside the published range
    over = next(e for e in m["expected"] if e["what"] == "rail-only all-to-all overhead")
    assert (over["low"], over["high"]) == (8.2, 11.2) and over["verdict"] in summary
    assert len(m["expected"]) == 3 + len(m["cost"])          # + one all-reduce per fabric
    # rail-only has no spines: fewer switches, less network cost and power
    assert m["cost"]["rail_only"]["cost_usd"] < m["cost"]["rail_optimized"]["cost_usd"]
    assert m["cost"]["rail_only"]["power_w"] < m["cost"]["rail_optimized"]["power_w"]
    assert "spine" not in m["cost"]["rail_only"]["switches"]
    assert f"on the emulated 4-endpoint fabric, {m['rail_only_cost_cut_percent']:.0f}% less " \
        "cost" in summary
    # the published cost/power cuts are compared at a real size, computed from its specs
    assert (m["at_scale"]["gpus"], m["at_scale"]["radix"]) == (1024, 128)
    cut = next(e for e in m["expected"] if e["what"].startswith("rail-only network cost cut"))
    assert (cut["low"], cut["high"]) == (38, 77) and "1024 GPUs" in cut["what"]
    assert cut["measured"] == m["rail_only_cost_cut_percent_at_scale"]
    assert "modelled from published per-link power" in summary
    assert len(m["runs"]) == 8


@pytest.mark.root
def test_transport_under_loss_smoke(tmp_path, host_untouched):
    out = subprocess.run([sys.executable, "scripts/transport_under_loss.py", "--loss", "0",
                          "0.02", "--hosts", "1", "--message-bytes", str(512 * 1024),
                          "--results", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    (folder,) = tmp_path.glob("transport_under_loss-*")
    assert_png(folder / "plots" / "goodput_jct_vs_loss.png")
    data = json.loads((folder / "metrics.json").read_text())
    rows = data["runs"]
    assert len(rows) == 8 and all(r["exactly_once"] for r in rows)

    def row(loss, transport):
        return next(r for r in rows if (r["loss"], r["transport"], r["entropy"])
                    == (loss, transport, "ecmp"))

    # go-back-N resends whole windows; selective recovery resends only what was lost
    assert row(0.02, "roce")["retransmits"] > row(0.02, "uet")["retransmits"]
    assert row(0.02, "uet")["naks"] == 0
    summary = (folder / "summary.md").read_text()
    assert_tables(summary)
    assert f"| 2 | roce | ecmp | {row(0.02, 'roce')['jct_s']:.3f} |" in summary
    # theory beside each lossy run: selective repeat below go-back-N, both above ideal
    assert "## Expected vs measured" in summary and len(data["expected"]) == 4
    for e in data["expected"]:
        assert row(0.02, "roce")["ideal_s"] < e["low"] <= e["high"]
        assert e["verdict"] in summary


@pytest.mark.root
def test_pfc_hol_smoke(tmp_path, host_untouched):
    out = subprocess.run([sys.executable, "scripts/pfc_hol.py", "--message-bytes",
                          str(1_500_000), "--queue-bytes", str(512 * 1024), "--xoff",
                          "100000", "--results", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    (folder,) = tmp_path.glob("pfc_hol-*")
    assert_png(folder / "plots" / "pfc_off_vs_on.png")
    rows = json.loads((folder / "metrics.json").read_text())
    on, off = rows["on"], rows["off"]
    assert on["exactly_once"] and off["exactly_once"]
    assert on["pause_frames"] > 0 and off["pause_frames"] == 0
    assert off["lossless_drops"] > 0 and on["lossless_drops"] < off["lossless_drops"]
    assert (folder / rows["on"]["folder"] / "plots" / "pfc_backlog_bytes.png").exists()
    summary = (folder / "summary.md").read_text()
    assert_tables(summary)
    assert f"| PFC on | {on['victim_mbps']:.1f} |" in summary
    # the fluid head-of-line model beside the measurement: B/3 for the victim
    victim = next(e for e in rows["expected"] if e["what"] == "victim with PFC on")
    assert victim["low"] == pytest.approx(100 / 3) and victim["measured"] == on["victim_mbps"]
    assert "## Expected vs measured" in summary and victim["verdict"] in summary
    # without PFC nothing pauses the victim and its path is not oversubscribed: B
    free = next(e for e in rows["expected"] if e["what"] == "victim with PFC off")
    assert 90 < free["low"] == free["high"] < 100 and free["measured"] == off["victim_mbps"]
    assert f"| {on['reaction_ms_p50']} | {on['fidelity']} |" in summary
    # the controller's lag is graded only where it pauses (PFC on), not where it watches
    graded = {mode: json.loads((folder / r["folder"] / "metrics.json").read_text())
              ["fidelity"]["figures"]["pfc_poll_gap_p99_ms"] for mode, r in (("on", on),
                                                                             ("off", off))}
    assert graded["off"] is None and graded["on"] is not None
    # VOQ: the incast still stops at its sources, paused toward its receiver, without a
    # drop; the victim is not held behind it as under PFC
    voq = rows["voq"]
    assert voq["exactly_once"] and voq["lossless_drops"] == 0 and voq["pause_frames"] > 0
    assert "l1h0" in voq["held_destinations"] and voq["pause_hops"] >= 1
    assert voq["victim_mbps"] > on["victim_mbps"]
    assert on["held_destinations"] == [] and not on["voq"] and on["pause_hops"] >= 1
    assert f"| VOQ | {voq['victim_mbps']:.1f} |" in summary
    assert f"| {', '.join(voq['held_destinations'])} | {voq['held_elsewhere']} |" in summary
    voq_rows = [e for e in rows["expected"] if "VOQ" in e["what"]]
    assert len(voq_rows) == 4 and all(e["verdict"] in summary for e in voq_rows)
    elsewhere = next(e for e in voq_rows if e["what"].startswith("queues held toward"))
    assert elsewhere["measured"] == voq["held_elsewhere"]
    # the scheduled fabric: credits, not pauses; every byte once, none dropped
    sch = rows["scheduled"]
    assert sch["exactly_once"] and sch["pause_frames"] == 0
    assert sch["lossless_drops"] == 0 or sch["fidelity"] == "unfaithful"
    assert sch["victim_mbps"] > on["victim_mbps"] and "| scheduled | " in summary
    sch_rows = [e for e in rows["expected"] if e["what"].endswith("scheduled")]
    assert len(sch_rows) == 4 and all(e["verdict"] in summary for e in sch_rows)


@pytest.mark.root
def test_microled_vs_laser_smoke(tmp_path, host_untouched):
    out = subprocess.run([sys.executable, "scripts/microled_vs_laser.py", "--server-count", "2",
                          "--gpus", "2", "--iterations", "3", "--message-bytes",
                          str(256 * 1024), "--fail-at-s", "0.05", "--repair-s", "0.5",
                          "--results", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    (folder,) = tmp_path.glob("microled_vs_laser-*")
    assert_png(folder / "plots" / "jct_and_energy.png")
    rows = json.loads((folder / "metrics.json").read_text())
    laser, micro = rows["laser"], rows["microled"]
    assert laser["exactly_once"] and micro["exactly_once"]
    assert laser["link_down_s"] > 0.3                # a lane failure takes a laser link down
    assert micro["link_down_s"] == 0 and micro["degraded_s"] > 0   # microLED only degrades
    assert micro["link_power_w"] < laser["link_power_w"]
    summary = (folder / "summary.md").read_text()
    assert_tables(summary)
    assert f"| laser | {', '.join(f'{j:.3f}' for j in laser['jct_s'])} |" in summary
    down = next(e for e in rows["expected"] if e["what"] == "laser link down")
    assert down["low"] == pytest.approx(min(0.5, laser["job_s"] - 0.05))
    assert down["measured"] == laser["failed_link_down_s"] and down["verdict"] in summary


@pytest.mark.root
def test_pfc_vs_ecn_smoke(tmp_path, host_untouched):
    """Four fabrics at 1 MB per flow: every byte exactly once; drop-tail drops and
    pauses nothing, PFC pauses, ECN marks and DCQCN sends CNPs only where on."""
    out = subprocess.run([sys.executable, "scripts/pfc_vs_ecn.py", "--smoke", "--results",
                          str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    (folder,) = tmp_path.glob("pfc_vs_ecn-*")
    assert_png(folder / "plots" / "pfc_vs_ecn.png")
    rows = json.loads((folder / "metrics.json").read_text())
    assert all(rows[m]["exactly_once"] for m in ("none", "pfc", "dcqcn", "pfc+dcqcn",
                                                 "pfc+voq"))
    none, pfc, dcqcn, both = rows["none"], rows["pfc"], rows["dcqcn"], rows["pfc+dcqcn"]
    assert none["pause_frames"] == dcqcn["pause_frames"] == 0 < pfc["pause_frames"]
    assert none["ce_marks"] == pfc["ce_marks"] == none["cnps"] == pfc["cnps"] == 0
    assert dcqcn["ce_marks"] > 0 and dcqcn["cnps"] > 0 and both["cnps"] > 0
    assert none["drops"] > 0                     # 3 windows overflow 512 KiB
    assert (folder / dcqcn["folder"] / "plots" / "dcqcn_rates.png").exists()
    summary = (folder / "summary.md").read_text()
    assert_tables(summary)
    assert "## Expected vs measured" in summary and "| pfc+dcqcn |" in summary
    # PFC with VOQ: pauses per destination, loses nothing, marks nothing (no ECN)
    voq = rows["pfc+voq"]
    assert voq["pause_frames"] > 0 and voq["drops"] == 0 and voq["ce_marks"] == voq["cnps"] == 0
    assert "l1h0" in voq["held_destinations"] and "| pfc+voq |" in summary
    victim = next(e for e in rows["expected"] if e["what"] == "victim, pfc+voq")
    assert victim["measured"] == voq["victim_mbps"] and 90 < victim["low"] < 100


@pytest.mark.root
def test_ib_vs_uec_smoke(tmp_path, host_untouched):
    """Three fabric philosophies on a 2 x 2 rail-optimized fabric: every byte exactly once;
    only the PFC fabrics pause, only adaptive routing steers, the table is complete."""
    out = subprocess.run([sys.executable, "scripts/ib_vs_uec.py", "--smoke", "--results",
                          str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    (folder,) = tmp_path.glob("ib_vs_uec-*")
    assert_png(folder / "plots" / "ib_vs_uec.png")
    rows = json.loads((folder / "metrics.json").read_text())
    workloads = ("permutation", "alltoall", "allreduce")
    for fabric in ("ethernet", "infiniband", "ultra", "ultra_drop"):
        for w in workloads:
            assert rows[fabric][w]["exactly_once"], (fabric, w)
    for fabric in ("ultra", "ultra_drop"):
        assert all(rows[fabric][w]["pause_frames"] == 0 for w in workloads)
    # only the trimming fabric trims (RoCE frames and the drop-tail UET fabric never)
    assert all(rows["ultra_drop"][w]["trimmed"] == 0 for w in workloads)
    assert all(rows[f][w]["trimmed"] == 0 for f in ("ethernet", "infiniband")
               for w in workloads)
    assert sum(rows["infiniband"][w]["steered"] for w in rows["infiniband"]) > 0
    assert all(rows["ethernet"][w]["steered"] == 0 for w in rows["ethernet"])
    summary = (folder / "summary.md").read_text()
    assert_tables(summary)
    assert summary.count("| ultra |") == 3 and summary.count("| ultra_drop |") == 3
    assert "## Expected vs measured" in summary
    assert "The article's Ultra Ethernet is packet spraying + VOQ" in summary


def test_ib_vs_uec_says_why_its_ultra_fabrics_run_without_voq():
    """The summary's reason stays true: VOQ refuses the ultra fabrics' PFC off, and with
    PFC on it still refuses their ECN marking and trimming."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from ib_vs_uec import FABRICS, NO_VOQ

    from fabric.lossless import SwitchSettings
    from topologies.spec import SpecError

    for name in ("ultra", "ultra_drop"):
        keys = {k: v for k, v in FABRICS[name].items() if k in ("pfc", "ecn", "trimming")}
        with pytest.raises(SpecError, match="needs pfc 'on'"):
            SwitchSettings(**keys, voq="on")
        with pytest.raises(SpecError, match="cannot run with ecn"):
            SwitchSettings(**{**keys, "pfc": "on"}, voq="on")
    assert FABRICS["ultra"]["trimming"] == "on" and "trimming" in NO_VOQ and "PFC" in NO_VOQ


def test_bench_voq_counts_only_faithful_runs():
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_voq import record

    def run(over: float, fidelity: str, elsewhere: int = 0) -> dict:
        return {"victim_over_line": over, "jct_over_model": 1.02, "drops": 0, "hops": 3,
                "held_elsewhere": elsewhere, "cpu": 20.0, "fidelity": fidelity,
                "counts": fidelity == "faithful", "exactly_once": True}

    values, missing = record({"pfc": [run(0.35, "faithful"), run(0.9, "degraded")],
                              "voq": [run(0.97, "faithful"), run(0.5, "degraded", 2)]})
    assert missing == []
    assert values["pfc_victim_over_line"] == values["pfc_victim_over_line_max"] == 0.35
    assert values["voq_victim_over_line_min"] == 0.97 and values["voq_victim_goal_met"] == 1
    assert values["voq_held_elsewhere"] == 0 and values["voq_pause_hops"] == 3
    assert values["voq_bench_verdicts"] == ["round 1 pfc: faithful", "round 2 pfc: degraded",
                                            "round 1 voq: faithful", "round 2 voq: degraded"]
    assert "pfc_controller_cpu_percent" not in values      # bench_pfc's figure stays its own
    values, missing = record({"pfc": [run(0.35, "degraded")],
                              "voq": [run(0.94, "faithful"), run(0.99, "faithful")]})
    assert missing == ["pfc"] and "pfc_victim_over_line" not in values
    assert values["voq_victim_over_line"] == pytest.approx(0.965)
    assert values["voq_victim_goal_met"] == 0                # the worst faithful run counts


def test_bench_voq_nic_figures_count_only_faithful_runs():
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_voq import nic_record

    def run(over: float, fidelity: str) -> dict:
        return {"victim_over_fluid": over, "fidelity": fidelity,
                "counts": fidelity == "faithful"}

    values, missing = nic_record({"nic_fifo": [run(0.5, "faithful"), run(0.9, "degraded")],
                                  "nic": [run(0.96, "faithful"), run(0.98, "faithful")]})
    assert missing == [] and values["nic_fifo_victim_over_fluid"] == 0.5
    assert values["nic_victim_over_fluid_min"] == 0.96 and values["nic_victim_goal_met"] == 1
    values, missing = nic_record({"nic_fifo": [run(0.5, "faithful")],
                                  "nic": [run(0.9, "faithful"), run(0.99, "unfaithful")]})
    assert values["nic_victim_goal_met"] == 0 and values["nic_victim_over_fluid_max"] == 0.9
    values, missing = nic_record({"nic_fifo": [run(0.5, "degraded")], "nic": []})
    assert missing == ["nic_fifo", "nic"] and "nic_victim_goal_met" not in values


def test_bench_scheduled_counts_only_faithful_runs():
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_scheduled import record

    def run(over: float, fidelity: str, pauses: int = 0) -> dict:
        return {"jct_over_ideal": over, "spine_p99_frames": 1.0, "pause_frames": pauses,
                "credit_frames": 40, "drops": 0, "cpu": 20.0, "fidelity": fidelity,
                "counts": fidelity == "faithful", "exactly_once": True}

    values, missing = record({"ecmp+pfc": [run(1.4, "faithful", 300)],
                              "spray+pfc": [run(1.2, "degraded", 100)],
                              "scheduled": [run(1.05, "faithful"), run(1.5, "unfaithful"),
                                            run(1.09, "faithful")]})
    assert missing == ["spray+pfc"] and "spray_pfc_alltoall_jct_over_ideal" not in values
    assert values["scheduled_alltoall_jct_over_ideal_max"] == 1.09
    assert values["scheduled_goal_met"] == 1 and values["ecmp_pfc_alltoall_pause_frames"] == 300
    assert values["scheduled_controller_cpu_percent"] == 20.0
    assert len(values["scheduled_bench_verdicts"]) == 5
    values, _ = record({"scheduled": [run(1.2, "faithful")]})
    assert values["scheduled_goal_met"] == 0


@pytest.mark.root
def test_bench_scheduled_smoke(tmp_path, host_untouched):
    out_json = tmp_path / "bench.json"
    out = subprocess.run([sys.executable, "scripts/bench_scheduled.py", "--rounds", "1",
                          "--smoke", "--out", str(out_json)], cwd=ROOT, capture_output=True,
                         text=True, timeout=900)
    got = json.loads(out_json.read_text())
    verdicts = dict(v.split(": ") for v in got["scheduled_bench_verdicts"])
    assert set(verdicts) == {"round 1 ecmp+pfc", "round 1 spray+pfc", "round 1 scheduled"}
    faithful = [v == "faithful" for v in verdicts.values()]
    assert out.returncode == (0 if all(faithful) else 1), out.stderr[-2000:]
    assert out.stdout.count("does not count") == faithful.count(False)
    if verdicts["round 1 scheduled"] == "faithful":
        assert got["scheduled_alltoall_pause_frames"] == 0
        assert got["scheduled_alltoall_lossless_drops"] == 0
        assert got["scheduled_alltoall_credit_frames"] > 0


def test_bench_scheduled_refuses_bad_arguments(tmp_path):
    for flag, value in (("--rounds", "0"), ("--rate", "-3"), ("--message-bytes", "0")):
        bad = subprocess.run([sys.executable, "scripts/bench_scheduled.py", flag, value,
                              "--out", str(tmp_path / "b.json")], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and flag in bad.stderr
    assert not list(tmp_path.iterdir())


def test_bench_voq_refuses_zero_rounds(tmp_path):
    out_json = tmp_path / "bench.json"
    bad = subprocess.run([sys.executable, "scripts/bench_voq.py", "--rounds", "0",
                          "--out", str(out_json)], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--rounds" in bad.stderr
    assert not out_json.exists() and not list(tmp_path.iterdir())


@pytest.mark.root
def test_bench_voq_smoke(tmp_path, host_untouched):
    """One round of PFC then VOQ: every run's verdict recorded; its figures only from a
    faithful run, and the round says which runs count."""
    out_json = tmp_path / "bench.json"
    out = subprocess.run([sys.executable, "scripts/bench_voq.py", "--rounds", "1",
                          "--message-bytes", "500000", "--out", str(out_json)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    got = json.loads(out_json.read_text())
    verdicts = dict(v.split(": ") for v in got["voq_bench_verdicts"])
    assert set(verdicts) == {"round 1 pfc", "round 1 voq"}, out.stderr[-2000:]
    nic = dict(v.split(": ") for v in got["nic_bench_verdicts"])
    assert set(nic) == {"round 1 nic_fifo", "round 1 nic"}
    faithful = {mode: verdicts[f"round 1 {mode}"] == "faithful" for mode in ("pfc", "voq")}
    nic_faithful = {m: nic[f"round 1 {m}"] == "faithful" for m in ("nic_fifo", "nic")}
    every = [*faithful.values(), *nic_faithful.values()]
    assert out.returncode == (0 if all(every) else 1), out.stderr[-2000:]
    assert out.stdout.count("does not count") == every.count(False)
    for mode, counts in nic_faithful.items():
        assert (f"{mode}_victim_over_fluid" in got) == counts
    assert "calibration" in out.stdout
    for mode, counts in faithful.items():
        assert (f"{mode}_victim_over_line" in got) == counts
    if faithful["voq"]:
        assert got["voq_lossless_drops"] == 0 and got["voq_pause_hops"] >= 1
        assert got["voq_victim_over_line"] > 0
    if all(faithful.values()):
        assert got["voq_victim_over_line"] > got["pfc_victim_over_line"]


def test_demo_verdicts_counts_the_runs_after_the_mark(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    from demo_verdicts import report, verdicts
    mark = tmp_path / ".mark"
    old = tmp_path / "old-run"
    old.mkdir()
    (old / "metrics.json").write_text(json.dumps({"fidelity": {"verdict": "unfaithful"}}))
    os.utime(old / "metrics.json", (1, 1))               # before the mark: not counted
    mark.touch()
    script = tmp_path / "ecmp_vs_spray-1"
    for name, verdict in (("a", "faithful"), ("b", "degraded")):
        (script / name).mkdir(parents=True)
        (script / name / "metrics.json").write_text(json.dumps(
            {"fidelity": {"verdict": verdict, "reasons": [f"{name} why"]}}))
    (script / "metrics.json").write_text(json.dumps({"jct": 1}))   # the script's own
    found = verdicts(tmp_path, mark.stat().st_mtime)
    assert [(f.name, v) for f, v, _ in found] == [("a", "faithful"), ("b", "degraded")]
    text = report(found)
    assert text.splitlines()[0] == "demo: 1 of 2 runs faithful (1 degraded)"
    assert "degraded: " in text and "(b why)" in text
    assert report(found[:1]) == "demo: 1 of 1 runs faithful"
    out = subprocess.run([sys.executable, "scripts/demo_verdicts.py", str(tmp_path / "no")],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "mark" in out.stderr


@pytest.mark.parametrize("script", ["topology_compare", "ecmp_vs_spray"])
def test_a_scripts_rate_keeps_nvlink_and_the_real_rates(script, tmp_path):
    """At a lower rate every link of the fabric slows by one factor: NVLink stays 9x the
    rails (3.6 Tb/s to 400 Gb/s) and the scale factor grows by the inverse, so the real
    rates the figures are scaled back to do not change."""
    import importlib

    from testbed.run import pick_link_rate
    sys.path.insert(0, str(ROOT / "scripts"))
    mod = importlib.import_module(script)
    if script == "topology_compare":
        args = mod.argparse.Namespace(message_bytes=1 << 20, iterations=1, seed=1,
                                      window=16, pfc="on", cc="none", servers=2, gpus=2)
        exps = mod.experiments(args, 25.0, tmp_path)
    else:
        args = {"servers": 2, "gpus": 2, "spines": 2, "rate_mbps": 25.0,
                "message_bytes": 1 << 20, "iterations": 1, "seed": 1}
        exps = [mod.from_toml(None, mod.settings(tmp_path, args, "ecmp", "allreduce", True))]
    rails = [e for e in exps if e.topology["kind"].startswith("rail")]
    assert rails
    for exp in rails:
        base = exp.resolve_topology()
        topo, _, _ = pick_link_rate(exp, base, [], None, print, None)
        assert topo.params["rate_mbps"] == 25.0
        assert topo.params["nvlink_rate_mbps"] == 9 * 25.0
        assert topo.scale_factor == base.scale_factor * 4


def test_topology_compare_sizes_each_fabrics_buffers_for_its_pfc_headroom(tmp_path):
    """With PFC, every switch ingress of every compared fabric holds its XOFF and the
    headroom of the controller's reaction at the run's rates (the default 128 KiB does
    not at 25 Mbit/s: a 16-port one-tier switch needs 271 kB)."""
    from testbed.lossless_plan import unfit_ingress
    from testbed.rate import rescaled
    from topologies.files import from_data
    sys.path.insert(0, str(ROOT / "scripts"))
    import topology_compare as mod
    args = mod.argparse.Namespace(message_bytes=1 << 20, iterations=1, seed=1, window=16,
                                  pfc="on", cc="none", servers=4, gpus=4)
    exps = mod.experiments(args, 25.0, tmp_path)
    assert {e.topology["name"] for e in exps} == set(mod.fabrics(4, 4))
    for exp in exps:
        topo = rescaled(exp.resolve_topology(), float(exp.rate))
        assert unfit_ingress(exp, topo) is None, exp.name
        # the headroom covers twice the assumed reaction on the fastest port
        assert exp.pfc_headroom_bytes == mod.lossless_sizing(exp)[1] > 0
        bare = {**exp.topology, "params": {k: v for k, v in exp.topology["params"].items()
                                           if k != "queue_bytes"}}
        if exp.topology["kind"] == "one_tier":   # what the builders' default leaves
            assert unfit_ingress(exp, rescaled(from_data(bare, source="test"), 25.0))


@pytest.mark.root
def test_train_step_compare_smoke(tmp_path, host_untouched):
    out = subprocess.run([sys.executable, "scripts/train_step_compare.py", "--rate", "20",
                          "--server-count", "2", "--gpus", "2", "--layers", "2", "--hidden",
                          "1024", "--seq-len", "512", "--fabrics", "rail_optimized,rail_only",
                          "--entropies", "spray", "--ccs", "pfc", "--results", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    (folder,) = tmp_path.glob("train_step_compare-*")
    assert_png(folder / "plots" / "step_split.png")
    m = json.loads((folder / "metrics.json").read_text())
    summary = (folder / "summary.md").read_text()
    assert_tables(summary)
    assert set(m["runs"]) == {f"{model}_{fabric}_spray_pfc" for model in ("dense", "moe")
                              for fabric in ("rail_optimized", "rail_only")}
    # one job per model: every run of it at the byte scale of its first
    assert set(m["byte_scale"]) == {"dense", "moe"}
    steps = [e for e in m["expected"] if e["what"].endswith("step time")]
    assert len(steps) == 4 and all(e["verdict"] in summary for e in steps)
    claim = [e for e in m["expected"] if "rail-only step over" in e["what"]]
    assert len(claim) == 2 and "2307.12169" in claim[0]["source"]
    for name, run_ in m["runs"].items():
        split = run_["slowest"]
        assert split["compute_s"] > 0 and split["exposed_comm_s"] >= 0, name
        assert next(folder.glob(f"{name}-*/timeline.png")).stat().st_size > 10_000
        assert next(folder.glob(f"{name}-*/trace/trace.0.et")).stat().st_size > 0


@pytest.mark.root
def test_bench_train_smoke(tmp_path, host_untouched):
    out_json = tmp_path / "bench.json"
    out = subprocess.run([sys.executable, "scripts/bench_train.py", "--rounds", "1",
                          "--rate", "20", "--out", str(out_json)], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads(out_json.read_text())
    assert data["train_step_over_analytic"] > 0 and data["train_step_rate_mbps"] == 20
    assert 0 <= data["train_step_trace_vs_plan"] < 1 and len(data["train_step_verdicts"]) == 2
    assert "train_step_over_analytic =" in out.stdout
    assert "rate_auto_verdicts" not in data          # a rate it was given, not auto's


@pytest.mark.root
def test_bench_lossless_smoke(host_untouched):
    env = {k: v for k, v in os.environ.items() if k != "AFT_BENCH_LOCK"}  # the test holds it
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "scripts/bench_lossless.py", "--quick", "--only",
                          "incast3_leaf_spine", "lossy15"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert time.monotonic() - t0 < 120
    got = json.loads(out.stdout.strip().splitlines()[-1])
    drops = {k: v for k, v in got["figures"].items() if k.endswith("_lossless_drops")}
    assert drops == {"pfc_incast3_leaf_spine_lossless_drops": 0}
    assert 0.95 <= got["figures"]["attribution_sum_over_fct_min"] \
        <= got["figures"]["attribution_sum_over_fct_max"] <= 1.05
    assert 0 < got["figures"]["attribution_explained_min"] <= 1.05
    assert all(got["goals"].values()) and len(got["goals"]) == 2
    rows = [line.split() for line in out.stdout.splitlines()
            if line.startswith(("incast3_leaf_spine ", "lossy15 "))]
    assert len(rows) == 2 and "PFC off" in out.stdout


def test_voq_fabric_refuses_bad_arguments(tmp_path):
    """--help names the workloads' flags; a bad value is one line on stderr naming the
    flag, exit 2, and no results folder."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "scripts/voq_fabric.py", "--help"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--message-bytes" in out.stdout and "--smoke" in out.stdout
    for flag, value in (("--message-bytes", "0"), ("--window", "-1"), ("--rate", "fast"),
                        ("--rate", "nan")):
        bad = subprocess.run([sys.executable, "scripts/voq_fabric.py", flag, value,
                              "--results", str(tmp_path)], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
        assert flag in bad.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.root
def test_voq_fabric_smoke(tmp_path, host_untouched):
    """A permutation and an all-to-all under ECMP/spray x PFC/VOQ on a 2 x 2 leaf-spine:
    every byte exactly once, no lossless drop, only the VOQ fabrics hold destinations,
    the table and the expectations complete."""
    out = subprocess.run([sys.executable, "scripts/voq_fabric.py", "--smoke", "--results",
                          str(tmp_path)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    (folder,) = tmp_path.glob("voq_fabric-*")
    assert_png(folder / "plots" / "voq_fabric.png")
    rows = json.loads((folder / "metrics.json").read_text())
    fabrics = ("ecmp+pfc", "ecmp+voq", "spray+pfc", "spray+voq", "scheduled")
    for fabric in fabrics:
        for w in ("permutation", "alltoall"):
            r = rows[fabric][w]
            assert r["exactly_once"] and r["lossless_drops"] == 0, (fabric, w)
            assert r["jct_over_ideal"] >= 0.9 and r["spine_queue_p99_bytes"] >= 0
            assert r["voq"] == (fabric not in ("ecmp+pfc", "spray+pfc"))
            assert r["pause_hops"] == len(
                r["switches_that_paused"])
            if not r["voq"]:
                assert r["held_destinations"] == []
    summary = (folder / "summary.md").read_text()
    assert_tables(summary)
    for fabric in fabrics:
        assert summary.count(f"| {fabric} |") == 2
    r = rows["ecmp+voq"]["alltoall"]
    assert (f"| ecmp+voq | alltoall | {r['jct_s']:.3f} | {r['jct_over_ideal']:.3f} |"
            in summary)
    # the permutation's ideal where the fabric sprays, the collision model where it
    # hashes, and no lossless drop in any of the ten runs; the scheduled fabric's
    # all-to-all at its ideal, without a pause
    assert "## Expected vs measured" in summary and len(rows["expected"]) == 17
    assert rows["scheduled"]["alltoall"]["pause_frames"] == 0
    spray = next(e for e in rows["expected"] if e["what"] == "permutation JCT, spray+pfc")
    assert spray["low"] == rows["spray+pfc"]["permutation"]["ideal_s"]
    ecmp = next(e for e in rows["expected"] if e["what"] == "permutation JCT, ecmp+pfc")
    assert ecmp["low"] == rows["ecmp+pfc"]["permutation"]["collision_model_s"] > 0
    assert all(e["verdict"] in summary for e in rows["expected"])
