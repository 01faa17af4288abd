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

import os
import time
from dataclasses import fields
from pathlib import Path

from fabric.core import Fabric
from fabric.state import FAILED_FILE, forget_run, read_state, record_run
from fabric.voq import check_size as voq_check_size
from testbed import attribution
from testbed.calibrate import calibration
from testbed.collect import LOW_FIDELITY_CPU_PERCENT, CpuSampler, LinkSampler
from testbed.experiment import Experiment, to_toml
from testbed.features import Part, entered, grade, run_options
from testbed.flow_plan import flow_schedule
from testbed.interrupts import failure_reason, stop_on_signals
from testbed.lossless_plan import lossless_refusal, lossless_rto_ms, sized_buffer
from testbed.rate import (
    base_rate_mbps,
    build_workload,
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
    controller_note,
    mark_failed,
    new_folder,
)
from testbed.run_output import Prepared, workload_window, write_run
from topologies.spec import SpecError
from traffic.launch import MAX_RUN_FLOWS, flow_count
from traffic.transport_settings import TransportSettings
from traffic.workloads import workload_named


def pick_ranks(exp: Experiment, topo) -> list[str]:
    endpoints = topo.endpoints()
    if exp.ranks > len(endpoints):
        raise SpecError("experiment.ranks", f"{exp.ranks} ranks but the topology has only "
                        f"{len(endpoints)} endpoints")
    ranks = endpoints[: exp.ranks] if exp.ranks else endpoints
    ring = exp.ring_order == "rails" and workload_named(exp.workload).ring
    return ring_ranks(topo, ranks) if ring else ranks


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
    if workload_named(exp.workload).job and exp.trace and not exp.ranks:
        from testbed.train_run import trace_ranks
        ranks = trace_ranks(exp, topo)
    return ranks, pairs


def pick_link_rate(exp: Experiment, topo, ranks, pairs, progress, cal: dict | None,
                   built=None):
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
        choice = pick_rate(cal, exp, topo, ranks, pairs, built)
        progress(f"rate auto: {choice['rate_mbps']:g} Mbit/s, set by {choice['bound_by']} "
                 f"(this machine should carry {choice['max_faithful_mbps']:g} Mbit/s of "
                 f"this experiment faithfully; the topology's own rate is "
                 f"{choice['limits_mbps']['topology']:g}"
                 f"{controller_note(choice)})")
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
            "seed": exp.seed, "dscp": exp.dscp, "ack_dscp": exp.ack_dscp,
            "iterations": exp.iterations}


# A set rate this many times the calibrated faithful one is refused unless forced: the
# run would take many times its planned length and its figures would not count.
REFUSE_OVER_FAITHFUL = 4.0
RESENT_OVER = 1.1          # received over the data's frames: ACKs are a few % of this


