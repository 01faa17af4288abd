"""Tests for a training step's plan (traffic.train), its ops (traffic.job) and the step's
split (testbed.train_run): no root, no fabric."""

from __future__ import annotations

import pytest

from testbed.train_run import _overlap, _union, rank_split
from topologies.spec import SpecError
from traffic.job import Job, JobError, Op, check, expand, min_message_bytes, scaled
from traffic.train import (
    TrainSettings,
    analytic_step,
    choose_byte_scale,
    figures,
    layout,
    pipeline_order,
    plan_job,
)

RANKS = [f"s{s}g{g}" for s in range(4) for g in range(4)]     # 4 servers x 4 GPUs


def rate_of(a: str, b: str) -> float:
    """NVLink inside a server, 100 Mbit/s NICs between servers."""
    return 900.0 if a[:2] == b[:2] else 100.0


def colls(job: Job, rank: str, mark: str) -> list[Op]:
    return [op for op in job.ranks[rank] if op.kind == "coll" and mark in op.name]


def test_megatron_layout_tp_in_a_server_dp_along_a_rail():
    t = TrainSettings(tp=4)
    job = plan_job(t, RANKS)
    tp = colls(job, "s1g2", ".tp")
    dp = colls(job, "s1g2", "grad.")
    assert tp and {op.group for op in tp} == {("s1g0", "s1g1", "s1g2", "s1g3")}
    assert dp and {op.group for op in dp} == {("s0g2", "s1g2", "s2g2", "s3g2")}
    assert layout(TrainSettings(tp=2, pp=2), RANKS)["s2g1"] == (1, 0, 1)
    # dp-first: DP inside a server, TP across servers (over the rails)
    swapped = plan_job(TrainSettings(tp=4, placement="dp-first"), RANKS)
    assert {op.group for op in colls(swapped, "s1g2", ".tp")} == {
        ("s0g2", "s1g2", "s2g2", "s3g2")}
    assert {op.group for op in colls(swapped, "s1g2", "grad.")} == {
        ("s1g0", "s1g1", "s1g2", "s1g3")}


def test_pipeline_orders():
    assert pipeline_order("1f1b", 0, 4, 4) == [("F", 0), ("F", 1), ("F", 2), ("F", 3), ("B", 0),
                                    ("B", 1), ("B", 2), ("B", 3)]
    assert pipeline_order("1f1b", 3, 4, 4) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2),
                                    ("B", 2), ("F", 3), ("B", 3)]
    assert pipeline_order("1f1b", 1, 4, 4)[:4] == [("F", 0), ("F", 1), ("F", 2), ("B", 0)]
    assert pipeline_order("gpipe", 3, 4, 2) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]


def test_sizes_and_compute_follow_the_model_formulas():
    t = TrainSettings(tp=4, hidden_size=1024, seq_len=512, micro_batch=2, gpu_tflops=100)
    fig = figures(t)
    assert fig.act_bytes == 2 * 512 * 1024 * 2
    assert fig.fwd_s == pytest.approx(24 * 2 * 512 * 1024 ** 2 * (1 + 512 / 6144) / 4 / 1e14)
    assert fig.dense_grad_bytes == 12 * 1024 ** 2 * 2 // 4
    assert figures(TrainSettings(tp=4, layer_ms=2.5)).fwd_s == 2.5e-3
    job = plan_job(t, RANKS)
    # two TP all-reduces per layer and pass: 4 layers x 2 micro-batches x 2 passes x 2
    assert len(colls(job, "s0g0", ".tp")) == 4 * 2 * 2 * 2
    assert {op.size_bytes for op in colls(job, "s0g0", ".tp")} == {fig.act_bytes}
    comp = sum(op.duration_ns for op in job.ranks["s0g0"] if op.kind == "comp")
    assert comp == pytest.approx(4 * 2 * 3 * fig.fwd_s * 1e9, abs=64)   # fwd + 2x bwd, in ns
    grads = sum(op.size_bytes for op in colls(job, "s0g0", "grad."))
    assert grads == 4 * fig.dense_grad_bytes


def test_buckets_hold_bucket_mb_and_overlap_decides_their_start():
    t = TrainSettings(tp=4, hidden_size=1024, bucket_mb=50)   # 6.3 MB a layer per rank
    job = plan_job(t, RANKS)
    buckets = colls(job, "s0g0", "grad.")
    assert len(buckets) == 1 and buckets[0].size_bytes == 4 * figures(t).dense_grad_bytes
    small = plan_job(TrainSettings(tp=4, hidden_size=1024, bucket_mb=1), RANKS)
    on = colls(small, "s0g0", "grad.")
    assert len(on) == 4
    for a, b in zip(on, on[1:], strict=False):   # one at a time, in backward's order
        assert a.id in b.deps
    last_comp = max(op.id for op in small.ranks["s0g0"] if op.kind == "comp")
    assert on[0].deps[0] < last_comp       # overlap: the first starts mid-backward
    off = colls(plan_job(TrainSettings(tp=4, hidden_size=1024, bucket_mb=1,
                                       overlap="off"), RANKS), "s0g0", "grad.")
    assert all(min(op.deps) >= last_comp - 1 for op in off)


