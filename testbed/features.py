"""A run's features: each mechanism a run turns on, on a fabric or on one server's part
of it, as one unit, and the one way every run enters them.

    orchestrator (this machine)            each server (this machine: the only one)
    options(exp) ── its settings' keys ──▶ running(part, options): set up, agents, torn down
                                           measure(state, part, window, measured): JSON
    merge({server: result}, run) ◀─────────┘
    metrics(merged, run): its metrics.json keys      summary(metrics): its summary.md lines

A run on this machine is a run on one server: `testbed.run` and each server of a run on
several machines (`testbed.remote agents`) enter the registered features in one ExitStack
(`entered`), measure them the same way (`Live.measure`) and grade the server's fidelity
the same way (`grade`). A feature's `options` are its settings types' keys (TOML data: what
crosses to a server as JSON), so a server rebuilds the same settings. A feature whose
`across_servers` is a reason, not True, is refused on several machines with that reason
(testbed.experiment.Experiment.check_spread). A class missing a hook is refused when it is
defined. docs/architecture.md walks through adding one.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from fabric.lossless import LosslessSettings, SwitchSettings
from fabric.pause_receiver import FAR_LINKS, receiving
from fabric.queue_counters import EcnSettings
from fabric.scheduled import switches_running
from fabric.switch_lb import SwitchLbSettings
from fabric.trimming import TrimSettings
from fabric.voq import VoqSettings
from testbed.cc_results import cc_metrics
from testbed.cc_results import summary_line as cc_line
from testbed.collect import CpuSampler, LinkSample, LinkSampler, Pcaps, port_totals
from testbed.fidelity import verdict
from testbed.kernel_timers import TimerWatch, busy_s, tolerance_s
from testbed.pfc_results import write_report
from testbed.switch_summary import spread_pfc_metrics, switch_lines
from topologies.link_settings import LinkSettings, physics_of
from topologies.settings import default_of, own_fields
from traffic.cc import DcqcnSettings
from traffic.nscc import NsccSettings

HOOKS = ("options", "running", "measure", "merge", "metrics", "summary", "plots")
SETTLE_S = 0.2    # a server's switches idle before its PFC controller and captures stop


@dataclass
class Part:
    """What a feature runs on: one server's part of the fabric (on this machine, all of
    it), where its files go, and what it hands the agents' launch."""

    fab: Any                      # fabric.core.Fabric, or testbed.remote.Deployed.whole()
    out: Path                     # its files (here: the results folder)
    progress: Callable[[str], None] = lambda msg: None
    ranks: list[str] = field(default_factory=list)    # the run's ranks, on every server
    spread: bool = False          # other servers hold the rest of the fabric
    helpers: dict[int, str] = field(default_factory=dict)   # watched with the agents
    starts: list[Callable[[int], None]] = field(default_factory=list)  # at the start (ns)
    path_delay_ns: dict | None = None   # the receivers' delay lines (link physics)

    @property
    def topo(self):
        return self.fab.topo

    def on_start(self, start_ns: int) -> None:
        for call in self.starts:
            call(start_ns)


@dataclass
class Run:
    """What a feature's merge and metrics see of the whole run."""

    folder: Path
    topo: Any
    agents: dict[str, dict]
    agent_options: dict = field(default_factory=dict)    # testbed.run.agent_options


