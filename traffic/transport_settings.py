"""The transport settings a user sets, declared once (topologies.settings).

`TransportSettings` is what the experiment file, the CLI and the agents all extend or
read (names, defaults, checks); `TransportParams` is the part the state machines in
traffic/transport.py run with. Pure data, no sockets.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property

from topologies.settings import setting
from topologies.spec import SpecError


class Transport(StrEnum):
    """The reliable transports (module docstring)."""

    ROCE = "roce"      # RC-like: in order, go-back-N
    UET = "uet"        # UET-style: unordered, selective ACKs and retransmits


class EntropyMode(StrEnum):
    """How a flow picks the UDP source port the switches hash (`Entropy`)."""

    ECMP = "ecmp"        # one port per flow
    SPRAY = "spray"      # a new port every packet
    FLOWLET = "flowlet"  # a new port after the flow's wire was idle for flowlet_gap_us


class CongestionControl(StrEnum):
    """The senders' reaction to congestion (traffic.cc, traffic.nscc)."""

    NONE = "none"      # window and link rate only
    DCQCN = "dcqcn"    # RoCE: CNPs from the receiver, rate cut and recovery at the sender
    NSCC = "nscc"      # UET: a window per flow from echoed CE marks and queuing delay


TRANSPORTS = tuple(t.value for t in Transport)
CC_MODES = tuple(c.value for c in CongestionControl)
ENTROPY_MODES = tuple(m.value for m in EntropyMode)
NIC_QUEUES = ("port", "destination")


MAX_PACKETS = 1 << 23          # PSNs stay below 2^23: no wrap inside a message
STAMP_BYTES = 16               # every data packet carries at least the stamp
COALESCE_FRAMES = 3.0          # agents' interrupt moderation (traffic.agent_config.AgentOptions)
PAYLOAD_MIN, PAYLOAD_MAX = 64, 8192   # RoCE MTU 4096 by default; 8192 fits the 9000 MTU
COALESCE_MAX = 64


@dataclass
class TransportSettings:
    """Transport: how the agents move a message (traffic.transport)

    Declared once: the experiment file, the `testbed run` flags
    (testbed.experiment.Experiment extends this class) and the agents
    (traffic.agent_config.AgentOptions extends it too) all use these names, defaults
    and checks."""

    transport: str = setting(
        Transport.ROCE.value, "roce (RC-like: in order, go-back-N) or uet (UET-style: "
        "unordered, selective ACKs and retransmits)", choices=TRANSPORTS)
    entropy: str = setting(
        EntropyMode.ECMP.value, "the UDP source port the switches hash: one per flow "
        "(ecmp), a new one per packet (spray) or per flowlet", choices=ENTROPY_MODES)
    payload_bytes: int = setting(4096, "RoCE payload per packet (the IB MTU)", whole=True,
                                 low=PAYLOAD_MIN, high=PAYLOAD_MAX, metavar="BYTES")
    window_packets: int = setting(64, "packets in flight per flow", whole=True, low=1,
                                  high=MAX_PACKETS - 1, metavar="N")
    ack_every: int = setting(8, "AckReq / coalesced ACK every N packets", whole=True, low=1,
                             high=MAX_PACKETS - 1, metavar="N")
    rto_ms: float = setting(50.0, "retransmission timeout, ms of emulated time",
                            number=True, low=0, low_open=True, high=3_600_000, metavar="MS")
    flowlet_gap_us: float = setting(
        200.0, "entropy flowlet: the idle wire, us, that starts a flowlet", number=True,
        low=0, low_open=True, high=1e9, metavar="US")
    coalesce_frames: float = setting(
        COALESCE_FRAMES, "the agents' interrupt moderation, in frame times (0: off)",
        number=True, low=0, high=COALESCE_MAX, metavar="FRAMES")
    nic_queues: str = setting(
        "port", "the NIC's send queues: one per egress port (port), or one per destination "
        "per port, each its own socket and queue, so a paused or slow destination holds "
        "no other's frames (destination; with voq on, its own class on the host's port "
        "too)", choices=NIC_QUEUES)
    cc: str = setting(
        CongestionControl.NONE.value, "congestion control: dcqcn (RoCE: receivers answer "
        "CE marks with CNPs, senders cut and recover their rate; needs --ecn on; "
        "parameters dcqcn_*), nscc (UET: each flow's window falls on echoed CE marks and "
        "queuing delay, grows below the target delay; with ecn on it reads marks, else "
        "delay alone; parameters nscc_*) or none",
        choices=CC_MODES)

    def check_transport(self, where: str) -> None:
        """The rule that ties two knobs together (each knob's own values are checked by
        its declaration: topologies.settings.check_declared): SpecError naming
        `where.cc`."""
        if self.cc == CongestionControl.DCQCN and self.transport != Transport.ROCE:
            raise SpecError(f"{where}.cc", f"dcqcn is RoCE's congestion control; transport "
                            f"{self.transport!r} takes cc = \"nscc\" or \"none\"")
        if self.cc == CongestionControl.NSCC and self.transport != Transport.UET:
            raise SpecError(f"{where}.cc", f"nscc is the UET transport's congestion control; "
                            f"transport {self.transport!r} takes cc = \"dcqcn\" or \"none\"")

    def check_message(self, field_name: str, size_bytes: int) -> None:
        """A message must fit one PSN space (fewer than 2^23 packets of payload_bytes)."""
        limit = (MAX_PACKETS - 1) * self.payload_bytes
        if size_bytes > limit:
            raise SpecError(field_name, f"{size_bytes} B is more than {limit} B, the "
                            f"largest message: {MAX_PACKETS - 1} packets (PSNs stay below "
                            f"2^23) of {self.payload_bytes} B")


@dataclass(frozen=True)
class TransportParams:
    window_packets: int = 64
    ack_every: int = 8
    rto_ms: float = 50.0
    reorder_threshold: int = 32
    ack_delay_us: float = 1000.0   # an ACK owed for longer than this goes out anyway

    def __post_init__(self) -> None:
        for name in ("window_packets", "ack_every", "reorder_threshold"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.rto_ms <= 0 or self.ack_delay_us <= 0:
            raise ValueError("rto_ms and ack_delay_us must be > 0")

    @cached_property          # read on every timer pass of an agent: computed once
    def ack_delay_ns(self) -> int:
        return int(self.ack_delay_us * 1000)

    @cached_property
    def rto_ns(self) -> int:
        return int(self.rto_ms * 1_000_000)
