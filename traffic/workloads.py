"""Workloads as schedules (pure data): who sends what to whom, in which dependent steps.

A schedule gives every participating endpoint a list of steps. A step's sends start
when all receives of the previous step of that endpoint have completed, so a ring
step starts when the previous chunk has arrived and a slow link slows the whole job,
as in NCCL. Sizes are bytes; a rank's message is `message_bytes` (nccl-tests' "size").

Collective formulas (nccl-tests): algbw = size / time; busbw = algbw * factor with
factor 2(n-1)/n for all-reduce, (n-1)/n for all-gather, reduce-scatter, all-to-all.

Every workload is one `Workload` in WORKLOADS_BY_NAME (the registry, at the end of this
file): its schedule builder, bus-bandwidth factor, ideal time and how its offered load
is priced (testbed.rate). WORKLOADS, COLLECTIVES, JOBS and RINGS are read from it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from topologies import units


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


def _one_step(ranks: list[str], flows: list[tuple[str, str, int]], tag: str) -> Schedule:
    """One step of independent flows (src, dst, bytes); ranks with none are left out."""
    sched: Schedule = {r: [Step()] for r in ranks}
    for a, b, size in flows:
        t = Transfer(a, b, size, f"{tag}.{a}>{b}")
        sched[a][0].sends.append(t)
        sched[b][0].recvs.append(t)
    return {r: steps for r, steps in sched.items() if steps[0].sends or steps[0].recvs}


# A schedule builder: (ranks, message_bytes, seed, pairs, tag) -> one iteration's steps,
# its transfers tagged `tag`.
Pairs = list[tuple[str, str]]
Builder = Callable[[list[str], int, int, Pairs | None, str], Schedule]


def _p2p(ranks: list[str], size: int, seed: int, pairs: Pairs | None, tag: str) -> Schedule:
    """Each given pair, else the first half of the ranks each to its partner in the other."""
    n = len(ranks)
    chosen = pairs or [(ranks[i], ranks[i + n // 2]) for i in range(n // 2)]
    return _one_step(ranks, [(a, b, size) for a, b in chosen], tag)


def _permutation(ranks: list[str], size: int, seed: int, pairs: Pairs | None,
                 tag: str) -> Schedule:
    """Every rank to another, by a random derangement seeded by `seed`."""
    rng = random.Random(seed)
    while True:  # a random derangement: nobody sends to itself
        perm = ranks[:]
        rng.shuffle(perm)
        if all(a != b for a, b in zip(ranks, perm, strict=True)):
            break
    return _one_step(ranks, [(a, b, size) for a, b in zip(ranks, perm, strict=True)], tag)


def _incast(ranks: list[str], size: int, seed: int, pairs: Pairs | None, tag: str) -> Schedule:
    """Every rank to the last one."""
    return _one_step(ranks, [(a, ranks[-1], size) for a in ranks[:-1]], tag)


def _allreduce(ranks: list[str], size: int, seed: int, pairs: Pairs | None,
               tag: str) -> Schedule:
    """Ring: reduce-scatter then all-gather, 2(n-1) steps."""
    return _ring(ranks, size, 2 * (len(ranks) - 1), tag)


def _half_ring(ranks: list[str], size: int, seed: int, pairs: Pairs | None,
               tag: str) -> Schedule:
    """Ring all-gather or reduce-scatter: n-1 steps."""
    return _ring(ranks, size, len(ranks) - 1, tag)


def _alltoall(ranks: list[str], size: int, seed: int, pairs: Pairs | None,
              tag: str) -> Schedule:
    """Every rank sends the j-th chunk of its message to rank j, all at once."""
    chunk = chunks(size, len(ranks))
    return _one_step(ranks, [(a, b, chunk[j]) for a in ranks
                             for j, b in enumerate(ranks) if a != b], tag)


def _all_but_one(n: int) -> float:
    return (n - 1) / n


LOADS = ("flows", "ring", "job", "open")   # how testbed.rate prices its offered load


@dataclass(frozen=True)
class Workload:
    """One workload: all the testbed knows of it. A new one is one entry in the registry
    below (docs/architecture.md, "How to add a workload"); an entry missing a piece it
    needs is refused when this module is imported.

    `load` says how testbed.rate prices its offered load: "flows", each first-step flow
    at its path's bottleneck; "ring", ranks ordered as a ring (experiment.ring_order
    applies) and every flow at the ring's slowest flow's rate; "job", a training step's
    jobs (traffic.job) at their analytic step's peak (testbed.train_run builds the
    schedule from the [train] table, so a job has no `build` and no `ideal_factor`);
    "open", open-loop flows at their [flows] table's load (testbed.flow_run builds the
    schedule at the run's link rate: no `build`, no `ideal_factor`: each flow has its own
    ideal, its time alone)."""

    name: str
    what: str                                  # one line: what the ranks do
    load: str                                  # one of LOADS
    busbw_factor: Callable[[int], float]       # busbw = algbw x this at n ranks (nccl-tests)
    build: Builder | None = None               # one iteration's steps
    ideal_factor: Callable[[int], float] | None = None   # ideal time = this x S / B
    collective: bool = False       # an NCCL collective (a job's op may be one)
    reducing: bool = False         # reduces (nccl-tests' redop "sum") rather than moves
    takes_pairs: bool = False      # experiment.pairs say who sends to whom

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise TypeError(f"workload {self.name!r}: its name must be an identifier")
        if not isinstance(self.what, str) or not self.what:
            raise TypeError(f"workload {self.name!r}: no `what` (one line on what it does)")
        if self.load not in LOADS:
            raise TypeError(f"workload {self.name!r}: load {self.load!r} is not one of "
                            f"{', '.join(LOADS)}")
        if not callable(self.busbw_factor):
            raise TypeError(f"workload {self.name!r}: no busbw_factor (a function of n)")
        for piece in ("build", "ideal_factor"):
            given = getattr(self, piece)
            if self.built_later and given is not None:
                article = "an" if self.load == "open" else "a"
                raise TypeError(f"workload {self.name!r}: {article} {self.load} workload has no "
                                f"{piece} (its steps come from testbed.train_run or "
                                "testbed.flow_run)")
            if not self.built_later and not callable(given):
                raise TypeError(f"workload {self.name!r}: no {piece} (a function)")

    @property
    def job(self) -> bool:
        """A training step: its ranks each run their own ops (traffic.job)."""
        return self.load == "job"

    @property
    def open_loop(self) -> bool:
        """Open-loop flows: each starts at its own Poisson instant (traffic.open_loop)."""
        return self.load == "open"

    @property
    def built_later(self) -> bool:
        """Its steps are built by testbed from its own table, not by `build`."""
        return self.job or self.open_loop

    @property
    def ring(self) -> bool:
        """Its ranks are ordered as a ring (testbed.run's ring_order applies)."""
        return self.load == "ring"

    def schedule(self, ranks: list[str], message_bytes: int, seed: int = 1,
                 pairs: Pairs | None = None, tag: str = "") -> Schedule:
        """The steps of one iteration over `ranks` (endpoint names), tagged `tag` (its
        name unless given); ValueError naming the bad argument."""
        if self.built_later:
            raise ValueError(f"workload: {self.name}'s steps come from its own table "
                             "(testbed.train_run, testbed.flow_run)")
        if len(ranks) < 2:
            raise ValueError("ranks: a workload needs at least two endpoints")
        if message_bytes < 1:
            raise ValueError("message_bytes: must be at least 1")
        if pairs and not self.takes_pairs:
            raise ValueError(f"pairs: {self.name} takes none")
        return self.build(list(ranks), message_bytes, seed, pairs, tag or self.name)

    def ideal_s(self, n: int, message_bytes: int, link_mbps: float) -> float | None:
        """Time on an ideal non-blocking fabric of `link_mbps` per endpoint port (no
        headers): ideal_factor(n) x S / B; None for a job (its analytic step instead)."""
        if self.ideal_factor is None:
            return None
        return self.ideal_factor(n) * message_bytes / units.mbps_to_bytes_per_s(link_mbps)


def register(*workloads: Workload) -> dict[str, Workload]:
    """The registry of `workloads` by name, in their order; ValueError for a name twice."""
    out: dict[str, Workload] = {}
    for w in workloads:
        if w.name in out:
            raise ValueError(f"workload {w.name!r} is registered twice")
        out[w.name] = w
    return out


def _one(n: int) -> float:
    return 1.0


# The registry: every workload, once. Ideal times: ring all-reduce 2(n-1)/n x S / B;
# all-gather, reduce-scatter, all-to-all (n-1)/n x S / B; point-to-point and permutation
# S / B; incast (n-1) x S / B (the receiver's port carries every sender's message).
WORKLOADS_BY_NAME: dict[str, Workload] = register(
    Workload("p2p", "given pairs, else half the ranks each to one of the other half",
             "flows", _one, _p2p, _one, takes_pairs=True),
    Workload("permutation", "every rank to another, a seeded random derangement", "flows",
             _one, _permutation, _one),
    Workload("incast", "every rank to the last one", "flows", _one, _incast,
             lambda n: n - 1),
    Workload("allreduce", "ring all-reduce: reduce-scatter then all-gather", "ring",
             lambda n: 2 * (n - 1) / n, _allreduce, lambda n: 2 * (n - 1) / n,
             collective=True, reducing=True),
    Workload("allgather", "ring all-gather", "ring", _all_but_one, _half_ring,
             _all_but_one, collective=True),
    Workload("reducescatter", "ring reduce-scatter", "ring", _all_but_one, _half_ring,
             _all_but_one, collective=True, reducing=True),
    Workload("alltoall", "every rank a chunk of its message to every other, at once",
             "flows", _all_but_one, _alltoall, _all_but_one, collective=True),
    Workload("flows", "open-loop flows: Poisson arrivals at the [flows] table's load, sizes "
             "from a distribution", "open", _one, takes_pairs=True),
    Workload("rpc", "request/response: clients ask servers, closed or open loop (the [rpc] "
             "table)", "open", _one),
    # a step has no one bus bandwidth: its collectives have theirs (testbed.train_run)
    Workload("train_step", "a training step: the [train] table's plan or Chakra traces",
             "job", _one),
)

WORKLOADS = tuple(n for n, w in WORKLOADS_BY_NAME.items() if not w.job)
COLLECTIVES = tuple(n for n, w in WORKLOADS_BY_NAME.items() if w.collective)
JOBS = tuple(n for n, w in WORKLOADS_BY_NAME.items() if w.job)   # ranks run own ops
RINGS = tuple(n for n, w in WORKLOADS_BY_NAME.items() if w.ring)


def workload_named(name: str) -> Workload:
    """The registered workload `name`; ValueError naming the allowed ones."""
    try:
        return WORKLOADS_BY_NAME[name]
    except (KeyError, TypeError):
        raise ValueError(f"workload: {name!r} is not one of "
                         f"{', '.join(WORKLOADS_BY_NAME)}") from None


def collective_steps(coll: str, group: list[str], size_bytes: int, name: str) -> Schedule:
    """The steps of one collective `coll` over `group`, its transfers tagged by `name`."""
    w = WORKLOADS_BY_NAME.get(coll)
    if w is None or not w.collective:
        raise ValueError(f"collective: {coll!r} is not one of {', '.join(COLLECTIVES)}")
    return w.build(group, size_bytes, 1, None, name)


def build_schedule(workload: str, ranks: list[str], message_bytes: int, seed: int = 1,
                   pairs: Pairs | None = None, receiver: str | None = None) -> Schedule:
    """The steps of one iteration of `workload` over `ranks` (endpoint names); an incast's
    `receiver` is the last rank unless given."""
    w = WORKLOADS_BY_NAME.get(workload)
    if w is None or w.built_later:
        built = [n for n in WORKLOADS if not WORKLOADS_BY_NAME[n].built_later]
        raise ValueError(f"workload: {workload!r} is not one of {', '.join(built)}")
    if receiver is not None:
        if workload != "incast" or receiver not in ranks:
            raise ValueError(f"receiver: {receiver!r} is not one of the ranks of an incast")
        ranks = [r for r in ranks if r != receiver] + [receiver]
    return w.schedule(ranks, message_bytes, seed, pairs)


def busbw_factor(workload: str, n: int) -> float:
    """busbw / algbw of `workload` at n ranks (nccl-tests)."""
    return workload_named(workload).busbw_factor(n)


def ideal_time_s(workload: str, n: int, message_bytes: int, link_mbps: float) -> float | None:
    """`workload`'s time on an ideal non-blocking fabric of `link_mbps` per endpoint port
    (Workload.ideal_s; None for a job)."""
    return workload_named(workload).ideal_s(n, message_bytes, link_mbps)


def bandwidths(workload: str, n: int, size_bytes: int, time_s: float) -> tuple[float, float]:
    """(algbw, busbw) in bytes/s of `size_bytes` moved by `n` ranks in `time_s`: algbw =
    size / time, busbw = algbw * busbw_factor (nccl-tests); both 0 for no time."""
    algbw = size_bytes / time_s if time_s > 0 else 0.0
    return algbw, algbw * busbw_factor(workload, n)


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
