"""Workloads as schedules (pure data): who sends what to whom, in which dependent steps.

A schedule gives every participating endpoint a list of steps. A step's sends start
when all receives of the previous step of that endpoint have completed, so a ring
step starts when the previous chunk has arrived and a slow link slows the whole job,
as in NCCL. Sizes are bytes; a rank's message is `message_bytes` (nccl-tests' "size").

Collective formulas (nccl-tests): algbw = size / time; busbw = algbw * factor with
factor 2(n-1)/n for all-reduce, (n-1)/n for all-gather, reduce-scatter, all-to-all.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field

from topologies import units

COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall")
WORKLOADS = ("p2p", "permutation", "incast") + COLLECTIVES
JOBS = ("train_step",)      # a job's ranks each run their own ops (traffic.job)


@dataclass(frozen=True)
class Transfer:
    src: str
    dst: str
    size_bytes: int
    tag: str  # unique within one iteration: names the flow in results


@dataclass
class Step:
    sends: list[Transfer] = field(default_factory=list)
    recvs: list[Transfer] = field(default_factory=list)
    # A job's steps (traffic.job) also say which of the rank's earlier steps they wait
    # for (None: the previous one) and how long they compute before sending; a
    # collective's steps are chained behind its first
    after: tuple[int, ...] | None = None
    compute_ns: int = 0
    label: str = ""      # the job's op it belongs to
    op: int = -1


Schedule = dict[str, list[Step]]


def chunks(total: int, n: int) -> list[int]:
    """Split `total` bytes into n chunks differing by at most one byte."""
    base, extra = divmod(total, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def _ring(ranks: list[str], message_bytes: int, steps: int, name: str) -> Schedule:
    n = len(ranks)
    chunk = chunks(message_bytes, n)
    sched: Schedule = {r: [] for r in ranks}
    for s in range(steps):
        for i, r in enumerate(ranks):
            nxt, prv = ranks[(i + 1) % n], ranks[(i - 1) % n]
            send_chunk = chunk[(i - s) % n]
            recv_chunk = chunk[(i - 1 - s) % n]
            sched[r].append(Step(
                sends=[Transfer(r, nxt, send_chunk, f"{name}.s{s}.{r}>{nxt}")],
                recvs=[Transfer(prv, r, recv_chunk, f"{name}.s{s}.{prv}>{r}")]))
    return sched


def collective_steps(coll: str, group: list[str], size_bytes: int, name: str) -> Schedule:
    """The steps of one collective `coll` over `group`, its transfers tagged by `name`."""
    n = len(group)
    if coll == "allreduce":  # ring: reduce-scatter then all-gather
        return _ring(group, size_bytes, 2 * (n - 1), name)
    if coll in ("allgather", "reducescatter"):
        return _ring(group, size_bytes, n - 1, name)
    if coll != "alltoall":
        raise ValueError(f"collective: {coll!r} is not one of {', '.join(COLLECTIVES)}")
    chunk = chunks(size_bytes, n)
    sched: Schedule = {r: [Step()] for r in group}
    for a in group:
        for j, b in enumerate(group):
            if a != b:
                t = Transfer(a, b, chunk[j], f"{name}.{a}>{b}")
                sched[a][0].sends.append(t)
                sched[b][0].recvs.append(t)
    return sched


def build_schedule(workload: str, ranks: list[str], message_bytes: int, seed: int = 1,
                   pairs: list[tuple[str, str]] | None = None,
                   receiver: str | None = None) -> Schedule:
    """The steps of one iteration of `workload` over `ranks` (endpoint names)."""
    if workload not in WORKLOADS:
        raise ValueError(f"workload: {workload!r} is not one of {', '.join(WORKLOADS)}")
    if len(ranks) < 2:
        raise ValueError("ranks: a workload needs at least two endpoints")
    if message_bytes < 1:
        raise ValueError("message_bytes: must be at least 1")
    n = len(ranks)
    if workload in COLLECTIVES:
        return collective_steps(workload, ranks, message_bytes, workload)
    sched: Schedule = {r: [Step()] for r in ranks}
    if workload == "incast":
        target = receiver or ranks[-1]
        if target not in ranks:
            raise ValueError(f"receiver: {target!r} is not one of the ranks")
        flows = [(a, target, message_bytes) for a in ranks if a != target]
    elif workload == "permutation":
        rng = random.Random(seed)
        while True:  # a random derangement: nobody sends to itself
            perm = ranks[:]
            rng.shuffle(perm)
            if all(a != b for a, b in zip(ranks, perm, strict=True)):
                break
        flows = [(a, b, message_bytes) for a, b in zip(ranks, perm, strict=True)]
    else:  # p2p
        chosen = pairs or [(ranks[i], ranks[i + n // 2]) for i in range(n // 2)]
        flows = [(a, b, message_bytes) for a, b in chosen]
    for a, b, size in flows:
        t = Transfer(a, b, size, f"{workload}.{a}>{b}")
        sched[a][0].sends.append(t)
        sched[b][0].recvs.append(t)
    return {r: steps for r, steps in sched.items() if steps[0].sends or steps[0].recvs}


def busbw_factor(workload: str, n: int) -> float:
    if workload == "allreduce":
        return 2 * (n - 1) / n
    if workload in ("allgather", "reducescatter", "alltoall"):
        return (n - 1) / n
    return 1.0


def bandwidths(workload: str, n: int, size_bytes: int, time_s: float) -> tuple[float, float]:
    """(algbw, busbw) in bytes/s of `size_bytes` moved by `n` ranks in `time_s`: algbw =
    size / time, busbw = algbw * busbw_factor (nccl-tests); both 0 for no time."""
    algbw = size_bytes / time_s if time_s > 0 else 0.0
    return algbw, algbw * busbw_factor(workload, n)


def ideal_time_s(workload: str, n: int, message_bytes: int, link_mbps: float) -> float:
    """Time on an ideal non-blocking fabric of `link_mbps` per endpoint port (no headers).

    Ring all-reduce: 2(n-1)/n * S / B; all-gather, reduce-scatter, all-to-all:
    (n-1)/n * S / B; point-to-point and permutation: S / B; incast: (n-1) * S / B.
    """
    rate = units.mbps_to_bytes_per_s(link_mbps)
    if workload == "incast":
        return (n - 1) * message_bytes / rate
    return busbw_factor(workload, n) * message_bytes / rate


def step_extras(s: Step) -> dict:
    """A job step's dependencies, compute and op, as an agent's config carries them
    (nothing for a plain step)."""
    if s.after is None and not s.compute_ns and s.op < 0:
        return {}
    return {"after": list(s.after) if s.after is not None else None,
            "compute_ns": s.compute_ns, "label": s.label, "op": s.op}


def schedule_to_data(sched: Schedule) -> dict:
    return {r: [{"sends": [asdict(t) for t in s.sends], "recvs": [asdict(t) for t in s.recvs],
                 **step_extras(s)} for s in steps] for r, steps in sched.items()}


def schedule_from_data(data: dict) -> Schedule:
    return {r: [Step([Transfer(**t) for t in s["sends"]], [Transfer(**t) for t in s["recvs"]],
                     tuple(s["after"]) if s.get("after") is not None else None,
                     s.get("compute_ns", 0), s.get("label", ""), s.get("op", -1))
                for s in steps] for r, steps in data.items()}


def nccl_table(workload: str, n: int, rows: list[dict], unit: str = "GB/s",
               title: str = "") -> str:
    """nccl-tests-style table. rows: {size_bytes, time_us} per iteration.

    unit "GB/s" = 10^9 bytes/s or "MB/s" = 10^6 bytes/s (emulated rates are small).
    """
    scale = {"GB/s": 1e9, "MB/s": 1e6}[unit]
    factor = busbw_factor(workload, n)
    out = [f"# {title or workload}, {n} ranks; algbw = size / time, "
           f"busbw = algbw * {factor:.4g}",
           f"# {'size':>12s} {'count':>12s} {'type':>6s} {'iter':>5s} {'time':>12s} "
           f"{'algbw':>9s} {'busbw':>9s}",
           f"# {'(B)':>12s} {'(elements)':>12s} {'':>6s} {'':>5s} {'(us)':>12s} "
           f"{'(' + unit + ')':>9s} {'(' + unit + ')':>9s}"]
    busbws = []
    for i, row in enumerate(rows):
        size, t_us = row["size_bytes"], row["time_us"]
        algbw, busbw = (bw / scale for bw in bandwidths(workload, n, size, t_us * 1e-6))
        busbws.append(busbw)
        out.append(f"  {size:12d} {size // 4:12d} {'float':>6s} {i:5d} {t_us:12.1f} "
                   f"{algbw:9.4f} {busbw:9.4f}")
    avg = sum(busbws) / len(busbws) if busbws else 0.0
    out.append(f"# Avg bus bandwidth    : {avg:.4f} {unit}")
    return "\n".join(out)
