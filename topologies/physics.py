"""Link physics as data: technology profiles, reach, BER, lane failures, energy and cost.

Pure functions and dataclasses, no root and no kernel state (fabric/impair.py applies
them to a built fabric). The defaults live in topologies/link_profiles.toml with the
source of every number; a user's TOML file of the same shape overrides fields of a
built-in profile or adds profiles of its own, and `[use]` says which profile a link of
each technology gets.

    profile ──reach──▶ refuse links that are too long (SpecError naming the link)
            ──ber────▶ packet loss for a frame size: 1 - (1 - ber)^(8 x frame_bytes)
            ──lanes──▶ lanes of a link = ceil(its real rate / lane rate) (+ spares);
                       rate after failures: (lanes - lost) / lanes, or down
            ──fit────▶ seeded random failure schedule, time-compressed
            ──power──▶ lit lanes x power per lane; energy = power x time; static
                       cost/power table per topology (power modelled from published
                       per-link figures, not measured)

Units are in the names: `_gbps` real Gb/s (10^9 bit/s), `_mbps` emulated Mbit/s, `_fit`
failures per 10^9 hours, `_h` hours, `_s` seconds, `_w` watts, `_j` joules.
"""

from __future__ import annotations

import math
import random
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from topologies import units
from topologies.files import read_toml
from topologies.spec import (
    LINK_PROFILES_FILE,
    MTU_BYTES,
    TECHS,
    SpecError,
    Topology,
    check_count,
    check_name,
    check_reach,
    did_you_mean,
)

LANE_FAILURES = ("degrade", "link_down")
SECTIONS = ("profiles", "use", "switches")           # the tables of a link-profiles file
# A RoCEv2 RDMA WRITE packet with a 4096-byte payload, as the FCS covers it:
# Ethernet 14 + IPv4 20 + UDP 8 + BTH 12 + RETH 16 + 4096 + ICRC 4 + FCS 4.
ROCE_FRAME_BYTES = 4174
JUMBO_FRAME_BYTES = MTU_BYTES + 18      # Ethernet header + FCS
FIT_HOURS = 1e9                         # FIT: failures per 10^9 device-hours
HOURS_PER_MONTH = 730.0                 # 8760 / 12
LASER_LIKE = frozenset({"laser", "microled"})   # a transceiver at each end
# Link power is an input of the profiles, never a measurement of this testbed.
POWER_SOURCE = "modelled from published per-link power ([MOSAIC] SIGCOMM 2025)"


@dataclass(frozen=True)
class LinkProfile:
    """The physics of one link of a technology (real-fabric numbers)."""

    name: str
    tech: str
    description: str
    ref_rate_gbps: float       # the port the power and cost figures are quoted for
    spare_lanes: int           # extra lanes per link that absorb failures first
    lane_rate_gbps: float      # a link has ceil(real rate / lane rate) working lanes
    reach_m: float
    ber: float                 # bit error rate as delivered (after FEC)
    power_w_per_end: float     # at ref_rate_gbps, per link end
    lane_fit: float            # per lane (spares included)
    link_fit: float            # whole-link failures (fibre, backend, cable)
    lane_failure: str          # "degrade": lose 1/lanes each; "link_down": link fails
    repair_h: float            # time to repair a failed lane or link
    cost_usd_per_link: float   # cable plus transceivers at both ends

    @property
    def ref_lanes(self) -> int:
        """Working lanes of the reference port (800G laser: 8; 800G microLED: 400)."""
        return lanes_for_rate(self, self.ref_rate_gbps)

    @property
    def lane_power_w(self) -> float:
        """One lit lane, both ends together (spare lanes stay dark: no power)."""
        return 2 * self.power_w_per_end / self.ref_lanes

    @property
    def pj_per_bit(self) -> float:
        """Energy per bit of link capacity, both ends together."""
        return self.lane_power_w / (self.lane_rate_gbps * 1e9) * 1e12

    def packet_loss(self, frame_bytes: int = ROCE_FRAME_BYTES) -> float:
        return packet_loss(self.ber, frame_bytes)

    def rate_fraction(self, lanes: int, failed_lanes: int, link_failed: bool = False) -> float:
        """Fraction of nominal rate of a `lanes`-lane link with `failed_lanes` lanes dead
        (spares first); 0 = down."""
        if link_failed:
            return 0.0
        lost = max(0, failed_lanes - self.spare_lanes)
        if lost == 0:
            return 1.0
        if self.lane_failure == "link_down" or lost >= lanes:
            return 0.0
        return (lanes - lost) / lanes

    def link_power_w(self, rate_gbps: float) -> float:
        """Both ends of a link of this tech running at `rate_gbps`: its lit lanes."""
        return lanes_for_rate(self, rate_gbps) * self.lane_power_w

    def to_data(self) -> dict:
        return asdict(self)


