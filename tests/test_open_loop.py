"""Open-loop flows and request/response (traffic.open_loop, traffic.rpc): their plans and
steps without a fabric, then real runs (testbed.flow_run, testbed.rpc_run)."""

from __future__ import annotations

import csv
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from fabric.shaping import htb_params
from testbed.experiment import from_toml
from testbed.link_check import FRAME_OVERHEAD_BYTES
from testbed.run import run
from topologies.spec import SpecError
from traffic.flow_sizes import load
from traffic.open_loop import (
    BACKGROUND_TAG,
    background,
    open_loop_schedule,
    plan_flows,
)
from traffic.rpc import RpcSettings, plan_rpcs, rpc_schedule
from traffic.workloads import schedule_from_data, schedule_to_data

ROOT = Path(__file__).resolve().parent.parent
RANKS = ["a", "b", "c", "d"]
MBPS = dict.fromkeys(RANKS, 100.0)


def _graph_ok(sched) -> None:
    """Every step waits only for earlier steps of its rank (what the agents require)."""
    for steps in sched.values():
        for k, st in enumerate(steps):
            assert st.after is not None and all(0 <= d < k for d in st.after), (k, st.after)


def test_flows_arrive_as_a_poisson_process_at_the_asked_load():
    sizes = load("ali_storage")
    flows = plan_flows(RANKS, sizes, 0.4, 4000, "uniform", None, 7, MBPS)
    gaps = [(b.arrival_ns - a.arrival_ns) / 1e9 for a, b in zip(flows, flows[1:],
                                                                strict=False)]
    rate = 4 * 0.4 * 100e6 / 8 / sizes.mean_bytes()      # flows/s over the 4 senders
    assert statistics.mean(gaps) == pytest.approx(1 / rate, rel=4 / math.sqrt(len(gaps)))
    # exponential gaps: their coefficient of variation is 1
    assert statistics.stdev(gaps) / statistics.mean(gaps) == pytest.approx(1, abs=0.1)
    assert all(f.src != f.dst for f in flows)
    assert {f.src for f in flows} == set(RANKS)
    assert plan_flows(RANKS, sizes, 0.4, 50, "uniform", None, 7, MBPS) == flows[:50]


def test_a_duration_takes_every_flow_arriving_within_it():
    sizes = load("ali_storage")
    flows = plan_flows(RANKS, sizes, 0.3, 1, "uniform", None, 4, MBPS, duration_s=2.0)
    rate = 4 * 0.3 * 100e6 / 8 / sizes.mean_bytes()
    assert len(flows) == pytest.approx(2.0 * rate, rel=4 / math.sqrt(2.0 * rate))
    assert flows[-1].arrival_ns <= 2e9 and flows == plan_flows(
        RANKS, sizes, 0.3, len(flows), "uniform", None, 4, MBPS)   # the same draws
    with pytest.raises(SpecError, match="flows.flow_duration_s"):
        plan_flows(RANKS, load("google_rpc"), 0.9, 1, "uniform", None, 4, MBPS,
                   duration_s=600.0)


def test_destinations_permutation_and_pairs():
    sizes = load("google_rpc")
    perm = plan_flows(RANKS, sizes, 0.3, 200, "permutation", None, 3, MBPS)
    peer = {}
    for f in perm:
        assert peer.setdefault(f.src, f.dst) == f.dst and f.src != f.dst
    pairs = [("a", "b"), ("a", "c"), ("d", "b")]
    given = plan_flows(RANKS, sizes, 0.3, 60, "pairs", pairs, 3, MBPS)
    assert {(f.src, f.dst) for f in given} == set(pairs)
    assert [f.dst for f in given if f.src == "a"][:4] == ["b", "c", "b", "c"]   # in turn


def test_a_senders_flows_are_a_chain_of_gaps_each_starting_one_flow():
    flows = plan_flows(RANKS, load("ali_storage"), 0.3, 40, "uniform", None, 1, MBPS)
    sched = open_loop_schedule(flows, RANKS)
    _graph_ok(sched)
    for rank, steps in sched.items():
        mine = [f for f in flows if f.src == rank]
        chain = [st for st in steps if st.sends]
        assert [st.sends[0].tag for st in chain] == [f.tag for f in mine]
        # the gaps add up to each flow's instant
        assert sum(st.compute_ns for st in chain) == pytest.approx(mine[-1].arrival_ns,
                                                                   abs=len(mine))
        received = [st for st in steps if st.recvs]
        assert all(st.after == () and not st.compute_ns for st in received)
        assert len(received) == sum(f.dst == rank for f in flows)
    # the agents read the steps as a graph: after and compute survive the trip
    data = schedule_to_data(sched)
    assert schedule_from_data(data) == sched