class Feature:
    """A mechanism a run turns on. Subclasses set `name` (its key in metrics.json's
    features and the request to a server), `settings` (the settings types its keys come
    from) and `across_servers` (True, or why it is refused on several machines), and
    give every hook of HOOKS; a hook with nothing to do says so in its body."""

    name: ClassVar[str]
    settings: ClassVar[tuple[type, ...]] = ()
    across_servers: ClassVar[bool | str] = True

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        missing = [h for h in HOOKS if getattr(cls, h) is getattr(Feature, h)]
        if "name" not in cls.__dict__:
            missing.insert(0, "name")
        if missing:
            raise TypeError(f"feature {cls.__name__} lacks {', '.join(missing)}: every "
                            f"feature gives name and {', '.join(HOOKS)} (testbed.features)")

    def options(self, exp) -> dict | None:
        """Its settings' keys from the experiment, or None when the run does not use it."""
        raise NotImplementedError

    def spread_refusal(self, exp) -> tuple[str, str] | None:
        """(the key, why) of a setting of `exp` this feature cannot run on several
        machines with: any of its own settings off its default, when `across_servers`
        is a reason."""
        return None if self.across_servers is True else \
            changed_key(exp, self.settings, self.across_servers)

    def running(self, part: Part, options: dict):
        """A context manager: set up on `part`, yield its state, tear down."""
        raise NotImplementedError

    def measure(self, state, part: Part, window: tuple[float, float] | None,
                measured: dict) -> dict | None:
        """After the tear-down: what it measured on this part (JSON-ready); `measured`
        holds the results of the features registered before it."""
        raise NotImplementedError

    def merge(self, by_server: dict[str, dict], run: Run) -> Any:
        """One result from every server's (on this machine: one server, "")."""
        raise NotImplementedError

    def metrics(self, merged, run: Run) -> dict:
        """Its keys of metrics.json (`merged` None: the run did not use it)."""
        raise NotImplementedError

    def summary(self, m: dict) -> list[str]:
        """Its lines of summary.md, from metrics.json (`testbed report` redraws them)."""
        raise NotImplementedError

    def plots(self, folder: Path, m: dict) -> list[Path]:
        """The plots it draws from the files it wrote in `folder` (testbed.plots draws
        every plot of a folder, for a run and for `testbed report`)."""
        raise NotImplementedError


def changed_key(exp, types: tuple[type, ...], why: str) -> tuple[str, str] | None:
    """(the first key of `types`' own fields that `exp` sets off its default, `why`)."""
    for cls in types:
        for f in fields(cls):
            if f.name in own_fields(cls) and getattr(exp, f.name) != default_of(f):
                return f.name, why
    return None


def keys_of(exp, *types: type) -> dict:
    """The experiment's values of every field of `types` (their settings keys)."""
    return {f.name: getattr(exp, f.name) for t in types for f in fields(t)}


class Captures(Feature):
    """tcpdump on the ports asked for, each on its node's server (testbed.collect.Pcaps);
    started first and stopped last, so they see the other features' last frames."""

    name = "pcap"

    def options(self, exp) -> dict | None:
        return {"pcap": list(exp.pcap)} if exp.pcap else None

    @contextlib.contextmanager
    def running(self, part: Part, options: dict) -> Iterator[Pcaps]:
        owners = {p.ifname: n for n, ports in part.fab.plan.ports.items() for p in ports}
        here = set(part.fab.here)
        pcaps = Pcaps(part.fab, [i for i in options["pcap"] if owners.get(i) in here],
                      part.out / "pcaps")
        try:
            pcaps.start()
            part.helpers.update(pcaps.helpers())
            yield pcaps
        finally:
            pcaps.stop()

    def measure(self, state: Pcaps, part, window, measured) -> dict:
        return {"files": [c.path.name for c in state.captures if c.path.exists()]}

    def merge(self, by_server: dict[str, dict], run: Run) -> list[Path]:
        return sorted(run.folder / "pcaps" / name for r in by_server.values()
                      for name in r["files"])

    def metrics(self, merged, run: Run) -> dict:
        return {}    # the files are the result; summary.md lists them from the folder

    def summary(self, m: dict) -> list[str]:
        return []    # summary_md's pcaps line, written from the folder's files

    def plots(self, folder: Path, m: dict) -> list[Path]:
        return []    # captures are opened in Wireshark


