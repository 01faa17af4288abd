"""A flow's time split into causes (testbed.attribution) on constructed cases, the
kernel route request (fabric.paths) byte by byte, and DCQCN at its own line rate
(testbed.dcqcn_model). No root: the cases are data."""

from __future__ import annotations

import errno
import socket
import struct

import networkx as nx
import pytest

from fabric import paths
from testbed import attribution as att
from testbed import link_check, plots, split_bars
from testbed.dcqcn_model import incast
from traffic.agent_config import FRAME_OVERHEAD_BYTES
from traffic.transport import RoceSender
from traffic.transport_settings import TransportParams

S = 10**9          # ns per second


def _flow(tag: str, dst: str, start_s: float, end_s: float, size: int = 1_000_000,
          **extra) -> dict:
    return {"role": "send", "tag": tag, "iteration": 0, "dst": dst, "size_bytes": size,
            "npackets": size // 4000, "packets": size // 4000, "retransmits": 0,
            "start_ns": int(start_s * S), "end_ns": int(end_s * S), **extra}


def _wire_bits(f: dict) -> float:
    return 8 * (f["size_bytes"] + f["npackets"] * FRAME_OVERHEAD_BYTES)


def test_max_min_shares_a_link_evenly_and_gives_the_rest_to_the_others():
    weights = {"a": {("x", "y"): 1.0}, "b": {("x", "y"): 1.0, ("y", "z"): 1.0},
               "c": {("y", "z"): 1.0}}
    rate, neck = att.max_min(["a", "b", "c"], weights, {("x", "y"): 10.0, ("y", "z"): 100.0})
    assert rate == pytest.approx({"a": 5.0, "b": 5.0, "c": 95.0})
    assert neck["a"] == neck["b"] == ("x", "y") and neck["c"] == ("y", "z")


def test_spread_weights_split_evenly_at_every_hop():
    routes = {"leaf0": {"d": ("s0", "s1")}, "s0": {"d": ("leaf1",)}, "s1": {"d": ("leaf1",)},
              "leaf1": {"d": ("d",)}}
    w = att.spread_weights(routes, "h", "d", ["leaf0"])
    assert w == pytest.approx({("h", "leaf0"): 1.0, ("leaf0", "s0"): 0.5, ("leaf0", "s1"): 0.5,
                               ("s0", "leaf1"): 0.5, ("s1", "leaf1"): 0.5,
                               ("leaf1", "d"): 1.0})


def test_a_flow_sharing_a_link_with_k_others_is_split_at_a_share_of_one_in_k_plus_1():
    link = ("leaf", "spine")
    k = 3
    flows = [_flow(f"f{i}", "d", 0.0, 4.0) for i in range(k + 1)]
    agents = {f"h{i}": {"flows": [f]} for i, f in enumerate(flows)}
    weights = {att.flow_id(f"h{i}", f): {(f"h{i}", "leaf"): 1.0, link: 1.0}
               for i, f in enumerate(flows)}
    capacity = {link: 8.0, **{(f"h{i}", "leaf"): 100.0 for i in range(k + 1)}}
    rows = att.attribute(agents, weights, capacity)
    for f in flows:
        r = rows[att.flow_id(f"h{flows.index(f)}", f)]
        assert r["fair_mbps"] == pytest.approx(8.0 / (k + 1))
        assert r["bottleneck"] == "leaf>spine"
        assert r["serialization_s"] == pytest.approx(_wire_bits(f) / 2e6)
        assert r["paused_s"] == r["cc_s"] == r["recovery_s"] == r["acks_s"] == 0
        assert r["unexplained_s"] == pytest.approx(4.0 - sum(r[p] for p in att.PARTS))


