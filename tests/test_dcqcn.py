"""DCQCN on a real fabric: CE marks at the switches, CNPs on the wire, senders' rates."""

from __future__ import annotations

import subprocess

import pytest

from testbed.experiment import from_toml
from testbed.run import run

pytestmark = pytest.mark.root

SCALE = 400     # 100 Mbit/s for 40 Gb/s (the DCQCN paper's ports): CNP interval 20 ms


def _incast(tmp_path, name: str, **kw):
    settings = {"name": name, "workload": "incast", "message_bytes": 1 << 20,
                "iterations": 1, "transport": "roce", "pfc": "off", "ecn": "on",
                "results_dir": str(tmp_path), "timeout_s": 90.0, "rto_ms": 50.0,
                "topology": {"kind": "leaf_spine", "scale_factor": SCALE, "params": {
                    "leaves": 2, "spines": 1, "hosts_per_leaf": 3}}}
    settings.update(kw)
    return from_toml(None, settings)


def _cnps_in_pcap(pcap) -> list[tuple[float, str]]:
    out = subprocess.run(["tshark", "-r", str(pcap), "-Y", "infiniband.bth.opcode == 129",
                          "-T", "fields", "-e", "frame.time_relative",
                          "-e", "infiniband.bth.destqp", "-e", "ip.dsfield.dscp"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [line.split("\t") for line in out.stdout.splitlines() if line.strip()]
    assert all(dscp == "48" for _, _, dscp in rows)          # the CNP class
    return [(float(t), qp) for t, qp, _ in rows]


def test_dcqcn_incast_cnps_on_the_wire_rate_limited_per_qp_senders_slow_and_recover(
        tmp_path, host_untouched):
    """5:1 incast, ECN alone (no PFC): the receiver answers CE marks with CNPs, at most one
    per QP per interval on the wire (tshark decodes them), every one reaches its sender,
    every sender cuts its rate and raises it again."""
    exp = _incast(tmp_path, "t_dcqcn", cc="dcqcn")
    port = exp.resolve_topology().ifname("leaf1", "l1h2")      # into the receiver
    exp.pcap = [port]
    folder, m = run(exp)
    assert m["flows"]["exactly_once"]
    cc = m["cc"]
    assert cc["algorithm"] == "dcqcn" and cc["cnp_interval_ms"] == 50e-3 * SCALE
    assert cc["ce_packets"] > 0 and 0 < cc["cnps_sent"] <= cc["ce_packets"]
    # the way back (receiver -> senders) carries only ACKs and CNPs: none is lost
    assert cc["cnps_received"] == cc["cnps_sent"] and cc["cnps_unknown"] == 0
    interval_s = cc["cnp_interval_ms"] / 1e3
    cnps = _cnps_in_pcap(folder / "pcaps" / f"{port}.pcap")
    assert 0 < len(cnps) <= cc["cnps_sent"]
    by_qp: dict[str, list[float]] = {}
    for t, qp in cnps:
        by_qp.setdefault(qp, []).append(t)
    for qp, times in by_qp.items():
        # The gate spaces its CNPs >= interval apart on the agent's clock; each then
        # reaches the wire late by the agent's own delay (a preempted agent, a frame
        # queued behind ACKs), so one gap on the wire can be short (15.8 ms against
        # 20 in a loaded CI run). That delay does not add up over a QP's CNPs: n of
        # them span (n - 1) intervals less one delay, and one interval of slack takes
        # any delay up to 20 ms. Without the rate limit a QP gets one CNP per mark.
        span = times[-1] - times[0]
        assert len(times) - 1 <= span / interval_s + 1, (qp, len(times), span)
    senders = {q: v for q, v in cc["qps"].items() if "cuts" in v}
    assert len(senders) == 5
    for qp, v in senders.items():
        assert v["cuts"] >= 1 and v["lowest_mbps"] < v["line_mbps"], qp
        assert v["increases"] >= 1 and v["final_mbps"] > v["lowest_mbps"], qp
    assert (folder / "dcqcn_rates.csv").stat().st_size > 0
    assert (folder / "plots" / "dcqcn_rates.png").read_bytes()[:4] == b"\x89PNG"
    assert "congestion control dcqcn" in (folder / "summary.md").read_text()
    # the share of the receiver's link the senders' rates left them, and what it predicts
    assert cc["held"]["receiver"] == "l1h2" and cc["held"]["senders"] == 5
    assert 0 < cc["held"]["allowed_fraction"] <= 1
    assert "DCQCN let the senders of l1h2 (5) use" in (folder / "summary.md").read_text()


def test_dcqcn_without_pfc_loses_far_fewer_packets_than_no_congestion_control(
        tmp_path, host_untouched):
    """The same incast without PFC: senders at line rate overflow the receiver's port for
    the whole transfer; with DCQCN they lose packets only until the first cuts land."""
    _, none = run(_incast(tmp_path, "t_nocc", cc="none"))
    _, dcqcn = run(_incast(tmp_path, "t_dcqcn_drops", cc="dcqcn"))
    assert none["flows"]["exactly_once"] and dcqcn["flows"]["exactly_once"]
    lost_none = none["pfc"]["totals"]["drops"]
    lost_dcqcn = dcqcn["pfc"]["totals"]["drops"]
    assert none["cc"] is None and dcqcn["cc"]["cnps_sent"] > 0
    assert lost_none > 0 and 3 * lost_dcqcn < lost_none, (lost_dcqcn, lost_none)
