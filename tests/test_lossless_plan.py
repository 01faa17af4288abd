"""Planning a lossless run: buffers sized for the headroom, refusals, the timeout."""

import pytest

from fabric.lossless import (
    LOSSLESS_MTU_BYTES,
    bursts_bytes,
    headroom_bytes,
    hold_leak_bytes,
    release_burst_bytes,
    thresholds_for,
)
from fabric.switch_ports import fan_in
from testbed.experiment import Experiment
from testbed.lossless_plan import (
    LOSSLESS_FRAME_BYTES,
    XOFF_FRAMES,
    lossless_refusal,
    lossless_rto_ms,
    needed_buffer_bytes,
    sized_buffer,
    unfit_ingress,
)
from testbed.rate import frame_bits, rescaled
from topologies.files import build
from topologies.spec import DEFAULT_QUEUE_BYTES
from traffic.workloads import build_schedule


def leaf_spine_16(**params):
    return build("leaf_spine", {"leaves": 4, "spines": 4, "hosts_per_leaf": 4, **params})


def incast(**keys) -> Experiment:
    return Experiment(workload="incast", pfc="on", **keys)


def test_headroom_counts_the_upstreams_bursts():
    """After XOFF an ingress still takes the rate over the reaction, the crossing frame,
    the upstream's release burst (its HTB bucket on RoCE frames: two of them) and the
    hold's leak (one jumbo frame): at 25 Mbit/s and 1.8 ms, 27 kB."""
    frame = LOSSLESS_MTU_BYTES + 14
    assert release_burst_bytes(25) == 2 * frame
    assert release_burst_bytes(400) == 50_000            # 1 ms of the rate beyond 2 frames
    assert hold_leak_bytes() == 9014
    assert bursts_bytes(25, LOSSLESS_MTU_BYTES) == frame + 2 * frame + 9014
    assert headroom_bytes(25, 0.0018, LOSSLESS_MTU_BYTES) == 5625 + 3 * frame + 9014
    # what the reaction time covers leaves the bursts out
    th = thresholds_for(1 << 20, 7, 25, 0.0018, LOSSLESS_MTU_BYTES)
    assert th.covers_ms == pytest.approx(1.8, abs=1e-3)


def test_a_15_to_1_leaf_needs_more_than_the_default_buffer():
    """A leaf of the 4 x 4 leaf-spine has 7 ingress ports: 7 x (XOFF + 27 kB) is more
    than 128 KiB at any rate, since the bursts alone are 21.5 kB."""
    exp = incast()
    topo = rescaled(leaf_spine_16(), 25.0)
    assert fan_in(topo, "leaf0") == 7
    assert "leaf" in unfit_ingress(exp, topo)
    need = needed_buffer_bytes(exp, topo)
    room = max(t for t in [headroom_bytes(25, 0.00183, LOSSLESS_MTU_BYTES)])
    assert need % 1024 == 0
    assert 7 * (XOFF_FRAMES * LOSSLESS_FRAME_BYTES + room) <= need < 7 * (
        XOFF_FRAMES * LOSSLESS_FRAME_BYTES + room) + 1024 + 7 * 200
    # the slowest rate does not help: the bursts are bytes
    assert unfit_ingress(exp, rescaled(leaf_spine_16(), 2.0))


def test_default_buffers_are_sized_and_said():
    exp = incast()
    topo = rescaled(leaf_spine_16(), 25.0)
    sized, line = sized_buffer(exp, topo)
    assert unfit_ingress(exp, sized) is None
    assert sized.params["queue_bytes"] == needed_buffer_bytes(exp, topo) > DEFAULT_QUEUE_BYTES
    assert sized.params["rate_mbps"] == 25.0 and sized.scale_factor == topo.scale_factor
    assert f"{sized.params['queue_bytes']} B per port instead of 131072 B" in line
    assert lossless_refusal(exp, sized, force=False) is None


def test_what_fits_or_is_not_pfc_is_left_alone():
    small = rescaled(build("leaf_spine", {}), 25.0)     # 2 hosts and 2 spines a leaf
    assert sized_buffer(incast(), small) == (small, None)
    big = rescaled(leaf_spine_16(), 25.0)
    for exp in (Experiment(workload="incast"), Experiment(workload="incast", pfc="off")):
        assert sized_buffer(exp, big) == (big, None)
        assert lossless_refusal(exp, big, force=False) is None


def test_a_buffer_the_user_set_is_refused_not_resized():
    exp = incast(topology={"kind": "leaf_spine",
                           "params": {"leaves": 4, "spines": 4, "hosts_per_leaf": 4,
                                      "queue_bytes": 192 * 1024}})
    topo = rescaled(exp.resolve_topology(), 25.0)
    assert sized_buffer(exp, topo) == (topo, None)
    why = lossless_refusal(exp, topo, force=False)
    assert why.startswith("with PFC on this fabric cannot be lossless: leaf")
    assert f"queue_bytes >= {needed_buffer_bytes(exp, topo)}" in why and "--force" in why
    assert lossless_refusal(exp, topo, force=True) is None
    # thresholds set by hand are the user's too
    hand = incast(pfc_xoff_bytes=20_000)
    topo = rescaled(leaf_spine_16(), 25.0)
    assert sized_buffer(hand, topo) == (topo, None)
    assert lossless_refusal(hand, topo, force=False)


def test_the_lossless_timeout_outlasts_the_windows_draining():
    """15 senders x 64 frames into one 25 Mbit/s port take 1.28 s to drain: the timeout
    is at least twice that, and the experiment's own when it is longer or PFC is off."""
    topo = rescaled(leaf_spine_16(), 25.0)
    ranks = topo.endpoints()
    schedule = build_schedule("incast", ranks, 1 << 21)
    exp = incast()
    drain_s = 15 * 64 * frame_bits(4096) // 8 * 8 / 25e6
    assert lossless_rto_ms(200.0, exp, topo, schedule) == pytest.approx(2e3 * drain_s, abs=0.1)
    assert lossless_rto_ms(1e4, exp, topo, schedule) == 1e4
    assert lossless_rto_ms(200.0, Experiment(workload="incast"), topo, schedule) == 200.0
    # a message smaller than a window counts as what it is
    tiny = build_schedule("incast", ranks, 8192)
    assert lossless_rto_ms(1.0, exp, topo, tiny) == pytest.approx(
        2e3 * 15 * 2 * frame_bits(4096) // 8 * 8 / 25e6, abs=0.1)