def test_a_flow_paused_for_a_known_time_is_split_into_that_pause():
    """Alone on a 10 Mbit/s link for 3 s; in the middle second its port holds frames and
    sends nothing: a third of its capacity is lost, and the pause explains the rest."""
    link = ("h", "leaf")
    f = _flow("f", "d", 0.0, 3.0, size=2_400_000)
    bits = _wire_bits(f)
    per_s = bits / 2 / 8                       # bytes sent per second while it sends
    sent = [0.0, per_s, per_s, 2 * per_s]      # at 0, 1, 2 and 3 s: nothing in (1, 2)
    held = [0.0, 0.0, 1.0, 1.0]                # held by a pause all of (1, 2)
    samples = {link: [(float(t), 50_000, sent[t], held[t]) for t in range(4)]}
    capacity = {link: bits / 2 / 1e6}         # its bytes take exactly 2 s at line rate
    lost = att.lost_fractions(samples, capacity)
    assert lost[link] == [(S, 2 * S, 1.0)]
    rows = att.attribute({"h": {"flows": [f]}}, {att.flow_id("h", f): {link: 1.0}},
                         capacity, lost)
    r = rows[att.flow_id("h", f)]
    assert r["serialization_s"] == pytest.approx(2.0)
    assert r["paused_s"] == pytest.approx(1.0, rel=0.02)
    assert abs(r["unexplained_s"] + r["hops_s"]) < 0.03


def test_a_port_that_sends_at_line_rate_or_holds_nothing_lost_no_capacity():
    link = ("a", "b")                         # 10 Mbit/s with frames queued, then empty
    samples = {link: [(0.0, 9000, 0, 0.0), (1.0, 9000, 1_250_000, 0.5),
                      (2.0, 0, 1_259_000, 0.5), (3.0, 0, 1_259_000, 0.6)]}
    assert att.lost_fractions(samples, {link: 10.0}) == {link: [(0, S, 0.0)]}


def test_a_port_never_paused_lost_nothing_to_pfc():
    """PFC off: a port that sent nothing for a second with frames queued was not paused
    (the emulator's or the samples'), so no flow through it is "paused by PFC"."""
    link = ("a", "b")
    samples = {link: [(0.0, 9000, 0, 0.0), (1.0, 9000, 0, 0.0), (2.0, 9000, 1_250_000, 0.0)]}
    assert att.lost_fractions(samples, {link: 10.0}) == {}
    # held for a quarter of a second it sent nothing in: a quarter lost, not all of it
    samples[link][1] = (1.0, 9000, 0, 0.25)
    samples[link][2] = (2.0, 9000, 1_250_000, 0.25)
    assert att.lost_fractions(samples, {link: 10.0}) == {link: [(0, S, 0.25)]}


def test_timeouts_and_dcqcn_are_their_own_parts():
    link = ("h", "d")
    f = _flow("f", "d", 0.0, 2.0, rto_wait_ns=int(0.3 * S), retransmits=10)
    agents = {"h": {"flows": [f], "cc": {"qps": {"d": {
        "line_mbps": 100.0, "rate_mbps": [[int(1.0 * S), 25.0]]}}}}}
    rows = att.attribute(agents, {att.flow_id("h", f): {link: 1.0}}, {link: 100.0})
    r = rows[att.flow_id("h", f)]
    frame = f["size_bytes"] / f["npackets"] + FRAME_OVERHEAD_BYTES
    assert r["recovery_s"] == pytest.approx(0.3 + 10 * 8 * frame / 100e6)
    assert r["cc_s"] == pytest.approx(1.0 * (1 - 25 / 100))   # 1 s at a quarter of its share


def test_acks_held_on_the_way_back_are_counted_when_the_window_runs_out():
    link = ("h", "d")
    f = _flow("f", "d", 0.0, 6.0, rtt_mean_ns=int(0.2 * S), window_packets=10)
    agents = {"h": {"flows": [f]}, "d": {"flows": [], "latency_ns": [["f", 0, 1_000_000]] * 5}}
    rows = att.attribute(agents, {att.flow_id("h", f): {link: 1.0}}, {link: 100.0})
    r = rows[att.flow_id("h", f)]
    frame = f["size_bytes"] / f["npackets"] + FRAME_OVERHEAD_BYTES
    back = 0.2 - 0.001                               # the round trip less the way there
    window_bps = 10 * frame * 8 / 0.2                # the window over a 0.2 s round trip
    model = back + _wire_bits(f) / window_bps - r["serialization_s"]
    assert model < 6.0 and r["acks_s"] == pytest.approx(model) and r["overlap_s"] == 0
    f["end_ns"] = 3 * S            # done sooner than the model says: charged what is left
    r = att.attribute(agents, {att.flow_id("h", f): {link: 1.0}}, {link: 100.0})["h:f#0"]
    assert r["acks_s"] == pytest.approx(3.0 - r["serialization_s"] - r["hops_s"])
    assert r["unexplained_s"] == pytest.approx(0, abs=1e-9)
    assert r["overlap_s"] == pytest.approx(model - r["acks_s"])
    f["window_packets"] = 10_000                     # a window that never runs out
    rows = att.attribute(agents, {att.flow_id("h", f): {link: 1.0}}, {link: 100.0})
    assert rows[att.flow_id("h", f)]["acks_s"] == 0


