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
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import tomli_w

from fabric.lossless import (
    LOSSLESS_MTU_BYTES,
    PfcMode,
    SwitchSettings,
    headroom_bytes,
)
from testbed.features import FEATURE_SETTINGS, FEATURES
from testbed.sizes import FORM as SIZES_FORM
from testbed.sizes import MAX_SWEEP_SIZES, is_sweep, parse_sizes
from topologies.files import from_data, read_toml, resolve
from topologies.partition import ClusterSettings
from topologies.settings import (
    check_declared,
    finite_float,
    number_or_auto,
    own_fields,
    reference_json,
    reference_md,
    setting,
)
from topologies.spec import (
    MAX_RATE_MBPS,
    MIN_RATE_MBPS,
    SpecError,
    Topology,
    check_name,
    check_rate,
    did_you_mean,
    key_field,
)
from traffic.agent_config import DEFAULT_TIMEOUT_S, MAX_ITERATIONS
from traffic.chakra import ChakraError, check_traces
from traffic.open_loop import FlowSettings
from traffic.rpc import RpcSettings
from traffic.train import TrainSettings
from traffic.train_size import check_plan_size
from traffic.transport_settings import TransportSettings
from traffic.workloads import JOBS, WORKLOADS, WORKLOADS_BY_NAME, workload_named

PCAP_RE = re.compile(r"\A[A-Za-z][A-Za-z0-9_]*-eth[0-9]+\Z")
MIN_RANKS = 2                    # every workload: a sender and a receiver
RING_ORDERS = ("listed", "rails")  # a ring collective's rank order (testbed.run.ring_ranks)


rate_arg = number_or_auto("a number of Mbit/s")   # argparse type of a rate flag


