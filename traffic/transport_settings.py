"""The transport settings a user sets, declared once (issue: every setting one home).

`TransportSettings` is what the experiment file, the CLI and the agents all extend or
read (names, defaults, checks); `TransportParams` is the part the state machines in
traffic/transport.py run with. Pure data, no sockets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from enum import StrEnum
from functools import cached_property

from topologies.spec import SpecError, check_count


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


MAX_PACKETS = 1 << 23          # PSNs stay below 2^23: no wrap inside a message
STAMP_BYTES = 16               # every data packet carries at least the stamp
COALESCE_FRAMES = 3.0          # agents' interrupt moderation (traffic.agent_config.AgentOptions)
PAYLOAD_MIN, PAYLOAD_MAX = 64, 8192   # RoCE MTU 4096 by default; 8192 fits the 9000 MTU
COALESCE_MAX = 64


@dataclass
class TransportSettings:
    """The transport knobs a user sets, declared once: the experiment file and the CLI
    (testbed.experiment.Experiment extends this class, the CLI takes its choices from
    the enums) and the agents (traffic.agent_config.AgentOptions extends it too) all use these
    names, defaults and checks."""

    transport: str = Transport.ROCE.value
    entropy: str = EntropyMode.ECMP.value
    payload_bytes: int = 4096          # RoCE payload per packet (the IB MTU)
    window_packets: int = 64           # packets in flight per flow
    ack_every: int = 8                 # AckReq / coalesced ACK every N packets
    rto_ms: float = 50.0               # retransmission timeout
    flowlet_gap_us: float = 200.0      # entropy=flowlet: idle wire that starts a flowlet
    coalesce_frames: float = COALESCE_FRAMES   # interrupt moderation, frame times (0: off)
    cc: str = "none"                   # congestion control: none, dcqcn or nscc

    def check_transport(self, where: str) -> None:
        """Raise SpecError naming `where.<field>` for the first bad knob."""
        _choice(f"{where}.transport", self.transport, Transport)
        _choice(f"{where}.entropy", self.entropy, EntropyMode)
        check_count(f"{where}.payload_bytes", self.payload_bytes, PAYLOAD_MIN, PAYLOAD_MAX)
        check_count(f"{where}.window_packets", self.window_packets, 1, MAX_PACKETS - 1)
        check_count(f"{where}.ack_every", self.ack_every, 1, MAX_PACKETS - 1)
        _number(f"{where}.rto_ms", self.rto_ms, 0, 3_600_000, low_open=True)
        _number(f"{where}.flowlet_gap_us", self.flowlet_gap_us, 0, 1e9, low_open=True)
        _number(f"{where}.coalesce_frames", self.coalesce_frames, 0, COALESCE_MAX)
        _choice(f"{where}.cc", self.cc, CongestionControl)
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


TRANSPORT_SETTINGS = tuple(f.name for f in fields(TransportSettings))


def _choice(field_name: str, value: object, enum: type[StrEnum]) -> None:
    allowed = [m.value for m in enum]
    if value not in allowed:
        raise SpecError(field_name, f"{value!r} is not one of {', '.join(allowed)}")


def _number(field_name: str, value: object, low: float, high: float,
            low_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        raise SpecError(field_name, f"{value!r} is not a finite number")
    if value < low or (low_open and value == low) or value > high:
        raise SpecError(field_name, f"{value:g} is not in {'(' if low_open else '['}"
                        f"{low:g}, {high:g}]")


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