def test_fluid_completion_is_the_collision_model():
    link = ("l", "s")
    done = att.fluid_completion({"a": 10e6, "b": 20e6}, {"a": {link: 1.0}, "b": {link: 1.0}},
                                {link: 10.0})
    assert done == pytest.approx({"a": 2.0, "b": 3.0})


def test_summary_names_why_the_split_is_missing_and_explains_the_slowest():
    assert att.summary_lines({"unavailable": "5000 flows"})[-1] == "Not split: 5000 flows."
    nothing = att.summarize({}, {}, {"kernel": 0, "spread": 0}, None)
    assert att.summary_lines({**nothing, "slowest": []})[-1] == \
        "No send flow finished: nothing to split."
    link = ("h", "d")
    f = _flow("f", "d", 0.0, 1.0)
    agents = {"h": {"flows": [f]}}
    rows = att.attribute(agents, {att.flow_id("h", f): {link: 1.0}}, {link: 100.0})
    summary = att.summarize(rows, agents, {"kernel": 1, "spread": 0}, 0.01)
    summary["slowest"] = att.explain(rows, agents)
    text = "\n".join(att.summary_lines(summary))
    assert "h:f#0" in text and "bottleneck h>d" in text and "unexplained" in text
    assert summary["unexplained_max_fraction"] == pytest.approx(
        abs(rows[att.flow_id("h", f)]["unexplained_s"]))


def test_route_request_carries_the_five_tuple_and_the_answer_is_read():
    msg = paths.route_request("198.19.0.1", "198.19.0.2", iif=7, sport=50000, seq=3)
    length, kind, flags, seq, _ = struct.unpack_from("=IHHII", msg)
    assert (length, kind, flags, seq) == (len(msg), paths.RTM_GETROUTE, paths.NLM_F_REQUEST, 3)
    attrs, at = {}, 16 + 12
    while at < len(msg):
        size, k = struct.unpack_from("=HH", msg, at)
        attrs[k] = msg[at + 4:at + size]
        at += (size + 3) & ~3
    assert attrs[paths.RTA_DST] == socket.inet_aton("198.19.0.2")
    assert attrs[paths.RTA_SRC] == socket.inet_aton("198.19.0.1")
    assert struct.unpack("=I", attrs[paths.RTA_IIF]) == (7,)
    assert attrs[paths.RTA_IP_PROTO] == bytes([socket.IPPROTO_UDP])
    assert struct.unpack("!H", attrs[paths.RTA_SPORT]) == (50000,)
    assert struct.unpack("!H", attrs[paths.RTA_DPORT]) == (paths.ROCE_UDP_PORT,)
    body = struct.pack("=BBBBBBBBI", 2, 32, 0, 0, 254, 0, 0, 1, 0) + \
        struct.pack("=HHI", 8, 15, 254) + struct.pack("=HHI", 8, paths.RTA_OIF, 9)
    reply = struct.pack("=IHHII", 16 + len(body), paths.RTM_NEWROUTE, 0, 3, 0) + body
    assert paths.output_ifindex(reply) == 9
    error = struct.pack("=IHHII", 36, paths.NLMSG_ERROR, 0, 3, 0) + struct.pack(
        "=i", -errno.ENETUNREACH) + msg[:16]
    with pytest.raises(OSError) as exc:
        paths.output_ifindex(error)
    assert exc.value.errno == errno.ENETUNREACH


def test_dcqcn_at_40g_leaves_a_short_incast_idle_and_a_long_one_near_line_rate():
    """The paper's parameters at the paper's rate: 8 x 4 MB lasts 6.5 ms, about the
    time additive increase takes to win back a cut; 8 x 40 MB lasts ten times longer."""
    short = incast(message_bytes=4_000_000)
    long = incast(message_bytes=40_000_000)
    assert short["jct_over_ideal"] > 1.4 and short["cnps"] > 0
    assert long["jct_over_ideal"] < 1.15
    assert short["lowest_rate_fraction"] < 0.1