def rate_refusal(rate_set: dict | None, force: bool) -> str | None:
    """Why a set rate is refused (rate_check's figures: more than REFUSE_OVER_FAITHFUL
    times the rate the calibrated CPU budget carries the packets at, and not `force`d),
    or None. The fastest flow's frame time does not refuse, nor does the switch
    controller's share: past them the fast ports starve or the machine runs hot, which
    the verdict reports, but the run does not fall behind as a whole."""
    if not rate_set or force:
        return None
    rate, packets = rate_set["rate_mbps"], rate_set["max_packets_mbps"]
    if rate <= REFUSE_OVER_FAITHFUL * packets:
        return None
    return (f"{rate:g} Mbit/s is {rate / packets:.0f}x what "
            f"this machine carries faithfully for this experiment "
            f"({packets:g} Mbit/s, its calibration of "
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


def prepare(exp: Experiment, progress, force: bool, judged: bool = True) -> Prepared:
    """What the run will be, decided before anything is built, the same for a run on
    this machine and on several: its topology at its rate with its buffers sized, ranks,
    schedule (or training step), timeout and agents' options; SpecError for what this
    machine's calibration or the lossless class cannot carry (`force` lets them through).
    `judged` False (a run on several machines, whose orchestrator need not be root nor
    like its servers): only `rate = "auto"` reads this machine's calibration."""
    topo = exp.resolve_topology()
    exp.check_against(topo)
    ranks, pairs = pick_endpoints(exp, topo)
    built = build_workload(exp, ranks, pairs, topo)    # the schedule, or a job's real job: once
    if judged:
        cal = judging_calibration(exp, progress, force)
    else:
        cal = ensure_calibration(progress) if exp.rate == "auto" else None
    topo, rate_choice, rto_ms = pick_link_rate(exp, topo, ranks, pairs, progress, cal, built)
    rate_set = None if rate_choice or not judged else rate_check(cal, exp, topo, ranks,
                                                                 pairs, built)
    refusal = rate_refusal(rate_set, force)
    if refusal:
        raise SpecError("experiment.rate", refusal)
    if refusal := lossless_refusal(exp, topo, force):
        raise SpecError("experiment.pfc", refusal)
    if exp.voq != "off":
        voq_check_size(topo)
    if rate_set and not rate_set["within"]:
        progress(f"this machine should carry this experiment faithfully at "
                 f"{rate_set['max_faithful_mbps']:g} Mbit/s links at most (its calibration); "
                 f"at {rate_set['rate_mbps']:g} the emulator is likely to fall behind "
                 f"(--rate auto picks a rate it keeps up with)")
    job_info = flow_info = None
    if workload_named(exp.workload).job:
        from testbed.train_run import job_schedule
        schedule, job_info = job_schedule(exp, topo, ranks, progress, built)
    elif workload_named(exp.workload).open_loop:   # again, at the rate the run picked
        schedule, flow_info = flow_schedule(exp, topo, ranks, pairs)
    else:
        schedule = built
    check_flows(exp, schedule)
    lossless_rto = lossless_rto_ms(rto_ms, exp, topo, schedule)
    if lossless_rto > rto_ms:
        progress(f"retransmission timeout {lossless_rto:g} ms (not {rto_ms:g}): with PFC on, "
                 f"twice the time the busiest receiver's link takes to carry every window "
                 f"that may queue towards it (docs/lossless.md)")
        rto_ms = lossless_rto
    return Prepared(exp, topo, ranks, pairs, schedule, job_info, rate_choice, rate_set,
                    rto_ms, agent_options(exp, topo.scale_factor, rto_ms), flow_info)


def _run(exp: Experiment, progress, lab: str, force: bool) -> tuple[Path, dict]:
    from traffic.launch import AgentDiedError, HelperDiedError, run_agents

    p = prepare(exp, progress, force)
    folder = new_folder(exp.results_dir, exp.name, "experiment.results_dir")
    (folder / "config.toml").write_text(to_toml(exp, p.topo))
    record_run(lab, folder)   # testbed clean marks it FAILED if this process is killed
    progress(f"results: {folder}")
    fabric = Fabric(p.topo, seed=exp.seed, progress=progress, lab=lab)
    part = Part(fabric, folder, progress, p.ranks)
    timings: dict[str, float] = {}
    try:
        t0 = time.monotonic()
        fabric.start()
        timings["build_s"] = time.monotonic() - t0
        with entered(part, run_options(exp)) as live:   # torn down in reverse, even on error
            progress(f"running {exp.workload} on {len(p.ranks)} ranks, {exp.iterations} "
                     "iterations" + ("" if p.job_info or p.flow_info
                                     else f" of {exp.message_bytes} B")
                     + f" ({exp.transport}, {exp.entropy})")
            if part.helpers:
                progress("watching " + ", ".join(f"{what} (pid {pid})"
                                                 for pid, what in part.helpers.items()))
            t0 = time.monotonic()
            agents = run_agents(fabric, p.schedule, workdir=folder / "agents",
                                progress=progress, on_start=part.on_start,
                                timeout_s=exp.timeout_s, path_delay_ns=part.path_delay_ns,
                                processes=exp.agent_processes,
                                status=run_status(exp, p.schedule, p.ranks,
                                                  live.state["links"], live.state["cpu"]),
                                helpers=part.helpers, **p.agent_options)
            timings["run_s"] = time.monotonic() - t0
        measured = live.measure(workload_window(agents))
        found = attribution.collect(fabric, p.topo, agents)   # flows' paths: the kernel's
        t0 = time.monotonic()
        fabric.stop()
        timings["teardown_s"] = time.monotonic() - t0
    except BaseException as exc:
        fabric.stop()
        if isinstance(exc, (AgentDiedError, HelperDiedError)):  # failed, in one line
            mark_failed(folder, str(exc))
            raise RunFailedError(str(exc), folder) from None
        mark_failed(folder, failure_reason(exc))
        raise
    metrics = write_run(p, folder, agents, {"": measured}, {"": grade(agents, measured)},
                        timings, progress, found=found)
    return folder, metrics