class Switches(Feature):
    """PFC, ECN marking, switch load balancing and trimming: the switch control plane
    (fabric.switch_control) over the part's switches, and on several machines the receiver
    of the pauses other servers send into this part (fabric.pause_receiver)."""

    name = "switch"
    settings = (LosslessSettings, EcnSettings, SwitchLbSettings, TrimSettings, VoqSettings)

    def options(self, exp) -> dict | None:
        switch = SwitchSettings.of(exp)
        return switch.to_keys() if switch.mode else None

    def spread_refusal(self, exp) -> tuple[str, str] | None:
        """PFC runs on every server (fabric.pause_receiver obeys the pauses that cross); ECN
        marking, DLB and trimming read the eBPF queue counters, which count a queue's bytes
        out at the link's far end: on another machine for a link between servers."""
        return (changed_key(exp, (EcnSettings, SwitchLbSettings, TrimSettings), FAR_LINKS)
                or changed_key(exp, (VoqSettings,), "the pause receiver on the other "
                               "machine holds a whole class, not one destination's queue"))

    @contextlib.contextmanager
    def running(self, part: Part, options: dict) -> Iterator[dict]:
        switch = SwitchSettings(**options)
        with contextlib.ExitStack() as stack:
            ctl = stack.enter_context(switches_running(part.fab, switch))
            rx = stack.enter_context(receiving(part.fab, switch)) if part.spread else None
            part.helpers.update({p.pid: what for p, what in ((ctl, "the PFC controller"),
                                                             (rx, "the PFC receiver"))
                                 if p is not None and p.pid is not None})
            part.progress(f"PFC {switch.mode}: lossless class for DSCP "
                          f"{switch.traffic_class.dscp} on every port"
                          + (", a queue per destination paused per destination (VOQ)"
                             if switch.voq == "on" else "")
                          + (", credit-scheduled per destination (VOQ scheduled)"
                             if switch.voq == "scheduled" else "")
                          + (" (pauses from other servers obeyed by its receiver)"
                             if part.spread else ""))
            if part.spread:  # a last XON, sent a late poll after, still reaches the others
                stack.callback(time.sleep, SETTLE_S)
            yield {"controller": ctl, "receiver": rx, "enabled": switch.enabled}

    def measure(self, state: dict, part, window, measured) -> dict:
        ctl, rx = state["controller"], state["receiver"]
        return {"controller": ctl.report(), "receiver": rx.report() if rx else None,
                "timeline": [] if part.spread else ctl.timeline,   # its file: one machine's
                "t0": ctl.t0, "enabled": state["enabled"]}

    def merge(self, by_server: dict[str, dict], run: Run) -> dict:
        if set(by_server) == {""}:   # this machine's whole fabric: pfc.json, its timeline
            got = by_server[""]
            write_report(run.folder, got["controller"], got["timeline"])
            return got
        for s, got in by_server.items():
            write_json(run.folder / f"pfc-{s}.json", {k: got[k] for k in ("controller",
                                                                          "receiver")})
        return {"per_server": by_server}

    def metrics(self, merged: dict | None, run: Run) -> dict:
        if merged is None:
            return {"pfc": None}
        if "per_server" in merged:
            return {"pfc": spread_pfc_metrics(merged)}
        rep = merged["controller"]
        out = {k: rep.get(k) for k in ("enabled", "headroom", "reaction_ms", "totals",
                                       "storms", "controller", "ecn", "switch_lb",
                                       "trimming", "voq")}
        return {"pfc": out | {k: rep["calibration"].get(k)
                              for k in ("occupancy_from", "poll_ms", "sleep")}}

    def summary(self, m: dict) -> list[str]:
        return switch_lines(m)

    def plots(self, folder: Path, m: dict) -> list[Path]:
        from testbed.feature_plots import pfc_plots  # matplotlib: only where one draws
        timeline = folder / "pfc_timeline.csv"
        return pfc_plots(folder, m) if timeline.exists() else []


