"""testbed.run_result: a run's results typed; metrics.json is RunResult written out and
read back exactly, with its schema version, and a file this code cannot read is refused
naming the file and the key."""

from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from testbed.results import RUN_KEYS, compute_metrics, summary_md, write_metrics
from testbed.run_result import (
    SCHEMA_VERSION,
    Fidelity,
    FlowTotals,
    Iteration,
    MetricsError,
    PfcReport,
    RunResult,
)
from topologies.builders import leaf_spine

TOPO_SUMMARY = {"name": "t", "kind": "leaf_spine"}


def agent(node: str, peer: str, start_ns: int, end_ns: int) -> dict:
    """What an agent reports of one completed iteration: a flow sent and one received."""
    flow = {"size_bytes": 4096, "start_ns": start_ns, "end_ns": end_ns, "retransmits": 1,
            "naks": 0, "timeouts": 0, "ooo_packets": 2, "dup_packets": 0, "max_reorder": 1,
            "exactly_once": True, "bytes_delivered": 4096}
    return {"ok": True, "iterations": [{"start_ns": start_ns, "end_ns": end_ns}],
            "flows": [{**flow, "role": "send", "src": node, "dst": peer},
                      {**flow, "role": "recv", "src": peer, "dst": node}],
            "latency_ns": [("t", 0, 150_000), ("t", 0, 250_000)], "cpu_s": 0.5}


def computed() -> dict:
    """compute_metrics of a two-rank p2p on a small leaf-spine: what every run starts from."""
    topo = leaf_spine(leaves=2, spines=1, hosts_per_leaf=1)
    ranks = sorted(n for n in topo.graph if not topo.graph.nodes[n].get("forwards"))
    exp = SimpleNamespace(workload="p2p", message_bytes=4096, iterations=1,
                          transport="roce", entropy="ecmp", seed=1)
    agents = {ranks[0]: agent(ranks[0], ranks[1], 1_000, 2_001_000),
              ranks[1]: agent(ranks[1], ranks[0], 3_000, 1_503_000)}
    totals = {(n, topo.ifname(n, p)): {"tx_bytes": 5000, "drops": 0, "max_backlog_bytes": 9}
              for n in topo.graph for p in topo.ports(n)}
    cpu = {"cpu_mean_percent": 20.0, "cores": 2}
    return compute_metrics(exp, topo, ranks, agents, totals, cpu,
                           {"build_s": 1.0, "run_s": 2.0, "teardown_s": 0.1})


def test_every_key_compute_metrics_writes_is_a_required_field():
    metrics = computed()
    assert set(metrics) == set(RunResult.required_keys()) == RUN_KEYS
    result = RunResult.from_dict(metrics)
    assert result.to_dict() == {"schema_version": SCHEMA_VERSION, **metrics}
    assert list(result.to_dict())[0] == "schema_version" and SCHEMA_VERSION == 1
    # the sections read most are typed, their values those compute_metrics computed
    (it,) = result.iterations          # first start to last end: 1 us to 2001 us
    assert isinstance(it, Iteration) and (it.iteration, it.jct_s) == (0, 0.002)
    assert it.jct_s_real == 0.002 / result.scale_factor
    assert isinstance(result.flows, FlowTotals) and result.flows.retransmits == 2
    assert (result.flows.bytes_delivered, result.flows.exactly_once) == (8192, True)
    assert (result.latency_us.samples, result.links.drops) == (4, 0)
    assert result.jct_mean_s == 0.002 and result.fidelity is None
    # and every field a run adds afterwards may be left out: the file stays as it was
    optional = {f.name for f in fields(RunResult)} - RUN_KEYS - {"extra", "absent"}
    assert optional >= {"pfc", "fidelity", "train", "servers", "expected", "cc"}
    assert result.absent == optional


def test_a_run_dict_and_its_result_write_the_same_file(tmp_path: Path):
    metrics = {**computed(), "engine": "python", "rto_ms": 200.0, "pfc": None, "train": None}
    write_metrics(tmp_path, metrics)
    from_dict = (tmp_path / "metrics.json").read_text()
    write_metrics(tmp_path, RunResult.from_dict(metrics))
    assert (tmp_path / "metrics.json").read_text() == from_dict
    loaded = RunResult.load(tmp_path)
    assert loaded.to_dict() == json.loads(from_dict) == {"schema_version": 1, **metrics}
    assert loaded.pfc is None and "pfc" not in loaded.absent and "cc" in loaded.absent
    assert loaded.save(tmp_path).read_text() == from_dict
    # a run's value of the wrong type is refused before anything is written
    (tmp_path / "metrics.json").unlink()
    with pytest.raises(MetricsError, match=r"metrics\.flows\.retransmits is text"):
        write_metrics(tmp_path, {**metrics, "flows": {**metrics["flows"], "retransmits": "2"}})
    assert not (tmp_path / "metrics.json").exists()


def test_a_newer_schema_a_missing_key_or_a_wrong_type_is_refused_naming_file_and_key(
        tmp_path: Path):
    metrics = computed()
    path = tmp_path / "metrics.json"
    cases = [({**metrics, "schema_version": 2},
              f"{path} has schema_version 2; this testbed reads versions up to 1"),
             ({**metrics, "schema_version": "1"}, "schema_version '1'"),
             ({k: v for k, v in metrics.items() if k != "links"},
              f"{path}: no 'links' (a required key)"),
             ({**metrics, "flows": {k: v for k, v in metrics["flows"].items()
                                    if k != "naks"}}, f"{path}.flows: no 'naks'"),
             ({**metrics, "ranks": 2.5}, f"{path}.ranks is a number (2.5), not an integer"),
             ({**metrics, "ok": 1}, f"{path}.ok is an integer (1), not true/false"),
             ({**metrics, "iterations": [{"iteration": 0}]}, f"{path}.iterations[0]: no"),
             ({**metrics, "pfc": []}, f"{path}.pfc is a list ([]), not a table or null"),
             ([1, 2], f"{path} is a list, not a table")]
    for table, said in cases:
        path.write_text(json.dumps(table))
        with pytest.raises(MetricsError) as got:
            RunResult.load(tmp_path)
        assert said in str(got.value) and "\n" not in str(got.value), str(got.value)
    path.write_text("{not json")
    with pytest.raises(MetricsError, match="is not JSON"):
        RunResult.load(tmp_path)


