"""A run's results folder, from what its agents and its features gave: the same code for
a run on this machine (one server, "") and a run on several (testbed.run_spread).

    agents + each server's measured features + each server's verdict
        ─▶ features merged (testbed.features) ─▶ metrics.json, flows/links/cpu tables,
           pfc files, rates, a training step's trace and timeline, plots, summary.md
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed import attribution, flow_run, incast_expect
from testbed.cc_results import write_rates
from testbed.features import Run, features_metrics, merged_results
from testbed.fidelity import VERDICTS
from testbed.page import PAGE, write_run_page
from testbed.plots import draw_all
from testbed.results import (
    RunFailedError,
    compute_metrics,
    mark_failed,
    summary_md,
    write_metrics,
    write_tables,
)
from topologies.physics import cost_table, energy_report, load_profiles


@dataclass
class Prepared:
    """A run as decided before anything is built (testbed.run.prepare)."""

    exp: Any                      # testbed.experiment.Experiment, its rate now a number
    topo: Any                     # at the run's rate, its buffers sized
    ranks: list[str]
    pairs: list[tuple[str, str]] | None
    schedule: dict                # traffic.workloads.Schedule
    job_info: Any                 # a training step's job (testbed.train_run), or None
    rate_choice: dict | None      # --rate auto's choice
    rate_set: dict | None         # a set rate's check against the calibration
    rto_ms: float
    agent_options: dict           # testbed.run.agent_options
    flow_info: Any = None         # open-loop flows as planned (testbed.flow_run), or None


def workload_window(agents: dict[str, dict]) -> tuple[float, float] | None:
    """The workload's first start and last end (seconds, CLOCK_MONOTONIC of the machine
    that ran the agents, or of the orchestrator once a spread run corrected them): the CPU
    load is graded over it, not over the agents' start-up."""
    spans = [it for a in agents.values() for it in a["iterations"] if it.get("end_ns")]
    if not spans:
        return None
    return (min(s["start_ns"] for s in spans) / 1e9, max(s["end_ns"] for s in spans) / 1e9)


def worst_server(verdicts: dict[str, dict]) -> str:
    return max(verdicts, key=lambda s: VERDICTS.index(verdicts[s]["verdict"]))


def write_run(p: Prepared, folder: Path, agents: dict[str, dict], by_server: dict[str, dict],
              verdicts: dict[str, dict], timings: dict[str, float], progress, *,
              found: dict | None = None, servers: dict | None = None,
              extra_md: str = "") -> dict:
    """Every result file of the run in `folder`; its metrics. `by_server`: each server's
    measured features (testbed.features.Live.measure); `verdicts`: each server's fidelity
    (testbed.features.grade), the run's the worst; `found`: what attribution.collect read
    from the standing fabric (a run on this machine); `servers`: a spread run's per-server
    figures (metrics.json "servers"), `extra_md` its section of summary.md."""
    exp, topo = p.exp, p.topo
    run = Run(folder, topo, agents, p.agent_options)
    merged = merged_results(by_server, run)
    links = merged["links"]
    worst = worst_server(verdicts)
    metrics = compute_metrics(exp, topo, p.ranks, agents, links["totals"],
                              by_server[worst]["cpu"]["summary"], timings)
    metrics |= features_metrics(merged, run)
    engines = sorted({(a.get("host") or {}).get("engine") or "unknown" for a in agents.values()})
    metrics["engine"] = ", ".join(engines)   # which code ran the agents (traffic.engine)
    window = workload_window(agents)
    if window:  # on the time axis of links.csv and cpu.csv; and on CLOCK_MONOTONIC
        metrics["workload_window_s"] = [window[0] - links["base_s"], window[1] - links["base_s"]]
        metrics["workload_start_monotonic_s"] = window[0]
    job_s = (window[1] - window[0]) if window else 0.0   # the workload, all iterations
    profiles = load_profiles(exp.link_profiles or None)
    metrics["link_energy"] = energy_report(topo, profiles, timings["run_s"],
                                           {exp.workload: job_s})
    metrics["fabric_cost"] = cost_table(topo, profiles)
    metrics["rate_choice"] = p.rate_choice
    metrics["rate_check"] = p.rate_set
    metrics["rto_ms"] = p.rto_ms
    switch = merged.get("switch")
    report = switch.get("controller") if switch else None   # one server's controller
    metrics["expected"] = [e.to_dict() for e in incast_expect.expectations(
        topo, p.ranks, metrics, report)]
    metrics["fidelity"] = verdicts[worst] if servers is None else {
        **verdicts[worst], "server": worst,
        "per_server": {s: v["verdict"] for s, v in verdicts.items()}}
    metrics["train"] = None
    if p.job_info:   # a training step: its own expected time (the analytic step)
        from testbed.train_run import train_metrics
        tm = metrics["train"] = train_metrics(p.job_info, agents, metrics["iterations"])
        metrics["ideal_s"], metrics["jct_over_ideal"] = (tm["analytic_step_s"],
                                                         tm["step_over_analytic"])
    split: dict = {}
    if found is not None:
        split, metrics["attribution"] = attribution.results(
            found, topo, agents, links["totals"], report and switch["timeline"],
            report and switch["t0"])
    if servers is not None:
        metrics["servers"] = servers
    if p.flow_info:   # open-loop flows: slowdowns by size, what was asked and produced
        metrics["open_loop"] = ol = flow_run.results(p.flow_info, agents, split)
        metrics["expected"] += [e.to_dict() for e in flow_run.expectations(ol)]
    write_tables(folder, agents, links["samples"], merged["cpu"]["samples"], split)
    write_metrics(folder, metrics)
    if metrics["cc"] and window:
        write_rates(folder, agents, int(window[0] * 1e9))
    captured = merged.get("pcap") or []
    summary = summary_md(exp.name, metrics, topo.summary(), captured) + extra_md
    if p.job_info:
        from testbed.train_run import write_timeline, write_trace
        write_trace(folder, p.job_info)
        if metrics["iterations"]:
            write_timeline(folder, p.job_info, agents, metrics["iterations"][-1]["iteration"])
    plots = draw_all(folder, metrics)      # from the files: as testbed report redraws them
    (folder / "summary.md").write_text(summary)
    write_run_page(folder)                 # summary.html, from the same files
    progress(f"wrote {len(plots)} plots, {len(captured)} pcaps, {PAGE}")
    if not metrics["ok"]:
        mark_failed(folder, "agents reported errors: " + json.dumps(metrics["errors"]))
        raise RunFailedError(f"the run did not complete: {metrics['errors']}", folder)
    return metrics
