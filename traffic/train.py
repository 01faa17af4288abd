"""A training step from a parallelism plan: each rank's operations, and the step time the
fabric's link rates predict.

    TrainSettings (the [train] table) + the ranks ─▶ plan_job ─▶ Job (traffic.job)
        compute per layer from the model's FLOPs and the GPU's achieved FLOP/s;
        TP all-reduces, PP sends, EP all-to-alls, DP gradient buckets by their sizes
    ─▶ scaled: bytes / byte_scale, times x time_scale / byte_scale (both printed)
    analytic_step(job, rate_of) ─▶ the step time with every transfer alone on its links

Megatron-LM's layout (Narayanan et al., SC'21): ranks are numbered TP fastest, then DP,
then PP stage, so a TP group is one server's GPUs (its NVLink domain) and a DP group
holds the same GPU of every server (one rail); `placement = "dp-first"` swaps TP and DP.
Per layer and micro-batch the forward pass takes 24 b s h^2 (1 + s / 6h) FLOPs (their
eq. 2 per layer; backward twice that), split over TP (or a given `layer_ms`); a layer
holds 12 h^2 parameters. Tensor parallelism all-reduces b s h values twice in the forward
pass and twice in the backward pass (Shoeybi et al. 2019, sec. 3); a pipeline stage
sends b s h / tp values per micro-batch (scatter/gather); a mixture-of-experts layer
(experts > 0) runs every token through top_k experts of 8 h^2 parameters each and moves
its tokens by an all-to-all before and after them, twice per pass. The pipeline runs
1F1B (PipeDream-Flush) or GPipe; gradients are all-reduced over DP in buckets of
`bucket_mb`, each as soon as its layers' last backward pass is done (overlap on) or all
after the backward pass (overlap off), one bucket at a time, as PyTorch DDP does on its
one NCCL stream. Expert gradients are all-reduced over the dp / ep ranks that hold the
same experts.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from topologies.settings import number_or_auto, setting
from topologies.spec import SpecError
from traffic.job import Job, Op, min_message_bytes, scaled
from traffic.workloads import busbw_factor

MIN_PACKETS = 16        # packets in the smallest message after scaling: see docs/train.md
TARGET_STEP_S = 3.0     # byte_scale auto: an emulated step of about this long
OVERLAPS = ("on", "off")
SCHEDULES = ("1f1b", "gpipe")
PLACEMENTS = ("tp-first", "dp-first")
# Each integer setting's range: past any real model, and small enough that the plan's
# arithmetic stays exact (traffic.train_size bounds the plan they make together)
MAX_LAYERS = 100_000
MAX_HIDDEN = 1 << 20
MAX_SEQ_LEN = 1 << 24
MAX_BATCH = 1 << 24
MAX_DEGREE = 1 << 16        # tp, pp, ep: no more than a fabric's nodes
MAX_EXPERTS = 1 << 16
MAX_BUCKET_MB = 1e6


@dataclass
class TrainSettings:
    """Training step: the model and its parallelism plan (workload train_step, docs/train.md)"""

    layers: int = setting(4, "transformer layers", whole=True, low=1,
                          high=MAX_LAYERS, metavar="N")
    hidden_size: int = setting(4096, "hidden size h", whole=True, low=1,
                               high=MAX_HIDDEN, metavar="H")
    seq_len: int = setting(2048, "sequence length s (tokens)", whole=True, low=1,
                           high=MAX_SEQ_LEN, metavar="S")
    micro_batch: int = setting(1, "micro-batch size b (sequences)", whole=True, low=1,
                               high=MAX_BATCH, metavar="B")
    global_batch: int = setting(0, "sequences per step (0: 2 micro-batches per DP rank "
                                "and pipeline stage)", whole=True, low=0, high=MAX_BATCH,
                                metavar="B")
    dtype_bytes: int = setting(2, "bytes per value (2: bf16)", whole=True, low=1, high=8)
    tp: int = setting(1, "tensor-parallel degree (inside a server)", whole=True, low=1,
                      high=MAX_DEGREE)
    pp: int = setting(1, "pipeline stages", whole=True, low=1, high=MAX_DEGREE)
    ep: int = setting(1, "expert-parallel degree (divides the DP degree)", whole=True,
                      low=1, high=MAX_DEGREE)
    experts: int = setting(0, "experts per MoE layer (0: a dense model)", whole=True, low=0,
                           high=MAX_EXPERTS)
    top_k: int = setting(2, "experts each token goes through", whole=True, low=1,
                         high=MAX_EXPERTS)
    bucket_mb: float = setting(25.0, "DP gradient bucket, MB of the real model (PyTorch "
                               "DDP's default)", number=True, low=0, low_open=True,
                               high=MAX_BUCKET_MB)
    overlap: str = setting("on", "DP all-reduce overlapped with the backward pass",
                           choices=OVERLAPS)
    gpu_tflops: float = setting(400.0, "a GPU's achieved dense TFLOP/s (an H100's 989 "
                                "bf16 peak at 40 % utilization)", number=True, low=0,
                                low_open=True)
    layer_ms: float = setting(0.0, "one layer's forward pass for one micro-batch on one "
                              "GPU, real ms, given instead of computed (0: from the FLOPs "
                              "and gpu_tflops)", number=True, low=0)
    schedule: str = setting("1f1b", "pipeline schedule: 1f1b (PipeDream-Flush) or gpipe "
                            "(every forward, then every backward)", choices=SCHEDULES)
    placement: str = setting("tp-first", "which degree the consecutive GPUs of a server "
                             "take: tp-first (TP in a server, DP along a rail, as NCCL "
                             "and Megatron place them) or dp-first (DP in a server, TP "
                             "across servers)", choices=PLACEMENTS)
    byte_scale: str | float = setting(
        "auto", "real bytes and compute per emulated ones (auto: a step of about "
        f"{TARGET_STEP_S:g} s with every message at least {MIN_PACKETS} packets)",
        convert=number_or_auto("a number"), metavar="N|auto")
    trace: str = setting("", "a folder of Chakra execution traces to replay instead of "
                         "the plan (<prefix>.<rank>.et and comm_group.json)", metavar="DIR")

    def check_train(self, ranks: int) -> tuple[int, int]:
        """Raise SpecError unless the plan fits `ranks`; (dp, micro-batches per step)."""
        if self.byte_scale != "auto" and (not isinstance(self.byte_scale, (int, float))
                                          or self.byte_scale < 1):
            raise SpecError("train.byte_scale", "must be auto or a number >= 1")
        if ranks % (self.tp * self.pp):
            raise SpecError("train.tp", f"tp x pp = {self.tp * self.pp} does not divide the "
                            f"{ranks} ranks")
        dp = ranks // (self.tp * self.pp)
        if self.layers % self.pp:
            raise SpecError("train.pp", f"{self.pp} stages do not divide {self.layers} layers")
        if dp % self.ep:
            raise SpecError("train.ep", f"ep {self.ep} does not divide the DP degree {dp}")
        if self.ep > 1 and not self.experts:
            raise SpecError("train.ep", "expert parallelism needs experts > 0")
        if self.experts and (self.experts % self.ep or self.top_k > self.experts):
            raise SpecError("train.experts", f"{self.experts} experts: ep ({self.ep}) must "
                            f"divide them and top_k ({self.top_k}) must not exceed them")
        per_step = self.micro_batch * dp
        batch = self.global_batch or 2 * self.pp * per_step
        if batch % per_step:
            raise SpecError("train.global_batch", f"{batch} sequences is not a whole number "
                            f"of micro-batches ({self.micro_batch}) x DP ranks ({dp})")
        return dp, batch // per_step


@dataclass
class Figures:
    """The real model's per-layer figures, one TP rank's share (seconds and bytes)."""
    fwd_s: float            # one layer, one micro-batch, forward
    act_bytes: int          # b s h values: a TP all-reduce, an MoE all-to-all per expert
    pp_bytes: int           # a stage's send per micro-batch
    dense_grad_bytes: int   # a layer's gradients all-reduced over the whole DP group
    expert_grad_bytes: int  # ... over the ranks holding the same experts


def figures(t: TrainSettings) -> Figures:
    b, s, h = t.micro_batch, t.seq_len, t.hidden_size
    flops = 24 * b * s * h * h * (1 + s / (6 * h))
    if t.experts:
        flops += (t.top_k - 1) * 16 * b * s * h * h     # each further expert's MLP
    act = b * s * h * t.dtype_bytes
    dense = (4 if t.experts else 12) * h * h * t.dtype_bytes // t.tp
    expert = 8 * h * h * (t.experts // t.ep) * t.dtype_bytes // t.tp if t.experts else 0
    fwd_s = t.layer_ms / 1e3 if t.layer_ms else flops / t.tp / (t.gpu_tflops * 1e12)
    return Figures(fwd_s, act, act // t.tp, dense, expert)


def layout(t: TrainSettings, ranks: list[str]) -> dict[str, tuple[int, int, int]]:
    """rank -> (stage, dp index, tp index): TP fastest, then DP, then stage (tp-first);
    DP fastest, then TP (dp-first)."""
    dp = len(ranks) // (t.tp * t.pp)
    if t.placement == "dp-first":
        return {r: (i // (t.tp * dp), i % dp, i // dp % t.tp) for i, r in enumerate(ranks)}
    return {r: (i // (t.tp * dp), i // t.tp % dp, i % t.tp) for i, r in enumerate(ranks)}


def pipeline_order(schedule: str, stage: int, stages: int, m: int) -> list[tuple[str, int]]:
    """A stage's passes: 1F1B (warm-up forwards, then one forward one backward, then the
    rest of the backwards) or GPipe (every forward, then every backward)."""
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warm = min(stages - stage - 1, m)
    order = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        order += [("F", warm + i), ("B", i)]
    return order + [("B", i) for i in range(m - warm, m)]


class _Rank:
    """One rank's ops as they are planned, in program order."""

    def __init__(self):
        self.ops: list[Op] = []

    def add(self, kind: str, name: str, deps=(), **kw) -> int:
        op = Op(len(self.ops), kind, name, tuple(sorted({d for d in deps if d is not None})),
                **kw)
        self.ops.append(op)
        return op.id


