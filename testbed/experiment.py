"""Experiment settings (pure data): from a TOML file and/or flags, validated, no root.

An experiment file:

    [experiment]
    name = "allreduce16"          # plain identifier; names the results folder
    workload = "allreduce"        # p2p, permutation, incast, allreduce, allgather,
                                  # reducescatter, alltoall
    ranks = 16                    # the first N endpoints, N >= 2 (0, the default: all;
                                  # a --ranks flag of 0 is refused: omit it for all)
    message_bytes = 1048576
    iterations = 3
    transport = "roce"            # roce (go-back-N) or uet (selective, unordered)
    entropy = "ecmp"              # ecmp, spray or flowlet
    seed = 1
    pcap = ["leaf0-eth0"]         # interfaces to capture (node-ethK)
    pairs = ["s0g0>s1g1"]         # p2p only: who sends to whom (default: i -> i + n/2)

    [topology]                    # a topology table (as in topologies/*.toml) ...
    kind = "rail_optimized"
    [topology.params]
    servers = 4
    # ... or, instead of the table:  topology = "rail_optimized"  (file or kind)
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import tomli_w

from fabric.lossless import LOSSLESS_MTU_BYTES, PfcMode, PfcSettings, headroom_bytes
from fabric.traffic_class import ROCE_CLASS
from topologies.files import from_data, read_toml, resolve
from topologies.spec import (
    MAX_RATE_MBPS,
    MIN_RATE_MBPS,
    SpecError,
    Topology,
    check_count,
    check_name,
    check_positive,
    check_rate,
    key_field,
)
from traffic.agent_config import DEFAULT_TIMEOUT_S
from traffic.cc import DcqcnSettings
from traffic.nscc import NsccSettings
from traffic.transport_settings import TransportSettings
from traffic.workloads import WORKLOADS

_PFC = PfcSettings()
_DCQCN = DcqcnSettings()
_NSCC = NsccSettings()
PCAP_RE = re.compile(r"\A[A-Za-z][A-Za-z0-9_]*-eth[0-9]+\Z")
MIN_RANKS = 2                    # every workload: a sender and a receiver
RING_ORDERS = ("listed", "rails")  # a ring collective's rank order (testbed.run.ring_ranks)
DELAY_MODES = ("off", "on")      # propagation delay: none, or each link's (netem or
                                 # the agents' delay line, fabric.impair)


@dataclass
class Experiment(TransportSettings):
    """Every setting of a run. The transport knobs (transport, entropy, payload_bytes,
    window_packets, ack_every, rto_ms, flowlet_gap_us, coalesce_frames) are declared
    once, in traffic.transport_settings.TransportSettings, and inherited here."""

    name: str = "experiment"
    workload: str = "allreduce"
    ranks: int = 0                 # 0: every endpoint
    message_bytes: int = 1 << 20
    iterations: int = 3
    seed: int = 1
    pcap: list[str] = field(default_factory=list)
    pairs: list[str] = field(default_factory=list)   # p2p: ["s0g0>s1g1", ...]
    ring_order: str = "listed"     # "rails": NCCL's rail-aligned ring on rail fabrics
    # link physics (topologies/physics.py, fabric/impair.py)
    loss_rate: float = 0.0           # random loss on fabric links (both directions)
    loss_links: list[str] = field(default_factory=list)   # "a:b" links; default all
    delay: str = "off"               # "on": each link's propagation delay (scaled)
    link_profiles: str = ""          # a TOML file overriding topologies/link_profiles.toml
    failures: list[dict] = field(default_factory=list)    # {link, lane?, at_s, repair_s?}
    failure_horizon_h: float = 0.0   # random failures over this many real hours ...
    failure_compression: float = 1e6  # ... played back this many times faster
    # PFC and the lossless class: declared (defaults, meaning, checks) in
    # fabric.lossless.PfcSettings and fabric.traffic_class.TrafficClass; the keys here
    # are their [experiment] names and take their defaults from them.
    pfc: str = _PFC.mode.value       # "" (one lossy queue), "on" or "off"
    pfc_xoff_bytes: int = _PFC.xoff_bytes
    pfc_xon_bytes: int = _PFC.xon_bytes
    pfc_headroom_bytes: int = _PFC.headroom_bytes
    pfc_watchdog_ms: float = _PFC.watchdog_ms
    pfc_watchdog_action: str = _PFC.watchdog_action.value
    pfc_poll_ms: float = _PFC.poll_ms
    ecn: str = _PFC.ecn              # "on": switches mark CE (needs pfc "on" or "off")
    ecn_kmin_bytes: int = _PFC.ecn_kmin_bytes
    ecn_kmax_bytes: int = _PFC.ecn_kmax_bytes
    ecn_pmax: float = _PFC.ecn_pmax
    switch_lb: str = _PFC.switch_lb  # "dlb" or "adaptive": the switches pick the egress
    switch_lb_gap_us: float = _PFC.switch_lb_gap_us   # (needs pfc "on" or "off")
    trimming: str = _PFC.trimming    # "on": switches trim UET frames at full queues
    trim_threshold_bytes: int = _PFC.trim_threshold_bytes   # 0: each port's queue - 1 frame
    # DCQCN (cc = "dcqcn"), in real units: declared in traffic.cc.DcqcnSettings
    dcqcn_cnp_interval_us: float = _DCQCN.cnp_interval_us
    dcqcn_timer_us: float = _DCQCN.timer_us
    dcqcn_g: float = _DCQCN.g
    dcqcn_byte_counter_bytes: int = _DCQCN.byte_counter_bytes
    dcqcn_fast_recovery: int = _DCQCN.fast_recovery
    dcqcn_rai_fraction: float = _DCQCN.rai_fraction
    dcqcn_rhai_fraction: float = _DCQCN.rhai_fraction
    dcqcn_min_rate_fraction: float = _DCQCN.min_rate_fraction
    # NSCC (cc = "nscc", transport uet), in real units: declared in traffic.nscc.NsccSettings
    nscc_target_qdelay_us: float = _NSCC.target_qdelay_us
    nscc_gamma: float = _NSCC.gamma
    nscc_max_md: float = _NSCC.max_md
    nscc_ce_gain: float = _NSCC.ce_gain
    nscc_fair_increase_packets: float = _NSCC.fair_increase_packets
    nscc_prop_increase_packets: float = _NSCC.prop_increase_packets
    nscc_min_cwnd_packets: float = _NSCC.min_cwnd_packets
    timeout_s: float = DEFAULT_TIMEOUT_S    # declared with the agents' options
    # Agent processes: 0 one per core, each serving several endpoints (traffic.host);
    # N at most N (N >= the ranks: one per endpoint)
    agent_processes: int = 0
    # Emulated link rate: "" keeps the topology's; a number (Mbit/s) or "auto" (the
    # highest this machine should carry faithfully, testbed.calibrate) rescales every
    # link of the topology by one factor and its scale_factor by the inverse, so rate
    # ratios and the real rates they stand for stay as they were.
    rate: str | float = ""
    dscp: int = ROCE_CLASS.dscp      # the lossless class the agents mark and PFC matches
    results_dir: str = "results"
    topology: dict = field(default_factory=lambda: {"kind": "rail_optimized"})

    def validate(self) -> Experiment:
        check_name("experiment.name", self.name)
        if self.workload not in WORKLOADS:
            raise SpecError("experiment.workload",
                            f"{self.workload!r} is not one of {', '.join(WORKLOADS)}")
        self.check_transport("experiment")
        self.check_ranks()
        check_count("experiment.message_bytes", self.message_bytes, 1)
        self.check_message("experiment.message_bytes", self.message_bytes)
        check_count("experiment.iterations", self.iterations, 1)
        check_count("experiment.seed", self.seed, 0)
        check_positive("experiment.timeout_s", self.timeout_s)
        check_count("experiment.agent_processes", self.agent_processes, 0)
        if self.rate not in ("", "auto"):
            check_rate("experiment.rate", self.rate)
        if not isinstance(self.pcap, list) or not all(isinstance(p, str) for p in self.pcap):
            raise SpecError("experiment.pcap", "must be a list of interface names")
        for port in self.pcap:
            if not PCAP_RE.match(port):
                raise SpecError("experiment.pcap", f"{port!r} is not a port name "
                                "(<node>-eth<k>, e.g. leaf0-eth0)")
        if not isinstance(self.pairs, list) or not all(
                isinstance(p, str) and p.count(">") == 1 for p in self.pairs):
            raise SpecError("experiment.pairs", 'must be a list of "src>dst" endpoint pairs')
        if self.pairs and self.workload != "p2p":
            raise SpecError("experiment.pairs", "only the p2p workload takes pairs")
        if isinstance(self.loss_rate, bool) or not isinstance(self.loss_rate, (int, float)) \
                or not 0 <= self.loss_rate < 1:
            raise SpecError("experiment.loss_rate", "must be a fraction in [0, 1)")
        if not isinstance(self.loss_links, list) or not all(
                isinstance(p, str) and p.count(":") == 1 for p in self.loss_links):
            raise SpecError("experiment.loss_links", 'must be a list of "a:b" links')
        if self.ring_order not in RING_ORDERS:
            raise SpecError("experiment.ring_order", f"{self.ring_order!r} is not one of "
                            f"{', '.join(RING_ORDERS)}")
        if self.delay not in DELAY_MODES:
            raise SpecError("experiment.delay", f"{self.delay!r} is not one of "
                            f"{', '.join(DELAY_MODES)}")
        if not isinstance(self.link_profiles, str):
            raise SpecError("experiment.link_profiles", "must be a TOML file's path")
        if self.link_profiles:
            read_toml("experiment.link_profiles", self.link_profiles)
        if not isinstance(self.failures, list):
            raise SpecError("experiment.failures", "must be a list of tables")
        if self.failure_horizon_h:
            check_positive("experiment.failure_horizon_h", self.failure_horizon_h)
        check_positive("experiment.failure_compression", self.failure_compression)
        self.pfc_settings()
        self.dcqcn_settings().check("experiment")
        self.nscc_settings().check("experiment")
        if self.cc == "dcqcn" and self.ecn != "on":
            raise SpecError("experiment.cc", 'dcqcn reacts to CE marks: it needs ecn = "on", '
                            'e.g. --ecn on --cc dcqcn')
        if self.trimming == "on" and self.transport != "uet":
            raise SpecError("experiment.trimming", 'only UET recovers a trimmed packet (its '
                            'receiver NACKs it): set transport = "uet", or trimming = "off"')
        return self

    def check_ranks(self) -> None:
        """0 (every endpoint) or at least MIN_RANKS."""
        check_count("experiment.ranks", self.ranks, 0)
        if 0 < self.ranks < MIN_RANKS:
            raise SpecError("experiment.ranks", f"{self.ranks} is fewer than the {MIN_RANKS} "
                            "every workload needs (a sender and a receiver); 0 means every "
                            "endpoint")

    def dcqcn_settings(self) -> DcqcnSettings:
        return DcqcnSettings(**{k: getattr(self, f"dcqcn_{k}")
                                for k in DcqcnSettings.__dataclass_fields__})

    def nscc_settings(self) -> NsccSettings:
        return NsccSettings(**{k: getattr(self, f"nscc_{k}")
                               for k in NsccSettings.__dataclass_fields__})

    def pfc_settings(self) -> PfcSettings:
        """The PFC settings and lossless class, validated where they are declared."""
        return PfcSettings.from_keys(self.to_data())

    def check_against(self, topo: Topology) -> None:
        """What only the topology can tell: captured ports, ranks, pairs, lossless
        thresholds, the rescaled rates and the link physics fit it. Called before
        anything is built (the CLI, and testbed.run.run)."""
        ports = {topo.ifname(n, peer) for n in topo.graph for peer in topo.ports(n)}
        for port in self.pcap:
            if port not in ports:
                raise SpecError("experiment.pcap", f"{port!r} is not a port of {topo.name} "
                                f"(ports are <node>-eth<k>, e.g. {sorted(ports)[0]})")
        if self.ring_order == "rails" and any(
                topo.graph.nodes[n].get("server") is None
                or topo.graph.nodes[n].get("rail") is None for n in topo.endpoints()):
            raise SpecError("experiment.ring_order", f"'rails' needs GPUs with a server and "
                            f"a rail (rail_optimized, rail_only); {topo.name} has none")
        self._check_ranks_against(topo)
        self._check_pfc_against(topo)
        self._check_rate_against(topo)
        self._check_physics_against(topo)

    def _check_rate_against(self, topo: Topology) -> None:
        """A `rate` scales every link by rate / the endpoint links' rate (testbed.rate
        rescaled): each scaled link must stay in what HTB shapes."""
        base_mbps = topo.params.get("rate_mbps")
        if self.rate in ("", "auto") or not base_mbps:
            return
        factor = float(self.rate) / base_mbps
        for a, b, rate_mbps in topo.graph.edges(data="rate_mbps"):
            if not MIN_RATE_MBPS <= rate_mbps * factor <= MAX_RATE_MBPS:
                raise SpecError("experiment.rate", f"{self.rate:g} Mbit/s puts link {a}:{b} "
                                f"at {rate_mbps * factor:g} Mbit/s, outside what HTB shapes: "
                                f"minimum {MIN_RATE_MBPS:g}, maximum {MAX_RATE_MBPS:g} Mbit/s")

    def _check_ranks_against(self, topo: Topology) -> None:
        endpoints = topo.endpoints()
        if self.ranks > len(endpoints):
            raise SpecError("experiment.ranks", f"{self.ranks} ranks but {topo.name} has "
                            f"only {len(endpoints)} endpoints")
        for pair in self.pairs:
            src, dst = pair.split(">")
            for node in (src, dst):
                if node not in endpoints:
                    raise SpecError("experiment.pairs", f"{node!r} is not an endpoint of "
                                    f"{topo.name}")
            if src == dst:
                raise SpecError("experiment.pairs", f"{pair} sends to itself")

    def _check_pfc_against(self, topo: Topology) -> None:
        """An ingress port pauses its upstream at XOFF and still takes the headroom after
        it (fabric.lossless.thresholds_for): XOFF + headroom must fit the smallest queue
        of the topology's links. A headroom of 0 is derived, two frames at least."""
        if self.pfc_settings().mode is PfcMode.NONE:
            return
        queue_bytes = min(q for _, _, q in topo.graph.edges(data="queue_bytes"))
        where = f"the smallest queue of {topo.name} ({queue_bytes} bytes per port)"
        for key in ("pfc_xoff_bytes", "pfc_headroom_bytes"):
            if getattr(self, key) > queue_bytes:
                raise SpecError(f"experiment.{key}", f"{getattr(self, key)} is more than "
                                f"{where}")
        headroom = self.pfc_headroom_bytes or headroom_bytes(0.0, 0.0, LOSSLESS_MTU_BYTES)
        if self.pfc_xoff_bytes and self.pfc_xoff_bytes + headroom > queue_bytes:
            key = "pfc_headroom_bytes" if self.pfc_headroom_bytes else "pfc_xoff_bytes"
            derived = "" if self.pfc_headroom_bytes else " (derived: two frames at least)"
            raise SpecError(f"experiment.{key}", f"XOFF {self.pfc_xoff_bytes} + headroom "
                            f"{headroom} bytes{derived} is more than {where}")

    def _check_physics_against(self, topo: Topology) -> None:
        """Link reach with the experiment's profiles, failures and lossy links exist."""
        from topologies.physics import check_topology, load_profiles, parse_events
        profiles = load_profiles(self.link_profiles or None)
        check_topology(topo, profiles)
        parse_events(self.failures, topo, profiles)
        for text in self.loss_links:
            a, b = text.split(":")
            if not topo.graph.has_edge(a, b):
                raise SpecError("experiment.loss_links", f"{text!r} is not a link of "
                                f"{topo.name}")

    def resolve_topology(self) -> Topology:
        topo = self.topology
        if isinstance(topo, str):
            return resolve(topo)
        if not isinstance(topo, dict):
            raise SpecError("topology", "must be a table or a topology file/kind name")
        return from_data(topo, source="[topology]")

    def to_data(self) -> dict:
        return asdict(self)