class LinkPhysics(Feature):
    """Loss, propagation delay and link failures (fabric.impair): loss and delay applied
    before the agents start, failures played from their agreed start by a process of
    their own. On several machines each server changes its own ends of every link (loss
    at the receiving end, netem and rates at the sending end) and plays its part of each
    failure. Its kernel state goes with the fabric's namespaces."""

    name = "link_physics"
    settings = (LinkSettings,)

    def options(self, exp) -> dict | None:
        on = exp.loss_rate or exp.delay == "on" or exp.failures or exp.failure_horizon_h
        return {**keys_of(exp, LinkSettings), "seed": exp.seed} if on else None

    @contextlib.contextmanager
    def running(self, part: Part, options: dict) -> Iterator[dict]:
        from fabric.impair import Impairments
        opts = dict(options)
        seed = opts.pop("seed")
        settings = LinkSettings(**opts)
        profiles, events, loss_links = physics_of(settings, part.topo, seed)
        imp = Impairments(part.fab, profiles, delay=settings.delay == "on")
        state = {"imp": imp, "record": None}
        failures = None
        try:
            if settings.loss_rate:
                imp.apply(loss_rate=settings.loss_rate, links=loss_links or None)
                part.progress(f"loss {settings.loss_rate:g} on "
                              f"{f'{len(loss_links)} links' if loss_links else 'every link'}"
                              f" by {imp.loss_where}")
            if settings.delay == "on":
                self._delay(imp, part)
            if events:  # the playback process loads now, before the clock matters
                failures = imp.prepare_schedule(events)
                if failures.pid is not None:
                    part.helpers[failures.pid] = "the failure player"

                def start(start_ns: int) -> None:   # timed from the agents' agreed start
                    failures.start(start_ns)
                    part.progress(f"failure schedule: {len(events)} events")
                part.starts.append(start)
            yield state
        finally:
            if failures is not None:
                failures.stop()
            state["record"] = imp.record()

    @staticmethod
    def _delay(imp, part: Part) -> None:
        imp.apply_delay()
        if imp.delay_mechanism == "agent delay line":
            part.path_delay_ns = imp.path_delays_ns(
                [(a, b) for a in part.ranks for b in part.ranks if a != b])
        delays = part.path_delay_ns
        mean_ms = sum(delays.values()) / len(delays) / 1e6 if delays else None
        part.progress(f"propagation delay by {imp.delay_mechanism}"
                      + (f", one way {mean_ms:.3f} ms mean over rank pairs"
                         if mean_ms is not None else ""))

    def measure(self, state: dict, part, window, measured) -> dict:
        return state["record"]

    def merge(self, by_server: dict[str, dict], run: Run) -> dict:
        """Every server planned the same links and events, and played its ends of them:
        an event landed when the last of its servers had it."""
        records = list(by_server.values())
        merged = dict(max(records, key=lambda r: len(r["events"])))
        events = []
        for i, e in enumerate(merged["events"]):   # the i-th event of the same schedule
            had = [r["events"][i] for r in records if len(r["events"]) > i]
            events.append({**e, "t_s": max(x["t_s"] for x in had),
                           "began_s": min(x["began_s"] for x in had)}
                          | ({} if len(had) == len(records) else {"ends_played": len(had)}))
        merged["events"] = events
        for key in ("not_emulated", "schedule_errors"):
            merged[key] = list(dict.fromkeys(x for r in records for x in r[key]))
        return merged

    def metrics(self, merged: dict | None, run: Run) -> dict:
        return {"link_physics": merged}

    def summary(self, m: dict) -> list[str]:
        physics = m.get("link_physics")
        if not physics:
            return []
        events = physics["events"]
        return [f"- link physics: loss by {physics['mechanisms']['loss']}, delay "
                f"{physics['mechanisms']['delay']}; {len(events)} failure events applied"
                + "".join(f"; {r}" for r in physics["not_emulated"])]

    def plots(self, folder: Path, m: dict) -> list[Path]:
        return []    # its events are in metrics.json and the summary


class LinkCounters(Feature):
    """Every port's byte counters and queues, sampled (testbed.collect.LinkSampler):
    links.csv, the run's link totals; the agents' progress line reads it."""

    name = "links"

    def options(self, exp) -> dict:
        return {}

    @contextlib.contextmanager
    def running(self, part: Part, options: dict) -> Iterator[LinkSampler]:
        links = LinkSampler(part.fab).start()
        try:
            yield links
        finally:
            links.stop()

    def measure(self, state: LinkSampler, part, window, measured) -> dict:
        return {"t0_ns": int(state.t0 * 1e9), "period_s_mean": state.period_s_mean(),
                "rows": [list(vars(x).values()) for x in state.samples]}

    def merge(self, by_server: dict[str, dict], run: Run) -> dict:
        """Every server's samples on one time axis (from the earliest sampler's start;
        a server's t0_ns is on this machine's clock by then)."""
        base_ns = min(r["t0_ns"] for r in by_server.values())
        samples = sorted((LinkSample((r["t0_ns"] - base_ns) / 1e9 + row[0], *row[1:])
                          for r in by_server.values() for row in r["rows"]),
                         key=lambda x: x.t_s)
        periods = [r["period_s_mean"] for r in by_server.values() if r["period_s_mean"]]
        return {"base_s": base_ns / 1e9, "samples": samples, "totals": port_totals(samples),
                "period_s_mean": max(periods) if periods else None}

    def metrics(self, merged: dict, run: Run) -> dict:
        return {"link_sample_period_s": merged["period_s_mean"]}   # collect.SAMPLER_SHARE

    def summary(self, m: dict) -> list[str]:
        return []    # the links line is the run's own (results.summary_md)

    def plots(self, folder: Path, m: dict) -> list[Path]:
        return []    # port rates: the run's own (results.write_plots)


