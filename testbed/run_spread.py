"""A run on several machines (`testbed run --servers a,b`, or `[cluster] servers`): the
fabric placed (topologies.partition), each server's part built there (testbed.spread),
the agents started together across servers, the results gathered into one folder here.

    settings ─▶ placement ─▶ every server reached (exit 2 otherwise, nothing built)
        ─▶ parts built ─▶ agents + samplers on each server ─▶ parts removed
        ─▶ one results folder: metrics.json, summary.md, flows/links tables, plots,
           servers.json (placement, cut links, each server's clock offset, CPU load and
           fidelity verdict)

Each server's verdict is measured there (its agents, its CPU); the run's is the worst.
Stamps are put on this machine's clock by each server's measured offset; the offset and
its uncertainty are in servers.json. The rate picked by `--rate auto` is this machine's
calibration's; every server is assumed to carry as much.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from fabric.cluster import ServerError
from fabric.state import forget_run, record_run
from testbed.experiment import Experiment, to_toml
from testbed.fidelity import VERDICTS
from testbed.interrupts import failure_reason, stop_on_signals
from testbed.lossless_plan import lossless_refusal, lossless_rto_ms
from testbed.plots import draw_all
from testbed.results import (
    RunFailedError,
    compute_metrics,
    mark_failed,
    new_folder,
    summary_md,
    write_metrics,
    write_tables,
)
from topologies.spec import SpecError
from traffic.workloads import build_schedule


def run_spread(exp: Experiment, progress=None) -> tuple[Path, dict]:
    """Run `exp` on its servers (module docstring); ServerError before anything is built
    when a server cannot be reached or used. Ctrl-C, SIGTERM and SIGHUP take every
    server's part down and mark the folder FAILED (testbed.interrupts)."""
    from testbed.run import run_lab
    lab = run_lab()
    try:
        with stop_on_signals():
            return _run_spread(exp, progress or (lambda msg: None), lab)
    finally:
        if os.geteuid() == 0:
            forget_run(lab)


def _run_spread(exp: Experiment, progress, lab: str) -> tuple[Path, dict]:
    from testbed.cli_spread import spread_fabric
    from testbed.collect import LinkSample, port_totals
    from testbed.run import (
        agent_options,
        ensure_calibration,
        pick_endpoints,
        pick_link_rate,
    )
    topo = exp.resolve_topology()
    exp.check_against(topo)
    ranks, pairs = pick_endpoints(exp, topo)
    cal = ensure_calibration(progress) if exp.rate == "auto" else None
    topo, rate_choice, rto_ms = pick_link_rate(exp, topo, ranks, pairs, progress, cal)
    if refusal := lossless_refusal(exp, topo, force=False):
        raise SpecError("experiment.pfc", refusal)
    schedule = build_schedule(exp.workload, ranks, exp.message_bytes, seed=exp.seed,
                              pairs=pairs)
    rto_ms = lossless_rto_ms(rto_ms, exp, topo, schedule)
    fab = spread_fabric(topo, exp.servers, seed=exp.seed, lab=lab, progress=progress)
    for line in fab.placement.lines(topo):
        progress(line)
    fab.connect()
    folder = new_folder(exp.results_dir, exp.name, "experiment.results_dir")
    (folder / "config.toml").write_text(to_toml(exp, topo))
    progress(f"results: {folder}")
    if os.geteuid() == 0:   # after a kill -9 here, `testbed clean` marks the folder FAILED
        record_run(lab, folder, exp.servers)
    timings: dict[str, float] = {}
    try:
        t0 = time.monotonic()
        fab.start()
        timings["build_s"] = time.monotonic() - t0
        progress(f"running {exp.workload} on {len(ranks)} ranks over {len(exp.servers)} "
                 f"servers, {exp.iterations} iterations of {exp.message_bytes} B")
        t0 = time.monotonic()
        switch = exp.switch_settings()
        if switch.mode:
            progress(f"PFC {switch.pfc}: each server's controller over its part, pauses "
                     "from other servers obeyed by its receiver (testbed.pfc_remote)")
        agents = fab.run_agents(schedule, processes=exp.agent_processes or None,
                                pfc=switch.to_keys() if switch.mode else None,
                                pcap=exp.pcap,
                                **agent_options(exp, topo.scale_factor, rto_ms))
        timings["run_s"] = time.monotonic() - t0
    except BaseException as exc:
        fab.stop()
        fab.close()
        mark_failed(folder, failure_reason(exc))
        if isinstance(exc, ServerError):     # a server failed once the run had begun
            raise RunFailedError(str(exc), folder) from None
        raise
    t0 = time.monotonic()
    fab.stop()
    fab.close()
    timings["teardown_s"] = time.monotonic() - t0
    # every server's port samples on one time axis (this machine's clock)
    base_ns = min(r["links_t0_ns"] for r in fab.last_run.values())
    samples = sorted((LinkSample((r["links_t0_ns"] - base_ns) / 1e9 + row[0], *row[1:])
                      for r in fab.last_run.values() for row in r["links"]),
                     key=lambda x: x.t_s)
    totals = port_totals(samples)
    servers = {s: {k: v for k, v in r.items() if k not in ("links", "pfc", "pcaps")}
               for s, r in fab.last_run.items()}
    captured = []
    for r in fab.last_run.values():      # each port captured on its node's server
        for name, data in r["pcaps"].items():
            (folder / "pcaps").mkdir(exist_ok=True)
            captured.append(folder / "pcaps" / name)
            captured[-1].write_bytes(data)
    worst = max(servers, key=lambda s: VERDICTS.index(servers[s]["fidelity"]["verdict"]))
    metrics = compute_metrics(exp, topo, ranks, agents, totals, servers[worst]["cpu"],
                              timings)
    engines = sorted({(a.get("host") or {}).get("engine") or "unknown" for a in agents.values()})
    metrics["engine"] = ", ".join(engines)
    spans = [it for a in agents.values() for it in a["iterations"] if it.get("end_ns")]
    if spans:   # on the time axis of links.csv
        metrics["workload_window_s"] = [(min(x["start_ns"] for x in spans) - base_ns) / 1e9,
                                        (max(x["end_ns"] for x in spans) - base_ns) / 1e9]
    metrics["rate_choice"] = rate_choice
    metrics["rto_ms"] = rto_ms
    metrics["fidelity"] = {**servers[worst]["fidelity"], "server": worst,
                           "per_server": {s: r["fidelity"]["verdict"]
                                          for s, r in servers.items()}}
    metrics["servers"] = servers
    metrics["pfc"] = pfc_metrics(folder, {s: r["pfc"] for s, r in fab.last_run.items()
                                          if r.get("pfc")})
    from testbed.spread import spread_summary
    (folder / "servers.json").write_text(json.dumps(
        {**spread_summary(fab), "run": servers}, indent=1) + "\n")
    write_tables(folder, agents, samples, [])
    write_metrics(folder, metrics)
    plots = draw_all(folder, metrics)
    (folder / "summary.md").write_text(summary_md(exp.name, metrics, topo.summary(),
                                                  sorted(captured))
                                       + servers_md(fab, servers, worst))
    progress(f"wrote {len(plots)} plots")
    if not metrics["ok"]:
        mark_failed(folder, "agents reported errors: " + json.dumps(metrics["errors"]))
        raise RunFailedError(f"the run did not complete: {metrics['errors']}", folder)
    return folder, metrics


