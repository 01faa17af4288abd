"""The lossless traffic class, declared once: the DSCP the ports classify on and the skb
priority / 802.1p PCP that agents' sockets carry and PFC frames pause.

The fabric's lossless layout (fabric.lossless), the PFC controller, the agents
(traffic.packets marks the DSCP) and the experiment settings all take it from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from topologies.spec import SpecError, check_count

DEFAULT_DSCP = 26          # the RoCE class, as NIC vendors default it
DEFAULT_PRIORITY = 3       # its skb priority / 802.1p PCP, the class PFC frames pause
CONTROL_DSCP = 48          # CNPs always; ACKs and NAKs too with ack_class "control"
ACK_CLASSES = ("data", "control")
DSCP_MAX, PRIORITY_MAX = 63, 7


@dataclass(frozen=True)
class TrafficClass:
    """The lossless class: IPv4 DSCP `dscp` and skb priority / PCP `priority`; with
    `ack_dscp`, the ACKs', NAKs' and CNPs' own class: frames of that DSCP wait in a queue
    of their own on every port, served before data and never paused (fabric.lossless)."""

    dscp: int = DEFAULT_DSCP
    priority: int = DEFAULT_PRIORITY
    ack_dscp: int | None = None

    def __post_init__(self) -> None:
        check_count("experiment.dscp", self.dscp, 0, DSCP_MAX)
        check_count("experiment.priority", self.priority, 0, PRIORITY_MAX)
        if self.ack_dscp == self.dscp:
            raise SpecError("experiment.dscp", f"{self.dscp} is the ACKs' own DSCP "
                            f"(ack_class \"control\"): the lossless class needs another")


ROCE_CLASS = TrafficClass()         # DSCP 26, priority 3
