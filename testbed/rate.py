"""Which emulated link rate an experiment can have on this machine: the model behind
`--rate N|auto`, from the calibration `testbed calibrate` measured (testbed.calibrate).

A delivered packet costs the machine  c(h) = a + b h  seconds at h switch hops, with a
(agents, host stacks) and b (one kernel forwarding hop) measured by calibration. An
experiment whose flows offer D Mbit/s of data over a mean of h hops keeps up when

    D / frame_bits x c(h) <= UTILIZATION      (0.6: room for wake-ups, timers, collectors)

so the highest rate that should stay faithful scales the topology's rates (ratios kept)
until equality. A second bound is the fastest flow's frame time: an agent process
turns each chunk around and keeps its ports fed between its wake-ups, which takes the
longer the more a packet costs this machine, so a frame on the fastest flow's path
(its bottleneck) must last at least FRAME_COST_PACKETS packets' worth, c(h):

    frame_bits / fastest_flow_rate >= FRAME_COST_PACKETS x c(h)

A run with the switch controller (fabric.switch_control: PFC on or off, ECN, switch
balancing, trimming, VOQ) has a third cost that follows time, not packets: the
controller polls every pfc_poll_ms while lossless bytes are queued, whatever the rate,
and each poll reads and decides every switch port. Its share of the machine comes off
the budget before the packets':

    poll = (POLL_COST_PACKETS + PORT_POLL_COST_PACKETS x switch ports) x a
    controller = min(1 core, poll / pfc_poll_ms) / cores
    D / frame_bits x c(h) <= UTILIZATION - controller

Both are predictions from two paced runs (testbed.calibrate: the machine's time per
packet at an experiment's load); the run's own fidelity verdict (testbed.fidelity) says
whether they held.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

from fabric import routing
from testbed.experiment import Experiment
from testbed.flow_plan import flow_schedule
from testbed.train_run import real_job
from topologies.files import build
from topologies.spec import SpecError, Topology
from traffic import workloads
from traffic.engine import INTERPRETED, engine, engine_name, requested
from traffic.job import Job, expand, scaled
from traffic.open_loop import TAG as FLOWS_TAG
from traffic.packets import BTH_BYTES, ETH_BYTES, ICRC_BYTES, IPV4_BYTES, UDP_BYTES
from traffic.rpc import TAG as RPC_TAG
from traffic.train import analytic_step, rate_function
from traffic.workloads import Schedule, workload_named

CACHE = Path(os.environ.get("AFT_CALIBRATION", "/var/cache/aft-testbed/calibration.json"))
MAX_AGE_S = 7 * 24 * 3600
CLOCK_SKEW_S = 3600          # a calibration dated later than now by more is not trusted
MODEL = "paced-load2"   # what the cached costs mean (testbed.calibrate); others are stale
UTILIZATION = 0.6
# What starting and finishing one open-loop flow costs the agents beyond its packets (its
# step, timers, ACK of a short flow, results row), in packets' worth of CPU: a ratio, so
# it follows the machine's calibrated packet cost. scripts/bench_flows.py measures the
# range it lies in (docs/benchmarks.md); this is the range's upper end, so that auto
# does not over-promise
FLOW_COST_PACKETS = 6.0
# How many packets' worth of the machine (c(h)) a frame on the fastest flow must last.
# Measured on one 2-core machine (calibrated 10.1 us a packet over one hop), the flows
# over NVLink at 9x the rails (rail_optimized: the training step's TP all-reduces, and
# a 16-rank ring in rails order) starved their wires 0.07-1.8 % of busy time at 14.6
# packets a frame (faithful), 0.9-2.3 % at 7.3 (degraded) and 3.7-15 % at 3.7
# (unfaithful), at 20-60 % CPU: the CPU budget alone had picked the 3.7
# (docs/kernel_cost.md)
FRAME_COST_PACKETS = 12.0
# What the switch controller spends on a poll, and on each switch port at each poll, in
# packets' worth of the machine (a, the calibrated direct cost): ratios, so they follow
# the machine. Measured on one 2-core machine (a = 17.4 us), permutations with PFC on
# leaf-spines of 12, 27 and 48 switch ports: 0.15-0.33 ms a poll, and 0.4-1.3 ms on the
# 48 ports at 25 Mbit/s, where the controller took a whole core and the runs read 82-94 %
# CPU (the budget without it had promised 32 %). These are the range's upper end. Its
# process is one thread: one core at most (docs/kernel_cost.md)
POLL_COST_PACKETS = 8.0
PORT_POLL_COST_PACKETS = 0.5
# Down to 2 Mbit/s: a 128-GPU ring needs under 5 here. There one 4 KiB frame takes 17 ms,
# close to the PFC controller's 20 ms timeline sample, and a run takes minutes per MiB.
RATE_LADDER_MBPS = (2, 5, 10, 20, 25, 50, 75, 100, 150, 200, 300, 400, 500, 800, 1000,
                    2000)
MIN_RATE_MBPS = RATE_LADDER_MBPS[0]
RINGS = workloads.RINGS    # the ring collectives (Workload.ring)


def machine_key() -> dict:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"hostname": platform.node(), "cpu_model": cpu, "cores": os.cpu_count(),
            "kernel": platform.release()}


def agents_engine() -> str:
    """The engine the agents a run starts now will run ("compiled" or "interpreted"):
    they inherit AFT_ENGINE, and load the extensions where they are built."""
    return INTERPRETED if requested() == INTERPRETED else engine_name(engine())


def load_cached(path: Path | None = None, max_age_s: float = MAX_AGE_S) -> dict | None:
    """The cached calibration of this machine, if it is recent enough and its agents ran
    the engine a run's agents would run now (the compiled one costs less per packet, so a
    budget measured with it over-rates the interpreted one)."""
    path = path or CACHE
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    t = data.get("t")
    age = time.time() - t if isinstance(t, int | float) else math.inf
    # measured in the future: a clock that was wrong then, or a file made by hand
    if (data.get("machine") != machine_key() or data.get("model") != MODEL
            or not -CLOCK_SKEW_S <= age <= max_age_s
            or data.get("engine") != agents_engine()
            or not all(_number(data.get(k), low) for k, low in NUMBERS.items())
            or not isinstance(data.get("runs"), dict)):
        return None
    return data


# what the rate model computes with, each a finite number above (or at, for a hop) this
NUMBERS = {"cost_us_per_packet": 1e-9, "cost_us_per_hop": 0.0, "budget_pps_direct": 1e-9}


def _number(value, low: float) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) \
        and math.isfinite(value) and value >= low


# -- what an experiment asks of the machine -------------------------------------------
def frame_bits(payload_bytes: int) -> int:
    """Bits of one data frame on the wire: headers, BTH and stamp inside payload, ICRC."""
    return (ETH_BYTES + IPV4_BYTES + UDP_BYTES + BTH_BYTES + payload_bytes + ICRC_BYTES) * 8


def build_workload(exp: Experiment, ranks: list[str], pairs: list[tuple[str, str]] | None,
                   topo: Topology) -> Schedule | Job:
    """What the run's agents will do, built once: the schedule of one iteration, or for a
    job (train_step) its real job, which testbed.train_run.job_schedule scales to the
    rate the run picks; open-loop flows at `topo`'s own rates (testbed.flow_run builds
    them again at the rate the run picks: the same flows, their instants scaled). The
    rate's prediction and the run both take it."""
    workload = workload_named(exp.workload)
    if workload.job:
        return real_job(exp, ranks)
    if workload.open_loop:
        return flow_schedule(exp, topo, ranks, pairs)[0]
    return workload.schedule(ranks, exp.message_bytes, seed=exp.seed, pairs=pairs)


