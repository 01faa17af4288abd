"""Run an experiment: build the fabric, run the workload, collect, tear down, write results.

    settings ─▶ fabric (own lab) ─▶ pcaps, samplers ─▶ agents (one per rank, inside
    its namespace) ─▶ stop collectors ─▶ teardown ─▶ results folder

Ctrl-C stops cleanly: agents, captures and the fabric come down, and the folder says
FAILED (interrupted). Returns the results folder and the metrics.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

from fabric.core import Fabric
from testbed.collect import CpuSampler, LinkSampler, Pcaps
from testbed.experiment import Experiment, to_toml
from testbed.results import (
    compute_metrics,
    latencies_us,
    mark_failed,
    new_folder,
    summary_md,
    write_plots,
    write_tables,
)
from topologies.spec import SpecError
from traffic.workloads import build_schedule


class RunFailedError(RuntimeError):
    """The run did not complete; the results folder carries FAILED with the reason."""

    def __init__(self, message: str, folder: Path):
        super().__init__(message)
        self.folder = folder


def pick_ranks(exp: Experiment, topo) -> list[str]:
    endpoints = topo.endpoints()
    if exp.ranks > len(endpoints):
        raise SpecError("experiment.ranks", f"{exp.ranks} ranks but the topology has only "
                        f"{len(endpoints)} endpoints")
    return endpoints[: exp.ranks] if exp.ranks else endpoints


def pick_pairs(exp: Experiment, topo) -> list[tuple[str, str]] | None:
    if not exp.pairs:
        return None
    endpoints = set(topo.endpoints())
    pairs = [tuple(p.split(">")) for p in exp.pairs]
    for src, dst in pairs:
        for node in (src, dst):
            if node not in endpoints:
                raise SpecError("experiment.pairs", f"{node!r} is not an endpoint of "
                                f"{topo.name}")
        if src == dst:
            raise SpecError("experiment.pairs", f"{src}>{dst} sends to itself")
    return pairs


def link_physics(exp: Experiment, topo):
    """Profiles (reach checked with them: a SpecError before anything is built) and the
    failure events the run will play, timed from the workload's start."""
    from topologies.physics import check_topology, load_profiles, parse_events, random_failures
    profiles = load_profiles(exp.link_profiles or None)
    check_topology(topo, profiles)
    events = parse_events(exp.failures, topo, profiles)
    if exp.failure_horizon_h:
        events += random_failures(topo, profiles, exp.seed, exp.failure_horizon_h,
                                  exp.failure_compression)
    loss_links = []
    for text in exp.loss_links:
        a, b = text.split(":")
        if not topo.graph.has_edge(a, b):
            raise SpecError("experiment.loss_links", f"{text!r} is not a link of {topo.name}")
        loss_links.append((a, b))
    return profiles, sorted(events), loss_links


def pfc_settings(exp: Experiment):
    from testbed.pfc import PfcRunSettings
    return PfcRunSettings(mode=exp.pfc, xoff_bytes=exp.pfc_xoff_bytes or None,
                          xon_bytes=exp.pfc_xon_bytes or None,
                          headroom_bytes=exp.pfc_headroom_bytes or None,
                          watchdog_ms=exp.pfc_watchdog_ms,
                          watchdog_action=exp.pfc_watchdog_action, poll_ms=exp.pfc_poll_ms)


def agent_options(exp: Experiment) -> dict:
    return {"transport": exp.transport, "entropy": exp.entropy, "seed": exp.seed,
            "payload_bytes": exp.payload_bytes, "window_packets": exp.window_packets,
            "ack_every": exp.ack_every, "rto_ms": exp.rto_ms,
            "flowlet_gap_us": exp.flowlet_gap_us, "dscp": exp.dscp,
            "iterations": exp.iterations, "coalesce_frames": exp.coalesce_frames}


