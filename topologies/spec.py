"""Topology specs: pure data (a networkx graph with roles and link attributes).

A spec is what a fabric is built from. It imports, validates and draws without root,
and knows nothing of namespaces, addresses or tc.

Node attributes:
    role       one of ROLES (gpu/cpu are endpoints; the rest are switches)
    server     server index of a GPU or NVSwitch (None elsewhere)
    rail       rail index of a GPU or rail leaf (None elsewhere)
    forwards   True if the node forwards packets (switches; GPUs in rail-only/PXN)

Edge attributes (units in the names):
    rate_mbps    emulated link rate, Mbit/s (10^6 bit/s)
    queue_bytes  egress queue limit of each end, bytes
    length_m     cable length, metres
    tech         link technology, one of TECHS
"""

from __future__ import annotations

import difflib
import functools
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import networkx as nx

ENDPOINT_ROLES = frozenset({"gpu", "cpu"})
SWITCH_ROLES = frozenset({"nvswitch", "leaf", "spine", "plane"})
ROLES = ENDPOINT_ROLES | SWITCH_ROLES
TECHS = frozenset({"copper", "laser", "microled", "nvlink"})

# One emulated Mbit/s stands for SCALE_FACTOR real Mbit/s: 100 Mbit/s for 400 Gb/s.
DEFAULT_SCALE_FACTOR = 4000
DEFAULT_RATE_MBPS = 100.0
# NVLink 4 (H100): 900 GB/s per GPU is the bidirectional total, 18 links x 50 GB/s; per
# direction 450 GB/s = 3.6 Tb/s (NVIDIA H100 datasheet / Hopper architecture whitepaper).
# A veth link is one direction each way, so 3.6 Tb/s; at the same factor, 900 Mbit/s.
DEFAULT_NVLINK_RATE_MBPS = 900.0
DEFAULT_QUEUE_BYTES = 128 * 1024
DEFAULT_LENGTH_M = 2.0
MTU_BYTES = 9000  # jumbo frames: RoCE's 4096-byte payload plus headers fits

# Interface names are "<node>-eth<k>" and must fit IFNAMSIZ (15 characters).
IFNAME_MAX = 15

# What a fabric can be built with; a spec beyond these is refused before anything is built.
# Addresses (fabric/addressing.py): one /31 per link out of 198.18.0.0/16, one /32 loopback
# per node out of 198.19.0.0/16 (network and broadcast addresses left out).
MAX_LINKS = 2**16 // 2
MAX_NODES = 2**16 - 2
# HTB's rate is a 32-bit count of bytes per second (tc_ratespec): at most 34.3 Gbit/s.
MAX_RATE_MBPS = 32_000.0
# The slowest link HTB can shape in both port layouts (fabric.shaping, fabric.lossless):
# every class needs a rate of 1 byte/s at least (0 divides by zero in the transmit time),
# and each class's burst time (burst / rate, in 64 ns ticks) must fit tc_htb_opt's 32-bit
# buffer: at most 274 s. The lossless layout's control class gets 1 % of the link with a
# burst of two 9014-byte frames, which fits from 0.053 Mbit/s; rounded up to 0.1.
MIN_RATE_MBPS = 0.1
# bfifo's limit is 32 bits; past 1 GiB per port it is no switch buffer (real: 10-100 MB).
MAX_QUEUE_BYTES = 1 << 30
NAME_RE = re.compile(r"\A[A-Za-z][A-Za-z0-9_]*\Z")
NAME_MAX_CHARS = 32
FIELD_KEY_RE = re.compile(r"\A[A-Za-z0-9_-]+\Z")   # a user's key shown as part of a field


