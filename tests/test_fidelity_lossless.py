"""The lossless class in the fidelity verdict: with PFC on, a lossless drop is the
emulator's failure unless the thresholds could not be lossless; a reaction beyond the
headroom is degraded; with PFC off, drops are the lossy class's physics."""

from testbed import fidelity
from tests.test_fidelity import agent, clock_port

SIZED_MS = 1.784
NOTE = ("buffer 65536 B cannot hold 8 x (XOFF 9000 B + headroom 13916 B for 1.78 ms at "
        "25 Mbit/s): drops are possible; needs >= 183328 B")


def pfc_report(drops=0, enabled=True, verdict="ok", slowest_ms=0.9, max_gap_ms=1.2,
               bad=()) -> dict:
    """pfc.json's shape (fabric.switch_report.report): `bad` ingresses' thresholds do
    not fit their buffer; a leaf3 egress dropped `drops` lossless frames."""
    ingresses = ["leaf0:leaf0-eth0", "leaf3:leaf3-eth0", "leaf3:leaf3-eth1"]
    thresholds = {port: {"xoff_bytes": 4808, "xon_bytes": 2404, "headroom_bytes": 13916,
                         "ok": port not in bad, "note": NOTE if port in bad else "",
                         "covers_ms": SIZED_MS} for port in ingresses}
    return {"enabled": enabled, "thresholds": thresholds,
            "headroom": {"verdict": "too_small" if bad else verdict,
                         "thresholds_fit": not bad, "sized_for_reaction_ms": SIZED_MS,
                         "slowest_reaction_ms": slowest_ms,
                         "notes": [f"{p.split(':')[0]}: {NOTE}" for p in bad]},
            "ports": {"leaf0:leaf0-eth4": {"drops": 0},
                      "leaf3:leaf3-eth3": {"drops": drops}},
            "totals": {"drops": drops, "frames_sent": 100, "paused_s": 1.0},
            "controller": {"max_poll_gap_ms": max_gap_ms, "poll_gap_p99_ms": 0.7}}


def test_a_lossless_drop_with_thresholds_that_fit_is_unfaithful():
    """86,073 lossless drops at a leaf with every threshold fitting its buffer, the
    controller stalled 143 ms against 1.784 ms sized: the emulator failed, whatever its
    agents' figures say."""
    pfc = pfc_report(drops=86073, verdict="exceeded", slowest_ms=4.008, max_gap_ms=143.568)
    v = fidelity.verdict({"a": agent()}, cpu_mean_percent=29, pfc_poll_gap_p99_ms=0.7,
                         pfc=pfc)
    assert v["verdict"] == "unfaithful" and v["grades"]["lossless"] == "unfaithful"
    assert v["reasons"] == ["86073 lossless drops with PFC on (slowest reaction 4.008 ms "
                            "and longest poll gap 143.568 ms > 1.784 ms the headroom was "
                            "sized for)"]
    assert v["figures"]["lossless_drops"] == 86073
    assert v["figures"]["pfc_max_poll_gap_ms"] == 143.568
    line = fidelity.summary_line(v)
    assert line.startswith("fidelity: **unfaithful**") and "; lossless drops 86073)" in line
    # a drop the controller's figures do not explain is still the emulator's
    quiet = fidelity.verdict({"a": agent()}, pfc=pfc_report(drops=2))
    assert quiet["verdict"] == "unfaithful"
    assert quiet["reasons"] == ["2 lossless drops with PFC on"]


def test_drops_where_the_thresholds_cannot_be_lossless_are_physics_named_not_graded():
    """A given XOFF or headroom, or a forced rate, that the buffers cannot hold: drops
    are what the user chose. The line names the ingress, on the switch that dropped."""
    pfc = pfc_report(drops=86073, bad=("leaf0:leaf0-eth0", "leaf3:leaf3-eth1"))
    v = fidelity.verdict({"a": agent()}, pfc=pfc)
    assert v["verdict"] == "faithful" and v["grades"]["lossless"] == "faithful"
    assert v["reasons"] == []
    assert v["figures"]["lossless_physics"] == f"leaf3: {NOTE}; 1 more ingresses"
    assert ("lossless drops 86073: the buffers cannot hold fan-in x (XOFF + headroom) at "
            f"this rate (leaf3: {NOTE}; 1 more ingresses), physics, not the emulator"
            ) in fidelity.summary_line(v)
    # metrics.json's "pfc" has no thresholds: its headroom's notes name them
    slim = {k: val for k, val in pfc.items() if k not in ("thresholds", "ports")}
    v = fidelity.verdict({"a": agent()}, pfc=slim)
    assert v["verdict"] == "faithful" and v["figures"]["lossless_physics"] == f"leaf0: {NOTE}"
    # an emulator's own failure elsewhere still decides
    v = fidelity.verdict({"a": agent(starved_ns=5 * 10**8)}, pfc=pfc)
    assert v["verdict"] == "unfaithful" and "starved_fraction" in v["reasons"][0]


