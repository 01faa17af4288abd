"""What an agent reads and what it writes: options, config checks, constants, results helpers.

    CONFIG.json ─▶ AgentConfig.from_dict (checked here, once) ─▶ traffic.agent.Agent
    Agent.results / empty_results ─▶ write_json ─▶ agent-<node>.json

`AgentOptions` holds every knob that neither the fabric nor the schedule decides;
traffic.launch fills an `AgentConfig` per endpoint from a fabric and a schedule.
"""

from __future__ import annotations

import json
import resource
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from traffic.cc import DcqcnSettings
from traffic.nscc import NsccSettings
from traffic.packets import (
    BTH_BYTES,
    DEFAULT_DSCP,
    DEFAULT_PRIORITY,
    ETH_BYTES,
    ICRC_BYTES,
    IPV4_BYTES,
    UDP_BYTES,
    UET_QPN_FLAG,
    now_ns,
)
from traffic.transport_settings import (
    CC_MODES,
    ENTROPY_MODES,
    STAMP_BYTES,
    TRANSPORTS,
    TransportParams,
    TransportSettings,
)

DCQCN_AGENT_KEYS = tuple(DcqcnSettings().dcqcn_emulated(1))
NSCC_AGENT_KEYS = tuple(NsccSettings().nscc_emulated(1))
ITERATION_MSG_STRIDE = 1 << 20      # wire message id = msg_id + iteration * 2**20
MSG_ID_BITS = 32                    # the message id field of a data frame (traffic.packets)
MAX_ITERATIONS = (1 << MSG_ID_BITS) // ITERATION_MSG_STRIDE   # 4096: ids past it would wrap
MSN_MASK = 0xFFFFFF
FRAME_OVERHEAD_BYTES = ETH_BYTES + IPV4_BYTES + UDP_BYTES + BTH_BYTES + ICRC_BYTES
RCVBUF_MIN_BYTES = 16 << 20         # the agent's receive buffer: at least this ...
RCVBUF_MAX_BYTES = 1 << 30          # ... at most this (SO_RCVBUFFORCE takes an int)
SKB_OVERHEAD_BYTES = 4096           # kernel memory per datagram beyond its payload, generously
REQUIRED = ("node", "loopback", "transport", "entropy", "payload_bytes", "ports", "routes",
            "peers", "steps", "results_path")


class TerminatedError(BaseException):
    """SIGTERM or SIGINT arrived."""


TERMINATED = "terminated"   # the error an agent reports when a signal stopped it


class ConfigError(ValueError):
    pass


DEFAULT_TIMEOUT_S = 120.0   # a run's agents give up after this long (an experiment's default)


@dataclass
class AgentOptions(TransportSettings):
    """Every knob of an agent, that neither the fabric nor the schedule decides: the
    transport settings users set (declared once, in traffic.transport_settings), and these."""

    seed: int = 1
    dscp: int = DEFAULT_DSCP
    priority: int = DEFAULT_PRIORITY
    reorder_threshold: int = 32
    ack_delay_us: float = 1000.0
    timeout_s: float = DEFAULT_TIMEOUT_S
    iterations: int = 1
    latency_sample_every: int = 16
    linger_ms: float | None = None          # default: max(4 x rto_ms, 200)
    sndbuf_bytes: int | None = None         # default: the kernel's
    ack_dscp: int | None = None     # ACKs, NAKs, CNPs: own DSCP and queue (None: the data's)
    dcqcn: dict = field(default_factory=dict)   # cc = dcqcn: DcqcnSettings.dcqcn_emulated()
    nscc: dict = field(default_factory=dict)    # cc = nscc: NsccSettings.nscc_emulated()