def offered_load(exp: Experiment, topo: Topology, ranks: list[str],
                 pairs: list[tuple[str, str]] | None,
                 built: Schedule | Job | None = None) -> dict:
    """Data Mbit/s the workload offers at the topology's rates, and its mean switch hops
    (weighted by rate). Flows run at their path's bottleneck; a rank sends and receives
    no faster than its ports together; a ring's flows all run at its slowest flow's
    rate (a rank forwards a chunk only once it has arrived: on rail128 the NVLink hops
    of the ring wait on the rails, and counting them at NVLink rate made its offered
    load 64 times the real one); a job's load is its analytic step's peak.
    `built`: build_workload's, when the caller has it (else built here)."""
    g = topo.graph
    workload = workload_named(exp.workload)
    built = build_workload(exp, ranks, pairs, topo) if built is None else built
    peak, per_flow = None, None
    if workload.job:   # a job's transfers; its load at the analytic step's peak
        flows = {(t.src, t.dst) for steps in expand(built).values() for st in steps
                 for t in st.sends}
        peak = analytic_step(scaled(built, 1.0, topo.scale_factor),
                             rate_function(g))["peak_mbps"]
    elif workload.open_loop:   # every flow's pair; each sender at its load (and the
        flows = {(t.src, t.dst) for steps in built.values() for st in steps   # background
                 for t in st.sends}                                          # at its peak)
        senders = {t.src for steps in built.values() for st in steps for t in st.sends
                   if t.tag.startswith(FLOWS_TAG + ".")}
        clients = {t.src for steps in built.values() for st in steps for t in st.sends
                   if t.tag.startswith(RPC_TAG + ".") and t.tag.endswith(".req")}
        # flows: each sender at its load, a background job at its ranks' links; RPCs:
        # the responses into the clients, at most their links
        peak = exp.flow_load * sum(topo.nic_rate_mbps(n) for n in senders) \
            + sum(topo.nic_rate_mbps(n) for n in clients) \
            + (0.0 if exp.workload != "flows" or exp.flow_background == "none" else
               sum(topo.nic_rate_mbps(n) for n in ranks))
        per_flow = flow_costs(built, exp.payload_bytes)
    else:
        flows = {(t.src, t.dst) for steps in built.values() for st in steps[:1]
                 for t in st.sends}
    port_mbps = {n: sum(d["rate_mbps"] for _, _, d in g.edges(n, data=True)) for n in ranks}
    out_mbps: dict[str, float] = {}
    in_mbps: dict[str, float] = {}
    weighted_hops = total = 0.0
    # the fabric's own routes: a GPU never forwards, so a path may not cross one (a
    # shortest path in the bare graph did, on rail fabrics: 13,440 of rail128's
    # 16,256 all-to-all flows)
    routes = routing.compute_routes(topo) if flows else {}
    paths = {f: routing.path(topo, routes, *f) for f in flows}
    bottleneck = {f: min(g.edges[a, b]["rate_mbps"] for a, b in pairwise(p))
                  for f, p in paths.items()}
    ring = min(bottleneck.values(), default=0.0) if workload.ring else None
    for (src, dst), path in paths.items():
        rate = ring if ring is not None else bottleneck[src, dst]
        out_mbps[src] = out_mbps.get(src, 0.0) + rate
        in_mbps[dst] = in_mbps.get(dst, 0.0) + rate
        weighted_hops += rate * (len(path) - 2)
        total += rate
    sent = sum(min(v, port_mbps[n]) for n, v in out_mbps.items())
    received = sum(min(v, port_mbps[n]) for n, v in in_mbps.items())
    out = {"offered_mbps": peak if peak is not None else min(sent, received),
           "mean_switch_hops": weighted_hops / total
           if total else 0.0, "flows": len(flows),
           # a ring's hop runs at its own links' pace while its chunk lasts
           "fastest_flow_mbps": max(bottleneck.values(), default=0.0)}
    if per_flow:   # open loop: flows per second at these rates, and their packets each
        mean_bytes, packets = per_flow
        out |= {"flows_per_s": out["offered_mbps"] * 1e6 / 8 / mean_bytes,
                "packets_per_flow": packets}
    return out