def pfc_metrics(folder: Path, reports: dict[str, dict]) -> dict | None:
    """pfc-<server>.json per server (`reports`: its controller's report and its
    receiver's), and the run's PFC figures: totals summed over servers (frames sent by the
    controllers, time held by them and by the receivers), the rest from the server that
    paused most."""
    if not reports:
        return None
    for s, rep in reports.items():
        (folder / f"pfc-{s}.json").write_text(json.dumps(rep, indent=1) + "\n")
    ctls = {s: rep["controller"] for s, rep in reports.items()}
    busiest = max(ctls, key=lambda s: ctls[s]["totals"]["frames_sent"])
    totals = {k: sum(c["totals"][k] for c in ctls.values()) for k in ctls[busiest]["totals"]}
    received = {k: sum(rep["receiver"]["totals"][k] for rep in reports.values())
                for k in ("frames_received", "xoff_frames", "xon_frames", "expired")}
    totals["paused_s"] = round(totals["paused_s"] + sum(
        rep["receiver"]["totals"]["paused_s"] for rep in reports.values()), 4)
    out = {k: ctls[busiest].get(k) for k in ("enabled", "headroom", "reaction_ms", "storms",
                                             "controller", "ecn", "switch_lb", "trimming")}
    out |= {"totals": totals, "from_other_servers": received,
            "files": ", ".join(f"pfc-{s}.json" for s in reports),
            "occupancy_from": ctls[busiest]["calibration"].get("occupancy_from"),
            "poll_ms": ctls[busiest]["calibration"].get("poll_ms"),
            "sleep": ctls[busiest]["calibration"].get("sleep"),
            "per_server": {s: {"sent": c["totals"]["frames_sent"],
                               "received_from_others":
                                   reports[s]["receiver"]["totals"]["frames_received"]}
                           for s, c in ctls.items()}}
    return out


def servers_md(fab, servers: dict, worst: str) -> str:
    """The summary's section on the machines."""
    cut = len(fab.placement.cut)
    lines = ["", "## Servers", "",
             f"{len(fab.servers)} servers, {cut} links between them over VXLAN "
             f"({fab.placement.cut_gbps():g} Gbit/s each way at line rate); the run's "
             f"verdict is the worst server's ({worst}). Clock offsets against the "
             "orchestrator were measured at start and taken out of every stamp "
             "(servers.json).", "",
             "| server | nodes | clock offset (us) | +- (us) | CPU mean % | verdict |",
             "|---|---|---|---|---|---|"]
    for s, r in servers.items():
        lines.append(f"| {s} | {len(fab.placement.nodes_on(s))} | "
                     f"{r['clock']['offset_ns'] / 1e3:.1f} | "
                     f"{r['clock']['uncertainty_ns'] / 1e3:.1f} | "
                     f"{r['cpu']['cpu_mean_percent']} | {r['fidelity']['verdict']} |")
    return "\n".join(lines) + "\n"