class CpuLoad(Feature):
    """The machine's CPU load (testbed.collect.CpuSampler), graded over the workload's
    window: the fidelity verdict's CPU input."""

    name = "cpu"

    def options(self, exp) -> dict:
        return {}

    @contextlib.contextmanager
    def running(self, part: Part, options: dict) -> Iterator[CpuSampler]:
        cpu = CpuSampler().start()
        try:
            yield cpu
        finally:
            cpu.stop()

    def measure(self, state: CpuSampler, part, window, measured) -> dict:
        return {"summary": state.summary(window), "rows": [list(r) for r in state.samples]}

    def merge(self, by_server: dict[str, dict], run: Run) -> dict:
        if set(by_server) == {""}:
            got = by_server[""]
            return {"summary": got["summary"], "samples": [tuple(r) for r in got["rows"]]}
        return {"by_server": {s: r["summary"] for s, r in by_server.items()}, "samples": []}

    def metrics(self, merged: dict, run: Run) -> dict:
        return {}    # results.compute_metrics writes "cpu" from the graded server's summary

    def summary(self, m: dict) -> list[str]:
        return []    # part of the run's links line

    def plots(self, folder: Path, m: dict) -> list[Path]:
        return []    # its samples are cpu.csv


class ShapingTimers(Feature):
    """How late the kernel fired the shaping timers (testbed.kernel_timers), graded as
    wire time lost over the part's ports' busy time."""

    name = "shaping_timers"

    def options(self, exp) -> dict:
        return {}

    @contextlib.contextmanager
    def running(self, part: Part, options: dict) -> Iterator[TimerWatch]:
        watch = TimerWatch(tolerance_s(part.topo)).start()
        try:
            yield watch
        finally:
            watch.stop()

    def measure(self, state: TimerWatch, part, window, measured) -> dict:
        rows = measured["links"]["rows"]
        return state.summary(busy_s(part.topo, port_totals([LinkSample(*r) for r in rows])))

    def merge(self, by_server: dict[str, dict], run: Run) -> dict:
        return worst_timers(by_server)

    def metrics(self, merged: dict, run: Run) -> dict:
        return {"shaping_timers": merged}

    def summary(self, m: dict) -> list[str]:
        return []    # graded in the fidelity line (testbed.fidelity)

    def plots(self, folder: Path, m: dict) -> list[Path]:
        return []    # a figure of the verdict


def worst_timers(by_server: dict[str, dict]) -> dict:
    """The server whose shaping timers lost the largest share of its ports' time."""
    return max(by_server.values(), key=lambda t: t.get("lost_fraction") or 0.0)


class CongestionControl(Feature):
    """DCQCN or NSCC, run by the agents (traffic.cc, traffic.nscc) with their times
    scaled to the fabric (testbed.run.agent_options); nothing to set up on a switch."""

    name = "cc"
    settings = (DcqcnSettings, NsccSettings)

    def options(self, exp) -> dict | None:
        return {"cc": exp.cc} if exp.cc in ("dcqcn", "nscc") else None

    @contextlib.contextmanager
    def running(self, part: Part, options: dict) -> Iterator[None]:
        yield None   # the agents run it

    def measure(self, state, part, window, measured) -> None:
        return None  # the agents' results carry its figures

    def merge(self, by_server: dict[str, dict], run: Run) -> None:
        return None

    def metrics(self, merged, run: Run) -> dict:
        """From the agents' results, whoever ran it (None when no agent did)."""
        dcqcn = run.agent_options.get("dcqcn") or {}
        return {"cc": cc_metrics(run.agents, dcqcn.get("cnp_interval_ns"))}

    def summary(self, m: dict) -> list[str]:
        return [cc_line(m["cc"], m.get("jct_over_ideal"))] if m.get("cc") else []

    def plots(self, folder: Path, m: dict) -> list[Path]:
        from testbed.feature_plots import dcqcn_plot  # matplotlib: only where one draws
        rates = folder / "dcqcn_rates.csv"
        return [p for p in [dcqcn_plot(folder)] if p] if rates.exists() else []