def flow_costs(built: Schedule, payload_bytes: int) -> tuple[float, float] | None:
    """An open-loop schedule's mean transfer (bytes) and packets per transfer (a mouse
    of 300 B is a whole packet, not 300 B of one); None without a transfer."""
    sizes = [t.size_bytes for steps in built.values() for st in steps for t in st.sends]
    if not sizes:
        return None
    return (sum(sizes) / len(sizes),
            sum(-(-s // payload_bytes) for s in sizes) / len(sizes))


def base_rate_mbps(topo: Topology) -> float:
    """The rate a topology's `rate_mbps` parameter sets (its endpoint links)."""
    rate = topo.params.get("rate_mbps")
    if rate is None:
        raise SpecError("experiment.rate", f"topology kind {topo.kind} has no rate_mbps")
    return float(rate)


def scaled_rto_ms(rto_ms: float, base_mbps: float, rate_mbps: float) -> float:
    """The retransmission timeout for links rescaled from `base_mbps` to `rate_mbps`:
    stretched as the rate falls (a window's wire time, and so the RTT under load, grows
    by base/rate: at 5 Mbit/s a 64-packet window is 425 ms against the default 50 ms),
    never shortened (the emulator's own wake-up lag does not shrink with a faster link)."""
    return rto_ms * max(1.0, base_mbps / rate_mbps)


def rescaled(topo: Topology, rate_mbps: float) -> Topology:
    """The same fabric at base rate `rate_mbps`: every rate scaled by one factor (their
    ratios kept) and the scale factor divided by it (the real rates kept)."""
    k = rate_mbps / base_rate_mbps(topo)
    params = dict(topo.params)
    params["rate_mbps"] = rate_mbps
    for key in ("nvlink_rate_mbps", "uplink_rate_mbps"):
        if params.get(key) is not None:
            params[key] = params[key] * k
    return build(topo.kind, params, topo.name, topo.scale_factor / k)


def pick_rate(cal: dict, exp: Experiment, topo: Topology, ranks: list[str],
              pairs: list[tuple[str, str]] | None, built: Schedule | Job | None = None
              ) -> dict:
    """The highest ladder rate that keeps every constraint of the run (`rate_mbps`, beside
    what `predict` gives, and `bound_by`, the constraint that set it): this machine's CPU
    budget (the calibration), the fastest flow's frame time against a packet's cost
    ("port": FRAME_COST_PACKETS), the topology's own rate (auto never runs a fabric
    faster than its file says); SpecError if none is left. With PFC on, the run then sizes
    the buffers for the rate (testbed.lossless_plan). `built`: as offered_load's."""
    choice = predict(cal, exp, topo, ranks, pairs, built)
    limits = {"cpu": choice["max_cpu_mbps"], "topology": base_rate_mbps(topo)}
    if choice["max_port_mbps"] is not None:
        limits["port"] = choice["max_port_mbps"]
    fitting = [r for r in RATE_LADDER_MBPS if r <= min(limits.values())]
    if not fitting:
        raise SpecError("experiment.rate", f"auto: this machine can carry this experiment "
                        f"at {choice['max_faithful_mbps']:.1f} Mbit/s per link at most "
                        f"(calibrated {cal['budget_pps_direct']} packets/s on "
                        f"{cal['date_utc']}), below the lowest sensible {MIN_RATE_MBPS} "
                        "Mbit/s; use fewer ranks"
                        + (f" (its switch controller alone takes {choice['controller_cores']:g}"
                           f" of the {choice['cores']} cores while queues are busy)"
                           if choice["controller_cores"] else ""))
    bound_by = min(limits, key=limits.get)
    choice["rate_mbps"] = float(fitting[-1])
    choice["bound_by"] = bound_by
    choice["limits_mbps"] = limits
    return choice


def predict(cal: dict, exp: Experiment, topo: Topology, ranks: list[str],
            pairs: list[tuple[str, str]] | None, built: Schedule | Job | None = None
            ) -> dict:
    """The highest base rate at which the experiment should stay faithful here
    (`max_faithful_mbps`, not rounded to the ladder), and what it came from. `built`:
    as offered_load's."""
    load = offered_load(exp, topo, ranks, pairs, built)
    cost_s = (cal["cost_us_per_packet"] + cal["cost_us_per_hop"] * load["mean_switch_hops"]) \
        / 1e6
    pps_per_mbps = load["offered_mbps"] / base_rate_mbps(topo) * 1e6 / \
        frame_bits(exp.payload_bytes)          # offered packets/s per Mbit/s of base rate
    if "flows_per_s" in load:    # open loop: per flow, its packets and its own cost
        pps_per_mbps = load["flows_per_s"] / base_rate_mbps(topo) \
            * (load["packets_per_flow"] + FLOW_COST_PACKETS)
    controller, cores = controller_cores(cal, exp, topo), cores_of(cal)
    packets_mbps = UTILIZATION / (pps_per_mbps * cost_s)      # the packets' own budget
    cpu_mbps = packets_mbps * max(0.0, 1 - controller / cores / UTILIZATION)
    # the fastest flow's rate scales with the base rate: its frames last long enough
    port_mbps = (base_rate_mbps(topo) / load["fastest_flow_mbps"]
                 * frame_bits(exp.payload_bytes) / (FRAME_COST_PACKETS * cost_s) / 1e6
                 if load["fastest_flow_mbps"] > 0 else math.inf)
    return {"max_faithful_mbps": round(min(cpu_mbps, port_mbps), 1),
            "max_cpu_mbps": round(cpu_mbps, 1), "max_packets_mbps": round(packets_mbps, 1),
            "max_port_mbps": round(port_mbps, 1) if math.isfinite(port_mbps) else None,
            "cost_us_per_packet": cost_s * 1e6, "controller_cores": round(controller, 3),
            "cores": cores,
            **load, "base_mbps": base_rate_mbps(topo), "calibrated_utc": cal["date_utc"],
            "budget_pps_direct": cal["budget_pps_direct"]}


def cores_of(cal: dict) -> int:
    """The calibrated machine's cores (the calibration is of this machine: load_cached)."""
    return (cal.get("machine") or {}).get("cores") or os.cpu_count() or 1


def controller_cores(cal: dict, exp: Experiment, topo: Topology) -> float:
    """The cores the run's switch controller takes while lossless bytes are queued: each
    poll reads and decides every switch port of `topo`; 0 where the run has none."""
    settings = exp.switch_settings()
    if not settings.mode:
        return 0.0
    ports = sum(len(topo.ports(s)) for s in topo.switches())
    poll_s = (POLL_COST_PACKETS + PORT_POLL_COST_PACKETS * ports) \
        * cal["cost_us_per_packet"] / 1e6
    return min(1.0, poll_s / (settings.pfc_poll_ms / 1e3))


def rate_check(cal: dict | None, exp: Experiment, topo: Topology, ranks: list[str],
               pairs: list[tuple[str, str]] | None, built: Schedule | Job | None = None
               ) -> dict | None:
    """A rate the experiment set (not auto) against what this machine's calibration says
    it carries faithfully: `predict`'s figures, the base rate it runs at (`rate_mbps`)
    and whether that is `within` them; None without a calibration. `built`: as
    offered_load's."""
    if cal is None:
        return None
    got = predict(cal, exp, topo, ranks, pairs, built)
    rate = base_rate_mbps(topo)
    return {**got, "rate_mbps": rate, "within": rate <= got["max_faithful_mbps"]}


def common_rate(value: str | float, experiments: Callable[[float], list[Experiment]],
                progress=print, cache: Path | None = None) -> float:
    """A script's rate: `value` as it is, or for "auto" one rate for all its runs, so
    they compare: the lowest of the rates pick_rate gives each experiment
    (`experiments(rate)` builds them at any rate; the pick does not depend on it)."""
    if value != "auto":
        return float(value)
    cal = load_cached(cache)
    if cal is None:
        raise SpecError("--rate", "auto needs this machine's calibration: run "
                        "'testbed calibrate' first (about 20 s)")
    picks = []
    for exp in experiments(100.0):
        topo = exp.resolve_topology()
        pairs = [tuple(p.split(">")) for p in exp.pairs] or None   # checked by the run
        ranks = (sorted({n for p in pairs for n in p}) if pairs
                 else topo.endpoints()[:exp.ranks or None])
        picks.append((pick_rate(cal, exp, topo, ranks, pairs), exp.name))
    (low, name), top = min(picks, key=lambda p: p[0]["rate_mbps"]), max(
        p[0]["max_faithful_mbps"] for p in picks)
    progress(f"rate auto: {low['rate_mbps']:g} Mbit/s for every run (the highest at which "
             f"{name}, the most demanding, should stay faithful here: up to "
             f"{low['max_faithful_mbps']:g} Mbit/s; the lightest up to {top:g}; calibrated "
             f"{cal['budget_pps_direct']} packets/s on {cal['date_utc']})")
    return low["rate_mbps"]