def test_a_path_is_written_as_its_hops_and_read_back():
    w = att.path_weights(["h", "leaf0", "spine1", "leaf1", "d"])
    assert att.path_text("h", "d", w) == "h>leaf0>spine1>leaf1>d"
    assert att.weights_of("h>leaf0>spine1>leaf1>d", {}, "h", "d", ["leaf0"]) == w
    routes = {"leaf0": {"d": ("s0", "s1")}, "s0": {"d": ("d",)}, "s1": {"d": ("d",)}}
    spread = att.spread_weights(routes, "h", "d", ["leaf0"])
    assert att.path_text("h", "d", spread) == "spread"
    assert att.weights_of("spread", routes, "h", "d", ["leaf0"]) == spread


def test_a_senders_wait_for_its_data_is_before_its_flow_not_in_it():
    """Step 2 starts 0.5 s after step 1 ended (its input arrived then): that wait is
    the flow's `waited_s`, and its own time is split as usual."""
    link = ("h", "d")
    f1, f2 = _flow("s1", "d", 1.0, 2.0), _flow("s2", "d", 2.5, 3.5)
    agents = {"h": {"flows": [f1, f2], "iterations": [{"start_ns": int(0.8 * S)}]}}
    weights = {att.flow_id("h", f): {link: 1.0} for f in (f1, f2)}
    rows = att.attribute(agents, weights, {link: 100.0})
    assert rows["h:s1#0"]["waited_s"] == pytest.approx(0.2)
    assert rows["h:s2#0"]["waited_s"] == pytest.approx(0.5)
    summary = att.summarize(rows, agents, {"kernel": 2, "spread": 0}, None)
    assert summary["waited_s"] == pytest.approx(0.7)
    assert "waited 0.700 s in all" in "\n".join(att.summary_lines(
        {**summary, "slowest": att.explain(rows, agents)}))


def test_the_plot_never_draws_a_flow_past_its_measured_time():
    over = {"fct_s": "2.0", "serialization_s": "1.5", "hops_s": "0.1", "paused_s": "0",
            "acks_s": "0", "recovery_s": "1.4", "cc_s": "0", "starved_s": "0",
            "unexplained_s": "-1.0"}
    parts, scale = split_bars.bar_parts(over)
    assert sum(parts.values()) == pytest.approx(2.0) and scale == pytest.approx(2.0 / 3.0)
    assert parts["recovery_s"] == pytest.approx(1.4 * 2 / 3) and parts["unexplained_s"] == 0
    under = {**over, "recovery_s": "0.1", "unexplained_s": "0.3"}
    parts, scale = split_bars.bar_parts(under)
    assert scale == 1.0 and sum(parts.values()) == pytest.approx(2.0)


def _split_row(tag: str, fct_s: float, **parts: float) -> dict:
    row = {"node": "h", "tag": tag, "iteration": "0", "fct_s": str(fct_s)}
    row |= {p: "0" for p in (*att.PARTS, "unexplained_s")}
    row |= {p: str(v) for p, v in parts.items()}
    row["unexplained_s"] = str(fct_s - sum(parts.values()))
    return row


# a 15:1 incast's flows: one that beat its max-min share (its share's time 2.55 s, its
# FCT 1.19 s), one slower than its share, and one of a split that did not charge its
# overlapping causes once (recovery three times its FCT)
SPLIT_ROWS = [_split_row("fast", 1.19, serialization_s=2.55, hops_s=0.001),
              _split_row("slow", 2.54, serialization_s=1.61, hops_s=0.001),
              _split_row("old", 26.8, serialization_s=0.73, recovery_s=80.0)]


def test_no_segment_of_a_bar_passes_the_measured_fct():
    shown = split_bars.bar_rows(SPLIT_ROWS, k=24)
    assert [r["tag"] for r, _, _ in shown] == ["fast", "slow", "old"]     # slowest last
    for row, segments, _ in shown:
        fct = float(row["fct_s"])
        assert all(left + width <= fct * (1 + 1e-12) for _, left, width in segments)
        assert sum(width for _, _, width in segments) == pytest.approx(fct)
    notes = {r["tag"]: note for r, _, note in shown}
    assert notes == {"fast": " (x0.47, faster than its share)", "slow": "",
                     "old": " (x0.33, causes overlap)"}
    assert [r["tag"] for r, _, _ in split_bars.bar_rows(SPLIT_ROWS, k=1)] == ["old"]


