"""A training step on the fabric: its job, scaled; what the run measured of it, split the
way a training engineer reads a step; the timeline plot.

    [train] plan (traffic.train) or Chakra traces (traffic.chakra) ─▶ Job, real sizes
        ─▶ byte_scale (given, or auto) and time_scale (the topology's) ─▶ scaled Job
        ─▶ traffic.job.expand ─▶ the agents' steps
    agents' step records ─▶ per rank: compute, exposed collectives, pipeline waits, idle;
        per collective: time and bus bandwidth (nccl-tests); the step scaled back

A rank's compute is the time its compute stream ran; a collective's time at a rank runs
from when the rank was ready for it to when its last chunk arrived; what of it no
computation covered is exposed. A pipeline wait is the time a rank waited for a
neighbouring stage's activations or gradients. Idle is the rest of its step.
"""

from __future__ import annotations

import csv
from pathlib import Path

from topologies.spec import SpecError
from traffic.job import Job, expand, min_message_bytes, scaled
from traffic.train import analytic_step, choose_byte_scale, plan_job, rate_function
from traffic.train_size import MAX_STEPS, MAX_TRANSFERS
from traffic.workloads import Schedule, bandwidths, nccl_table

KIND_NAMES = {"compute": "compute", "tp": "TP all-reduce", "dp": "DP gradient all-reduce",
              "ep": "EP all-to-all", "pp": "pipeline wait", "coll": "collective"}
KIND_COLORS = {"compute": "#4c72b0", "tp": "#dd8452", "dp": "#55a868", "ep": "#c44e52",
               "pp": "#8172b3", "coll": "#937860"}


def trace_ranks(exp, topo) -> list[str]:
    """The endpoints a trace folder's ranks run on: the first as many as it has ranks."""
    from traffic.chakra import ChakraError, trace_files
    try:
        n = len(trace_files(exp.trace))
    except ChakraError as exc:
        raise SpecError("train.trace", str(exc)) from None
    endpoints = topo.endpoints()
    if n > len(endpoints):
        raise SpecError("train.trace", f"{n} ranks in {exp.trace} but {topo.name} has "
                        f"{len(endpoints)} endpoints")
    return endpoints[:n]


def real_job(exp, ranks: list[str]) -> Job:
    """The job of the real model: the Chakra traces given, else the plan."""
    if exp.trace:
        from traffic.chakra import ChakraError, read_traces
        try:
            return read_traces(exp.trace, ranks)
        except ChakraError as exc:
            raise SpecError("train.trace", str(exc)) from None
    exp.check_train(len(ranks))
    return plan_job(exp, ranks)


def job_schedule(exp, topo, ranks: list[str], progress, job: Job | None = None
                 ) -> tuple[Schedule, dict]:
    """The agents' steps of the scaled job, and what the results need of it. `job`: the
    real job when the caller built it already (testbed.rate.build_workload)."""
    job = real_job(exp, ranks) if job is None else job
    rate_of = rate_function(topo.graph)
    time_scale = topo.scale_factor
    byte_scale, why = choose_byte_scale(job, exp.byte_scale, time_scale, rate_of,
                                        exp.payload_bytes)
    run = scaled(job, byte_scale, time_scale)
    schedule = expand(run)
    _check_schedule(exp, schedule)
    smallest = min_message_bytes(run)
    analytic = analytic_step(run, rate_of)
    progress(f"train_step: {'Chakra traces ' + exp.trace if exp.trace else 'plan'}, "
             f"{sum(len(o) for o in job.ranks.values())} ops on {len(ranks)} ranks; "
             f"time x{time_scale:g} (the links), bytes / {byte_scale:.4g} ({why}): "
             f"emulated times are x{time_scale / byte_scale:.4g} the real ones; smallest "
             f"message {smallest} B ({-(-smallest // exp.payload_bytes)} packets); "
             f"analytic step {analytic['step_s']:.3f} s")
    info = {"job": run, "real_job": job, "byte_scale": byte_scale, "byte_scale_why": why,
            "time_scale": time_scale, "analytic": analytic,
            "smallest_message_bytes": smallest, "source": exp.trace or "plan"}
    return schedule, info


def _check_schedule(exp, schedule: Schedule) -> None:
    """SpecError for a scaled job's schedule the agents cannot run (a trace's: a plan's
    bounds were checked from its settings): too many steps or transfers, a message past
    one PSN space."""
    field = "train.trace" if exp.trace else "train.layers"
    steps = sum(len(s) for s in schedule.values())
    sends = [t for s in schedule.values() for st in s for t in st.sends]
    transfers = len({t.tag for t in sends})
    for count, limit, what in ((steps, MAX_STEPS, "agent steps"),
                               (transfers, MAX_TRANSFERS, "transfers in one iteration")):
        if count > limit:
            raise SpecError(field, f"the job makes {count} {what}, more than the {limit} "
                            "allowed")
    exp.check_message("train.byte_scale", max((t.size_bytes for t in sends), default=0))


