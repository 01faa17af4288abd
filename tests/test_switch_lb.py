"""Switch-side load balancing (fabric.switch_lb): path hashes, settings, and on a real
fabric where the switches sent the frames."""

from __future__ import annotations

import pytest

from fabric.lossless import PfcMode, SwitchSettings
from fabric.switch_lb import MAX_PATHS, lb_config, path_hashes
from topologies.spec import SpecError


def kernel_pick(path_hash: int, weights: list[int]) -> int:
    """fib_select_multipath: the first next hop whose upper bound is >= hash >> 1."""
    total, cum, h = sum(weights), 0, path_hash >> 1
    for i, w in enumerate(weights):
        cum += w
        if h <= ((cum << 31) + total // 2) // total - 1:
            return i
    raise AssertionError("past the last upper bound")


@pytest.mark.parametrize("weights", [[1, 1], [1, 1, 1], [1] * 8, [1, 2, 1], [3, 1]])
def test_each_path_hash_selects_its_own_next_hop(weights):
    hashes = path_hashes(weights)
    assert [kernel_pick(h, weights) for h in hashes] == list(range(len(weights)))
    assert all(0 <= h < 1 << 32 and h % 2 == 0 for h in hashes)


def test_settings_name_the_key_and_bring_the_counted_class():
    assert SwitchSettings(pfc="off", switch_lb="dlb").switch_lb == "dlb"
    with pytest.raises(SpecError, match="switch_lb.*ecmp, dlb, adaptive"):
        SwitchSettings(pfc="on", switch_lb="conga")
    # a feature on the counted queues brings the lossless class, unpaused, unless PFC
    # is asked for; each is a switch of its own
    for key, value in (("switch_lb", "adaptive"), ("ecn", "on"), ("trimming", "on")):
        got = SwitchSettings(**{key: value})
        assert got.mode is PfcMode.OFF and got.counted_by == [key] and not got.enabled
        assert SwitchSettings(pfc="on", **{key: value}).mode is PfcMode.ON
    assert SwitchSettings().mode is PfcMode.NONE and SwitchSettings().counted_by == []
    with pytest.raises(SpecError, match="switch_lb_gap_us"):
        SwitchSettings(pfc="on", switch_lb="dlb", switch_lb_gap_us=0)


def test_program_config_refuses_what_it_cannot_encode():
    with pytest.raises(ValueError, match="mode"):
        lb_config(0, "ecmp", 1000, 10, 20)
    with pytest.raises(ValueError, match="gap_ns"):
        lb_config(0, "dlb", 1 << 31, 10, 20)
    cfg = lb_config(3, "dlb", 1000, 10, 20)
    assert (cfg.switch_no, cfg.dlb, cfg.gap_ns, cfg.ecn_base, cfg.load_base) == (
        3, 1, 1000, 10, 20)
    assert lb_config(0, "adaptive", 0, 0, 0).dlb == 0 and MAX_PATHS == 8


# -- on real fabrics (root) ---------------------------------------------------------------
def _uplink_bytes(fab) -> dict[str, int]:
    out = {}
    with fab.ipr("leaf0") as ipr:
        for spine in ("spine0", "spine1"):
            link = ipr.get_links(ifname=fab.plan.port("leaf0", spine).ifname)[0]
            out[spine] = link.get_attr("IFLA_STATS64")["tx_bytes"]
    return out


def _elephants(fab, tmp_path, mode: str, size: int = 3_000_000,
               seed: int = 1) -> tuple[dict, dict, dict]:
    """Two elephants from leaf0 to leaf1 of `fab` (2 spines) with the switches in `mode`:
    (bytes each leaf0 uplink sent meanwhile, the agents' results, the controller's
    report)."""
    from fabric import switch_control
    from traffic.launch import run_agents
    from traffic.workloads import build_schedule
    sched = build_schedule("p2p", ["l0h0", "l0h1", "l1h0", "l1h1"], size,
                           pairs=[("l0h0", "l1h0"), ("l0h1", "l1h1")])
    settings = SwitchSettings(pfc="off", switch_lb=mode, switch_lb_gap_us=2000.0)
    with switch_control.controller_running(fab, settings) as ctl:
        before = _uplink_bytes(fab)
        res = run_agents(fab, sched, workdir=tmp_path, transport="uet", entropy="ecmp",
                         rto_ms=200.0, timeout_s=60.0, seed=seed)
        after = _uplink_bytes(fab)
    assert all(r["ok"] for r in res.values()), {n: r["error"] for n, r in res.items()}
    recvs = [f for r in res.values() for f in r["flows"] if f["role"] == "recv"]
    assert len(recvs) == 2 and all(f["exactly_once"] for f in recvs)
    return {s: after[s] - before[s] for s in after}, res, ctl.report()


COLLIDING_SEED = 5   # here the kernel's hash puts both elephants on one spine (seeds 1-8:
                     # 5 and 8 collide); another kernel may hash otherwise, DLB must not


@pytest.mark.root
def test_dlb_puts_two_colliding_elephants_on_different_uplinks(fabric, tmp_path):
    """Each elephant is one flowlet on one uplink; the second to start sees the first's
    load and takes the other, so each uplink carries one elephant where ECMP's hash put
    both on one spine."""
    from topologies import leaf_spine
    fab = fabric(leaf_spine(leaves=2, spines=2, hosts_per_leaf=2), seed=COLLIDING_SEED)
    ecmp, _, rep_ecmp = _elephants(fab, tmp_path / "ecmp", "ecmp", 1_000_000,
                                   COLLIDING_SEED)
    sent, _, rep = _elephants(fab, tmp_path / "dlb", "dlb", seed=COLLIDING_SEED)
    total = sum(sent.values())
    assert total >= 2 * 3_000_000
    assert min(sent.values()) >= 0.35 * total, (sent, "ECMP:", ecmp)
    lb = rep["switch_lb"]
    assert lb["mode"] == "dlb" and lb["mechanism"].startswith("dlb: tc clsact eBPF")
    assert lb["steered"] > 0 and not rep["errors"]
    # ECMP is the kernel's hash, untouched: nothing steered
    assert rep_ecmp["switch_lb"]["steered"] == 0
    assert rep_ecmp["switch_lb"]["mechanism"].startswith("ecmp")


@pytest.mark.root
def test_adaptive_spreads_one_flows_packets_over_both_uplinks(fabric, tmp_path):
    """Per packet, least loaded first: even one flow uses both spines."""
    from fabric import switch_control
    from topologies import leaf_spine
    from traffic.launch import run_agents
    from traffic.workloads import build_schedule
    fab = fabric(leaf_spine(leaves=2, spines=2, hosts_per_leaf=2))
    sched = build_schedule("p2p", ["l0h0", "l1h0"], 2_000_000)
    with switch_control.controller_running(
            fab, SwitchSettings(pfc="off", switch_lb="adaptive")) as ctl:
        before = _uplink_bytes(fab)
        res = run_agents(fab, sched, workdir=tmp_path, transport="uet", entropy="ecmp",
                         rto_ms=200.0, timeout_s=60.0)
        after = _uplink_bytes(fab)
    assert all(r["ok"] for r in res.values())
    (recv,) = [f for f in res["l1h0"]["flows"] if f["role"] == "recv"]
    assert recv["exactly_once"]
    sent = {s: after[s] - before[s] for s in after}
    assert min(sent.values()) >= 0.25 * sum(sent.values()), sent
    assert ctl.report()["switch_lb"]["steered"] > 0