class SpecError(ValueError):
    """Bad topology input. `field` names what was wrong; str() is one line."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


def did_you_mean(word: object, known) -> str:
    """" (did you mean 'x'?)" when `word` is close to one of `known` (a typo), else "":
    what a refusal of an unknown name adds before it lists what is allowed."""
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, [str(k) for k in known], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# -- link reach (link physics) -------------------------------------------------------
# The longest link each technology carries, from topologies/link_profiles.toml (the
# profile named after the tech); topologies.physics checks again with a user's profiles.
LINK_PROFILES_FILE = Path(__file__).resolve().parent / "link_profiles.toml"


@functools.cache
def default_reach_m() -> dict[str, float]:
    """tech -> maximum reach in metres, from the default link profiles."""
    with LINK_PROFILES_FILE.open("rb") as f:
        profiles = tomllib.load(f)["profiles"]
    return {tech: float(profiles[tech]["reach_m"]) for tech in TECHS if tech in profiles}


def check_reach(where: str, tech: str, length_m: float,
                reach_m: dict[str, float] | None = None) -> None:
    """Refuse a link longer than its technology reaches (SpecError naming the link)."""
    reach = (default_reach_m() if reach_m is None else reach_m).get(tech)
    if reach is not None and length_m > reach:
        raise SpecError(f"{where}.length_m", f"{length_m:g} m is beyond the {reach:g} m "
                        f"reach of {tech} links; use a longer-reach tech (or a shorter link)")


def key_field(table: str, key: object) -> str:
    """The field naming a user's key of `table`: "table.key" for a plain name; a key that
    is not one (empty, spaces, a newline) leaves the field at the table and goes, quoted,
    in the message, so the refusal stays one line."""
    plain = isinstance(key, str) and FIELD_KEY_RE.match(key)
    return (f"{table}.{key}" if table else key) if plain else (table or "topology")


def check_name(field_name: str, value: object, max_len: int = NAME_MAX_CHARS) -> str:
    """A plain identifier (letter first, then letters, digits, underscore)."""
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise SpecError(field_name, f"{value!r} is not a plain identifier "
                        "(a letter, then letters, digits or '_')")
    if len(value) > max_len:
        raise SpecError(field_name, f"{value!r} is longer than {max_len} characters")
    return value


def check_count(field_name: str, value: object, minimum: int = 1,
                maximum: int | None = None) -> int:
    """An integer >= minimum (and <= maximum; bool is not an integer here)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(field_name, f"{value!r} is not an integer")
    if value < minimum:
        raise SpecError(field_name, f"{value} is less than {minimum}")
    if maximum is not None and value > maximum:
        raise SpecError(field_name, f"{value} is not in {minimum}..{maximum}")
    return value