@dataclass(kw_only=True)
class AgentConfig(AgentOptions):
    """What one agent reads: the options, plus its node, ports, routes and steps."""

    node: str
    loopback: str
    ports: dict[str, dict]          # ifname -> src_mac, dst_mac (, rate_mbps)
    routes: dict[str, list[str]]
    peers: dict[str, str]
    steps: list[dict]
    results_path: str
    start_at_ns: int = 0
    start_from_stdin: bool = False
    namespace: str = ""             # its node's namespace, a path ("": the process's own)
    rx_delay_ns: dict[str, int] = field(default_factory=dict)   # peer -> one-way path
    path_mbps: dict[str, float] = field(default_factory=dict)  # peer -> path bottleneck
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict) -> AgentConfig:
        missing = [k for k in REQUIRED if k not in data]
        if missing:
            raise ConfigError(f"config: missing {', '.join(missing)}")
        known = set(cls.__dataclass_fields__) - {"extra"}
        cfg = cls(**{k: v for k, v in data.items() if k in known},
                  extra={k: v for k, v in data.items() if k not in known})
        if cfg.transport not in TRANSPORTS:
            raise ConfigError(f"transport: {cfg.transport!r} is not one of {TRANSPORTS}")
        if cfg.entropy not in ENTROPY_MODES:
            raise ConfigError(f"entropy: {cfg.entropy!r} is not one of {ENTROPY_MODES}")
        if cfg.iterations < 1 or cfg.latency_sample_every < 1 or cfg.timeout_s <= 0:
            raise ConfigError("iterations, latency_sample_every and timeout_s must be positive")
        if cfg.iterations > MAX_ITERATIONS:
            raise ConfigError(f"iterations: {cfg.iterations}, at most {MAX_ITERATIONS} (the "
                              "wire's message ids)")
        if cfg.cc not in CC_MODES:
            raise ConfigError(f"cc: {cfg.cc!r} is not one of {CC_MODES}")
        if cfg.cc == "dcqcn":
            missing = [k for k in DCQCN_AGENT_KEYS if k not in cfg.dcqcn]
            if missing:
                raise ConfigError(f"dcqcn: missing {', '.join(missing)}")
        if cfg.cc == "nscc":
            if cfg.transport != "uet":
                raise ConfigError(f"cc: nscc runs on transport uet, not {cfg.transport!r}")
            missing = [k for k in NSCC_AGENT_KEYS if k not in cfg.nscc]
            if missing:
                raise ConfigError(f"nscc: missing {', '.join(missing)}")
        if cfg.payload_bytes < STAMP_BYTES:
            raise ConfigError(f"payload_bytes must be at least {STAMP_BYTES}")
        if cfg.coalesce_frames < 0:
            raise ConfigError(f"coalesce_frames must be >= 0, got {cfg.coalesce_frames}")
        for peer, ifnames in cfg.routes.items():
            if not ifnames or any(i not in cfg.ports for i in ifnames):
                raise ConfigError(f"routes[{peer}]: {ifnames} are not all in ports")
        for peer, ns in cfg.rx_delay_ns.items():
            if peer not in cfg.peers or isinstance(ns, bool) or not isinstance(ns, int) \
                    or ns < 0:
                raise ConfigError(f"rx_delay_ns[{peer}]: must be a peer's delay in whole "
                                  f"ns >= 0, got {ns!r}")
        for peer, mbps in cfg.path_mbps.items():
            if peer not in cfg.peers or isinstance(mbps, bool) or not isinstance(
                    mbps, (int, float)) or mbps <= 0:
                raise ConfigError(f"path_mbps[{peer}]: must be a peer's path rate in "
                                  f"Mbit/s > 0, got {mbps!r}")
        for step in cfg.steps:
            for t in step.get("sends", []) + step.get("recvs", []):
                peer = t["dst"] if t["src"] == cfg.node else t["src"]
                if cfg.node not in (t["src"], t["dst"]):
                    raise ConfigError(f"transfer {t['tag']}: {cfg.node} is neither end")
                if peer not in cfg.routes or peer not in cfg.peers:
                    raise ConfigError(f"transfer {t['tag']}: no route or address for {peer}")
                if not 0 <= int(t["msg_id"]) < ITERATION_MSG_STRIDE:
                    raise ConfigError(f"transfer {t['tag']}: msg_id must be < 2**20")
        return cfg

    @property
    def params(self) -> TransportParams:
        return TransportParams(self.window_packets, self.ack_every, self.rto_ms,
                               self.reorder_threshold, self.ack_delay_us)

    @property
    def linger_ns(self) -> int:
        return int(linger_ms(self.linger_ms, self.rto_ms) * 1e6)

    @property
    def rcvbuf_bytes(self) -> int:
        """A receive buffer that holds a full window of every flow this agent receives,
        all at once (the most its senders can have outstanding), and ACKs for every flow
        it sends: however long the agent is descheduled, its socket cannot overflow."""
        recvs = sum(len(s.get("recvs", [])) for s in self.steps) * self.iterations
        sends = sum(len(s.get("sends", [])) for s in self.steps) * self.iterations
        data = recvs * self.window_packets * (self.payload_bytes + SKB_OVERHEAD_BYTES)
        acks = sends * self.window_packets * SKB_OVERHEAD_BYTES
        return min(max(RCVBUF_MIN_BYTES, data + acks), RCVBUF_MAX_BYTES)

    @property
    def coalesce_ns(self) -> int:
        """Interrupt moderation, as a NIC does it: once awake, the agent handles what
        has queued, then sleeps until `coalesce_frames` frame times of its fastest port
        have passed since it woke (or a timer is due), so a wake-up (~15 us of CPU here)
        serves a few frames instead of one. The fastest port, so that no port's socket
        buffer runs dry while the agent sleeps; 0 when a port's rate is unknown."""
        rates = [p.get("rate_mbps") for p in self.ports.values()]
        if not self.coalesce_frames or not rates or not all(rates):
            return 0
        frame_bits = (self.payload_bytes + FRAME_OVERHEAD_BYTES) * 8
        return int(self.coalesce_frames * frame_bits / max(rates) * 1000)