def plan_job(t: TrainSettings, ranks: list[str]) -> Job:
    """Each rank's ops for one step of the real model (traffic.job.scaled scales it)."""
    dp, m = t.check_train(len(ranks))
    fig = figures(t)
    place = layout(t, ranks)
    at = {v: r for r, v in place.items()}

    def nbytes(real: float) -> int:
        return max(1, round(real))

    def ns(real_s: float) -> int:
        return round(real_s * 1e9)

    job = Job(name="train_step")
    for rank in ranks:
        job.ranks[rank] = _plan_rank(t, fig, rank, place, at, m, nbytes, ns)
    return job


def _plan_rank(t: TrainSettings, fig: Figures, rank: str, place, at, m: int, nbytes,
               ns) -> list[Op]:
    """One rank's ops: its pipeline passes in 1F1B order, then its gradient buckets."""
    dp = len(place) // (t.tp * t.pp)
    per_stage = t.layers // t.pp
    stage, d, k = place[rank]
    me = _Rank()
    tp_group = tuple(at[stage, d, j] for j in range(t.tp))
    ep_base = d - d % t.ep
    ep_group = tuple(at[stage, ep_base + j, k] for j in range(t.ep))
    dp_group = tuple(at[stage, j, k] for j in range(dp))
    twin_group = tuple(at[stage, j, k] for j in range(d % t.ep, dp, t.ep))
    layer_grads_done: dict[int, int] = {}

    def tp_allreduce(name: str, dep: int) -> int:
        if t.tp == 1:
            return dep
        return me.add("coll", f"{name}.tp{stage}.{d}", (dep,), coll="allreduce",
                      size_bytes=nbytes(fig.act_bytes), group=tp_group)

    def experts(name: str, dep: tuple, share: float) -> int:
        """Tokens to their experts, the experts' work, tokens back."""
        size = nbytes(fig.act_bytes * t.top_k)
        if t.ep > 1:
            dep = (me.add("coll", f"{name}.dispatch.ep{stage}.{ep_base}.{k}", dep,
                          coll="alltoall", size_bytes=size, group=ep_group),)
        dep = me.add("comp", f"{name}.experts", dep, duration_ns=ns(share))
        if t.ep > 1:
            dep = me.add("coll", f"{name}.combine.ep{stage}.{ep_base}.{k}", (dep,),
                         coll="alltoall", size_bytes=size, group=ep_group)
        return dep

    prev = None
    for kind, mb in pipeline_order(t.schedule, stage, t.pp, m):
        step = "fwd" if kind == "F" else "bwd"
        scale = 1 if kind == "F" else 2
        src = stage - 1 if kind == "F" else stage + 1
        dst = stage + 1 if kind == "F" else stage - 1
        dep: tuple = (prev,)
        if 0 <= src < t.pp:      # the activations (gradients) from the next stage
            peer = at[src, d, k]
            dep += (me.add("recv", f"{step}.mb{mb}.recv", dep, peer=peer,
                           size_bytes=nbytes(fig.pp_bytes),
                           tag=f"{step}.mb{mb}.{peer}>{rank}"),)
        layers = range(stage * per_stage, (stage + 1) * per_stage)
        for layer in (layers if kind == "F" else reversed(layers)):
            name = f"{step}.mb{mb}.l{layer}"
            attn_share = fig.fwd_s * scale / 3
            mlp_share = fig.fwd_s * scale - attn_share
            halves = (("attn", attn_share), ("mlp", mlp_share))
            for part, share in (halves if kind == "F" else halves[::-1]):
                if part == "mlp" and t.experts:
                    last = experts(f"{name}.moe", dep, share)
                else:
                    last = me.add("comp", f"{name}.{part}", dep, duration_ns=ns(share))
                dep = (tp_allreduce(f"{name}.{part}", last),)
            if kind == "B" and mb == m - 1:
                layer_grads_done[layer] = dep[0]
        if 0 <= dst < t.pp:
            peer = at[dst, d, k]
            me.add("send", f"{step}.mb{mb}.send", dep, peer=peer,
                   size_bytes=nbytes(fig.pp_bytes), tag=f"{step}.mb{mb}.{rank}>{peer}")
        prev = dep[0]
    _dp_buckets(t, fig, me, stage, d, k, layer_grads_done, prev, dp_group, twin_group,
                nbytes)
    return me.ops