def test_a_reaction_beyond_the_headroom_without_drops_is_degraded():
    pfc = pfc_report(verdict="exceeded", slowest_ms=1.3, max_gap_ms=143.568)
    v = fidelity.verdict({"a": agent()}, pfc=pfc)
    assert v["verdict"] == "degraded" and v["grades"]["lossless"] == "degraded"
    assert v["reasons"] == ["PFC reacted beyond its headroom: longest poll gap 143.568 ms "
                            "> 1.784 ms the headroom was sized for (no drops)"]
    assert "lossless drops 0" in fidelity.summary_line(v)
    # measured, not a proxy: with one agent figure past its limit it stays degraded
    v = fidelity.verdict({"a": agent(starved_ns=5 * 10**7)}, pfc=pfc)
    assert v["verdict"] == "degraded" and len(v["reasons"]) == 2


def test_a_lossless_class_that_held_is_faithful_and_shown():
    v = fidelity.verdict({"a": agent()}, pfc=pfc_report())
    assert v["verdict"] == "faithful" and v["reasons"] == []
    assert v["grades"]["lossless"] == "faithful" and v["figures"]["lossless_drops"] == 0
    assert "; lossless drops 0" in fidelity.summary_line(v)


def test_with_pfc_off_drops_are_the_lossy_class_physics():
    off = pfc_report(drops=86073, enabled=False, verdict="exceeded", max_gap_ms=143.568)
    for pfc in (off, None):
        v = fidelity.verdict({"a": agent()}, pfc=pfc)
        assert v["verdict"] == "faithful" and v["reasons"] == []
        assert "lossless" not in v["grades"] and "lossless_drops" not in v["figures"]
        assert "lossless" not in fidelity.summary_line(v)
    # a folder written before the grade existed still reads
    assert "lossless" not in fidelity.summary_line(fidelity.verdict({"a": agent()}))


def test_a_flow_waiting_on_its_retransmission_timer_starves_no_wire():
    """After a loss a go-back-N sender with its window full has nothing it may send
    until its RTO fires: the agent registers no demand for it (Port.waiting with
    ready=tx.ready()), so the wait is the network's loss, not starvation."""
    from traffic.transport import RoceSender
    from traffic.transport_settings import TransportParams

    tx = RoceSender(16, TransportParams(window_packets=4, rto_ms=50.0))
    for _ in range(4):
        assert tx.take(0) >= 0
    assert not tx.ready() and tx.deadline_ns() == 50_000_000    # the lost one's timer
    frame = bytearray(1250)                    # 100 us at 100 Mbit/s
    p, sent = clock_port(100.0, [False], [0])
    p.push(frame, 0)
    p.waiting(100_000, ready=tx.ready())       # the agent sleeps until the RTO
    assert tx.on_timer(50_000_000) and tx.ready() and tx.take(50_000_000) == 0
    p.push(frame, 50_000_000)                  # the resend, on time
    assert p.starved_ns == 0 and len(sent) == 2
    # a flow that could send and was left is starved (the same port, for contrast)
    p.waiting(50_100_000, ready=tx.ready())
    p.push(frame, 51_100_000)
    assert p.starved_ns == 1_000_000


def test_an_ingress_past_its_headroom_is_named():
    """The report's own note (a peak charge beyond XOFF + headroom) is the reason."""
    pfc = pfc_report(verdict="exceeded")
    note = ("2 ingresses took more than their headroom after XOFF (the most: "
            "leaf3:leaf3-eth4, 30000 B against 27000 B); 0 lossless drops")
    pfc["headroom"]["notes"] = [note]
    v = fidelity.verdict({"a": agent()}, pfc=pfc)
    assert v["verdict"] == "degraded"
    assert v["reasons"] == [f"PFC reacted beyond its headroom: {note} (no drops)"]
