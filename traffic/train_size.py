"""How big a training step's plan is, counted from its settings alone, and the bounds a
plan must stay within: refused before anything is planned or built.

traffic.train.plan_job makes, per rank and per micro-batch pass (forward and backward,
`m` micro-batches each), for every layer of the rank's stage two parts (attention, MLP):
a computation (with experts: an all-to-all before and after, when ep > 1) and a TP
all-reduce (tp > 1); a pipeline receive and send at the stage's boundaries; then its DP
gradient buckets. traffic.job.expand turns a ring all-reduce over n ranks into 2(n - 1)
steps per member with one transfer each, an all-to-all into one step with n - 1. The
counts below are those of plan_job and expand exactly (tests/test_train.py compares).

    steps       every rank's steps: what the agents hold and the planner builds, some
                1 KiB of memory each
    transfers   distinct messages of one iteration: the agents number them below 2^20
    message     the largest message, real bytes
    compute     the longest computation, real seconds
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from topologies.spec import SpecError
from traffic.agent_config import ITERATION_MSG_STRIDE
from traffic.train import TrainSettings, figures

MAX_STEPS = 500_000                       # some 0.5 GB of plan and schedule
MAX_TRANSFERS = ITERATION_MSG_STRIDE - 1  # message ids of one iteration (traffic.launch)
MAX_MESSAGE_BYTES = 1 << 50               # 1 PiB: int64 in a Chakra trace, exact in a float
MAX_COMPUTE_S = 3600.0                    # one layer's pass, real seconds
# What each count grows with, and each setting's default: a refusal names the setting
# furthest above its default (below, for the ones marked -1).
GROWS_WITH = {
    "steps": (("layers", 4, 1), ("global_batch", 0, 1), ("tp", 1, 1), ("ep", 1, 1)),
    "message": (("hidden_size", 4096, 1), ("seq_len", 2048, 1), ("micro_batch", 1, 1),
                ("top_k", 2, 1), ("dtype_bytes", 2, 1), ("experts", 1, 1)),
    "compute": (("layer_ms", 0.0, 1), ("hidden_size", 4096, 1), ("seq_len", 2048, 1),
                ("micro_batch", 1, 1), ("gpu_tflops", 400.0, -1), ("top_k", 2, 1)),
}


@dataclass(frozen=True)
class PlanSize:
    ops: int
    steps: int
    transfers: int
    message_bytes: int      # the largest message, real bytes
    compute_s: float        # the longest computation, real seconds
    micro_batches: int      # per step


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _bucket_layers(per_layer: int, bucket_real: float) -> int:
    """The layers of a gradient bucket traffic.train._dp_buckets makes: it closes at the
    first k layers with k x per_layer >= bucket_real."""
    k = max(1, math.ceil(bucket_real / per_layer))
    while k > 1 and (k - 1) * per_layer >= bucket_real:
        k -= 1
    while k * per_layer < bucket_real:
        k += 1
    return k


def plan_size(t: TrainSettings, ranks: int) -> PlanSize:
    """The size of the plan of `t` (TrainSettings) on `ranks` ranks, which
    t.check_train(ranks) has accepted; arithmetic only."""
    dp, m = t.check_train(ranks)
    fig = figures(t)
    tp, pp, ep = t.tp, t.pp, t.ep
    per_stage = t.layers // pp
    passes = 2 * m * per_stage                   # (micro-batch, layer) passes of a rank
    a2a = bool(t.experts) and ep > 1
    ops_pass = 2 + (2 if a2a else 0) + (2 if tp > 1 else 0)
    steps_pass = 2 + (2 if a2a else 0) + (2 * 2 * (tp - 1) if tp > 1 else 0)
    p2p = tp * dp * (pp - 1) * 2 * m             # sends, as many receives
    bucket_real = t.bucket_mb * 1e6
    twins = dp // ep
    dense_k = _bucket_layers(fig.dense_grad_bytes, bucket_real) if dp > 1 else 0
    expert_k = _bucket_layers(fig.expert_grad_bytes, bucket_real) \
        if twins > 1 and fig.expert_grad_bytes else 0
    dense = _ceil_div(per_stage, dense_k) if dense_k else 0
    expert = _ceil_div(per_stage, expert_k) if expert_k else 0
    ops = ranks * (passes * ops_pass + dense + expert) + 2 * p2p
    steps = ranks * (passes * steps_pass + dense * 2 * (dp - 1)
                     + expert * 2 * (twins - 1)) + 2 * p2p
    transfers = (p2p + (dp * pp * passes * 2 * 2 * (tp - 1) * tp if tp > 1 else 0)
                 + (pp * tp * twins * passes * 2 * ep * (ep - 1) if a2a else 0)
                 + pp * tp * dense * 2 * (dp - 1) * dp
                 + pp * tp * ep * expert * 2 * (twins - 1) * twins)
    message = max(fig.act_bytes * (t.top_k if a2a else 1), fig.pp_bytes,
                  fig.dense_grad_bytes * min(dense_k, per_stage),
                  fig.expert_grad_bytes * min(expert_k, per_stage))
    return PlanSize(ops, steps, transfers, message, fig.fwd_s * 2 * 2 / 3, m)


def _culprit(t, count: str, m: int) -> str:
    """The setting furthest above its default (below, for those marked -1) among those
    `count` grows with; global_batch by its micro-batches per stage."""
    def ratio(name: str, default: float, sign: int) -> float:
        if name == "global_batch":
            return m / (2 * t.pp) if t.global_batch else 0.0
        value = getattr(t, name)
        if not default:
            return 1.0 + value if value else 0.0
        return (value / default) ** sign if value else 0.0
    return "train." + max(GROWS_WITH[count], key=lambda c: ratio(*c))[0]


def check_plan_size(t: TrainSettings, ranks: int) -> PlanSize:
    """SpecError, naming the setting that makes it too big, for a plan past a bound
    (module docstring); before anything is planned."""
    size = plan_size(t, ranks)
    for count, value, limit, what in (
            ("steps", size.steps, MAX_STEPS, "agent steps"),
            ("steps", size.transfers, MAX_TRANSFERS, "transfers in one iteration"),
            ("message", size.message_bytes, MAX_MESSAGE_BYTES, "bytes in its largest "
             "message"),
            ("compute", size.compute_s, MAX_COMPUTE_S, "s in its longest computation")):
        if not value <= limit:
            name = _culprit(t, count, size.micro_batches)
            raise SpecError(name, f"{getattr(t, name.split('.')[1])!r} makes a plan of "
                            f"{value:.3g} {what} on {ranks} ranks, more than the "
                            f"{limit:.6g} allowed")
    return size