def test_a_background_job_runs_beside_the_flows_under_its_own_tags():
    flows = plan_flows(RANKS, load("ali_storage"), 0.3, 20, "uniform", None, 1, MBPS)
    ring = background("allreduce", RANKS, 1 << 16, 1)
    sched = open_loop_schedule(flows, RANKS, ring)
    _graph_ok(sched)
    bg = [st for steps in sched.values() for st in steps
          if any(t.tag.startswith(BACKGROUND_TAG + ".") for t in st.sends + st.recvs)]
    assert len(bg) == sum(len(s) for s in ring.values())
    # the ring's own order holds: each of its steps waits for the one before it
    for steps in sched.values():
        mine = [k for k, st in enumerate(steps) if st in bg]
        assert all(steps[k].after == (prev,) for prev, k in zip(mine, mine[1:],
                                                                 strict=False))
    assert background("none", RANKS, 1, 1) == {}


def test_rpc_closed_loop_chains_and_servers_answer_each_request():
    s = RpcSettings(rpc_concurrency=2, rpc_count=5)
    rpcs = plan_rpcs(RANKS, s, None, 1)
    assert {r.client for r in rpcs} == {"a", "b"} and {r.server for r in rpcs} <= {"c", "d"}
    sched = rpc_schedule(rpcs, RANKS)
    _graph_ok(sched)
    for client in ("a", "b"):
        steps = sched[client]
        assert len(steps) == 5 and all(len(st.sends) == len(st.recvs) == 1 for st in steps)
        assert [st.after for st in steps] == [(), (), (0,), (1,), (2,)]   # two chains
    served = [st for r in ("c", "d") for st in sched.get(r, [])]
    assert sum(bool(st.recvs) for st in served) == sum(bool(st.sends) for st in served) == 10


def test_rpc_open_loop_sends_at_poisson_instants():
    s = RpcSettings(rpc_rate=200.0, rpc_count=400)
    rpcs = plan_rpcs(RANKS, s, load("google_rpc"), 2)
    mine = [r for r in rpcs if r.client == "a"]
    gaps = [(b.arrival_ns - a.arrival_ns) / 1e9 for a, b in zip(mine, mine[1:], strict=False)]
    assert statistics.mean(gaps) == pytest.approx(1 / 200, rel=4 / math.sqrt(len(gaps)))
    sched = rpc_schedule(rpcs, RANKS)
    _graph_ok(sched)
    assert all(st.compute_ns >= 1 for st in sched["a"] if st.sends)