def _units_for(real_rate_gbps: float, unit_gbps: float) -> int:
    """ceil(rate / unit), at least 1; the tolerance keeps 400.0000001 / 2.0 from
    becoming 201."""
    if real_rate_gbps <= 0:
        raise ValueError(f"a link rate must be > 0 Gb/s, got {real_rate_gbps!r}")
    return max(1, math.ceil(real_rate_gbps / unit_gbps - 1e-9))


def lanes_for_rate(profile: LinkProfile, real_rate_gbps: float) -> int:
    """Working lanes of a link of `profile` at `real_rate_gbps` (spares not counted):
    ceil(rate / lane rate). The one place lanes are counted: 400G of 2 Gb/s microLED
    channels is 200 lanes, 800G is 400; 400G laser or copper (100G lanes) is 4."""
    return _units_for(real_rate_gbps, profile.lane_rate_gbps)


def ports_for_rate(profile: LinkProfile, real_rate_gbps: float) -> int:
    """Reference ports (`ref_rate_gbps`) a link of `profile` at `real_rate_gbps` takes:
    ceil(rate / reference rate). A spec link wider than the reference port (a leaf's
    3.2 Tb/s to one spine) stands for a bundle of that many parallel links, each with
    its cable, transceivers and cost; the emulator runs the bundle as one link."""
    return _units_for(real_rate_gbps, profile.ref_rate_gbps)


@dataclass(frozen=True)
class SwitchCost:
    power_w: float
    cost_usd: float


@dataclass
class Profiles:
    """Every profile by name, which one each tech uses, and switch costs."""

    profiles: dict[str, LinkProfile]
    use: dict[str, str] = field(default_factory=dict)   # tech -> profile name
    switches: dict[str, SwitchCost] = field(default_factory=dict)
    source: str = str(LINK_PROFILES_FILE)

    def for_tech(self, tech: str) -> LinkProfile:
        name = self.use.get(tech, tech)
        if name not in self.profiles:
            raise SpecError(f"use.{tech}", f"no link profile {name!r} "
                            f"(have {sorted(self.profiles)})")
        return self.profiles[name]

    def for_link(self, topo: Topology, a: str, b: str) -> LinkProfile:
        return self.for_tech(topo.graph.edges[a, b]["tech"])

    def link_lanes(self, topo: Topology, a: str, b: str) -> int:
        """Working lanes of link a:b at the real rate its emulated rate stands for."""
        return lanes_for_rate(self.for_link(topo, a, b),
                              real_rate_gbps(topo, topo.graph.edges[a, b]["rate_mbps"]))

    def reach_m(self) -> dict[str, float]:
        return {tech: self.for_tech(tech).reach_m for tech in TECHS
                if self.use.get(tech, tech) in self.profiles}

    def to_data(self) -> dict:
        return {"source": self.source, "use": dict(self.use),
                "profiles": {n: p.to_data() for n, p in self.profiles.items()},
                "switches": {r: asdict(s) for r, s in self.switches.items()}}


# -- loading and validation ------------------------------------------------------------
PROFILE_FIELDS = [f.name for f in fields(LinkProfile) if f.name != "name"]