def run(exp: Experiment, progress=None) -> tuple[Path, dict]:
    from traffic.launch import run_agents

    progress = progress or (lambda msg: None)
    topo = exp.resolve_topology()
    exp.check_against(topo)
    profiles, events, loss_links = link_physics(exp, topo)
    pairs = pick_pairs(exp, topo)
    ranks = sorted({n for p in pairs for n in p}, key=topo.endpoints().index) if pairs \
        else pick_ranks(exp, topo)
    schedule = build_schedule(exp.workload, ranks, exp.message_bytes, seed=exp.seed,
                              pairs=pairs)
    folder = new_folder(exp.results_dir, exp.name)
    (folder / "config.toml").write_text(to_toml(exp, topo))
    progress(f"results: {folder}")
    fabric = Fabric(topo, seed=exp.seed, progress=progress, lab=f"run{os.getpid()}")
    timings: dict[str, float] = {}
    pcaps = links = cpu = imp = failures = pfc_ctl = None
    stack = contextlib.ExitStack()
    try:
        t0 = time.monotonic()
        fabric.start()
        timings["build_s"] = time.monotonic() - t0
        if exp.loss_rate or events:
            from fabric.impair import Impairments
            imp = Impairments(fabric, profiles)
            if exp.loss_rate:
                imp.apply(loss_rate=exp.loss_rate, links=loss_links or None)
                progress(f"loss {exp.loss_rate:g} on "
                         f"{f'{len(loss_links)} links' if loss_links else 'every link'} "
                         f"by {imp.loss_where}")
            if events:  # the playback process loads now, before the clock matters
                failures = imp.prepare_schedule(events)

        def start_failures(start_at_ns: int) -> None:
            if failures is not None:  # timed from the agents' agreed start
                failures.start(start_at_ns)
                progress(f"failure schedule: {len(events)} events")

        if exp.pfc:
            from testbed.pfc import pfc_running
            pfc_ctl = stack.enter_context(pfc_running(fabric, pfc_settings(exp).config()))
            progress(f"PFC {exp.pfc}: lossless class for DSCP {exp.dscp} on every port")
        pcaps = Pcaps(fabric, exp.pcap, folder / "pcaps").start()
        links = LinkSampler(fabric).start()
        cpu = CpuSampler().start()
        progress(f"running {exp.workload} on {len(ranks)} ranks, {exp.iterations} iterations "
                 f"of {exp.message_bytes} B ({exp.transport}, {exp.entropy})")
        t0 = time.monotonic()
        agents = run_agents(fabric, schedule, workdir=folder / "agents", progress=progress,
                            on_start=start_failures, timeout_s=exp.timeout_s,
                            **agent_options(exp))
        timings["run_s"] = time.monotonic() - t0
        if failures is not None:
            failures.stop()
        stack.close()  # the PFC controller stops here
        physics = imp.record() if imp is not None else None
        cpu.stop()
        links.stop()
        captured = pcaps.stop()
        t0 = time.monotonic()
        fabric.stop()
        timings["teardown_s"] = time.monotonic() - t0
    except BaseException as exc:
        for collector in (failures, stack, cpu, links, pcaps):
            if collector is not None:
                try:
                    (collector.close if collector is stack else collector.stop)()
                except Exception:  # the fabric must still come down
                    pass
        fabric.stop()
        reason = "interrupted (Ctrl-C)" if isinstance(exc, KeyboardInterrupt) else repr(exc)
        mark_failed(folder, reason)
        raise
    spans = [it for a in agents.values() for it in a["iterations"] if it.get("end_ns")]
    window = ((min(s["start_ns"] for s in spans) / 1e9, max(s["end_ns"] for s in spans) / 1e9)
              if spans else None)  # CPU load while the workload ran, not agent start-up
    metrics = compute_metrics(exp, topo, ranks, agents, links.totals(), cpu.summary(window),
                              timings)
    if window:  # on the time axis of links.csv and cpu.csv
        metrics["workload_window_s"] = [window[0] - links.t0, window[1] - links.t0]
    from topologies.physics import cost_table, energy_report
    job_s = (window[1] - window[0]) if window else 0.0   # the workload, all iterations
    metrics["link_energy"] = energy_report(topo, profiles, timings["run_s"],
                                           {exp.workload: job_s})
    metrics["fabric_cost"] = cost_table(topo, profiles)
    metrics["link_physics"] = physics
    metrics["pfc"] = None
    if pfc_ctl is not None:
        from testbed.pfc import write_results as write_pfc
        rep = write_pfc(pfc_ctl, folder)
        metrics["pfc"] = {k: rep.get(k) for k in ("enabled", "headroom_ok", "headroom_notes",
                                                   "reaction_ms", "totals", "storms",
                                                   "controller")}
    write_tables(folder, agents, links.samples, cpu.samples)
    (folder / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    plots = write_plots(folder, metrics, latencies_us(agents), links.samples)
    (folder / "summary.md").write_text(summary_md(exp.name, metrics, topo.summary(), captured))
    progress(f"wrote {len(plots)} plots, {len(captured)} pcaps")
    if not metrics["ok"]:
        mark_failed(folder, "agents reported errors: " + json.dumps(metrics["errors"]))
        raise RunFailedError(f"the run did not complete: {metrics['errors']}", folder)
    return folder, metrics