def _dp_buckets(t, fig, me, stage, d, k, grads_done, last, dp_group, twin_group,
                nbytes) -> None:
    """Gradient buckets in the order backward produces them, one all-reduce at a time."""
    bucket_real = t.bucket_mb * 1e6
    prev = None
    for what, group, per_layer in (("dense", dp_group, fig.dense_grad_bytes),
                                   ("expert", twin_group, fig.expert_grad_bytes)):
        if len(group) < 2 or not per_layer:
            continue
        buckets: list[list[int]] = [[]]
        for layer in sorted(grads_done, reverse=True):
            if buckets[-1] and len(buckets[-1]) * per_layer >= bucket_real:
                buckets.append([])
            buckets[-1].append(layer)
        for i, layers in enumerate(buckets):
            ready = grads_done[layers[-1]] if t.overlap == "on" else last
            prev = me.add("coll", f"grad.{what}{i}.dp{stage}.{k}.{d % t.ep}"
                          if what == "expert" else f"grad.{what}{i}.dp{stage}.{k}",
                          (ready, prev), coll="allreduce",
                          size_bytes=nbytes(per_layer * len(layers)), group=group)


# -- what the link rates predict -----------------------------------------------------------
def path_mbps(graph: nx.Graph, a: str, b: str) -> float:
    """The slowest link on a shortest path from a to b (Mbit/s)."""
    path = nx.shortest_path(graph, a, b)
    return min(graph.edges[u, v]["rate_mbps"] for u, v in zip(path, path[1:], strict=False))