def test_the_split_plot_hands_matplotlib_no_bar_past_its_fct(tmp_path, monkeypatch):
    columns = list(SPLIT_ROWS[0])
    with open(tmp_path / "flows.csv", "w") as fh:
        fh.write(",".join(columns) + "\n")
        fh.writelines(",".join(r[c] for c in columns) + "\n" for r in SPLIT_ROWS)
    figures = []
    monkeypatch.setattr(plots, "save_plot", lambda fig, folder, name: figures.append(fig))
    plots.split_plot(tmp_path)
    (fig,) = figures
    ends: dict[int, float] = {}
    for bar in fig.axes[0].patches:
        y = round(bar.get_y() + bar.get_height() / 2)
        ends[y] = max(ends.get(y, 0.0), bar.get_x() + bar.get_width())
    fcts = [1.19, 2.54, 26.8]
    assert sorted(ends) == [0, 1, 2]
    assert all(ends[y] <= fcts[y] * (1 + 1e-12) for y in ends)
    assert ends[0] == pytest.approx(1.19) and ends[2] == pytest.approx(26.8)


# -- under loss: causes that overlap on a flow's own timeline are counted once ----------
def _lossy(end_s: float, **extra) -> tuple[dict, dict, dict]:
    """One 1 MB flow alone on a 100 Mbit/s link (0.08 s at its share), its receiver's
    record with `arrivals` packets; (agents, weights, capacity)."""
    arrivals = extra.pop("arrivals", None)
    f = _flow("f", "d", 0.0, end_s, **extra)
    recv = {**f, "role": "recv", "src": "h", "packets": arrivals or f["npackets"]}
    return ({"h": {"flows": [f]}, "d": {"flows": [recv]}}, {"h:f#0": {("h", "d"): 1.0}},
            {("h", "d"): 100.0})


def _adds_up(r: dict, fct_s: float) -> None:
    assert all(r[p] >= 0 for p in (*att.PARTS, "overlap_s"))
    assert sum(r[p] for p in att.PARTS) + r["unexplained_s"] == pytest.approx(fct_s)
    assert abs(r["unexplained_s"]) <= 0.05 * fct_s and r["unexplained_s"] >= -1e-9


def test_two_timeouts_in_a_row_are_charged_the_time_their_waits_cover_once():
    """Two RTOs without progress, 0.5 s each, and a go-back-N window resent after each
    that arrived as duplicates: the waits overlap the resent windows' wire time, and the
    flow took 1.0 s. Waits that overlapped each other (1.5 s reported) are cut alike."""
    frame_s = 8 * (4000 + FRAME_OVERHEAD_BYTES) / 100e6
    for waited_s in (1.0, 1.5):
        agents, weights, capacity = _lossy(1.0, timeouts=2, rto_wait_ns=int(waited_s * S),
                                           retransmits=128, arrivals=250 + 128)
        r = att.attribute(agents, weights, capacity)["h:f#0"]
        _adds_up(r, 1.0)
        resent = 128 * frame_s                       # the duplicates' wire time, at its share
        assert r["recovery_s"] == pytest.approx(1.0 - r["serialization_s"] - r["hops_s"])
        assert r["recovery_s"] >= resent
        assert r["overlap_s"] == pytest.approx(
            r["serialization_s"] + r["hops_s"] + resent + waited_s - 1.0)


