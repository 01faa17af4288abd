"""Workload schedules and collective formulas (no root)."""

from __future__ import annotations

import pytest

from traffic.workloads import (
    build_schedule,
    busbw_factor,
    ideal_time_s,
    nccl_table,
    schedule_from_data,
    schedule_to_data,
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
