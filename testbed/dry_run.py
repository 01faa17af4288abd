"""What `testbed run` would do, without root and without building anything.

`testbed run --dry-run` and `testbed validate EXPERIMENT.toml` print the plan: the
resolved experiment (every setting, as the run's config.toml would hold it), the fabric
(nodes, link classes and their rates), the rate the run would use and why (with
`rate = "auto"`, testbed.rate's pick on this machine's cached calibration), the ideal
job time (testbed.results.ideal_jct, or a training step's analytic step), what the run
would refuse (a rate far above the calibrated faithful one without --force) and which
features it relies on that this machine lacks (fabric.doctor's checks that need no
namespace; the kernel's own need `sudo testbed doctor`). Bad settings raise SpecError
as a run does, before anything else.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import replace
from pathlib import Path

from fabric import doctor
from testbed.draw import link_classes, rate_text
from testbed.experiment import Experiment, from_toml, to_toml
from testbed.lossless_plan import lossless_refusal, sized_buffer
from testbed.rate import (
    base_rate_mbps,
    build_workload,
    load_cached,
    pick_rate,
    rate_check,
    rescaled,
)
from testbed.results import controller_note, ideal_jct
from testbed.run import REFUSE_OVER_FAITHFUL, pick_endpoints, rate_refusal
from testbed.sizes import is_sweep, parse_sizes
from testbed.train_run import job_schedule
from topologies import units
from topologies.files import parse_assignments, read_toml
from topologies.spec import SpecError, Topology
from traffic.job import Job
from traffic.workloads import Schedule, workload_named

CALIBRATION_S = 25       # about what `testbed calibrate` takes (testbed.calibrate)


def is_experiment_file(arg: str) -> bool:
    """A readable .toml file with an [experiment] table (not a topology file)."""
    path = Path(arg)
    if path.suffix != ".toml" or not path.is_file():
        return False
    try:
        return "experiment" in read_toml("experiment", path)
    except SpecError:
        return False


def load_experiment(path: str | None, overrides: dict, sets: list[str] | None) -> Experiment:
    """An experiment from its file and flags (`overrides`), validated; `sets` (--set
    KEY=VALUE) are builder parameters put on top of its topology, however it was given."""
    exp = from_toml(path, overrides)
    if sets:
        topo = exp.resolve_topology()
        exp.topology = {"name": topo.name, "kind": topo.kind,
                        "scale_factor": topo.scale_factor,
                        "params": {**topo.params, **parse_assignments(sets)}}
    return exp


def experiment_topology(exp: Experiment) -> Topology:
    """The experiment's topology at the rate it sets (a number; with auto, the rate
    pick_rate gives on the cached calibration, else the topology's own)."""
    topo = exp.resolve_topology()
    exp.check_against(topo)
    if exp.rate == "":
        return topo
    if exp.rate == "auto":
        cal = load_cached()
        if cal is None:
            return topo
        ranks, pairs = pick_endpoints(exp, topo)
        return rescaled(topo, pick_rate(cal, exp, topo, ranks, pairs)["rate_mbps"])
    return rescaled(topo, float(exp.rate))


def fabric_part(topo: Topology) -> dict:
    """Nodes by role, and each link class with its count and rates."""
    summary = topo.summary()
    return {"name": topo.name, "kind": topo.kind, "scale_factor": topo.scale_factor,
            "nodes": summary["nodes"], "roles": summary["roles"], "links": summary["links"],
            "rates": rate_text(topo),
            "link_classes": [{"roles": pair, "tech": tech, "rate_mbps": rate,
                              "rate_real": units.rate_text(units.real_mbps(
                                  rate, topo.scale_factor)), "count": len(links)}
                             for (pair, tech, rate), links in link_classes(topo).items()]}


