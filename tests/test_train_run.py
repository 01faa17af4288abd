"""A training step on a real fabric: the plan runs with every dependency kept, and its
Chakra traces replay the same job (traffic.train, traffic.chakra, testbed.train_run)."""

from __future__ import annotations

import json

import pytest

from testbed.experiment import from_toml
from testbed.run import run
from traffic.chakra import read_traces

pytestmark = pytest.mark.root

# 4 servers x 2 GPUs: TP 2 inside a server, 2 pipeline stages, DP 2 along a rail
TOPOLOGY = {"kind": "rail_optimized", "params": {"servers": 4, "gpus_per_server": 2,
                                                 "spines": 1}}
PLAN = {"tp": 2, "pp": 2, "layers": 2, "hidden_size": 1024, "seq_len": 512,
        "bucket_mb": 4.0}


def _exp(tmp_path, name: str, **kw):
    settings = {"name": name, "workload": "train_step", "iterations": 2, "rate": 20.0,
                "results_dir": str(tmp_path), "timeout_s": 120.0, "topology": TOPOLOGY,
                **PLAN}
    settings.update(kw)
    return from_toml(None, settings)


def _agents(folder) -> dict[str, dict]:
    return {p.name[len("agent-"):-len(".json")]: json.loads(p.read_text())
            for p in (folder / "agents").glob("agent-*.json")
            if not p.name.endswith(".config.json")}


def _configs(folder) -> dict[str, dict]:
    return {p.name[len("agent-"):-len(".config.json")]: json.loads(p.read_text())
            for p in (folder / "agents").glob("agent-*.config.json")}


def test_a_step_keeps_every_dependency_and_its_trace_replays_the_same_job(
        tmp_path, host_untouched):
    folder, m = run(_exp(tmp_path, "t_train"))
    assert m["ok"] and m["flows"]["exactly_once"]
    assert m["flows"]["bytes_delivered"] == m["flows"]["bytes_expected"] > 0
    agents, configs = _agents(folder), _configs(folder)
    assert len(agents) == 8
    for rank, agent in agents.items():
        steps = configs[rank]["steps"]
        for it in range(2):
            recs = [r for r in agent["steps"] if r["iteration"] == it]
            assert len(recs) == len(steps) and all(r["done_ns"] for r in recs)
            span = agent["iterations"][it]
            for r, step in zip(recs, steps, strict=True):
                deps = step["after"] if step.get("after") is not None else \
                    ([r["index"] - 1] if r["index"] else [])
                assert all(r["ready_ns"] >= recs[d]["done_ns"] for d in deps)
                assert span["start_ns"] <= r["ready_ns"] <= r["begin_ns"] <= r["sent_ns"] \
                    <= r["done_ns"] <= span["end_ns"]
                assert r["sent_ns"] - r["begin_ns"] >= r["compute_ns"]
            # one compute stream: no two computations of a rank overlap
            comp = sorted((r["begin_ns"], r["sent_ns"]) for r in recs if r["compute_ns"])
            assert comp and all(a[1] <= b[0] for a, b in zip(comp, comp[1:], strict=False))
    tm = m["train"]
    kinds = {c["kind"] for c in tm["collectives"]}
    assert kinds == {"tp", "dp"}
    for it in tm["iterations"]:
        for split in it["ranks"].values():
            parts = (split["compute_s"] + split["exposed_comm_s"] + split["pipeline_wait_s"]
                     + split["idle_s"])
            assert parts == pytest.approx(split["step_s"], abs=1e-3)
    # a pipeline stage waits for the activations of the stage before it
    assert any(s["pipeline_wait_s"] > 0 for it in tm["iterations"]
               for s in it["ranks"].values())
    assert tm["analytic_step_s"] > 0 and tm["step_mean_s_real"] > 0
    assert (folder / "timeline.png").stat().st_size > 10_000
    assert "## Training step" in (folder / "summary.md").read_text()
    # the plan's traces, replayed: the same ops, the same bytes delivered exactly once
    replay_job = read_traces(folder / "trace", list(agents))
    assert sum(len(o) for o in replay_job.ranks.values()) == tm["ops"]
    folder2, m2 = run(_exp(tmp_path, "t_trace", trace=str(folder / "trace"),
                           byte_scale=tm["byte_scale"], tp=1, pp=1))
    assert m2["ok"] and m2["flows"]["exactly_once"]
    assert m2["flows"]["bytes_expected"] == m["flows"]["bytes_expected"]
    assert m2["train"]["source"] == str(folder / "trace")
    assert m2["train"]["analytic_step_s"] == pytest.approx(tm["analytic_step_s"], rel=1e-6)
