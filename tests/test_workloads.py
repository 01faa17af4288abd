"""Workload schedules and collective formulas, and the registry that holds them (no root)."""

from __future__ import annotations

import importlib.util
import time
from collections import Counter

import pytest

from testbed import rate
from testbed.experiment import Experiment, from_toml
from testbed.flow_plan import flow_schedule
from testbed.run import pick_endpoints
from testbed.train_run import job_schedule
from topologies.spec import SpecError
from traffic.workloads import (
    COLLECTIVES,
    JOBS,
    RINGS,
    WORKLOADS,
    WORKLOADS_BY_NAME,
    Workload,
    build_schedule,
    busbw_factor,
    ideal_time_s,
    nccl_table,
    register,
    schedule_from_data,
    schedule_to_data,
    workload_named,
)

RANKS = [f"r{i}" for i in range(4)]


def _bytes_sent(sched):
    return {r: sum(t.size_bytes for s in steps for t in s.sends) for r, steps in sched.items()}


def test_ring_allreduce_moves_2_n_minus_1_over_n_of_the_message():
    sched = build_schedule("allreduce", RANKS, 1000)
    assert all(len(steps) == 2 * 3 for steps in sched.values())
    assert all(b == pytest.approx(2 * 3 / 4 * 1000, abs=6) for b in _bytes_sent(sched).values())
    # a rank receives at step k exactly what its predecessor sends at step k
    for k in range(6):
        for i, r in enumerate(RANKS):
            prev = RANKS[i - 1]
            assert sched[r][k].recvs[0] == sched[prev][k].sends[0]


@pytest.mark.parametrize("workload", ["allgather", "reducescatter"])
def test_half_rings(workload):
    sched = build_schedule(workload, RANKS, 4000)
    assert all(len(steps) == 3 for steps in sched.values())
    assert all(b == 3000 for b in _bytes_sent(sched).values())


def test_alltoall_incast_permutation_p2p():
    a2a = build_schedule("alltoall", RANKS, 4000)
    assert all(len(s[0].sends) == 3 and len(s[0].recvs) == 3 for s in a2a.values())
    inc = build_schedule("incast", RANKS, 500)
    assert len(inc["r3"][0].recvs) == 3 and inc["r3"][0].sends == []
    perm = build_schedule("permutation", RANKS, 100, seed=3)
    assert all(t.src != t.dst for s in perm.values() for t in s[0].sends)
    assert sorted(t.dst for s in perm.values() for t in s[0].sends) == RANKS
    assert perm == build_schedule("permutation", RANKS, 100, seed=3)   # seeded
    p2p = build_schedule("p2p", RANKS, 100)
    assert {(t.src, t.dst) for s in p2p.values() for t in s[0].sends} == {("r0", "r2"),
                                                                        ("r1", "r3")}


def test_tags_unique_and_round_trip():
    sched = build_schedule("allreduce", RANKS, 1000)
    tags = [t.tag for steps in sched.values() for s in steps for t in s.sends]
    assert len(tags) == len(set(tags))
    assert schedule_from_data(schedule_to_data(sched)) == sched


def test_bad_workload_input():
    with pytest.raises(ValueError, match="workload"):
        build_schedule("allscatter", RANKS, 10)
    with pytest.raises(ValueError, match="ranks"):
        build_schedule("allreduce", ["r0"], 10)
    with pytest.raises(ValueError, match="message_bytes"):
        build_schedule("allreduce", RANKS, 0)


def test_nccl_formulas_and_table():
    assert busbw_factor("allreduce", 8) == pytest.approx(2 * 7 / 8)
    assert busbw_factor("alltoall", 8) == pytest.approx(7 / 8)
    # 16 ranks, 1 MB at 100 Mbit/s: 2*15/16 * 1e6 / 12.5e6 s
    assert ideal_time_s("allreduce", 16, 1_000_000, 100) == pytest.approx(0.15)
    table = nccl_table("allreduce", 4, [{"size_bytes": 1_000_000, "time_us": 100_000.0}],
                       unit="MB/s")
    assert "(MB/s)" in table and "10.0000" in table and "15.0000" in table
    assert table.splitlines()[-1] == "# Avg bus bandwidth    : 15.0000 MB/s"


# -- the registry ----------------------------------------------------------------------
def test_the_registry_lists_each_workload_once_and_the_old_lists_come_from_it():
    names = [w.name for w in WORKLOADS_BY_NAME.values()]
    assert len(names) == len(set(names)) and list(WORKLOADS_BY_NAME) == names
    assert Counter(WORKLOADS + JOBS) == Counter(names)      # each once, nowhere else
    assert set(COLLECTIVES) | set(RINGS) <= set(WORKLOADS) and RINGS == rate.RINGS
    assert JOBS == ("train_step",) and set(RINGS) < set(COLLECTIVES)
    with pytest.raises(SpecError) as refused:      # the experiment's choices are its names
        from_toml(None, {"workload": "allscatter"})
    assert all(name in refused.value.message for name in names)
    with pytest.raises(ValueError, match="registered twice"):
        register(WORKLOADS_BY_NAME["p2p"], WORKLOADS_BY_NAME["p2p"])
    with pytest.raises(ValueError, match="workload: 'allscatter' is not one of p2p"):
        workload_named("allscatter")


SIZE = 840 * 100          # divisible by every n below: chunks are whole


@pytest.mark.parametrize("name", [n for n in WORKLOADS
                                  if not WORKLOADS_BY_NAME[n].built_later])