def check_number(field_name: str, value: object) -> float:
    """A finite number (bool is not a number here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(field_name, f"{value!r} is not a number")
    if not math.isfinite(value):
        raise SpecError(field_name, f"{value} is not a finite number")
    return float(value)


def check_positive(field_name: str, value: object, maximum: float = math.inf) -> float:
    """A finite number > 0 (and <= maximum)."""
    number = check_number(field_name, value)
    if not number > 0:
        raise SpecError(field_name, f"{value} must be greater than 0")
    if number > maximum:
        raise SpecError(field_name, f"{value:g} is more than the maximum {maximum:g}")
    return number


def check_rate(field_name: str, value: object) -> float:
    """A link rate in Mbit/s that HTB can shape: [MIN_RATE_MBPS, MAX_RATE_MBPS]."""
    rate_mbps = check_number(field_name, value)
    if not MIN_RATE_MBPS <= rate_mbps <= MAX_RATE_MBPS:
        raise SpecError(field_name, f"{value:g} Mbit/s is outside what HTB shapes: minimum "
                        f"{MIN_RATE_MBPS:g}, maximum {MAX_RATE_MBPS:g} Mbit/s")
    return rate_mbps


def check_queue(field_name: str, value: object) -> int:
    """An egress queue in bytes: one jumbo frame at least, MAX_QUEUE_BYTES at most."""
    check_count(field_name, value, MTU_BYTES)
    if value > MAX_QUEUE_BYTES:
        raise SpecError(field_name, f"{value} is more than the maximum {MAX_QUEUE_BYTES} "
                        "(1 GiB per port)")
    return value


def check_size(field_name: str, nodes: int, links: int) -> None:
    """Refuse a fabric the address plan cannot number (before building its graph)."""
    if nodes > MAX_NODES:
        raise SpecError(field_name, f"{nodes} nodes is more than the {MAX_NODES} a fabric "
                        "can have (one /32 loopback each out of 198.19.0.0/16)")
    if links > MAX_LINKS:
        raise SpecError(field_name, f"{links} links is more than the {MAX_LINKS} a fabric "
                        "can have (one /31 each out of 198.18.0.0/16)")


@dataclass
class Topology:
    """A topology spec: a named graph plus the parameters it was built from."""

    name: str
    kind: str
    graph: nx.Graph
    params: dict = field(default_factory=dict)
    scale_factor: float = DEFAULT_SCALE_FACTOR
    # Rail-only: a GPU's route to another rail prefers its NVLink domain (PXN).
    prefer_nvlink: bool = False

    def endpoints(self) -> list[str]:
        return [n for n, d in self.graph.nodes(data=True) if d["role"] in ENDPOINT_ROLES]

    def switches(self) -> list[str]:
        return [n for n, d in self.graph.nodes(data=True) if d["role"] in SWITCH_ROLES]

    def role(self, node: str) -> str:
        return self.graph.nodes[node]["role"]

    def nodes_with_role(self, role: str) -> list[str]:
        return [n for n, d in self.graph.nodes(data=True) if d["role"] == role]

    def ports(self, node: str) -> list[str]:
        """Neighbours of `node` in port order: port k (eth<k>) faces ports(node)[k]."""
        return list(self.graph.adj[node])

    def ifname(self, node: str, peer: str) -> str:
        return f"{node}-eth{self.ports(node).index(peer)}"

    def nic_rate_mbps(self, node: str) -> float:
        """An endpoint's fabric port rate: its slowest non-NVLink link (its NIC)."""
        rates = [d["rate_mbps"] for _, _, d in self.graph.edges(node, data=True)
                 if d["tech"] != "nvlink"]
        return min(rates) if rates else min(d["rate_mbps"] for _, _, d in
                                            self.graph.edges(node, data=True))

    def peer(self, node: str, ifname: str) -> str:
        """The node port `ifname` (<node>-eth<k>) of `node` faces: ifname's inverse."""
        return self.ports(node)[int(ifname.rsplit("eth", 1)[1])]

    def validate(self) -> Topology:
        """Check every node and link; raise SpecError naming the first bad one."""
        check_name("name", self.name)
        check_positive("scale_factor", self.scale_factor)
        g = self.graph
        if g.number_of_nodes() == 0:
            raise SpecError("nodes", "the topology has no nodes")
        check_size("nodes", g.number_of_nodes(), g.number_of_edges())
        if len(self.endpoints()) < 2:
            raise SpecError("nodes", "a topology needs at least two gpu/cpu endpoints")
        for node, data in g.nodes(data=True):
            check_name(f"nodes.{node}", node)
            role = data.get("role")
            if role not in ROLES:
                raise SpecError(f"nodes.{node}.role",
                                f"{role!r} is not one of {sorted(ROLES)}")
            if g.degree(node) == 0:
                raise SpecError(f"nodes.{node}", "has no links")
            longest = f"{node}-eth{g.degree(node) - 1}"
            if len(longest) > IFNAME_MAX:
                raise SpecError(f"nodes.{node}", f"interface name {longest!r} is longer "
                                f"than {IFNAME_MAX} characters; use a shorter node name")
        for a, b, data in g.edges(data=True):
            where = f"links.{a}:{b}"
            check_rate(f"{where}.rate_mbps", data.get("rate_mbps"))
            check_queue(f"{where}.queue_bytes", data.get("queue_bytes"))
            check_positive(f"{where}.length_m", data.get("length_m"))
            if data.get("tech") not in TECHS:
                raise SpecError(f"{where}.tech",
                                f"{data.get('tech')!r} is not one of {sorted(TECHS)}")
            check_reach(where, data["tech"], data["length_m"])
        if not nx.is_connected(g):
            raise SpecError("links", "the topology is not connected")
        return self

    def summary(self) -> dict:
        """Counts by role and by link technology, for printing and results."""
        roles: dict[str, int] = {}
        for _, d in self.graph.nodes(data=True):
            roles[d["role"]] = roles.get(d["role"], 0) + 1
        techs: dict[str, int] = {}
        for _, _, d in self.graph.edges(data=True):
            techs[d["tech"]] = techs.get(d["tech"], 0) + 1
        return {"name": self.name, "kind": self.kind, "params": dict(self.params),
                "nodes": self.graph.number_of_nodes(), "links": self.graph.number_of_edges(),
                "roles": roles, "link_techs": techs, "scale_factor": self.scale_factor}

    def to_data(self) -> dict:
        """JSON-ready form (round-trips through from_data)."""
        return {"name": self.name, "kind": self.kind, "params": dict(self.params),
                "scale_factor": self.scale_factor, "prefer_nvlink": self.prefer_nvlink,
                "graph": nx.node_link_data(self.graph, edges="links")}

    @classmethod
    def from_data(cls, data: dict) -> Topology:
        graph = nx.node_link_graph(data["graph"], edges="links")
        return cls(name=data["name"], kind=data["kind"], graph=graph,
                   params=data.get("params", {}), scale_factor=data["scale_factor"],
                   prefer_nvlink=data.get("prefer_nvlink", False))
