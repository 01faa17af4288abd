"""Run an experiment: build the fabric, run the workload, collect, tear down, write results.

    settings ─▶ fabric (own lab) ─▶ pcaps, samplers ─▶ agents (one per rank, inside
    its namespace) ─▶ stop collectors ─▶ teardown ─▶ results folder

Ctrl-C, SIGTERM and SIGHUP stop cleanly (testbed.interrupts): agents, captures and the
fabric come down, and the folder says FAILED with the reason ("interrupted (Ctrl-C)",
"terminated (SIGTERM)"). While it runs, the lab's record (fabric.state) names the
folder and this process, so after a `kill -9` `testbed clean` marks the folder FAILED.
Returns the results folder and the metrics.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import fields
from pathlib import Path

from fabric.core import Fabric
from fabric.state import FAILED_FILE, forget_run, read_state, record_run
from testbed import attribution, incast_expect
from testbed.calibrate import calibration
from testbed.cc_results import cc_metrics, write_rates
from testbed.collect import LOW_FIDELITY_CPU_PERCENT, CpuSampler, LinkSampler, Pcaps
from testbed.experiment import Experiment, to_toml
from testbed.fidelity import verdict as fidelity_verdict
from testbed.interrupts import failure_reason, stop_on_signals
from testbed.kernel_timers import TimerWatch, busy_s, tolerance_s
from testbed.lossless_plan import lossless_refusal, lossless_rto_ms, sized_buffer
from testbed.pfc import pfc_running
from testbed.pfc_results import write_results as write_pfc
from testbed.plots import draw_all
from testbed.rate import (
    RINGS,
    base_rate_mbps,
    common_rate,
    frame_bits,
    load_cached,
    pick_rate,
    rate_check,
    rescaled,
    scaled_rto_ms,
)
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
from traffic.launch import MAX_RUN_FLOWS, flow_count
from traffic.transport_settings import TransportSettings
from traffic.workloads import JOBS, build_schedule


def pick_ranks(exp: Experiment, topo) -> list[str]:
    endpoints = topo.endpoints()
    if exp.ranks > len(endpoints):
        raise SpecError("experiment.ranks", f"{exp.ranks} ranks but the topology has only "
                        f"{len(endpoints)} endpoints")
    ranks = endpoints[: exp.ranks] if exp.ranks else endpoints
    return ring_ranks(topo, ranks) if exp.ring_order == "rails" and exp.workload in RINGS \
        else ranks


def ring_ranks(topo, ranks: list[str]) -> list[str]:
    """NCCL's ring on a rail-optimized fabric: each server's GPUs in rail order, every
    other server's reversed, so a hop from one server to the next stays on one rail (one
    leaf, no spine, no ECMP choice): s0g0..s0g7, s1g7..s1g0, s2g0... (with an odd number
    of servers the hop back to the first one changes rails)."""
    g = topo.graph
    servers: dict = {}
    for r in ranks:     # servers in the order their first rank comes
        servers.setdefault(g.nodes[r]["server"], []).append(r)
    order: list[str] = []
    for k, gpus in enumerate(servers.values()):
        gpus = sorted(gpus, key=lambda r: g.nodes[r]["rail"])
        order += gpus if k % 2 == 0 else gpus[::-1]
    return order


def pick_pairs(exp: Experiment, topo) -> list[tuple[str, str]] | None:
    """The p2p pairs as (src, dst); Experiment.check_against has refused bad ones."""
    if not exp.pairs:
        return None
    return [tuple(p.split(">")) for p in exp.pairs]


def pick_endpoints(exp: Experiment, topo) -> tuple[list[str], list[tuple[str, str]] | None]:
    """The ranks a run uses (the pairs' ends, else the first `ranks` in ring order, else
    for a training step from a trace folder its ranks), and its p2p pairs (None for the
    other workloads)."""
    pairs = pick_pairs(exp, topo)
    ranks = sorted({n for p in pairs for n in p}, key=topo.endpoints().index) if pairs \
        else pick_ranks(exp, topo)
    if exp.workload in JOBS and exp.trace and not exp.ranks:
        from testbed.train_run import trace_ranks
        ranks = trace_ranks(exp, topo)
    return ranks, pairs


def link_physics(exp: Experiment, topo):
    """Profiles, the failure events the run will play (timed from the workload's start)
    and the lossy links; Experiment.check_against has refused what does not fit."""
    from topologies.physics import load_profiles, parse_events, random_failures
    profiles = load_profiles(exp.link_profiles or None)
    events = parse_events(exp.failures, topo, profiles)
    if exp.failure_horizon_h:
        events += random_failures(topo, profiles, exp.seed, exp.failure_horizon_h,
                                  exp.failure_compression)
    loss_links = [tuple(text.split(":")) for text in exp.loss_links]
    return profiles, sorted(events), loss_links


def pick_link_rate(exp: Experiment, topo, ranks, pairs, progress, cal: dict | None):
    """The topology at the experiment's `rate` (testbed.rate): as it is (""), at a given
    base rate, or at the highest rate this machine's calibration `cal` says stays faithful
    ("auto", which becomes the number in config.toml). Before anything is built. Also the
    retransmission timeout the agents use: `rto_ms`, stretched when the rate is lowered
    (testbed.rate.scaled_rto_ms)."""
    if exp.rate == "":
        topo, sized = sized_buffer(exp, topo)
        if sized:
            progress(sized)
        return topo, None, exp.rto_ms
    choice = None
    if exp.rate == "auto":
        choice = pick_rate(cal, exp, topo, ranks, pairs)
        progress(f"rate auto: {choice['rate_mbps']:g} Mbit/s, set by {choice['bound_by']} "
                 f"(this machine should carry {choice['max_faithful_mbps']:g} Mbit/s of "
                 f"this experiment faithfully; the topology's own rate is "
                 f"{choice['limits_mbps']['topology']:g})")
        exp.rate = choice["rate_mbps"]
    rto_ms = scaled_rto_ms(exp.rto_ms, base_rate_mbps(topo), float(exp.rate))
    topo, sized = sized_buffer(exp, rescaled(topo, float(exp.rate)))
    if sized:
        progress(sized)
    return topo, choice, rto_ms


def ensure_calibration(progress=None, force: bool = False) -> dict:
    """This machine's calibration (testbed.calibrate): the cached one, or one measured
    now with real runs (about 25 s, root) when none is cached or `force`. Every caller
    of `rate = "auto"` comes here, so auto behaves the same wherever it is asked for."""
    return calibration(run, progress, force)


def judging_calibration(exp: Experiment, progress, force: bool) -> dict | None:
    """The calibration the run's rate is chosen or judged by (docs/fidelity.md): for
    `rate = "auto"`, and for a rate set by hand when not `force`d (the CLI), the cached
    one or one measured now, so a set rate is never let through for want of one; for
    the topology's own rate (""), the cached one, and a line saying when there is none."""
    if exp.rate == "auto" or (exp.rate != "" and not force):
        return ensure_calibration(progress)
    cal = load_cached()
    if cal is None and not force:
        progress("no usable calibration of this machine: the topology's own rate is not "
                 "judged before the run, only by its fidelity verdict after it (--rate auto "
                 "or testbed calibrate measures one)")
    return cal


def script_rate(value: str | float, experiments, progress=print) -> float:
    """An experiment script's --rate: the number as given, or for "auto" one rate for
    all its runs (testbed.rate.common_rate), from this machine's calibration (measured
    first when none is cached, as a run with `rate = "auto"` does)."""
    if value == "auto":
        ensure_calibration(progress)
    return common_rate(value, experiments, progress)


def agent_options(exp: Experiment, scale_factor: float, rto_ms: float | None = None) -> dict:
    """The agents' options from the experiment; DCQCN's and NSCC's times scaled to the
    fabric (NSCC reads CE marks only where the switches set them: ecn = "on"); `rto_ms`
    the timeout pick_link_rate gives (default: the experiment's)."""
    # the transport knobs, all of them: both sides inherit TransportSettings
    transport = {f.name: getattr(exp, f.name) for f in fields(TransportSettings)}
    return {**transport, "rto_ms": exp.rto_ms if rto_ms is None else rto_ms,
            "dcqcn": exp.dcqcn_emulated(scale_factor) if exp.cc == "dcqcn" else {},
            "nscc": (exp.nscc_emulated(scale_factor, ecn=exp.ecn == "on")
                     if exp.cc == "nscc" else {}),
            "seed": exp.seed, "dscp": exp.dscp, "iterations": exp.iterations}


# A set rate this many times the calibrated faithful one is refused unless forced: the
# run would take many times its planned length and its figures would not count.
REFUSE_OVER_FAITHFUL = 4.0
RESENT_OVER = 1.1          # received over the data's frames: ACKs are a few % of this


def rate_refusal(rate_set: dict | None, force: bool) -> str | None:
    """Why a set rate is refused (rate_check's figures: more than REFUSE_OVER_FAITHFUL
    times the calibrated faithful rate, and not `force`d), or None."""
    if not rate_set or force or \
            rate_set["rate_mbps"] <= REFUSE_OVER_FAITHFUL * rate_set["max_faithful_mbps"]:
        return None
    return (f"{rate_set['rate_mbps']:g} Mbit/s is "
            f"{rate_set['rate_mbps'] / rate_set['max_faithful_mbps']:.0f}x what "
            f"this machine carries faithfully for this experiment "
            f"({rate_set['max_faithful_mbps']:g} Mbit/s, its calibration of "
            f"{rate_set['calibrated_utc']}): the emulator would fall far behind; "
            "use --rate auto or a lower rate, or --force to run it anyway")


def run_status(exp: Experiment, schedule, ranks: list[str], links: LinkSampler,
               cpu: CpuSampler):
    """What the progress lines say while the agents run: the bytes the ranks' ports have
    received (frames, ACKs and any traffic they forward included) against the data frames
    the workload sends, and the machine's recent CPU load (the verdict's CPU input)."""
    data_bytes = sum(t.size_bytes for steps in schedule.values() for st in steps
                     for t in st.sends) * exp.iterations
    wire_mb = data_bytes * frame_bits(exp.payload_bytes) / (8 * exp.payload_bytes) / 1e6

    def status() -> str:
        got_mb = links.rx_bytes(ranks) / 1e6
        load = cpu.recent_percent()
        busy = "" if load is None else (
            f"; CPU {load:.0f} %" + (" (the emulator may be falling behind)"
                                     if load >= LOW_FIDELITY_CPU_PERCENT else ""))
        resends = " (more than the data: resends)" if got_mb > RESENT_OVER * wire_mb else ""
        return (f"{got_mb:.1f} MB into the ranks' ports, for ~{wire_mb:.1f} MB of data"
                f"{resends}{busy}")
    return status


def check_flows(exp: Experiment, schedule) -> None:
    """Refuse (SpecError, before anything is built) a run whose agents would hold more
    than MAX_RUN_FLOWS flows: they build every flow of every iteration before they are
    ready."""
    flows = flow_count(schedule, exp.iterations)
    if flows > MAX_RUN_FLOWS:
        most = max(1, MAX_RUN_FLOWS // max(1, flows // exp.iterations))
        raise SpecError("experiment.iterations", f"{exp.iterations} iterations of "
                        f"{exp.workload} on {len(schedule)} ranks are {flows} flows for the "
                        f"agents to build and hold, more than {MAX_RUN_FLOWS} (~20 us and "
                        f"~1.5 KB each); at most {most} iterations here")


def helpers(pfc_ctl, failures, pcaps: Pcaps) -> dict[int, str]:
    """The run's processes the agents depend on, {pid: what}: watched as the agents are
    (traffic.launch), so the death of one fails the run at once, naming it."""
    found = pcaps.helpers()
    if pfc_ctl is not None and pfc_ctl.pid is not None:
        found[pfc_ctl.pid] = "the PFC controller"
    if failures is not None and failures.pid is not None:
        found[failures.pid] = "the failure player"
    return found


def run_lab() -> str:
    """The lab a run builds its fabric under (one run per process)."""
    return f"run{os.getpid()}"


def run(exp: Experiment, progress=None, force: bool = True) -> tuple[Path, dict]:
    """Run `exp`; a stop signal or error on the way leaves its folder marked FAILED.
    `force` False refuses (SpecError, before anything is built) a rate more than
    REFUSE_OVER_FAITHFUL times what the machine's calibration says it carries, measuring
    that calibration first for a set rate when none is cached (judging_calibration)."""
    lab = run_lab()
    try:
        with stop_on_signals():
            return _run(exp, progress or (lambda msg: None), lab, force)
    except BaseException as exc:  # after the teardown: a folder never stays unmarked
        _mark_unfinished(lab, exc)
        raise
    finally:
        forget_run(lab)


def _mark_unfinished(lab: str, exc: BaseException) -> None:
    run_entry = (read_state(lab) or {}).get("run")
    if run_entry and not (Path(run_entry["results"]) / FAILED_FILE).exists():
        mark_failed(Path(run_entry["results"]), failure_reason(exc))


def _run(exp: Experiment, progress, lab: str, force: bool) -> tuple[Path, dict]:
    from traffic.launch import AgentDiedError, HelperDiedError, run_agents

    topo = exp.resolve_topology()
    exp.check_against(topo)
    ranks, pairs = pick_endpoints(exp, topo)
    cal = judging_calibration(exp, progress, force)
    topo, rate_choice, rto_ms = pick_link_rate(exp, topo, ranks, pairs, progress, cal)
    rate_set = None if rate_choice else rate_check(cal, exp, topo, ranks, pairs)
    refusal = rate_refusal(rate_set, force)
    if refusal:
        raise SpecError("experiment.rate", refusal)
    if refusal := lossless_refusal(exp, topo, force):
        raise SpecError("experiment.pfc", refusal)
    if rate_set and not rate_set["within"]:
        progress(f"this machine should carry this experiment faithfully at "
                 f"{rate_set['max_faithful_mbps']:g} Mbit/s links at most (its calibration); "
                 f"at {rate_set['rate_mbps']:g} the emulator is likely to fall behind "
                 f"(--rate auto picks a rate it keeps up with)")
    profiles, events, loss_links = link_physics(exp, topo)
    job_info = None
    if exp.workload in JOBS:
        from testbed.train_run import job_schedule
        schedule, job_info = job_schedule(exp, topo, ranks, progress)
    else:
        schedule = build_schedule(exp.workload, ranks, exp.message_bytes, seed=exp.seed,
                                  pairs=pairs)
    check_flows(exp, schedule)
    lossless_rto = lossless_rto_ms(rto_ms, exp, topo, schedule)
    if lossless_rto > rto_ms:
        progress(f"retransmission timeout {lossless_rto:g} ms (not {rto_ms:g}): with PFC on, "
                 f"twice the time the busiest receiver's link takes to carry every window "
                 f"that may queue towards it (docs/lossless.md)")
        rto_ms = lossless_rto
    folder = new_folder(exp.results_dir, exp.name, "experiment.results_dir")
    (folder / "config.toml").write_text(to_toml(exp, topo))
    record_run(lab, folder)   # testbed clean marks it FAILED if this process is killed
    progress(f"results: {folder}")
    fabric = Fabric(topo, seed=exp.seed, progress=progress, lab=lab)
    timings: dict[str, float] = {}
    pcaps = links = cpu = timers = imp = failures = pfc_ctl = None
    stack = contextlib.ExitStack()
    try:
        t0 = time.monotonic()
        fabric.start()
        timings["build_s"] = time.monotonic() - t0
        delay_on = exp.delay == "on"
        path_delays = None
        if exp.loss_rate or events or delay_on:
            from fabric.impair import Impairments
            imp = Impairments(fabric, profiles, delay=delay_on)
            if exp.loss_rate:
                imp.apply(loss_rate=exp.loss_rate, links=loss_links or None)
                progress(f"loss {exp.loss_rate:g} on "
                         f"{f'{len(loss_links)} links' if loss_links else 'every link'} "
                         f"by {imp.loss_where}")
            if delay_on:
                imp.apply_delay()
                if imp.delay_mechanism == "agent delay line":
                    path_delays = imp.path_delays_ns(
                        [(a, b) for a in ranks for b in ranks if a != b])
                mean_ms = (sum(path_delays.values()) / len(path_delays) / 1e6
                           if path_delays else None)
                progress(f"propagation delay by {imp.delay_mechanism}"
                         + (f", one way {mean_ms:.3f} ms mean over rank pairs"
                            if mean_ms is not None else ""))
            if events:  # the playback process loads now, before the clock matters
                failures = imp.prepare_schedule(events)

        def start_failures(start_at_ns: int) -> None:
            if failures is not None:  # timed from the agents' agreed start
                failures.start(start_at_ns)
                progress(f"failure schedule: {len(events)} events")

        pfc = exp.switch_settings()
        if pfc.mode:
            pfc_ctl = stack.enter_context(pfc_running(fabric, pfc))
            progress(f"PFC {pfc.mode}: lossless class for DSCP {pfc.traffic_class.dscp} "
                     "on every port")
        pcaps = Pcaps(fabric, exp.pcap, folder / "pcaps").start()
        links = LinkSampler(fabric).start()
        cpu = CpuSampler().start()
        timers = TimerWatch(tolerance_s(topo)).start()
        progress(f"running {exp.workload} on {len(ranks)} ranks, {exp.iterations} iterations"
                 + ("" if job_info else f" of {exp.message_bytes} B")
                 + f" ({exp.transport}, {exp.entropy})")
        t0 = time.monotonic()
        options = agent_options(exp, topo.scale_factor, rto_ms)
        watched = helpers(pfc_ctl, failures, pcaps)
        if watched:
            progress("watching " + ", ".join(f"{what} (pid {pid})"
                                             for pid, what in watched.items()))
        agents = run_agents(fabric, schedule, workdir=folder / "agents", progress=progress,
                            on_start=start_failures, timeout_s=exp.timeout_s,
                            path_delay_ns=path_delays, processes=exp.agent_processes,
                            status=run_status(exp, schedule, ranks, links, cpu),
                            helpers=watched, **options)
        timings["run_s"] = time.monotonic() - t0
        if failures is not None:
            failures.stop()
        stack.close()  # the PFC controller stops here
        physics = imp.record() if imp is not None else None
        cpu.stop()
        timers.stop()
        links.stop()
        captured = pcaps.stop()
        found = attribution.collect(fabric, topo, agents)   # flows' paths: the kernel's
        t0 = time.monotonic()
        fabric.stop()
        timings["teardown_s"] = time.monotonic() - t0
    except BaseException as exc:
        for collector in (failures, stack, cpu, timers, links, pcaps):
            if collector is not None:
                try:
                    (collector.close if collector is stack else collector.stop)()
                except Exception:  # the fabric must still come down
                    pass
        fabric.stop()
        if isinstance(exc, (AgentDiedError, HelperDiedError)):  # failed, in one line
            mark_failed(folder, str(exc))
            raise RunFailedError(str(exc), folder) from None
        mark_failed(folder, failure_reason(exc))
        raise
    spans = [it for a in agents.values() for it in a["iterations"] if it.get("end_ns")]
    window = ((min(s["start_ns"] for s in spans) / 1e9, max(s["end_ns"] for s in spans) / 1e9)
              if spans else None)  # CPU load while the workload ran, not agent start-up
    totals = links.totals()
    metrics = compute_metrics(exp, topo, ranks, agents, totals, cpu.summary(window), timings)
    metrics["shaping_timers"] = timers.summary(busy_s(topo, totals))
    # which code ran the agents' per-packet work (traffic.engine): one name when all agree
    engines = sorted({(a.get("host") or {}).get("engine") or "unknown" for a in agents.values()})
    metrics["engine"] = engines[0] if len(engines) == 1 else ", ".join(engines)
    metrics["link_sample_period_s"] = links.period_s_mean()   # collect.SAMPLER_SHARE
    if window:  # on the time axis of links.csv and cpu.csv; and on CLOCK_MONOTONIC
        metrics["workload_window_s"] = [window[0] - links.t0, window[1] - links.t0]
        metrics["workload_start_monotonic_s"] = window[0]
    from topologies.physics import cost_table, energy_report
    job_s = (window[1] - window[0]) if window else 0.0   # the workload, all iterations
    metrics["link_energy"] = energy_report(topo, profiles, timings["run_s"],
                                           {exp.workload: job_s})
    metrics["fabric_cost"] = cost_table(topo, profiles)
    metrics["link_physics"] = physics
    metrics["rate_choice"] = rate_choice
    metrics["rate_check"] = rate_set
    metrics["rto_ms"] = rto_ms
    metrics["pfc"] = rep = None
    if pfc_ctl is not None:
        rep = write_pfc(pfc_ctl, folder)
        metrics["pfc"] = {k: rep.get(k) for k in ("enabled", "headroom",
                                                   "reaction_ms", "totals", "storms",
                                                   "controller", "ecn", "switch_lb",
                                                   "trimming")}
        metrics["pfc"]["occupancy_from"] = rep["calibration"].get("occupancy_from")
        metrics["pfc"]["poll_ms"] = rep["calibration"].get("poll_ms")
        metrics["pfc"]["sleep"] = rep["calibration"].get("sleep")
    metrics["expected"] = [e.to_dict() for e in incast_expect.expectations(
        topo, ranks, metrics, rep if pfc_ctl is not None else None)]
    # The controller's lag is graded only where it pauses: with PFC off it watches (ECN
    # marks and trims are the kernel's, at every frame; see testbed.fidelity)
    ctl = (metrics["pfc"] or {}).get("controller") or {}
    gap = ctl.get("poll_gap_p99_ms") if (metrics["pfc"] or {}).get("enabled") else None
    metrics["fidelity"] = fidelity_verdict(agents, metrics["cpu"]["cpu_mean_percent"], gap,
                                           metrics["cpu"].get("softnet"),
                                           metrics["cpu"].get("steal_mean_percent"),
                                           metrics["shaping_timers"], pfc=rep)
    metrics["cc"] = cc_metrics(agents, options["dcqcn"].get("cnp_interval_ns"))
    metrics["train"] = None
    if job_info:   # a training step: its own expected time (the analytic step)
        from testbed.train_run import train_metrics
        tm = metrics["train"] = train_metrics(job_info, agents, metrics["iterations"])
        metrics["ideal_s"], metrics["jct_over_ideal"] = (tm["analytic_step_s"],
                                                         tm["step_over_analytic"])
    split, metrics["attribution"] = attribution.results(
        found, topo, agents, totals, pfc_ctl.timeline if pfc_ctl else None,
        pfc_ctl.t0 if pfc_ctl else None)
    write_tables(folder, agents, links.samples, cpu.samples, split)
    write_metrics(folder, metrics)
    if metrics["cc"] and spans:
        write_rates(folder, agents, min(s["start_ns"] for s in spans))
    summary = summary_md(exp.name, metrics, topo.summary(), captured)
    if job_info:
        from testbed.train_run import write_timeline, write_trace
        write_trace(folder, job_info)
        if metrics["iterations"]:
            write_timeline(folder, job_info, agents, metrics["iterations"][-1]["iteration"])
    plots = draw_all(folder, metrics)      # from the files: as testbed report redraws them
    (folder / "summary.md").write_text(summary)
    progress(f"wrote {len(plots)} plots, {len(captured)} pcaps")
    if not metrics["ok"]:
        mark_failed(folder, "agents reported errors: " + json.dumps(metrics["errors"]))
        raise RunFailedError(f"the run did not complete: {metrics['errors']}", folder)
    return folder, metrics