def _number(where: str, value: object, minimum: float = 0.0, strict: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise SpecError(where, f"{value!r} is not a number")
    if value < minimum or (strict and value == minimum) or math.isinf(value):
        bound = ">" if strict else ">="
        raise SpecError(where, f"{value} must be finite and {bound} {minimum:g}")
    return float(value)


def _profile(name: str, data: dict, base: LinkProfile | None) -> LinkProfile:
    where = f"profiles.{name}"
    check_name(where, name)
    unknown = set(data) - set(PROFILE_FIELDS)
    if unknown:
        first = sorted(unknown)[0]
        raise SpecError(f"{where}.{first}",
                        f"unknown field{did_you_mean(first, PROFILE_FIELDS)}; "
                        f"allowed: {', '.join(PROFILE_FIELDS)}")
    values = {} if base is None else {k: getattr(base, k) for k in PROFILE_FIELDS}
    values.update(data)
    missing = [k for k in PROFILE_FIELDS if k not in values]
    if missing:
        raise SpecError(f"{where}.{missing[0]}", "missing (a new profile needs every field)")
    if values["tech"] not in TECHS:
        raise SpecError(f"{where}.tech", f"{values['tech']!r} is not one of {sorted(TECHS)}")
    if values["lane_failure"] not in LANE_FAILURES:
        raise SpecError(f"{where}.lane_failure",
                        f"{values['lane_failure']!r} is not one of {list(LANE_FAILURES)}")
    if not isinstance(values["description"], str):
        raise SpecError(f"{where}.description", "must be a string")
    values["spare_lanes"] = check_count(f"{where}.spare_lanes", values["spare_lanes"], 0)
    for key in ("ref_rate_gbps", "lane_rate_gbps", "reach_m"):
        values[key] = _number(f"{where}.{key}", values[key], strict=True)
    for key in ("power_w_per_end", "lane_fit", "link_fit", "repair_h", "cost_usd_per_link"):
        values[key] = _number(f"{where}.{key}", values[key])
    values["ber"] = _number(f"{where}.ber", values["ber"])
    if values["ber"] >= 0.5:
        raise SpecError(f"{where}.ber", f"{values['ber']} is not a bit error rate (< 0.5)")
    return LinkProfile(name=name, **values)


def _merge(profiles: Profiles, data: dict, source: str) -> Profiles:
    unknown = set(data) - set(SECTIONS)
    if unknown:
        first = sorted(unknown)[0]
        raise SpecError(first, f"unknown section{did_you_mean(first, SECTIONS)}; allowed: "
                        "profiles, use, switches")
    for section in ("profiles", "use", "switches"):
        if not isinstance(data.get(section, {}), dict):
            raise SpecError(section, "must be a table")
    merged = dict(profiles.profiles)
    for name, body in data.get("profiles", {}).items():
        if not isinstance(body, dict):
            raise SpecError(f"profiles.{name}", "must be a table")
        merged[name] = _profile(name, body, merged.get(name))
    use = dict(profiles.use)
    for tech, name in data.get("use", {}).items():
        if tech not in TECHS:
            raise SpecError(f"use.{tech}", f"{tech!r} is not one of {sorted(TECHS)}")
        if name not in merged:
            raise SpecError(f"use.{tech}", f"no link profile {name!r} (have {sorted(merged)})")
        if merged[name].tech != tech:
            raise SpecError(f"use.{tech}", f"profile {name!r} is a {merged[name].tech} profile")
        use[tech] = name
    switches = dict(profiles.switches)
    for role, body in data.get("switches", {}).items():
        where = f"switches.{role}"
        if not isinstance(body, dict) or set(body) - {"power_w", "cost_usd"}:
            raise SpecError(where, "must be a table of power_w and cost_usd")
        old = switches.get(role, SwitchCost(0.0, 0.0))
        switches[role] = SwitchCost(
            _number(f"{where}.power_w", body.get("power_w", old.power_w)),
            _number(f"{where}.cost_usd", body.get("cost_usd", old.cost_usd)))
    return Profiles(merged, use, switches, source)


def load_profiles(path: str | Path | None = None, overrides: dict | None = None) -> Profiles:
    """The defaults, then a user's TOML file over them, then a dict of overrides."""
    with LINK_PROFILES_FILE.open("rb") as f:
        result = _merge(Profiles({}), tomllib.load(f), str(LINK_PROFILES_FILE))
    if path is not None:   # a user's file: regular, bounded, parsed (topologies.files)
        result = _merge(result, read_toml("link_profiles", path),
                        f"{LINK_PROFILES_FILE} + {path}")
    if overrides:
        result = _merge(result, overrides, f"{result.source} + overrides")
    return result


def check_topology(topo: Topology, profiles: Profiles) -> None:
    """Refuse any link longer than its profile's reach (SpecError naming the link)."""
    reach = profiles.reach_m()
    for a, b, data in topo.graph.edges(data=True):
        check_reach(f"links.{a}:{b}", data["tech"], data["length_m"], reach)


# -- BER and loss ------------------------------------------------------------------------
def packet_loss(ber: float, frame_bytes: int = ROCE_FRAME_BYTES) -> float:
    """Probability that a frame of `frame_bytes` has at least one bit error (is dropped)."""
    return -math.expm1(8 * frame_bytes * math.log1p(-ber))


def ber_for_loss(loss_rate: float, frame_bytes: int = ROCE_FRAME_BYTES) -> float:
    """The BER at which frames of `frame_bytes` are lost at `loss_rate` (inverse of above)."""
    return -math.expm1(math.log1p(-loss_rate) / (8 * frame_bytes))


def propagation_delay_ns(length_m: float, ns_per_m: float = 5.0) -> float:
    """Light in glass (n ~ 1.5) or a signal in copper: about 5 ns per metre."""
    return length_m * ns_per_m


# -- lane state ----------------------------------------------------------------------------
@dataclass
class LaneState:
    """Which lanes of one link are dead; what rate the link runs at."""

    profile: LinkProfile
    lanes: int                 # working lanes at the link's rate (Profiles.link_lanes)
    failed: set[int] = field(default_factory=set)
    link_failed: bool = False

    @property
    def total_lanes(self) -> int:
        return self.lanes + self.profile.spare_lanes

    def check_lane(self, lane: int) -> int:
        if isinstance(lane, bool) or not isinstance(lane, int) or not \
                0 <= lane < self.total_lanes:
            raise ValueError(f"lane {lane!r} is not in 0..{self.total_lanes - 1} "
                             f"({self.profile.name})")
        return lane

    @property
    def fraction(self) -> float:
        return self.profile.rate_fraction(self.lanes, len(self.failed), self.link_failed)

    @property
    def working_lanes(self) -> int:
        return min(self.lanes, self.total_lanes - len(self.failed))


# -- failures ------------------------------------------------------------------------------
FAILURE_ACTIONS = ("fail_lane", "repair_lane", "fail_link", "repair_link")


@dataclass(frozen=True, order=True)
class FailureEvent:
    """At `t_s` emulated seconds after the start, do `action` on link a:b (lane k)."""

    t_s: float
    a: str
    b: str
    action: str
    lane: int | None = None

    def to_data(self) -> dict:
        return asdict(self)


def _link_of(topo: Topology, where: str, text: object) -> tuple[str, str]:
    if not isinstance(text, str) or text.count(":") != 1:
        raise SpecError(where, f"{text!r} is not a link 'nodeA:nodeB'")
    a, b = text.split(":")
    if not topo.graph.has_edge(a, b):
        raise SpecError(where, f"no link {a}:{b} in topology {topo.name}")
    return a, b


def parse_events(items: list[dict], topo: Topology, profiles: Profiles) -> list[FailureEvent]:
    """Explicit events from TOML: [[failures]] link = "a:b", lane = 3 (or none for the
    whole link), at_s = 1.0, repair_s = 2.0 (optional). Sorted by time."""
    events: list[FailureEvent] = []
    for i, item in enumerate(items):
        where = f"failures[{i}]"
        if not isinstance(item, dict) or set(item) - {"link", "lane", "at_s", "repair_s"}:
            raise SpecError(where, "fields: link, lane (optional), at_s, repair_s (optional)")
        a, b = _link_of(topo, f"{where}.link", item.get("link"))
        at_s = _number(f"{where}.at_s", item.get("at_s"))
        lane = item.get("lane")
        if lane is not None:
            total = profiles.link_lanes(topo, a, b) + profiles.for_link(topo, a, b).spare_lanes
            lane = check_count(f"{where}.lane", lane, 0)
            if lane >= total:
                raise SpecError(f"{where}.lane", f"{lane} is not in 0..{total - 1}")
        kind = "lane" if lane is not None else "link"
        events.append(FailureEvent(at_s, a, b, f"fail_{kind}", lane))
        if item.get("repair_s") is not None:
            repair_s = _number(f"{where}.repair_s", item["repair_s"])
            if repair_s <= at_s:
                raise SpecError(f"{where}.repair_s", f"{repair_s} is not after at_s {at_s}")
            events.append(FailureEvent(repair_s, a, b, f"repair_{kind}", lane))
    return sorted(events)


def random_failures(topo: Topology, profiles: Profiles, seed: int, horizon_h: float,
                    compression: float) -> list[FailureEvent]:
    """Failures drawn from each link's FIT rates over `horizon_h` real hours (Poisson:
    exponential times between failures; a failed part is repaired `repair_h` later and
    can then fail again), played back `compression` times faster: an event at real hour
    h happens at h x 3600 / compression emulated seconds. Same seed, same schedule."""
    _number("horizon_h", horizon_h, strict=True)
    _number("compression", compression, strict=True)
    rng = random.Random(seed)
    events: list[FailureEvent] = []

    def draw(fit: float, repair_h: float, a: str, b: str, kind: str, lane: int | None):
        if fit <= 0:
            return
        per_h = fit / FIT_HOURS
        t = rng.expovariate(per_h)
        while t < horizon_h:
            events.append(FailureEvent(t * 3600 / compression, a, b, f"fail_{kind}", lane))
            back = t + repair_h
            if back < horizon_h:
                events.append(FailureEvent(back * 3600 / compression, a, b,
                                           f"repair_{kind}", lane))
            t = back + rng.expovariate(per_h)

    for a, b in sorted(tuple(sorted(e)) for e in topo.graph.edges()):
        p = profiles.for_link(topo, a, b)
        draw(p.link_fit, p.repair_h, a, b, "link", None)
        for lane in range(profiles.link_lanes(topo, a, b) + p.spare_lanes):
            draw(p.lane_fit, p.repair_h, a, b, "lane", lane)
    return sorted(events)


def expected_failures(topo: Topology, profiles: Profiles, horizon_h: float) -> dict:
    """Mean number of lane and link failures over `horizon_h` (ignoring repair time)."""
    lanes = links = 0.0
    for a, b in topo.graph.edges():
        p = profiles.for_link(topo, a, b)
        links += p.link_fit / FIT_HOURS * horizon_h
        total = profiles.link_lanes(topo, a, b) + p.spare_lanes
        lanes += p.lane_fit * total / FIT_HOURS * horizon_h
    return {"horizon_h": horizon_h, "lane_failures": lanes, "link_failures": links}


# -- energy, power and cost --------------------------------------------------------------
def real_rate_gbps(topo: Topology, rate_mbps: float) -> float:
    """An emulated rate scaled back to the real fabric: Mbit/s x factor, in Gb/s."""
    return units.real_mbps(rate_mbps, topo.scale_factor) / 1000


def link_power(topo: Topology, profiles: Profiles) -> dict[str, dict]:
    """tech -> {links, profile, power_w}: power of every link at its real rate."""
    out: dict[str, dict] = {}
    for _, _, data in topo.graph.edges(data=True):
        p = profiles.for_tech(data["tech"])
        row = out.setdefault(data["tech"], {"links": 0, "profile": p.name, "power_w": 0.0})
        row["links"] += 1
        row["power_w"] += p.link_power_w(real_rate_gbps(topo, data["rate_mbps"]))
    return out


def link_energy(topo: Topology, profiles: Profiles, measured_s: float) -> dict:
    """Link energy = power x time per technology, summed, for a span of `measured_s`
    emulated seconds. `energy_j` is for the real fabric, which does the same work in
    measured_s / scale_factor; `energy_j_at_measured_time` keeps the emulated span."""
    _number("measured_s", measured_s)
    real_s = units.real_s(measured_s, topo.scale_factor)
    techs = {}
    for tech, row in sorted(link_power(topo, profiles).items()):
        techs[tech] = {**row, "energy_j": row["power_w"] * real_s,
                       "energy_j_at_measured_time": row["power_w"] * measured_s}
    return {"measured_s": measured_s, "real_s": real_s, "scale_factor": topo.scale_factor,
            "power_source": POWER_SOURCE, "techs": techs,
            "power_w": sum(r["power_w"] for r in techs.values()),
            "energy_j": sum(r["energy_j"] for r in techs.values()),
            "energy_j_at_measured_time": sum(r["energy_j_at_measured_time"]
                                             for r in techs.values())}


def energy_report(topo: Topology, profiles: Profiles, run_s: float,
                  jobs: dict[str, float] | None = None) -> dict:
    """Link energy of the whole run and of each job (job name -> its span, seconds)."""
    return {"run": link_energy(topo, profiles, run_s),
            "jobs": {name: link_energy(topo, profiles, s) for name, s in (jobs or {}).items()}}


def cost_table(topo: Topology, profiles: Profiles) -> dict:
    """Static cost and power of a topology: switches by role, links by technology
    (ports, transceivers, cables), at the real rates the emulated ones stand for.
    `links` counts the spec's links; ports, transceivers, cables and cost count the
    reference ports each takes (ports_for_rate: a link wider than the profile's
    reference port is a bundle of them)."""
    switches: dict[str, dict] = {}
    for role in sorted({topo.role(n) for n in topo.switches()}):
        count = len(topo.nodes_with_role(role))
        unit = profiles.switches.get(role, SwitchCost(0.0, 0.0))
        switches[role] = {"count": count, "power_w": count * unit.power_w,
                          "cost_usd": count * unit.cost_usd}
    links: dict[str, dict] = {}
    power = link_power(topo, profiles)
    for a, b, data in topo.graph.edges(data=True):
        tech = data["tech"]
        p = profiles.for_tech(tech)
        row = links.setdefault(tech, {"profile": p.name, "links": 0, "lanes": 0, "ports": 0,
                                      "transceivers": 0, "cables": 0,
                                      "power_w": power[tech]["power_w"], "cost_usd": 0.0})
        bundle = ports_for_rate(p, real_rate_gbps(topo, data["rate_mbps"]))
        row["links"] += 1
        row["lanes"] += profiles.link_lanes(topo, a, b) + p.spare_lanes
        row["ports"] += 2 * bundle
        row["transceivers"] += 2 * bundle if tech in LASER_LIKE else 0
        row["cables"] += bundle
        row["cost_usd"] += bundle * p.cost_usd_per_link
    total_power = sum(r["power_w"] for r in (*switches.values(), *links.values()))
    total_cost = sum(r["cost_usd"] for r in (*switches.values(), *links.values()))
    return {"topology": topo.name, "scale_factor": topo.scale_factor, "switches": switches,
            "links": links, "power_w": total_power, "cost_usd": total_cost,
            "power_source": POWER_SOURCE}


def format_cost_table(table: dict) -> str:
    """Fixed-width text of cost_table(), '#' header and a units row."""
    rows = [f"# cost and power of {table['topology']} (real rates, x{table['scale_factor']:g})",
            f"# {'item':<18} {'count':>6} {'lanes':>7} {'ports':>6} {'xcvrs':>6} "
            f"{'cables':>6} {'power':>10} {'cost':>12}",
            f"# {'':<18} {'':>6} {'':>7} {'':>6} {'':>6} {'':>6} {'(W)':>10} {'(USD)':>12}"]
    for role, r in table["switches"].items():
        rows.append(f"  {'switch ' + role:<18} {r['count']:>6} {'':>7} {'':>6} {'':>6} "
                    f"{'':>6} {r['power_w']:>10.1f} {r['cost_usd']:>12.0f}")
    for tech, r in sorted(table["links"].items()):
        rows.append(f"  {'link ' + tech:<18} {r['links']:>6} {r['lanes']:>7} {r['ports']:>6} "
                    f"{r['transceivers']:>6} {r['cables']:>6} {r['power_w']:>10.1f} "
                    f"{r['cost_usd']:>12.0f}")
    rows.append(f"  {'total':<18} {'':>6} {'':>7} {'':>6} {'':>6} {'':>6} "
                f"{table['power_w']:>10.1f} {table['cost_usd']:>12.0f}")
    rows.append(f"# link power: {table.get('power_source', POWER_SOURCE)}; "
                "lanes = ceil(real rate / lane rate) + spares")
    rows.append("# a link wider than its reference port counts as ceil(rate / reference "
                "rate) links: ports, transceivers, cables, cost")
    return "\n".join(rows) + "\n"


def with_spares(profile: LinkProfile, spare_lanes: int) -> LinkProfile:
    """The same profile with `spare_lanes` spare lanes."""
    return replace(profile, spare_lanes=check_count("spare_lanes", spare_lanes, 0))