@pytest.mark.parametrize("args, field", [
    (["--flow-sizes", "nosuch"], "flows.flow_sizes"),
    (["--flow-load", "1.5"], "flow_load"),
    (["--flow-destinations", "pairs"], "flows.flow_destinations"),
    (["--workload", "rpc", "--rpc-servers", "4"], "rpc.rpc_servers"),
])
def test_bad_flow_settings_are_one_line_and_exit_2(args, field, tmp_path):
    workload = [] if "--workload" in args else ["--workload", "flows"]
    out = subprocess.run([sys.executable, "-m", "testbed", "run", "--dry-run", "--topology",
                          "leaf_spine", "--set", "leaves=2", "--set", "hosts_per_leaf=2",
                          "--results", str(tmp_path), *workload, *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and field in lines[0], out.stderr
    assert list(tmp_path.iterdir()) == []


# -- real runs ------------------------------------------------------------------------

def _run(tmp_path, **settings):
    base = {"name": "t_flows", "results_dir": str(tmp_path), "timeout_s": 120.0,
            "iterations": 1, "rto_ms": 200.0,
            "topology": {"kind": "leaf_spine",
                         "params": {"leaves": 2, "spines": 2, "hosts_per_leaf": 2}}}
    return run(from_toml(None, {**base, **settings}))


def _rows(folder: Path) -> list[dict]:
    with open(folder / "flows.csv", newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.root
def test_open_loop_flows_run_exactly_once_never_before_their_instant(tmp_path,
                                                                    host_untouched):
    folder, metrics = _run(tmp_path, workload="flows", flow_sizes="ali_storage",
                           flow_count=40, flow_load=0.2, flow_background="elephants",
                           message_bytes=1 << 20)
    assert metrics["ok"] and metrics["flows"]["exactly_once"]
    rows = _rows(folder)
    sent = [r for r in rows if r["role"] == "send" and r["tag"].startswith("flows.")]
    assert len(sent) == 40
    # no flow beats its bytes at 100 Mbit/s but for what an idle port's bucket lets
    # through at once: its burst, and the frame HTB sends on its last tokens
    burst = htb_params(100.0).burst_bytes + 4096 + FRAME_OVERHEAD_BYTES
    for r in sent:
        assert r["arrival_s"] != "" and float(r["slowdown"]) > 0
        wire = int(r["size_bytes"]) + int(r["packets"]) * FRAME_OVERHEAD_BYTES
        assert float(r["fct_s"]) >= (wire - burst) * 8 / 100e6, r
    received = {r["tag"]: int(r["bytes_delivered"]) for r in rows if r["role"] == "recv"}
    assert all(received[r["tag"]] == int(r["size_bytes"]) for r in sent)
    # the instants the agents kept are Poisson: each sender's gaps over its mean gap,
    # pooled, against Exp(1) (Kolmogorov-Smirnov, alpha 0.001)
    rate = 0.2 * 100e6 / 8 / load("ali_storage").mean_bytes()       # per sender, 1/s
    gaps = []
    for src in {r["src"] for r in sent}:
        starts = sorted(int(r["start_ns"]) for r in sent if r["src"] == src)
        gaps += [(b - a) / 1e9 * rate for a, b in zip(starts, starts[1:], strict=False)]
    gaps.sort()
    d = max(max(abs((i + 1) / len(gaps) - (1 - math.exp(-g))),
                abs(i / len(gaps) - (1 - math.exp(-g)))) for i, g in enumerate(gaps))
    assert d < 1.95 / math.sqrt(len(gaps)), (d, len(gaps))
    # the load reached is the load the planned flows asked, within 5 %: their bytes over
    # the span of their instants, and over the span the agents started them in
    by_start = sorted(sent, key=lambda r: int(r["start_ns"]))
    planned = sorted(sent, key=lambda r: float(r["arrival_s"]))
    span_run = (int(by_start[-1]["start_ns"]) - int(by_start[0]["start_ns"])) / 1e9
    span_plan = float(planned[-1]["arrival_s"]) - float(planned[0]["arrival_s"])
    assert span_run == pytest.approx(span_plan, rel=0.05)
    ol = metrics["open_loop"]
    assert ol["flows_done"] == ol["flows_asked"] == 40
    assert ol["start_late_p50_s"] >= -1e-6       # a flow never starts before its instant
    assert sum(b["flows"] for b in ol["buckets"]) == 40
    assert ol["background"]["flows"] == 4        # the elephants, reported apart
    summary = (folder / "summary.md").read_text()
    assert "## Open-loop flows" in summary and "| flow size | flows |" in summary
    assert "open-loop flows' arrival rate" in summary
    assert (folder / "plots" / "slowdown.png").exists()
    saved = json.loads((folder / "metrics.json").read_text())
    assert saved["open_loop"]["kind"] == "flows"


@pytest.mark.root
def test_rpcs_are_answered_and_keep_littles_law(tmp_path, host_untouched):
    folder, metrics = _run(tmp_path, workload="rpc", rpc_count=12, rpc_concurrency=2,
                           rpc_response_bytes=20000)
    assert metrics["ok"] and metrics["flows"]["exactly_once"]
    ol = metrics["open_loop"]
    assert ol["kind"] == "rpc" and ol["rpcs_done"] == ol["rpcs_asked"] == 24
    assert ol["latency_p50_s"] >= ol["alone_mean_s"] * 0.95
    assert ol["latency_p50_s"] <= ol["latency_p99_s"] <= ol["latency_p999_s"]
    summary = (folder / "summary.md").read_text()
    assert "## Request/response" in summary and "Little's law" in summary
    assert (folder / "plots" / "rpc_latency.png").exists()


def test_rate_auto_prices_open_loop_flows_per_flow_not_per_bit(monkeypatch):
    """A mouse of 300 B is a whole packet and a flow's own cost: the budget counts
    flows x (packets each + FLOW_COST_PACKETS), so mice lower the faithful rate."""
    from testbed import rate
    from testbed.experiment import Experiment
    from testbed.run import pick_endpoints

    cal = {"cost_us_per_packet": 10.0, "cost_us_per_hop": 2.0, "budget_pps_direct": 100_000,
           "date_utc": "now"}
    exp = Experiment(workload="flows", flow_sizes="google_rpc", flow_count=300,
                     topology={"kind": "leaf_spine", "params": {"leaves": 2, "spines": 2,
                                                                "hosts_per_leaf": 2}})
    topo = exp.resolve_topology()
    ranks, pairs = pick_endpoints(exp, topo)
    load_ = rate.offered_load(exp, topo, ranks, pairs)
    mean = load_["offered_mbps"] * 1e6 / 8 / load_["flows_per_s"]
    assert load_["packets_per_flow"] >= 1 and mean > 0
    priced = rate.predict(cal, exp, topo, ranks, pairs)["max_faithful_mbps"]
    monkeypatch.setattr(rate, "FLOW_COST_PACKETS", 0.0)
    got = rate.predict(cal, exp, topo, ranks, pairs)
    bare = got["max_faithful_mbps"]
    assert priced < bare
    # per bit alone (full frames) would have priced google_rpc's mice far cheaper
    bits_only = rate.UTILIZATION / (load_["offered_mbps"] / rate.base_rate_mbps(topo) * 1e6
                                    / rate.frame_bits(exp.payload_bytes)
                                    * got["cost_us_per_packet"] / 1e6)
    assert bare < bits_only
