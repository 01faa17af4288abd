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
from testbed.features import run_options
from testbed.interrupts import failure_reason, stop_on_signals
from testbed.results import RunFailedError, mark_failed, new_folder
from testbed.run_output import worst_server, write_run


def run_spread(exp: Experiment, progress=None, force: bool = False) -> tuple[Path, dict]:
    """Run `exp` on its servers (module docstring); ServerError before anything is built
    when a server cannot be reached or used. Ctrl-C, SIGTERM and SIGHUP take every
    server's part down and mark the folder FAILED (testbed.interrupts). `force` lets
    through lossless buffers set by hand that cannot hold their thresholds."""
    from testbed.run import run_lab
    lab = run_lab()
    try:
        with stop_on_signals():
            return _run_spread(exp, progress or (lambda msg: None), lab, force)
    finally:
        if os.geteuid() == 0:
            forget_run(lab)


def _run_spread(exp: Experiment, progress, lab: str, force: bool) -> tuple[Path, dict]:
    from testbed.cli_spread import spread_fabric
    from testbed.run import prepare
    p = prepare(exp, progress, force, judged=False)
    fab = spread_fabric(p.topo, exp.servers, seed=exp.seed, lab=lab, progress=progress)
    for line in fab.placement.lines(p.topo):
        progress(line)
    fab.connect()
    folder = new_folder(exp.results_dir, exp.name, "experiment.results_dir")
    (folder / "config.toml").write_text(to_toml(exp, p.topo))
    progress(f"results: {folder}")
    if os.geteuid() == 0:   # after a kill -9 here, `testbed clean` marks the folder FAILED
        record_run(lab, folder, exp.servers)
    timings: dict[str, float] = {}
    try:
        t0 = time.monotonic()
        fab.start()
        timings["build_s"] = time.monotonic() - t0
        progress(f"running {exp.workload} on {len(p.ranks)} ranks over {len(exp.servers)} "
                 f"servers, {exp.iterations} iterations of {exp.message_bytes} B")
        t0 = time.monotonic()
        agents = fab.run_agents(p.schedule, processes=exp.agent_processes or None,
                                features=run_options(exp), ranks=p.ranks, **p.agent_options)
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
    for s, r in fab.last_run.items():      # captures: each port's on its node's server
        for name, data in r["files"].items():
            path = inside(folder, name, s)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    verdicts = {s: r["fidelity"] for s, r in fab.last_run.items()}
    servers = {s: {"clock": r["clock"], "cpu": r["features"]["cpu"]["summary"],
                   "fidelity": r["fidelity"],
                   "links_t0_ns": r["features"]["links"]["t0_ns"]}
               for s, r in fab.last_run.items()}
    from testbed.spread import spread_summary
    (folder / "servers.json").write_text(json.dumps(
        {**spread_summary(fab), "run": servers}, indent=1) + "\n")
    metrics = write_run(p, folder, agents, {s: r["features"] for s, r in fab.last_run.items()},
                        verdicts, timings, progress, servers=servers,
                        extra_md=servers_md(fab, servers, worst_server(verdicts)))
    return folder, metrics


def inside(folder: Path, name: str, server: str) -> Path:
    """Where a server's file `name` goes in the results folder: refused (ServerError)
    when it would land outside it."""
    path = (folder / name).resolve()
    if not path.is_relative_to(folder.resolve()) or path == folder.resolve():
        raise ServerError(f"{server}: a result file named {name!r} would land outside "
                          f"{folder}")
    return path


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