@pytest.mark.parametrize("n", [2, 3, 4, 7, 8])
def test_every_workload_moves_what_its_formula_says(name, n):
    """The busiest port's bytes (sent or received) are ideal_factor(n) x S, every send is
    someone's receive, and the ideal time is that over the link rate."""
    w = WORKLOADS_BY_NAME[name]
    ranks = [f"r{i}" for i in range(n)]
    sched = w.schedule(ranks, SIZE, seed=5)
    sends = Counter(t for steps in sched.values() for st in steps for t in st.sends)
    recvs = Counter(t for steps in sched.values() for st in steps for t in st.recvs)
    assert sends == recvs and all(t.src != t.dst for t in sends)
    sent = Counter({r: 0 for r in ranks})
    got = Counter({r: 0 for r in ranks})
    for t in sends:
        sent[t.src] += t.size_bytes
        got[t.dst] += t.size_bytes
    busiest = max(max(sent.values()), max(got.values()))
    assert busiest == pytest.approx(w.ideal_factor(n) * SIZE)
    assert w.ideal_s(n, SIZE, 100.0) == pytest.approx(busiest * 8 / 100e6)
    assert ideal_time_s(name, n, SIZE, 100.0) == w.ideal_s(n, SIZE, 100.0)
    assert sched == build_schedule(name, ranks, SIZE, seed=5)
    if w.collective:        # nccl-tests: busbw / algbw is what one port carries / S
        assert w.busbw_factor(n) == pytest.approx(w.ideal_factor(n))
    else:
        assert w.busbw_factor(n) == 1.0


def test_a_job_builds_from_its_train_table_not_a_message():
    job = WORKLOADS_BY_NAME["train_step"]
    assert job.job and job.ideal_s(8, SIZE, 100.0) is None and job.busbw_factor(8) == 1.0
    with pytest.raises(ValueError, match="train_step's steps come from its own table"):
        job.schedule(["a", "b"], SIZE)


def _f(n: int) -> float:
    return 1.0


def _build(ranks, size, seed, pairs, tag):
    return {}


@pytest.mark.parametrize("kw, says", [
    ({"load": "flows", "busbw_factor": _f, "ideal_factor": _f}, "no build"),
    ({"load": "flows", "busbw_factor": _f, "build": _build}, "no ideal_factor"),
    ({"load": "ring", "busbw_factor": None, "build": _build, "ideal_factor": _f},
     "no busbw_factor"),
    ({"load": "fluid", "busbw_factor": _f, "build": _build, "ideal_factor": _f},
     "load 'fluid' is not one of flows, ring, job, open"),
    ({"load": "job", "busbw_factor": _f, "build": _build}, "a job workload has no build"),
    ({"load": "open", "busbw_factor": _f, "ideal_factor": _f},
     "an? open workload has no ideal_factor"),
])
def test_a_workload_missing_a_piece_is_refused(kw, says):
    with pytest.raises(TypeError, match=f"workload 'x': {says}"):
        Workload("x", "what it does", **kw)
    with pytest.raises(TypeError, match="no `what`"):
        Workload("x", "", "flows", _f, _build, _f)


def test_a_registry_with_a_broken_entry_fails_at_import(tmp_path):
    path = tmp_path / "more_workloads.py"
    path.write_text("from traffic.workloads import Workload, register\n"
                    "BY_NAME = register(Workload('ping', 'one to one', 'flows', "
                    "lambda n: 1.0))\n")
    spec = importlib.util.spec_from_file_location("more_workloads", path)
    with pytest.raises(TypeError, match="workload 'ping': no build"):
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


# -- the rate's prediction from a workload built once -----------------------------------
def _cal() -> dict:
    return {"machine": rate.machine_key(), "t": time.time(), "date_utc": "now",
            "model": rate.MODEL, "engine": rate.agents_engine(), "cost_us_per_packet": 10.0,
            "cost_us_per_hop": 2.0, "budget_pps_direct": 100_000, "runs": {}}


@pytest.mark.parametrize("settings", [
    {"workload": "allreduce", "ring_order": "rails"}, {"workload": "alltoall"},
    {"workload": "incast", "ranks": 5}, {"workload": "permutation", "seed": 9},
    {"workload": "p2p", "pairs": ["s0g0>s1g3", "s1g0>s0g1"]}, {"workload": "train_step"},
    {"workload": "flows", "flow_sizes": "ali_storage", "flow_background": "allreduce"},
    {"workload": "rpc", "rpc_count": 5}])
def test_the_rate_from_a_prebuilt_workload_is_the_rate_without(settings):
    exp = Experiment(**settings, topology={"kind": "rail_optimized",
                                           "params": {"servers": 2, "gpus_per_server": 4}})
    topo = exp.resolve_topology()
    exp.check_against(topo)
    ranks, pairs = pick_endpoints(exp, topo)
    built = rate.build_workload(exp, ranks, pairs, topo)
    cal = _cal()
    assert rate.offered_load(exp, topo, ranks, pairs, built) == \
        rate.offered_load(exp, topo, ranks, pairs)
    assert rate.pick_rate(cal, exp, topo, ranks, pairs, built=built) == \
        rate.pick_rate(cal, exp, topo, ranks, pairs)
    assert rate.rate_check(cal, exp, topo, ranks, pairs, built) == \
        rate.rate_check(cal, exp, topo, ranks, pairs)
    if exp.workload in JOBS:      # the run scales the same job to its rate
        fresh, _ = job_schedule(exp, topo, ranks, lambda msg: None)
        again, _ = job_schedule(exp, topo, ranks, lambda msg: None, built)
        assert again == fresh
    elif WORKLOADS_BY_NAME[exp.workload].open_loop:   # the run builds it again: the same
        assert built == flow_schedule(exp, topo, ranks, pairs)[0]
    else:
        assert built == build_schedule(exp.workload, ranks, exp.message_bytes,
                                       seed=exp.seed, pairs=pairs)