FIELD_NAMES = {f.name for f in fields(Experiment)}


def from_toml(path: str | Path | None, overrides: dict | None = None) -> Experiment:
    """Settings from a file (optional), then `overrides` (flags), validated. A file's
    `ranks = 0` means every endpoint; a flag's ranks of 0 is refused (omit the flag)."""
    data = read_experiment_file(path) if path is not None else {}
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    if overrides.get("ranks") == 0:
        raise SpecError("experiment.ranks", f"0 is fewer than the {MIN_RANKS} every "
                        "workload needs; omit --ranks for every endpoint")
    data.update(overrides)
    for key in data:
        if key not in FIELD_NAMES:
            raise SpecError(key_field("experiment", key), f"{key!r} is an unknown "
                            "setting; allowed: "
                            + ", ".join(sorted(FIELD_NAMES)))
    try:
        exp = Experiment(**data)
    except TypeError as exc:
        raise SpecError("experiment", str(exc)) from None
    return exp.validate()


def read_experiment_file(path: str | Path) -> dict:
    """The settings of an experiment file: its [experiment] table, with its [topology]
    table as the topology. A file that sets nothing is refused, not run on defaults."""
    raw = read_toml("experiment", path)
    for key in raw:
        if key not in ("experiment", "topology"):
            raise SpecError(key_field("", key), f"{key!r} is an unknown table; allowed: "
                            "[experiment], [topology]")
    data = raw.get("experiment", {})
    if not isinstance(data, dict):
        raise SpecError("experiment", f"{path}: experiment must be a table ([experiment])")
    data = dict(data)
    if "topology" in raw:
        if "topology" in data:
            raise SpecError("topology", "given twice ([topology] and experiment.topology)")
        data["topology"] = raw["topology"]
    if not data:
        raise SpecError("experiment", f"{path} sets nothing: give an [experiment] table "
                        "(workload, ranks, ...) and/or a [topology] (see experiments/)")
    return data


def to_toml(exp: Experiment, topo: Topology) -> str:
    """What ran, as a TOML file that `testbed run` accepts again."""
    data = {"experiment": {k: v for k, v in exp.to_data().items() if k != "topology"},
            "topology": {"name": topo.name, "kind": topo.kind,
                         "scale_factor": topo.scale_factor, "params": dict(topo.params)}}
    return "# what ran: `testbed run config.toml` repeats it\n" + tomli_w.dumps(data)


def rate_arg(text: str) -> str | float:
    """argparse type of a rate flag: a number of Mbit/s, or "auto"."""
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of Mbit/s or 'auto'") \
            from None


def finite_float(text: str) -> float:
    """argparse type of a number flag: a finite float (no nan, no inf)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def positive_float(text: str) -> float:
    """argparse type of a number flag that must be finite and greater than 0."""
    value = finite_float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not greater than 0")
    return value