def test_a_pause_during_a_recovery_is_the_pauses_and_the_rest_the_recoverys():
    """Alone on a 10 Mbit/s link for 2 s: 0.8 s at its share, held by PFC with frames
    queued the whole second (1, 2) s, and an RTO that waited 0.9 s of that same second."""
    link = ("h", "d")
    f = _flow("f", "d", 0.0, 2.0, timeouts=1, rto_wait_ns=int(0.9 * S), retransmits=10)
    recv = {**f, "role": "recv", "src": "h", "packets": f["npackets"]}
    capacity = {link: _wire_bits(f) / 0.8e6}
    rows = att.attribute({"h": {"flows": [f]}, "d": {"flows": [recv]}}, {"h:f#0": {link: 1.0}},
                         capacity, {link: [(S, 2 * S, 1.0)]})
    r = rows["h:f#0"]
    _adds_up(r, 2.0)
    assert r["serialization_s"] == pytest.approx(0.8)
    assert r["paused_s"] == pytest.approx(1.0)
    assert r["recovery_s"] == pytest.approx(2.0 - 1.8 - r["hops_s"])     # what is left
    assert r["overlap_s"] == pytest.approx(0.9 - r["recovery_s"])


def test_go_back_n_resends_cost_wire_time_only_for_the_copies_that_arrived():
    """500 resends, of which 100 reached the receiver as copies it threw away (the rest
    were lost on the way): 100 frames' wire time at its share, and the timeout waits."""
    frame_s = 8 * (4000 + FRAME_OVERHEAD_BYTES) / 100e6
    agents, weights, capacity = _lossy(0.5, timeouts=1, rto_wait_ns=int(0.2 * S),
                                       retransmits=500, arrivals=250 + 100)
    r = att.attribute(agents, weights, capacity)["h:f#0"]
    assert r["recovery_s"] == pytest.approx(100 * frame_s + 0.2)
    assert r["overlap_s"] == 0
    assert r["unexplained_s"] == pytest.approx(0.5 - 0.2 - 350 * frame_s - r["hops_s"])
    assert all(r[p] >= 0 for p in (*att.PARTS, "unexplained_s"))
    agents, weights, capacity = _lossy(0.3, timeouts=1, rto_wait_ns=int(0.2 * S),
                                       retransmits=500, arrivals=250 + 100)
    r = att.attribute(agents, weights, capacity)["h:f#0"]        # the wait overlapped
    _adds_up(r, 0.3)
    assert r["recovery_s"] == pytest.approx(0.3 - r["serialization_s"] - r["hops_s"])


def test_two_timeouts_in_a_row_each_measure_their_own_wait():
    """The transport: a second RTO with no progress since the first measures from the
    first, so their waits never overlap."""
    tx = RoceSender(20, TransportParams(window_packets=4, ack_every=1, rto_ms=5))
    while tx.take(1000) >= 0:
        pass
    rto = tx.rto_ns
    assert tx.on_timer(1000 + rto) and tx.on_timer(1000 + 2 * rto)
    assert tx.timeouts == 2 and tx.rto_wait_ns == 2 * rto


class _Line:
    """h - s1 - s2 - d, each link with one port per end named after its peer."""

    def __init__(self):
        self.graph = nx.Graph()
        for n, fw in (("h", False), ("s1", True), ("s2", True), ("d", False)):
            self.graph.add_node(n, forwards=fw)

    def peer(self, node: str, ifname: str) -> str:
        return ifname.split("-")[1]


def test_the_path_check_counts_what_the_ports_sent_not_what_was_dropped_before():
    """700 frames sent (its host port refused 300 more: never counted as sent), 100
    dropped at s1's port toward s2: s1's counter sent 600 frames, and so does the check
    predict."""
    f = _flow("f", "d", 0.0, 1.0, size=4_000_000)
    f["packets"] = 700
    frame = att.frame_bytes(f)
    weights = {"h:f#0": att.path_weights(["h", "s1", "s2", "d"])}
    totals = {("h", "h-s1"): {"tx_bytes": 700 * frame, "drops": 300},
              ("s1", "s1-s2"): {"tx_bytes": 600 * frame, "drops": 100},
              ("s2", "s2-d"): {"tx_bytes": 600 * frame, "drops": 0}}
    assert att.path_check({"h": {"flows": [f]}}, weights, _Line(), totals) == \
        pytest.approx(0.0, abs=1e-9)
    carried = link_check.carried_frames({"a": ("h", 600), "b": ("h", 400)},
                                        {"a": weights["h:f#0"], "b": weights["h:f#0"]},
                                        {("s1", "s2"): 100})
    assert carried["a"][("s1", "s2")] == pytest.approx(540)    # drops shared 60:40
    assert carried["b"][("s2", "d")] == pytest.approx(360)