def transfer_s(op: Op, rank: str, rate_of) -> float:
    """Op `op` of `rank` alone on the fabric: a ring collective's 2(n-1)/n or (n-1)/n of
    its size at the ring's slowest hop, an all-to-all's (n-1)/n at the slowest pair, a
    send at its path's rate (nccl-tests' bus bandwidth formulas)."""
    if op.kind in ("send", "recv"):
        a, b = (rank, op.peer) if op.kind == "send" else (op.peer, rank)
        return op.size_bytes * 8 / (rate_of(a, b) * 1e6)
    g = list(op.group)
    n = len(g)
    if n < 2:
        return 0.0
    if op.coll == "alltoall":
        slow = min(rate_of(a, b) for a in g for b in g if a != b)
    else:
        slow = min(rate_of(g[i], g[(i + 1) % n]) for i in range(n))
    return busbw_factor(op.coll, n) * op.size_bytes * 8 / (slow * 1e6)


def analytic_step(job: Job, rate_of) -> dict:
    """The step time if every transfer had its links to itself: each rank's ops in order
    on one compute stream, a collective starting once its last member is ready and a
    receive once its send is; returns {step_s, peak_mbps: the busiest tenth's load}."""
    end: dict[tuple[str, int], float] = {}
    coll_start: dict[str, float] = {}
    pending = {r: 0 for r in job.ranks}
    free = {r: 0.0 for r in job.ranks}
    sent: dict[str, float] = {}
    members: dict[str, list[str]] = {}
    for r, ops in job.ranks.items():
        for op in ops:
            if op.kind == "coll":
                members.setdefault(op.name, []).append(r)
    waiting_coll: dict[str, dict[str, float]] = {}
    load: list[tuple[float, float, float]] = []     # (start, end, Mbit/s a rank sends)
    progress = True
    while progress:
        progress = False
        for r, ops in job.ranks.items():
            while pending[r] < len(ops):
                op = ops[pending[r]]
                ready = max((end[r, d] for d in op.deps), default=0.0)
                if op.kind == "comp":
                    start = max(ready, free[r])
                    end[r, op.id] = free[r] = start + op.duration_ns / 1e9
                elif op.kind == "send":
                    sent[op.tag] = ready
                    end[r, op.id] = ready + transfer_s(op, r, rate_of)
                    load.append((ready, end[r, op.id], rate_of(r, op.peer)))
                elif op.kind == "recv":
                    if op.tag not in sent:
                        break
                    end[r, op.id] = max(ready, sent[op.tag] + transfer_s(op, r, rate_of))
                else:
                    waiting_coll.setdefault(op.name, {})[r] = ready
                    if len(waiting_coll[op.name]) < len(members[op.name]):
                        break
                    if op.name not in coll_start:
                        coll_start[op.name] = max(waiting_coll[op.name].values())
                    end[r, op.id] = coll_start[op.name] + transfer_s(op, r, rate_of)
                    load.append((coll_start[op.name], end[r, op.id], _send_mbps(op, r,
                                                                                rate_of)))
                pending[r] += 1
                progress = True
    stuck = [r for r, ops in job.ranks.items() if pending[r] < len(ops)]
    if stuck:
        r = stuck[0]
        raise ValueError(f"the job deadlocks: rank {r} waits at op "
                         f"{job.ranks[r][pending[r]].name}")
    return {"step_s": max(end.values(), default=0.0), "peak_mbps": _peak(load)}