def test_a_file_from_before_versions_reads_as_version_0_and_is_written_as_1(tmp_path):
    metrics = computed()
    (tmp_path / "metrics.json").write_text(json.dumps(metrics))
    result = RunResult.load(tmp_path)
    assert result.to_dict() == {"schema_version": 1, **metrics}


def test_unknown_keys_ride_along_in_extra_and_come_back_where_they_were():
    """A key this code does not know (a feature's own section, a newer field in the same
    version) is kept, not refused: report and the scripts pass it through untouched."""
    metrics = {**computed(), "my_feature": {"marks": 3},
               "fidelity": {"verdict": "faithful", "reasons": [], "grades": {},
                            "figures": {}, "thresholds": {}, "judge": "new"}}
    result = RunResult.from_dict(metrics)
    assert result.extra == {"my_feature": {"marks": 3}}
    assert result.fidelity == Fidelity(verdict="faithful", reasons=[], grades={}, figures={},
                                       thresholds={}, extra={"judge": "new"})
    assert result.to_dict() == {"schema_version": 1, **metrics}
    # a section set after reading is written, one left out stays out
    added = replace(result, engine="compiled")
    assert added.to_dict()["engine"] == "compiled" and "cc" not in added.to_dict()


def test_pfc_and_a_spread_runs_sections_round_trip():
    totals = {"frames_sent": 5, "xoff_frames": 3, "send_errors": 0, "drops": 0,
              "host_refused": 1, "paused_s": 0.25}
    pfc = {"enabled": True, "headroom": {"verdict": "ok", "notes": []},
           "reaction_ms": {"count": 0}, "totals": totals, "storms": [], "controller": {},
           "ecn": {"enabled": False}, "switch_lb": {"mode": "ecmp"}, "trimming": {},
           "occupancy_from": "kernel", "poll_ms": 0.5, "sleep": None,
           "from_other_servers": {"frames_received": 5}, "files": "pfc-a.json, pfc-b.json",
           "per_server": {"a": {"sent": 5}}}
    fidelity = {"verdict": "degraded", "reasons": ["x"], "grades": {}, "figures": {},
                "thresholds": {}, "server": "a", "per_server": {"a": "degraded", "b": "ok"}}
    metrics = {**computed(), "pfc": pfc, "fidelity": fidelity, "servers": {"a": {}}}
    result = RunResult.from_dict(metrics)
    assert isinstance(result.pfc, PfcReport) and result.pfc.totals.xoff_frames == 3
    assert result.pfc.files == "pfc-a.json, pfc-b.json" and result.fidelity.server == "a"
    assert result.to_dict() == {"schema_version": 1, **metrics}


def test_the_summary_reads_the_same_from_a_result_and_from_its_table():
    metrics = {**computed(), "rto_ms": 200.0, "engine": "python",
               "pfc": {"enabled": True, "headroom": {"verdict": "ok", "notes": ["fits"]},
                       "reaction_ms": {"p50": 1.0, "p99": 2.0},
                       "totals": {"frames_sent": 5, "xoff_frames": 3, "send_errors": 0,
                                  "drops": 0, "host_refused": 0, "paused_s": 0.25},
                       "storms": [], "controller": {}, "ecn": {}, "switch_lb": {},
                       "trimming": {}, "occupancy_from": "kernel", "poll_ms": 0.5,
                       "sleep": None}}
    text = summary_md("t", metrics, TOPO_SUMMARY, [])
    assert text == summary_md("t", RunResult.from_dict(metrics), TOPO_SUMMARY, [])
    assert "5 pause frames sent (3 XOFF), 0.25 s paused in all" in text
    assert "headroom ok (fits)" in text and "(RTO 200 ms)" in text


@pytest.mark.root
def test_a_real_runs_metrics_json_reads_back_exactly(tmp_path, host_untouched):
    """A small run with PFC on: its metrics.json is RunResult's, field for field, and
    `testbed report` reads it back to the same summary."""
    from testbed.experiment import from_toml
    from testbed.report_folder import report
    from testbed.run import run
    exp = from_toml(None, {"name": "t_result", "workload": "allreduce", "pfc": "on",
                           "message_bytes": 64 * 1024, "iterations": 1, "timeout_s": 60.0,
                           "results_dir": str(tmp_path), "topology": {
                               "kind": "leaf_spine", "params": {
                                   "leaves": 2, "spines": 1, "hosts_per_leaf": 1}}})
    folder, metrics = run(exp)
    saved = json.loads((folder / "metrics.json").read_text())
    result = RunResult.load(folder)
    assert result.to_dict() == saved and list(result.to_dict()) == list(saved)
    assert saved == {"schema_version": SCHEMA_VERSION, **metrics}
    assert result.extra == {} and result.ok and isinstance(result.pfc, PfcReport)
    assert result.pfc.enabled and result.fidelity.verdict in ("faithful", "degraded",
                                                               "unfaithful")
    summary = (folder / "summary.md").read_text()
    assert report(folder)[0] == summary
