"""A training job as each rank's operations (pure data), and their expansion into steps.

    plan (traffic.train) ─┐
                          ├─▶ Job: per rank, Ops with their dependencies ─▶ expand()
    Chakra traces (traffic.chakra) ─┘      ─▶ Schedule: steps with `after` and `compute_ns`

An Op is what a trace node is: a computation of a stated duration, a collective over a
group of ranks, or one send or receive. An op starts once every op in its `deps` (ids of
the same rank's ops) has finished. Expanded, a computation is one step that takes its
duration on the rank's single compute stream (computations queue behind each other, as
kernels on one GPU stream do); a collective is its ring (or all-to-all) steps from
traffic.workloads, chained; a send or a receive is one step. A collective's message size
is nccl-tests' "size": the buffer each rank contributes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from traffic.workloads import COLLECTIVES, Schedule, Step, Transfer, chunks, collective_steps

KINDS = ("comp", "coll", "send", "recv")


class JobError(ValueError):
    """A job whose ops do not fit together: names the rank, the op and what is wrong."""


@dataclass(frozen=True)
class Op:
    id: int                      # unique among its rank's ops
    kind: str                    # comp, coll, send, recv
    name: str                    # a collective's name is the same at every member
    deps: tuple[int, ...] = ()   # this rank's ops that finish before it starts
    duration_ns: int = 0         # comp
    coll: str = ""               # coll: allreduce, allgather, reducescatter, alltoall
    size_bytes: int = 0          # coll: each rank's buffer; send, recv: the message
    group: tuple[str, ...] = ()  # coll: its ranks, in ring order
    peer: str = ""               # send: the receiver; recv: the sender
    tag: str = ""                # send, recv: the same at both ends


@dataclass
class Job:
    ranks: dict[str, list[Op]] = field(default_factory=dict)
    name: str = "job"
    _by_id: dict = field(default_factory=dict, repr=False, compare=False)

    def op(self, rank: str, op_id: int) -> Op:
        """The op of `rank` with id `op_id` (a trace's ids need not be its indices)."""
        if not self._by_id:
            self._by_id.update({(r, op.id): op for r, ops in self.ranks.items()
                                for op in ops})
        return self._by_id[rank, op_id]


def check(job: Job) -> None:
    """Raise JobError unless every op is well formed, depends only on earlier ops of its
    rank, every collective's members all hold it with the same group, type and size, and
    every send has its receive."""
    sends: dict[str, tuple[str, str, int]] = {}
    recvs: dict[str, tuple[str, str, int]] = {}
    colls: dict[str, tuple] = {}
    members: dict[str, set[str]] = {}
    for rank, ops in job.ranks.items():
        seen: set[int] = set()
        for op in ops:
            where = f"rank {rank}, op {op.id} ({op.name})"
            if op.kind not in KINDS:
                raise JobError(f"{where}: kind {op.kind!r} is not one of {', '.join(KINDS)}")
            if op.id in seen:
                raise JobError(f"{where}: id {op.id} is used twice")
            missing = [d for d in op.deps if d not in seen]
            if missing:
                raise JobError(f"{where}: depends on {missing}, not earlier ops of its rank")
            seen.add(op.id)
            if op.kind == "comp":
                if op.duration_ns < 0:
                    raise JobError(f"{where}: duration must be at least 0")
            elif op.size_bytes < 1:
                raise JobError(f"{where}: size must be at least 1 byte")
            if op.kind == "coll":
                if op.coll not in COLLECTIVES:
                    raise JobError(f"{where}: collective {op.coll!r} is not one of "
                                   f"{', '.join(COLLECTIVES)}")
                if rank not in op.group:
                    raise JobError(f"{where}: its group {list(op.group)} leaves out {rank}")
                key = (op.coll, op.size_bytes, op.group)
                if colls.setdefault(op.name, key) != key:
                    raise JobError(f"{where}: another member holds {op.name} with a "
                                   "different type, size or group")
                members.setdefault(op.name, set()).add(rank)
            elif op.kind in ("send", "recv"):
                if op.peer not in job.ranks or op.peer == rank:
                    raise JobError(f"{where}: peer {op.peer!r} is not another rank")
                book = sends if op.kind == "send" else recvs
                src, dst = (rank, op.peer) if op.kind == "send" else (op.peer, rank)
                if op.tag in book:
                    raise JobError(f"{where}: tag {op.tag!r} is used twice")
                book[op.tag] = (src, dst, op.size_bytes)
    for name, (_, _, group) in colls.items():
        if members[name] != set(group):
            raise JobError(f"collective {name}: held by {sorted(members[name])}, "
                           f"its group is {list(group)}")
    for tag in sends.keys() | recvs.keys():
        if sends.get(tag) != recvs.get(tag):
            raise JobError(f"transfer {tag}: send {sends.get(tag)} and receive "
                           f"{recvs.get(tag)} do not match (src, dst, bytes)")


def expand(job: Job) -> Schedule:
    """Each rank's steps: an op's first step waits for the last steps of its deps."""
    check(job)
    per_coll: dict[str, Schedule] = {}
    sched: Schedule = {}
    for rank, ops in job.ranks.items():
        steps: list[Step] = []
        last: dict[int, int] = {}            # op id -> index of its last step
        for op in ops:
            after = tuple(sorted({last[d] for d in op.deps}))
            if op.kind == "coll":
                if op.name not in per_coll:
                    per_coll[op.name] = collective_steps(op.coll, list(op.group),
                                                         op.size_bytes, op.name)
                mine = per_coll[op.name][rank] if len(op.group) > 1 else [Step()]
                for k, st in enumerate(mine):
                    steps.append(Step(st.sends, st.recvs, label=op.name, op=op.id,
                                      after=after if k == 0 else (len(steps) - 1,)))
            else:
                st = Step(label=op.name, op=op.id, after=after,
                          compute_ns=op.duration_ns if op.kind == "comp" else 0)
                if op.kind == "send":
                    st.sends = [Transfer(rank, op.peer, op.size_bytes, op.tag)]
                elif op.kind == "recv":
                    st.recvs = [Transfer(op.peer, rank, op.size_bytes, op.tag)]
                steps.append(st)
            last[op.id] = len(steps) - 1
        sched[rank] = steps
    return sched


def min_message_bytes(job: Job) -> int:
    """The smallest message any transfer of the job carries (a ring chunk for a ring)."""
    sizes = []
    for ops in job.ranks.values():
        for op in ops:
            if op.kind == "coll" and len(op.group) > 1:
                sizes.append(min(chunks(op.size_bytes, len(op.group))))
            elif op.kind in ("send", "recv"):
                sizes.append(op.size_bytes)
    return min(sizes) if sizes else 0


def scaled(job: Job, byte_scale: float, time_scale: float) -> Job:
    """The job with every size divided by `byte_scale` (1 byte at least) and every
    duration multiplied by `time_scale / byte_scale`: run on links `time_scale` times
    slower, it takes `time_scale / byte_scale` times the real time throughout."""
    out = Job(name=job.name)
    for rank, ops in job.ranks.items():
        out.ranks[rank] = [replace(op, size_bytes=max(1, round(op.size_bytes / byte_scale))
                                   if op.size_bytes else 0,
                                   duration_ns=round(op.duration_ns * time_scale / byte_scale))
                           for op in ops]
    return out