def write_trace(folder: Path, info: dict) -> Path:
    """trace/: the real job as Chakra traces (`--trace` replays them)."""
    from traffic.chakra import write_traces
    write_traces(info["real_job"], folder / "trace")
    return folder / "trace"


def _union(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _length(spans) -> int:
    return sum(b - a for a, b in spans)


def _overlap(xs, ys) -> int:
    """Total length of the intersection of two unions of spans."""
    total = 0
    for a, b in xs:
        for c, d in ys:
            lo, hi = max(a, c), min(b, d)
            if lo < hi:
                total += hi - lo
    return total


def op_kind(job: Job, rank: str, op_id: int) -> str:
    """compute, tp, dp, ep, pp (a send or receive) or coll (a collective of a trace)."""
    op = job.op(rank, op_id)
    if op.kind == "comp":
        return "compute"
    if op.kind in ("send", "recv"):
        return "pp"
    for kind, mark in (("dp", "grad."), ("ep", ".ep"), ("tp", ".tp")):
        if mark in op.name:
            return kind
    return "coll"


def op_spans(job: Job, rank: str, records: list[dict], iteration: int) -> dict[int, tuple]:
    """op id -> (kind, ready, compute begin or ready, done) in one iteration (ns)."""
    out: dict[int, list] = {}
    for st in records:
        if st["iteration"] != iteration or st["op"] < 0 or st["done_ns"] is None:
            continue
        got = out.get(st["op"])
        begin = st["begin_ns"] if st["compute_ns"] else st["ready_ns"]
        if got is None:
            out[st["op"]] = [op_kind(job, rank, st["op"]), st["ready_ns"], begin,
                             st["done_ns"]]
        else:
            got[1], got[2] = min(got[1], st["ready_ns"]), min(got[2], begin)
            got[3] = max(got[3], st["done_ns"])
    return {k: tuple(v) for k, v in out.items()}


def rank_split(job: Job, rank: str, agent: dict, iteration: int) -> dict | None:
    """A rank's step in one iteration: its length and what filled it (seconds)."""
    its = agent.get("iterations") or []
    if len(its) <= iteration:
        return None
    start, end = its[iteration]["start_ns"], its[iteration]["end_ns"]
    spans = op_spans(job, rank, agent.get("steps") or [], iteration)
    compute = _union([(b, d) for k, _, b, d in spans.values() if k == "compute"])
    colls = _union([(r, d) for k, r, _, d in spans.values() if k not in ("compute", "pp")])
    waits = _union([(r, d) for k, r, _, d in spans.values() if k == "pp"])
    busy = _union(compute + colls + waits)
    exposed = _length(colls) - _overlap(colls, compute)
    wait = _length(waits) - _overlap(waits, _union(compute + colls))
    step = end - start
    return {"step_s": step / 1e9, "compute_s": _length(compute) / 1e9,
            "exposed_comm_s": exposed / 1e9, "pipeline_wait_s": max(0, wait) / 1e9,
            "idle_s": max(0, step - _length(busy)) / 1e9}


def collective_rows(job: Job, agents: dict, iteration: int) -> list[dict]:
    """Every collective of one iteration: its span over its members, its bus bandwidth."""
    spans: dict[str, list] = {}
    for rank, agent in agents.items():
        if rank not in job.ranks:
            continue
        for op_id, (kind, ready, _, done) in op_spans(job, rank, agent.get("steps") or [],
                                                      iteration).items():
            op = job.op(rank, op_id)
            if op.kind != "coll":
                continue
            got = spans.setdefault(op.name, [kind, op, ready, done])
            got[2], got[3] = min(got[2], ready), max(got[3], done)
    rows = []
    for name, (kind, op, ready, done) in spans.items():
        t = (done - ready) / 1e9
        algbw, busbw = bandwidths(op.coll, len(op.group), op.size_bytes, t)
        rows.append({"name": name, "kind": kind, "coll": op.coll, "ranks": len(op.group),
                     "size_bytes": op.size_bytes, "time_s": t, "algbw_bytes_per_s": algbw,
                     "busbw_bytes_per_s": busbw})
    return rows


def train_metrics(info: dict, agents: dict, iterations: list[dict]) -> dict:
    """What metrics.json says of the step (module docstring)."""
    job: Job = info["job"]
    back = info["byte_scale"] / info["time_scale"]        # emulated s -> real s
    per_iter = []
    for it in iterations:
        i = it["iteration"]
        ranks = {r: rank_split(job, r, a, i) for r, a in agents.items() if r in job.ranks}
        ranks = {r: v for r, v in ranks.items() if v}
        slowest = max(ranks, key=lambda r: ranks[r]["step_s"]) if ranks else None
        per_iter.append({"iteration": i, "step_s": it["jct_s"], "step_s_real":
                         it["jct_s"] * back, "slowest_rank": slowest, "ranks": ranks})
    steps = [p["step_s"] for p in per_iter]
    mean = sum(steps) / len(steps) if steps else None
    groups: dict[tuple, list[dict]] = {}
    last = per_iter[-1]["iteration"] if per_iter else None
    rows = collective_rows(job, agents, last) if last is not None else []
    for row in rows:
        groups.setdefault((row["kind"], row["coll"], row["ranks"], row["size_bytes"]),
                          []).append(row)
    table = [{"kind": k[0], "coll": k[1], "ranks": k[2], "size_bytes": k[3],
              "count": len(v), "time_s": sum(r["time_s"] for r in v) / len(v),
              "busbw_bytes_per_s": sum(r["busbw_bytes_per_s"] for r in v) / len(v)}
             for k, v in sorted(groups.items())]
    analytic = info["analytic"]["step_s"]
    return {"source": info["source"], "byte_scale": info["byte_scale"],
            "byte_scale_why": info["byte_scale_why"], "time_scale": info["time_scale"],
            "smallest_message_bytes": info["smallest_message_bytes"],
            "ops": sum(len(o) for o in job.ranks.values()),
            "step_mean_s": mean, "step_mean_s_real": mean * back if mean else None,
            "analytic_step_s": analytic, "analytic_step_s_real": analytic * back,
            "step_over_analytic": mean / analytic if mean and analytic else None,
            "iterations": per_iter, "collectives": table}


def summary_lines(tm: dict) -> list[str]:
    """summary.md's training-step section."""
    out = ["", "## Training step", "",
           f"- job: {tm['source']}, {tm['ops']} ops; bytes / {tm['byte_scale']:.4g} "
           f"({tm['byte_scale_why']}), time x{tm['time_scale']:g}; smallest message "
           f"{tm['smallest_message_bytes']} B; its Chakra traces (real sizes): trace/, "
           "which `--trace` replays"]
    if tm["step_mean_s"]:
        out.append(f"- step: {tm['step_mean_s']:.3f} s measured, {tm['step_mean_s_real']*1e3:.2f}"
                   f" ms scaled back to the real fabric")
        out.append(f"- expected: {tm['analytic_step_s']:.3f} s (each rank's compute on one "
                   "stream plus every transfer alone on its links at the nccl-tests bus "
                   f"bandwidth formulas); measured / expected = {tm['step_over_analytic']:.3f}")
    if tm["iterations"]:
        last = tm["iterations"][-1]
        r = last["slowest_rank"]
        if r:
            s = last["ranks"][r]
            out.append(f"- slowest rank {r} (iteration {last['iteration']}): compute "
                       f"{s['compute_s']:.3f} s, exposed collectives {s['exposed_comm_s']:.3f}"
                       f" s, pipeline waits {s['pipeline_wait_s']:.3f} s, idle "
                       f"{s['idle_s']:.3f} s of {s['step_s']:.3f} s")
    if tm["collectives"]:
        out += ["", "| kind | collective | ranks | size (B) | count | time (ms) | busbw "
                "(Mbit/s) |", "|---|---|---:|---:|---:|---:|---:|"]
        out += [f"| {c['kind']} | {c['coll']} | {c['ranks']} | {c['size_bytes']} | "
                f"{c['count']} | {c['time_s'] * 1e3:.2f} | "
                f"{c['busbw_bytes_per_s'] * 8 / 1e6:.1f} |" for c in tm["collectives"]]
        back = tm["byte_scale"] / tm["time_scale"]
        tables = []
        for c in tm["collectives"]:     # nccl-tests' shape: as measured, and real
            title = f"{c['kind']} {c['coll']}, {c['count']} calls (mean)"
            tables += [nccl_table(c["coll"], c["ranks"], [{
                "size_bytes": c["size_bytes"], "time_us": c["time_s"] * 1e6}],
                unit="MB/s", title=f"{title} as measured"), nccl_table(
                c["coll"], c["ranks"], [{"size_bytes": round(c["size_bytes"] *
                                                              tm["byte_scale"]),
                                         "time_us": c["time_s"] * back * 1e6}],
                unit="GB/s", title=f"{title} on the real fabric")]
        out += ["", "```", "\n\n".join(tables), "```"]
    return out


def write_timeline(folder: Path, info: dict, agents: dict, iteration: int) -> Path | None:
    """timeline.csv (testbed.plots draws timeline.png from it): per rank, each op of one
    iteration, when it was ready, began and was done, in seconds since the step began."""
    job: Job = info["job"]
    ranks = [r for r in job.ranks if r in agents]
    starts = [a["iterations"][iteration]["start_ns"] for a in agents.values()
              if len(a.get("iterations") or []) > iteration]
    if not ranks or not starts:
        return None
    t0 = min(starts)
    path = folder / "timeline.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["iteration", "rank", "op", "kind", "ready_s", "begin_s", "done_s"])
        for rank in ranks:
            spans = op_spans(job, rank, agents[rank].get("steps") or [], iteration)
            w.writerows((iteration, rank, op, kind, *(f"{(t - t0) / 1e9:.9f}"
                                                      for t in (ready, begin, done)))
                        for op, (kind, ready, begin, done) in spans.items())
    return path