# In the order a run enters them (and leaves them, reversed): captures first, so they
# see every other feature's last frames; the samplers last, next to the agents.
FEATURES: tuple[Feature, ...] = (Captures(), Switches(), LinkPhysics(), LinkCounters(),
                                 CpuLoad(), ShapingTimers(), CongestionControl())
BY_NAME = {f.name: f for f in FEATURES}
# Their settings types, in registry order: the experiment is made of them
# (testbed.experiment.Experiment), and `testbed run --help` and docs/settings.md list them
FEATURE_SETTINGS: tuple[type, ...] = tuple(dict.fromkeys(
    cls for f in FEATURES for cls in f.settings))
# What every part runs whatever the settings: its fidelity is graded from them
SAMPLERS: dict[str, dict] = {"links": {}, "cpu": {}, "shaping_timers": {}}


def run_options(exp) -> dict[str, dict]:
    """Every feature the run uses, with its options: what each server is sent."""
    return {f.name: opts for f in FEATURES if (opts := f.options(exp)) is not None}


class Live:
    """The features entered on a part: their states while the agents run, then their
    results (`measure`, after the tear-down)."""

    def __init__(self, part: Part):
        self.part = part
        self.state: dict[str, Any] = {}

    def measure(self, window: tuple[float, float] | None) -> dict[str, Any]:
        measured: dict[str, Any] = {}
        for name, state in self.state.items():
            measured[name] = BY_NAME[name].measure(state, self.part, window, measured)
        return measured


@contextlib.contextmanager
def entered(part: Part, options: dict[str, dict]) -> Iterator[Live]:
    """The features of `options` set up on `part` in registry order, in one ExitStack:
    an error on the way, or the end of the block, tears down those already up."""
    live = Live(part)
    with contextlib.ExitStack() as stack:
        for feature in FEATURES:
            if feature.name in options:
                live.state[feature.name] = stack.enter_context(
                    feature.running(part, options[feature.name]))
        yield live


def grade(agents: dict[str, dict], measured: dict[str, Any]) -> dict:
    """A part's fidelity verdict (testbed.fidelity) from its agents and what its features
    measured: the same inputs on this machine and on every server."""
    load = measured["cpu"]["summary"]
    switch = measured.get("switch")
    ctl = switch["controller"] if switch else None
    gap = ctl["controller"].get("poll_gap_p99_ms") if ctl and switch["enabled"] else None
    return verdict(agents, load["cpu_mean_percent"], gap, load.get("softnet"),
                   load.get("steal_mean_percent"), measured.get("shaping_timers"), pfc=ctl)


def merged_results(by_server: dict[str, dict], run: Run) -> dict[str, Any]:
    """Every feature's merged result, from each server's measured features."""
    names = [f.name for f in FEATURES if any(f.name in r for r in by_server.values())]
    return {name: BY_NAME[name].merge({s: r[name] for s, r in by_server.items()
                                       if name in r}, run) for name in names}


def features_metrics(merged: dict[str, Any], run: Run) -> dict:
    """metrics.json's keys from every registered feature (those the run did not use
    give theirs as absent)."""
    out: dict = {}
    for feature in FEATURES:
        out |= feature.metrics(merged.get(feature.name), run)
    return out


def summary_lines(m: dict) -> list[str]:
    """summary.md's lines from every registered feature (from metrics.json alone)."""
    return [line for f in FEATURES for line in f.summary(m)]


def write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=1) + "\n")