def rate_part(exp: Experiment, topo: Topology, ranks: list[str], pairs, force: bool,
              refused: list[dict], built: Schedule | Job | None = None
              ) -> tuple[dict, Topology]:
    """The rate the run would use and why, and the topology at that rate; a refusal
    is appended to `refused`. `built`: testbed.rate.build_workload's, when built."""
    cal = load_cached()
    own = topo.params.get("rate_mbps")
    part: dict = {"setting": exp.rate if exp.rate != "" else "unset: the topology's own",
                  "topology_rate_mbps": own,
                  "calibration": cal and {"date_utc": cal.get("date_utc"),
                                          "budget_pps_direct": cal.get("budget_pps_direct")}}
    if exp.rate == "auto":
        if cal is None:
            part.update(rate_mbps=own, why=(
                f"no calibration of this machine is cached: a run first measures one "
                f"(about {CALIBRATION_S} s, needs root; or run 'sudo testbed calibrate'), "
                f"then picks the highest rate it keeps faithful, at most the topology's "
                f"own {own:g} Mbit/s"))
            return part, topo
        try:
            choice = pick_rate(cal, exp, topo, ranks, pairs, built)
        except SpecError as exc:
            refused.append({"field": exc.field, "reason": exc.message})
            part.update(rate_mbps=None, why=exc.message)
            return part, topo
        part.update(rate_mbps=choice["rate_mbps"], bound_by=choice["bound_by"],
                    max_faithful_mbps=choice["max_faithful_mbps"],
                    max_cpu_mbps=choice["max_cpu_mbps"],
                    max_packets_mbps=choice["max_packets_mbps"],
                    controller_cores=choice["controller_cores"],
                    why=f"set by {choice['bound_by']}: this machine should carry "
                        f"{choice['max_faithful_mbps']:g} Mbit/s of this experiment "
                        f"faithfully; the topology's own rate is {own:g} Mbit/s"
                        + controller_note(choice))
        return part, rescaled(topo, choice["rate_mbps"])
    if exp.rate != "":
        topo = rescaled(topo, float(exp.rate))
    check = rate_check(cal, exp, topo, ranks, pairs, built) if own else None
    part["rate_mbps"] = base_rate_mbps(topo) if own else None
    source = "as set" if exp.rate != "" else "the topology's own rate"
    if check is None:
        part["why"] = source + ("; no calibration of this machine cached to compare it "
                                "with" if own else "")
        return part, topo
    part.update(max_faithful_mbps=check["max_faithful_mbps"], within=check["within"],
                max_cpu_mbps=check["max_cpu_mbps"], max_packets_mbps=check["max_packets_mbps"],
                controller_cores=check["controller_cores"],
                why=f"{source}; "
                    f"this machine should carry up to {check['max_faithful_mbps']:g} Mbit/s "
                    f"of this experiment faithfully"
                    + ("" if check["within"] else " (the emulator is likely to fall "
                       f"behind; refused beyond {REFUSE_OVER_FAITHFUL:g}x "
                       f"{check['max_packets_mbps']:g} Mbit/s, what its CPU budget carries "
                       "the packets at, "
                       "without --force)"))
    reason = rate_refusal(check, force)
    if reason:
        refused.append({"field": "experiment.rate", "reason": reason})
    return part, topo


def lossless_part(exp: Experiment, topo: Topology, force: bool, refused: list[dict]
                  ) -> tuple[str | None, Topology]:
    """With PFC on: the buffers the run would size (a line, or None) and the topology
    with them; a buffer or thresholds the user set that cannot be lossless is refused."""
    topo, sized = sized_buffer(exp, topo)
    if reason := lossless_refusal(exp, topo, force):
        refused.append({"field": "experiment.pfc", "reason": reason})
    return sized, topo


def ideal_part(exp: Experiment, topo: Topology, ranks: list[str],
               built: Schedule | Job | None = None) -> dict:
    """The ideal time of one iteration (emulated and real seconds), as the run's
    metrics compute it. `built`: as rate_part's."""
    if workload_named(exp.workload).job:
        _, info = job_schedule(exp, topo, ranks, lambda msg: None, built)
        step_s = info["analytic"]["step_s"]
        return {"what": "analytic training step", "ideal_s": step_s,
                "ideal_s_real": step_s * info["byte_scale"] / info["time_scale"],
                "link_mbps": None, "iterations": exp.iterations}
    if workload_named(exp.workload).open_loop:   # each flow has its own: its time alone
        return {"what": f"{exp.workload}: no one ideal time; each flow's FCT is set against "
                        "its own time alone (flows.csv alone_s, slowdown)",
                "ideal_s": None, "ideal_s_real": None, "link_mbps": None,
                "iterations": exp.iterations}
    ideal_s, link_mbps = ideal_jct(exp, topo, ranks)
    return {"what": f"{exp.workload} of {exp.message_bytes} B per rank on {len(ranks)} "
                    f"ranks at {link_mbps:g} Mbit/s per rank",
            "ideal_s": ideal_s, "ideal_s_real": units.real_s(ideal_s, topo.scale_factor),
            "link_mbps": link_mbps, "iterations": exp.iterations}


def needed_checks(exp: Experiment) -> list[str]:
    """The doctor checks the run's settings rely on."""
    names = ["htb", "mininet", "mnexec", "scapy", "fib_multipath_hash_seed"]
    if exp.pcap:
        names.append("tcpdump")
    if exp.loss_rate:
        names += ["netem", "nftables"]
    if exp.delay == "on":
        names.append("netem")
    if exp.pfc == "on":
        names += ["ebpf_counters", "pfc_wake"]
    if exp.ecn == "on":
        names.append("ecn_marking")
    if exp.trimming == "on":
        names.append("packet_trimming")
    return list(dict.fromkeys(names))