def test_pipeline_sends_match_receives_and_moe_adds_all_to_alls():
    job = plan_job(TrainSettings(tp=2, pp=2), RANKS)
    check(job)
    sends = [op for ops in job.ranks.values() for op in ops if op.kind == "send"]
    recvs = [op for ops in job.ranks.values() for op in ops if op.kind == "recv"]
    assert sends and {op.tag for op in sends} == {op.tag for op in recvs}
    moe = plan_job(TrainSettings(tp=4, ep=4, experts=8), RANKS)
    a2a = colls(moe, "s0g0", ".ep")
    assert a2a and all(op.coll == "alltoall" and op.group == ("s0g0", "s1g0", "s2g0",
                                                               "s3g0") for op in a2a)
    assert len(a2a) == 4 * 2 * 2 * 2      # dispatch + combine, per layer, pass, mb


@pytest.mark.parametrize("kw,field", [({"tp": 3}, "train.tp"), ({"pp": 2, "layers": 3}, "train.pp"),
                                      ({"ep": 2}, "train.ep"),
                                      ({"experts": 3, "ep": 2}, "train.experts"),
                                      ({"global_batch": 5}, "train.global_batch")])
def test_a_plan_that_does_not_fit_names_its_field(kw, field):
    with pytest.raises(SpecError) as err:
        plan_job(TrainSettings(**kw), RANKS)
    assert err.value.field == field


def test_expand_chains_a_collective_and_waits_for_its_deps():
    job = Job({"a": [Op(0, "comp", "c", duration_ns=5),
                     Op(1, "coll", "ar", (0,), coll="allreduce", size_bytes=90,
                        group=("a", "b", "c")),
                     Op(2, "send", "s", (1,), size_bytes=7, peer="b", tag="t")],
               "b": [Op(0, "coll", "ar", coll="allreduce", size_bytes=90,
                        group=("a", "b", "c")),
                     Op(1, "recv", "r", (), size_bytes=7, peer="a", tag="t")],
               "c": [Op(0, "coll", "ar", coll="allreduce", size_bytes=90,
                        group=("a", "b", "c"))]})
    sched = expand(job)
    a = sched["a"]
    assert a[0].compute_ns == 5 and a[0].after == ()
    assert [s.after for s in a[1:5]] == [(0,), (1,), (2,), (3,)]       # 2(n-1) ring steps
    assert a[5].after == (4,) and a[5].sends[0].dst == "b"
    assert sched["b"][4].after == () and sched["b"][4].recvs[0].src == "a"
    assert min_message_bytes(job) == 7
    half = scaled(job, 2.0, 10.0)
    assert half.ranks["a"][0].duration_ns == 25 and half.ranks["a"][1].size_bytes == 45


@pytest.mark.parametrize("ops,says", [
    ({"a": [Op(0, "comp", "x", (1,))]}, "not earlier ops"),
    ({"a": [Op(0, "send", "s", size_bytes=1, peer="b", tag="t")], "b": []}, "do not match"),
    ({"a": [Op(0, "coll", "g", coll="allreduce", size_bytes=4, group=("a", "b"))],
      "b": []}, "held by"),
    ({"a": [Op(0, "coll", "g", coll="broadcast", size_bytes=4, group=("a",))]},
     "not one of"),
])
def test_a_job_that_does_not_fit_together_is_refused(ops, says):
    with pytest.raises(JobError, match=says):
        check(Job(ops))


def test_analytic_step_of_a_known_job():
    # compute 1 s on each, then a 2-rank ring all-reduce of 100 Mbit across servers:
    # 2(n-1)/n * S / B = 1 s; then b computes 0.5 s more
    size = 100e6 / 8
    job = Job({"s0g0": [Op(0, "comp", "c", duration_ns=10 ** 9),
                        Op(1, "coll", "ar", (0,), coll="allreduce", size_bytes=int(size),
                           group=("s0g0", "s1g0"))],
               "s1g0": [Op(0, "comp", "c", duration_ns=10 ** 9),
                        Op(1, "coll", "ar", (0,), coll="allreduce", size_bytes=int(size),
                           group=("s0g0", "s1g0")),
                        Op(2, "comp", "d", (1,), duration_ns=5 * 10 ** 8)]})
    got = analytic_step(job, rate_of)
    assert got["step_s"] == pytest.approx(2.5)
    assert got["peak_mbps"] == pytest.approx(200.0, rel=0.06)


def test_auto_byte_scale_keeps_messages_whole_packets():
    t = TrainSettings(tp=4)
    job = plan_job(t, RANKS)
    scale, why = choose_byte_scale(job, "auto", 4000, rate_of, 4096)
    assert min_message_bytes(scaled(job, scale, 4000)) >= 16 * 4096 - 1
    assert choose_byte_scale(job, 10.0, 4000, rate_of, 4096) == (10.0, "given")