# The features' settings types (testbed.features) join the experiment from the registry:
# a new feature's settings need no line here
@dataclass
class Experiment(TrainSettings, FlowSettings, RpcSettings, ClusterSettings,
                 *reversed(FEATURE_SETTINGS), TransportSettings):
    """Experiment: what runs, on which fabric, how often

    Every setting of a run: these, and those of the settings types it is made of, each
    declared once where its feature lives (topologies.settings)."""

    name: str = setting("experiment", "a plain identifier; names the results folder")
    workload: str = setting("allreduce", "what the ranks do (train_step: a training step, "
                            "the [train] table; flows: open-loop flows, the [flows] table; "
                            "rpc: request/response, the [rpc] table)",
                            choices=WORKLOADS + JOBS)
    ranks: int = setting(0, "use the first N endpoints, N >= 2 (0 in a file, or no flag: "
                         "every endpoint)", whole=True, low=0, metavar="N")
    message_bytes: int | str = setting(
        1 << 20, "bytes per rank (the nccl-tests size; K, M, G: KiB, MiB, GiB); a sweep "
        f"runs once per size, at most {MAX_SWEEP_SIZES} sizes (e.g. 1K:64M:x2)", convert=str,
        metavar="BYTES|B:E:xF",
        allowed="integer >= 1, or a sweep BEGIN:END:xFACTOR or BEGIN:END:+STEP")
    iterations: int = setting(3, f"times the workload runs (at most {MAX_ITERATIONS}: each takes "
                              "2^20 of the 32-bit message ids on the wire)", whole=True, low=1,
                              high=MAX_ITERATIONS, metavar="N")
    seed: int = setting(1, "the experiment's seed; also the ECMP hash seed", whole=True,
                        low=0)
    pcap: list[str] = setting(factory=list, help="ports to capture, e.g. leaf0-eth0",
                              metavar="IFACE")
    pairs: list[str] = setting(factory=list, help="p2p workload: who sends to whom, e.g. "
                               "'s0g0>s1g1' (default: i -> i + n/2)", metavar="SRC>DST")
    ring_order: str = setting(
        "listed", "a ring collective's rank order: listed (the topology's endpoint order) "
        "or rails (NCCL's on a rail fabric: every hop between servers stays on one rail)",
        choices=RING_ORDERS)
    timeout_s: float = setting(DEFAULT_TIMEOUT_S, "seconds before a hung run is failed",
                               number=True, low=0, low_open=True, aliases=("--timeout",),
                               metavar="S")
    agent_processes: int = setting(
        0, "agent processes: 0 one per core, each serving several endpoints; N at most N "
        "(N >= the ranks: one per endpoint)", whole=True, low=0, metavar="N")
    rate: str | float = setting(
        "", "emulated rate of the endpoint links, Mbit/s (every link scaled by the same "
        "factor, the scale factor by its inverse); auto: the highest this machine's "
        "calibration says stays faithful (testbed calibrate)", convert=rate_arg,
        metavar="MBPS|auto")
    results_dir: str = setting("results", "results base folder", aliases=("--results",),
                               metavar="DIR")
    topology: dict | str = setting(
        factory=lambda: {"kind": "rail_optimized"}, help="a topology file or kind, or a "
        "[topology] table in the file (default rail_optimized)", convert=str,
        metavar="TOPOLOGY")

    def validate(self) -> Experiment:
        check_name("experiment.name", self.name)
        check_declared(self)
        self.check_transport("experiment")
        self.check_ranks()
        self.check_message_sizes()
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
        takers = [n for n, w in WORKLOADS_BY_NAME.items() if w.takes_pairs]
        if self.pairs and self.workload not in takers:
            raise SpecError("experiment.pairs", f"only the {' and '.join(takers)} workload "
                            "takes pairs")
        if not isinstance(self.loss_links, list) or not all(
                isinstance(p, str) and p.count(":") == 1 for p in self.loss_links):
            raise SpecError("experiment.loss_links", 'must be a list of "a:b" links')
        if not isinstance(self.link_profiles, str):
            raise SpecError("experiment.link_profiles", "must be a TOML file's path")
        if self.link_profiles:
            read_toml("experiment.link_profiles", self.link_profiles)
        if not isinstance(self.failures, list):
            raise SpecError("experiment.failures", "must be a list of tables")
        self.check_lossless("experiment")
        self.check_ecn("experiment")
        self.check_trimming("experiment")
        self.switch_settings()      # what ties the switch settings together (SwitchSettings)
        if self.voq == "scheduled" and self.entropy != "spray":
            raise SpecError("experiment.entropy", f"voq \"scheduled\" sprays every flow over "
                            f"every spine: it needs entropy \"spray\", not {self.entropy!r} "
                            "(with transport \"uet\", which takes packets out of order)")
        self.check_cluster()
        if self.servers:
            self.check_spread()
        if self.workload in JOBS and self.servers:
            raise SpecError("experiment.workload", "train_step is not available on several "
                            "machines yet: run it without servers")
        if not isinstance(self.trace, str):
            raise SpecError("train.trace", "must be a folder's path")
        if not self.trace.isprintable():
            raise SpecError("train.trace", f"{self.trace!r} is not a printable path")
        if self.workload == "flows":
            self.check_flows(self.pairs)
        if workload_named(self.workload).open_loop and self.servers:
            raise SpecError("experiment.workload", f"{self.workload} is not available on "
                            "several machines yet: run it without servers")
        if self.trace and self.workload not in JOBS:
            raise SpecError("train.trace", f"traces replay a training step: only with "
                            f"workload = \"train_step\", not {self.workload!r}")
        if self.cc == "dcqcn" and self.ecn != "on":
            raise SpecError("experiment.cc", 'dcqcn reacts to CE marks: it needs ecn = "on", '
                            'e.g. --ecn on --cc dcqcn')
        if self.trimming == "on" and self.transport != "uet":
            raise SpecError("experiment.trimming", 'only UET recovers a trimmed packet (its '
                            'receiver NACKs it): set transport = "uet", or trimming = "off"')
        return self

    def check_message_sizes(self) -> None:
        """One size (its text, "64K", becomes its bytes) or a sweep (testbed.sizes), each
        size at least 1 B and within the largest message; a sweep runs each size on this
        machine (testbed.sweep), for a workload that sends message_bytes."""
        key = "experiment.message_bytes"
        sizes = parse_sizes(key, self.message_bytes)
        if not is_sweep(self.message_bytes):
            self.message_bytes = sizes[0]
        if sizes[0] < 1:
            raise SpecError(key, f"{sizes[0]} is less than 1; allowed: {SIZES_FORM}")
        self.check_message(key, sizes[-1])
        if is_sweep(self.message_bytes) and self.workload in JOBS:
            raise SpecError(key, f"a sweep runs a workload of message_bytes, not "
                            f"{self.workload} (its sizes are its [train] table's)")
        if is_sweep(self.message_bytes) and self.servers:
            raise SpecError(key, "a sweep runs on this machine: give one size to run on "
                            "servers")

    def check_ranks(self) -> None:
        """0 (every endpoint) or at least MIN_RANKS."""
        if 0 < self.ranks < MIN_RANKS:
            raise SpecError("experiment.ranks", f"{self.ranks} is fewer than the {MIN_RANKS} "
                            "every workload needs (a sender and a receiver); 0 means every "
                            "endpoint")

    def switch_settings(self) -> SwitchSettings:
        """What the switches run: PFC, ECN, balancing and trimming (fabric.lossless)."""
        return SwitchSettings.of(self)

    def check_spread(self) -> None:
        """Refuse, naming the key, what a run on several machines does not do: the
        settings of every feature whose `across_servers` gives a reason
        (testbed.features)."""
        for feature in FEATURES:
            if refused := feature.spread_refusal(self):
                key, why = refused
                raise SpecError(f"experiment.{key}", f"is not available on several machines "
                                f"({why}): leave it at its default or run without servers")

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
        self._check_train_against(topo)

    def _check_train_against(self, topo: Topology) -> None:
        """A training step's traces are readable within their bounds and have a rank per
        endpoint at most; a plan fits the ranks and stays within its bounds, counted from
        the settings (traffic.train_size), before anything is planned."""
        if self.workload not in JOBS:
            return
        endpoints = topo.endpoints()
        if self.trace:
            try:
                n = len(check_traces(self.trace))
            except ChakraError as exc:
                raise SpecError("train.trace", str(exc)) from None
            if n > len(endpoints):
                raise SpecError("train.trace", f"{n} ranks in {self.trace} but {topo.name} "
                                f"has {len(endpoints)} endpoints")
            return
        check_plan_size(self, self.ranks or len(endpoints))

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
        of the topology's links. A headroom of 0 is derived: a frame and the hold's leak
        at least."""
        if self.switch_settings().mode is PfcMode.NONE:
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
            derived = ("" if self.pfc_headroom_bytes
                       else " (derived: a frame and the hold's leak at least)")
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


# The settings types an experiment is made of, in the order `testbed run --help` and
# docs/settings.md list them.
SETTINGS_TYPES = (Experiment, TransportSettings, *FEATURE_SETTINGS, ClusterSettings,
                  TrainSettings, FlowSettings, RpcSettings)
FIELD_NAMES = {f.name for f in fields(Experiment)}
CLUSTER_KEYS = set(own_fields(ClusterSettings))
TRAIN_KEYS = set(own_fields(TrainSettings))
FLOW_KEYS = set(own_fields(FlowSettings))
RPC_KEYS = set(own_fields(RpcSettings))
# the file's tables of settings
TABLES = {"cluster": CLUSTER_KEYS, "train": TRAIN_KEYS, "flows": FLOW_KEYS, "rpc": RPC_KEYS}


def settings_page() -> str:
    """docs/settings.md: every setting, from the declarations (`testbed settings`)."""
    return ("# Settings\n\nEvery setting of `testbed run`, by feature: its [experiment] key "
            "in an experiment file, its flag (the flag wins over the file), its default and "
            "what it allows. Written by `testbed settings` from the declarations in the "
            "code (`--format json`: the same as JSON rows); a test keeps this page equal "
            "to them.\n\n" + reference_md(*SETTINGS_TYPES))


def settings_json() -> list[dict]:
    """Every setting as a row (topologies.settings.reference_json): `testbed settings
    --format json`."""
    return reference_json(*SETTINGS_TYPES)


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
                            f"setting{did_you_mean(key, FIELD_NAMES)}; allowed: "
                            + ", ".join(sorted(FIELD_NAMES)))
    try:
        exp = Experiment(**data)
    except TypeError as exc:
        raise SpecError("experiment", str(exc)) from None
    return exp.validate()


def read_experiment_file(path: str | Path) -> dict:
    """The settings of an experiment file: its [experiment] table, with its [topology]
    table as the topology and its [cluster] table's servers. A file that sets nothing is
    refused, not run on defaults."""
    raw = read_toml("experiment", path)
    for key in raw:
        if key not in ("experiment", "topology", *TABLES):
            raise SpecError(key_field("", key), f"{key!r} is an unknown table"
                            f"{did_you_mean(key, ('experiment', 'topology', *TABLES))}; "
                            "allowed: [experiment], [topology], [cluster], [train], "
                            "[flows], [rpc]")
    data = raw.get("experiment", {})
    if not isinstance(data, dict):
        raise SpecError("experiment", f"{path}: experiment must be a table ([experiment])")
    data = dict(data)
    for table, keys in TABLES.items():
        values = raw.get(table, {})
        if not isinstance(values, dict):
            raise SpecError(table, f"{path}: {table} must be a table ([{table}])")
        for key in keys & set(data):
            raise SpecError(key_field("experiment", key), f"belongs in the [{table}] table")
        for key, value in values.items():
            if key not in keys:
                raise SpecError(key_field(table, key), f"{key!r} is an unknown setting"
                                f"{did_you_mean(key, keys)}; allowed: "
                                + ", ".join(sorted(keys)))
            data[key] = value
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
    values = exp.to_data()
    ordered = [name for cls in SETTINGS_TYPES for name in own_fields(cls)]
    data = {"experiment": {k: values[k] for k in ordered if k != "topology"
                           and k not in CLUSTER_KEYS | TRAIN_KEYS | FLOW_KEYS | RPC_KEYS},
            "topology": {"name": topo.name, "kind": topo.kind,
                         "scale_factor": topo.scale_factor, "params": dict(topo.params)}}
    if exp.servers:
        data["cluster"] = {k: values[k] for k in sorted(CLUSTER_KEYS)}
    if exp.workload in JOBS:
        data["train"] = {k: values[k] for k in own_fields(TrainSettings)}
    if exp.workload == "flows":
        data["flows"] = {k: values[k] for k in own_fields(FlowSettings)}
    if exp.workload == "rpc":
        data["rpc"] = {k: values[k] for k in own_fields(RpcSettings)}
    return "# what ran: `testbed run config.toml` repeats it\n" + tomli_w.dumps(data)


def positive_float(text: str) -> float:
    """argparse type of a number flag that must be finite and greater than 0."""
    value = finite_float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not greater than 0")
    return value