def features_part(exp: Experiment) -> list[dict]:
    """Each feature the run relies on: available, missing (and what that disables), or
    a kernel feature only `sudo testbed doctor` can probe."""
    found = {c.name: c for c in doctor.checks_without_namespace()}
    out = []
    for name in needed_checks(exp):
        check = found.get(name)
        if check is None:
            state = "probed by 'sudo testbed doctor' (a scratch namespace)"
            out.append({"name": name, "available": None, "detail": state,
                        "disables": doctor.DISABLES[name]})
        else:
            out.append({"name": name, "available": check.available, "detail": check.detail,
                        "disables": check.disables})
    return out


def plan(exp: Experiment, force: bool = False) -> dict:
    """What a run of `exp` would do here (module docstring); SpecError for bad input."""
    topo = exp.resolve_topology()
    exp.check_against(topo)
    ranks, pairs = pick_endpoints(exp, topo)
    refused: list[dict] = []
    sizes = parse_sizes("experiment.message_bytes", exp.message_bytes)
    whole = exp
    if is_sweep(exp.message_bytes):   # its rate is its largest size's (testbed.sweep)
        exp = replace(exp, message_bytes=sizes[-1])
    built = build_workload(exp, ranks, pairs, topo)     # once, as the run builds it
    rate, run_topo = rate_part(exp, topo, ranks, pairs, force, refused, built)
    sized, run_topo = lossless_part(exp, run_topo, force, refused)
    if sized:
        rate["buffers"] = sized
    resolved = whole   # auto becomes the number the run would pick, as in its config.toml
    if exp.rate == "auto" and rate.get("rate_mbps") and rate.get("calibration"):
        resolved = replace(whole, rate=rate["rate_mbps"])
    config = to_toml(resolved, run_topo)
    return {"experiment": tomllib.loads(config), "config_toml": config,
            "fabric": fabric_part(run_topo), "ranks": ranks, "rate": rate,
            "ideal": ideal_part(exp, run_topo, ranks, built), "refused": refused,
            "sweep_sizes": sizes if len(sizes) > 1 else None,
            "features": features_part(exp),
            "needs_root": not exp.servers, "is_root": os.geteuid() == 0,
            "servers": list(exp.servers)}


def format_plan(p: dict) -> str:
    """The plan as text: sections for a person."""
    exp = p["experiment"]["experiment"]
    f, r, i = p["fabric"], p["rate"], p["ideal"]
    roles = ", ".join(f"{n} {role}" for role, n in f["roles"].items())
    lines = [f"# dry run of {exp['name']}: nothing is built", "",
             "## experiment (as the run's config.toml would hold it)", "",
             p["config_toml"].rstrip(), "",
             f"## fabric: {f['name']} ({f['kind']}), x{f['scale_factor']:g}", "",
             f"{f['nodes']} nodes ({roles}), {f['links']} links; {f['rates']}"]
    lines += [f"  {c['count']:>4} x {c['roles']} {c['tech']}: {c['rate_mbps']:g} Mbit/s "
              f"emulated = {c['rate_real']} real" for c in f["link_classes"]]
    rate = "not chosen" if r.get("rate_mbps") is None else f"{r['rate_mbps']:g} Mbit/s"
    lines += ["", f"## rate: {rate} (rate setting: {r['setting']})", "", r["why"]]
    if r.get("buffers"):
        lines += ["", r["buffers"]]
    if p.get("sweep_sizes"):
        lines += ["", f"a sweep of {len(p['sweep_sizes'])} sizes, "
                  f"{p['sweep_sizes'][0]} to {p['sweep_sizes'][-1]} B, one run each at "
                  "this rate (its largest size's); the ideal below is the largest size's"]
    lines += ["", "## ideal job time", "",
              f"{i['what']}: {i['ideal_s']:.4g} s emulated = {i['ideal_s_real']:.4g} s real "
              f"per iteration, {i['iterations']} iterations" if i["ideal_s"] is not None
              else f"{i['what']}; {i['iterations']} iterations"]
    lines += ["", f"## would be refused: {len(p['refused']) or 'nothing'}"]
    lines += [""] * bool(p["refused"]) + [f"{x['field']}: {x['reason']}" for x in p["refused"]]
    lines += ["", "## features it relies on", ""]
    for x in p["features"]:
        state = {True: "yes", False: "MISSING", None: "?"}[x["available"]]
        extra = f"; without it: {x['disables']}" if x["available"] is False else ""
        lines.append(f"  {x['name']:<24} {state:<8} {x['detail']}{extra}")
    where = (f"on {', '.join(p['servers'])} over ssh (no root here)" if p["servers"]
             else "here, as root" + ("" if p["is_root"] else " (you are not root: sudo)"))
    lines += ["", f"A run would start {where}." if not p["refused"] else
              "A run would be refused (above) before anything is built."]
    return "\n".join(lines)