def test_the_split_of_a_rank_adds_up():
    # compute 0-4 and 6-8, a collective 3-7 (4-6 exposed), a wait 8-9, idle 9-10
    s = 10 ** 9
    job = Job({"r": [Op(0, "comp", "c1", duration_ns=4 * s),
                     Op(1, "coll", "x.tp0.0", coll="allreduce", size_bytes=1, group=("r",)),
                     Op(2, "comp", "c2", duration_ns=2 * s),
                     Op(3, "recv", "w", size_bytes=1, peer="q", tag="t")]})
    steps = [{"iteration": 0, "op": 0, "compute_ns": 4 * s, "ready_ns": 0, "begin_ns": 0,
              "sent_ns": 4 * s, "done_ns": 4 * s},
             {"iteration": 0, "op": 1, "compute_ns": 0, "ready_ns": 3 * s, "begin_ns": 3 * s,
              "sent_ns": 3 * s, "done_ns": 7 * s},
             {"iteration": 0, "op": 2, "compute_ns": 2 * s, "ready_ns": 6 * s,
              "begin_ns": 6 * s, "sent_ns": 8 * s, "done_ns": 8 * s},
             {"iteration": 0, "op": 3, "compute_ns": 0, "ready_ns": 8 * s, "begin_ns": 8 * s,
              "sent_ns": 8 * s, "done_ns": 9 * s}]
    agent = {"iterations": [{"start_ns": 0, "end_ns": 10 * s}], "steps": steps}
    got = rank_split(job, "r", agent, 0)
    assert got == {"step_s": 10.0, "compute_s": 6.0, "exposed_comm_s": 2.0,
                   "pipeline_wait_s": 1.0, "idle_s": 1.0}
    assert _union([(0, 2), (1, 3), (5, 6)]) == [(0, 3), (5, 6)]
    assert _overlap([(0, 3)], [(2, 5)]) == 1


def test_the_train_table_of_a_file(tmp_path):
    from testbed.experiment import from_toml, read_experiment_file, to_toml
    path = tmp_path / "e.toml"
    path.write_text('[experiment]\nworkload = "train_step"\n[train]\ntp = 4\nlayers = 8\n')
    exp = from_toml(path)
    assert (exp.tp, exp.layers, exp.workload) == (4, 8, "train_step")
    again = tmp_path / "again.toml"
    again.write_text(to_toml(exp, exp.resolve_topology()))
    assert read_experiment_file(again)["tp"] == 4 and "[train]" in again.read_text()
    for text, field in (('[train]\ntpp = 4\n', "train.tpp"),
                        ('[experiment]\ntp = 4\n', "experiment.tp"),
                        ('[experiment]\nworkload = "train_step"\nservers = ["a"]\n',
                         "experiment.servers")):
        path.write_text(text)
        with pytest.raises(SpecError) as err:
            from_toml(path)
        assert err.value.field == field, text
    with pytest.raises(SpecError) as err:
        from_toml(None, {"workload": "train_step", "servers": ["a", "b"]})
    assert err.value.field == "experiment.workload"


def test_the_summary_tables_each_collective_as_nccl_tests_does():
    from testbed.train_run import summary_lines
    tm = {"source": "plan", "ops": 10, "byte_scale": 64.0, "byte_scale_why": "given",
          "time_scale": 16000.0, "smallest_message_bytes": 65536, "step_mean_s": 6.0,
          "step_mean_s_real": 0.024, "analytic_step_s": 5.9, "step_over_analytic": 1.02,
          "iterations": [], "collectives": [{
              "kind": "tp", "coll": "allreduce", "ranks": 4, "size_bytes": 262144,
              "count": 128, "time_s": 0.0229, "busbw_bytes_per_s": 1.7e7}]}
    text = "\n".join(summary_lines(tm))
    assert "# tp allreduce, 128 calls (mean) as measured, 4 ranks" in text
    # the real one: 64x the bytes in 64/16000 of the time
    assert "16777216" in text and "91.6" in text


def test_a_trace_s_op_ids_need_not_be_indices():
    from testbed.train_run import op_kind, rank_split
    s = 10 ** 9
    job = Job({"r": [Op(3317, "comp", "c", duration_ns=s),
                     Op(3318, "coll", "grad.dense0.dp0.0", (3317,), coll="allreduce",
                        size_bytes=1, group=("r",))]})
    assert op_kind(job, "r", 3318) == "dp"
    steps = [{"iteration": 0, "op": 3317, "compute_ns": s, "ready_ns": 0, "begin_ns": 0,
              "sent_ns": s, "done_ns": s},
             {"iteration": 0, "op": 3318, "compute_ns": 0, "ready_ns": s, "begin_ns": s,
              "sent_ns": s, "done_ns": 2 * s}]
    got = rank_split(job, "r", {"iterations": [{"start_ns": 0, "end_ns": 2 * s}],
                                "steps": steps}, 0)
    assert got["compute_s"] == 1.0 and got["exposed_comm_s"] == 1.0