def linger_ms(linger_ms: float | None, rto_ms: float) -> float:
    """How long an agent stays after its last flow is done: `linger_ms` if given, else
    max(4 x rto_ms, 200 ms)."""
    return linger_ms if linger_ms is not None else max(4 * rto_ms, 200.0)


def qpn(src: str, dst: str, transport: str) -> int:
    """The destination QP of the pair's flows (bit 23 marks a UET-style flow)."""
    q = (zlib.crc32(f"{src}>{dst}".encode()) & 0x7FFFFF) | 0x10
    return q | UET_QPN_FLAG if transport == "uet" else q


# -- results helpers --------------------------------------------------------------------
def realtime_offset_ns(tries: int = 5) -> int:
    """CLOCK_REALTIME - CLOCK_MONOTONIC, from the tightest of a few bracketed reads."""
    best = None
    for _ in range(tries):
        before = now_ns()
        real = time.clock_gettime_ns(time.CLOCK_REALTIME)
        after = now_ns()
        if best is None or after - before < best[0]:
            best = (after - before, real - (before + after) // 2)
    return best[1]


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def empty_results(node: str | None, error: str, transport: str | None = None,
                  entropy: str | None = None) -> dict:
    """Results of an agent that did not get to run (same keys as Agent.results)."""
    return {"node": node, "ok": False, "error": error, "transport": transport,
            "entropy": entropy, "iterations": [], "iterations_started": 0, "flows": [],
            "latency_ns": [], "cpu_s": cpu_seconds(), "cpu_run_s": None}


def udp_counters() -> dict[str, int]:
    """The Udp: line of /proc/net/snmp, of the namespace this thread is in."""
    try:
        lines = [ln.split() for ln in Path("/proc/net/snmp").read_text().splitlines()
                 if ln.startswith("Udp:")]
        return {k: int(v) for k, v in zip(lines[0][1:], lines[1][1:], strict=True)}
    except (OSError, IndexError, ValueError):
        return {}


def write_json(path: str, data: dict) -> None:
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(target)


def wait_for_go(stdin=None) -> int:
    """Print "ready", then read "go <start_at_ns>" (0: now); raise if stdin closes first
    (the agent's start, traffic.launch)."""
    stdin = stdin or sys.stdin
    print("ready", flush=True)
    line = stdin.readline().split()
    if len(line) != 2 or line[0] != "go":
        raise ConfigError(f"expected 'go <start_at_ns>' on stdin, got {' '.join(line)!r}")
    return int(line[1])
