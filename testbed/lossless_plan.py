"""Planning a lossless run before anything is built: buffers that hold the headroom, and
a retransmission timeout that the lossless class's own queueing never reaches.

- **Buffers.** Every switch ingress needs XOFF plus the headroom that still arrives
  after XOFF (fabric.lossless.headroom_bytes: the link rate over the controller's
  reaction, the crossing frame, the upstream's release burst and its hold's leak), and
  all the ingresses of a switch may fill one egress buffer together, so a port's buffer
  must hold fan-in x (XOFF + headroom). Where the topology's buffer is the builders'
  default, the run raises it to the least that holds XOFF_FRAMES frames of XOFF
  besides the headroom at every switch (`sized_buffer`) and says so; where the user
  set it (or set XOFF or headroom by hand), a buffer that cannot be lossless is refused
  unless forced (`lossless_refusal`).
- **The timeout.** A lossless fabric does not drop, so a retransmission timeout can only
  fire spuriously, when an ACK waits longer than the timeout behind paused queues. A
  real RoCE NIC's timeout is milliseconds (4.096 us x 2^n, n = 14 gives 67 ms), a
  thousand times the microseconds a frame queues in a real incast; scaled by x16000 it
  would be minutes here, and a drop the emulator failed to prevent would then stall a
  run for that long. With PFC on the run keeps the experiment's timeout but raises it
  to twice the time the most loaded receiver's link takes to carry every window that
  may be in flight towards it (`lossless_rto_ms`): no timeout fires while queues drain,
  and it is still below a real NIC's in real time.
"""

from __future__ import annotations

import math

from fabric.lossless import ETH_HEADER_BYTES, LOSSLESS_MTU_BYTES
from fabric.switch_ports import assumed_reaction_ms, fan_in, ingress_thresholds
from testbed.experiment import Experiment
from testbed.rate import frame_bits
from topologies.files import build
from topologies.spec import DEFAULT_QUEUE_BYTES, Topology

XOFF_FRAMES = 2            # sized buffers leave XOFF this many lossless frames
LOSSLESS_FRAME_BYTES = LOSSLESS_MTU_BYTES + ETH_HEADER_BYTES
RTO_QUEUE_FACTOR = 2       # the timeout: this many times the worst drain of the windows


def pfc_on(exp: Experiment) -> bool:
    return exp.switch_settings().enabled


def unfit_ingress(exp: Experiment, topo: Topology) -> str | None:
    """The first switch ingress of `topo` (at its rates) whose buffer cannot hold its
    fan-in's XOFF and headroom, as "switch: note", or None when all fit."""
    settings = exp.switch_settings()
    reaction_ms = assumed_reaction_ms(settings.pfc_poll_ms)
    for s in topo.switches():
        for peer in topo.ports(s):
            t = ingress_thresholds(topo, s, peer, settings, reaction_ms)
            if not t.ok:
                return f"{s}: {t.note}"
    return None


def needed_buffer_bytes(exp: Experiment, topo: Topology) -> int:
    """The least per-port buffer, rounded up to KiB, with which every switch ingress of
    `topo` holds XOFF (the experiment's, else XOFF_FRAMES frames) plus its headroom for
    its switch's fan-in."""
    settings = exp.switch_settings()
    reaction_ms = assumed_reaction_ms(settings.pfc_poll_ms)
    xoff = settings.pfc_xoff_bytes or XOFF_FRAMES * LOSSLESS_FRAME_BYTES
    need = 0
    for s in topo.switches():
        for peer in topo.ports(s):
            room = ingress_thresholds(topo, s, peer, settings, reaction_ms).headroom_bytes
            need = max(need, fan_in(topo, s) * (xoff + room))
    return math.ceil(need / 1024) * 1024


def buffer_is_default(topo: Topology) -> bool:
    """The topology's buffer is the builders' default (a user who wants 128 KiB exactly
    and PFC at a fan-in it cannot hold gets it sized too, and is told)."""
    return topo.params.get("queue_bytes") == DEFAULT_QUEUE_BYTES


def sized_buffer(exp: Experiment, topo: Topology) -> tuple[Topology, str | None]:
    """`topo` with buffers that hold every ingress's XOFF and headroom, and the line that
    says so; `topo` as it is (and None) when it needs no change or the user chose the
    buffer or the thresholds (lossless_refusal judges those)."""
    if not pfc_on(exp) or unfit_ingress(exp, topo) is None or not buffer_is_default(topo) \
            or exp.pfc_xoff_bytes or exp.pfc_headroom_bytes:
        return topo, None
    need = needed_buffer_bytes(exp, topo)
    params = {**topo.params, "queue_bytes": need}
    sized = build(topo.kind, params, topo.name, topo.scale_factor)
    return sized, (f"PFC buffers: {need} B per port instead of {topo.params['queue_bytes']} B, "
                   f"the least that holds every switch ingress's XOFF "
                   f"({XOFF_FRAMES} frames) and headroom for its fan-in at "
                   f"{topo.params['rate_mbps']:g} Mbit/s (docs/lossless.md)")


def lossless_refusal(exp: Experiment, topo: Topology, force: bool) -> str | None:
    """Why a PFC run whose buffers or thresholds the user set cannot be lossless (a
    message for SpecError on `experiment.pfc`), or None: it can, PFC is off, or
    `force`."""
    if force or not pfc_on(exp):
        return None
    why = unfit_ingress(exp, topo)
    if why is None:
        return None
    return (f"with PFC on this fabric cannot be lossless: {why}; leave queue_bytes, "
            f"pfc_xoff_bytes and pfc_headroom_bytes unset (the run then sizes the "
            f"buffers), give queue_bytes >= {needed_buffer_bytes(exp, topo)}, or --force "
            f"to run it anyway (its drops are then the buffer's, not the emulator's)")


def lossless_rto_ms(rto_ms: float, exp: Experiment, topo: Topology, schedule: dict) -> float:
    """The timeout the agents use: `rto_ms`, and with PFC on at least RTO_QUEUE_FACTOR
    times the time the busiest receiver's link takes to carry every window that may be
    queued towards it (the most flows into one rank in any step of `schedule`, each a
    window of frames or its message if smaller)."""
    if not pfc_on(exp) or not schedule:
        return rto_ms
    worst_s = 0.0
    steps = max((len(s) for s in schedule.values()), default=0)
    for k in range(steps):
        into: dict[str, int] = {}        # bits that may queue towards each rank
        for plan in schedule.values():
            if k >= len(plan):
                continue
            for send in plan[k].sends:
                window = min(exp.window_packets, math.ceil(send.size_bytes / exp.payload_bytes))
                into[send.dst] = into.get(send.dst, 0) + window * frame_bits(exp.payload_bytes)
        for dst, queued in into.items():
            rate = min(topo.graph.edges[dst, p]["rate_mbps"] for p in topo.ports(dst))
            worst_s = max(worst_s, queued / (rate * 1e6))
    return max(rto_ms, round(RTO_QUEUE_FACTOR * worst_s * 1e3, 1))