def _send_mbps(op: Op, rank: str, rate_of) -> float:
    """What `rank` puts on the fabric while collective `op` runs: its ring hop's rate
    (a ring runs at its slowest hop), or for an all-to-all the sum toward each peer up
    to its slowest path."""
    g = list(op.group)
    n = len(g)
    if n < 2:
        return 0.0
    if op.coll == "alltoall":
        return min(rate_of(rank, b) for b in g if b != rank)
    return min(rate_of(g[i], g[(i + 1) % n]) for i in range(n))


def _peak(load: list[tuple[float, float, float]], bins: int = 200,
          window: int = 20) -> float:
    """The largest mean rate of the transfers over any `window` / `bins` of the step
    (a tenth: the queues absorb what is shorter)."""
    end = max((b for _, b, _ in load), default=0.0)
    if end <= 0:
        return 0.0
    width = end / bins
    bits = [0.0] * bins
    for a, b, rate in load:
        for k in range(int(a / width), min(bins, int(b / width) + 1)):
            lo, hi = max(a, k * width), min(b, (k + 1) * width)
            if hi > lo:
                bits[k] += rate * (hi - lo)
    sums = [sum(bits[k:k + window]) for k in range(bins - window + 1)]
    return max(sums) / (window * width)


def rate_function(graph: nx.Graph):
    """rate_of(a, b) in Mbit/s over `graph`, remembered per pair."""
    memo: dict[tuple[str, str], float] = {}

    def rate_of(a: str, b: str) -> float:
        if (a, b) not in memo:
            memo[a, b] = path_mbps(graph, a, b)
        return memo[a, b]
    return rate_of


def choose_byte_scale(job: Job, setting: str | float, time_scale: float, rate_of,
                      payload_bytes: int) -> tuple[float, str]:
    """byte_scale for the real `job`, and why: the given one, or auto's (module
    docstring, MIN_PACKETS)."""
    if setting != "auto":
        return float(setting), "given"
    step = analytic_step(scaled(job, 1.0, time_scale), rate_of)["step_s"]
    want = max(1.0, step / TARGET_STEP_S)
    most = max(1.0, min_message_bytes(job) / (MIN_PACKETS * payload_bytes))
    if want <= most:
        return want, f"a step of about {TARGET_STEP_S:g} s"
    return most, (f"the smallest message kept at {MIN_PACKETS} packets: a step of about "
                  f"{step / most:.1f} s")
