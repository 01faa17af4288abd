"""The claim scripts on the open-loop workloads: scripts/mice_vs_elephants.py and
scripts/gpuless_retrieval.py (their refusals, their settings without a fabric, and a
smoke run of each)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.experiment import from_toml
from testbed.gpuless_retrieval import FABRICS, RetrievalKnobs
from testbed.gpuless_retrieval import experiment as retrieval_experiment
from testbed.mice_elephants import MIXES, SETTINGS, MixKnobs
from testbed.mice_elephants import experiment as mix_experiment
from tests.test_scripts import assert_png, assert_tables

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _script(name: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, f"scripts/{name}.py", *args], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(("flag", "value"), [
    ("--modes", "hash"), ("--modes", "none"), ("--controls", "ecn"), ("--sizes", "nosuch"),
    ("--load", "0"), ("--load", "0.99"), ("--flows", "0"), ("--message-bytes", "0"),
    ("--hosts-per-leaf", "0"), ("--rate", "fast"), ("--rate", "nan")])
def test_mice_vs_elephants_refuses_bad_arguments(flag, value, tmp_path):
    """A bad value is one line on stderr naming the flag, exit 2, and no results folder."""
    bad = _script("mice_vs_elephants", flag, value, "--results", str(tmp_path))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert flag in bad.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(("flag", "value"), [
    ("--endpoints", "5"), ("--endpoints", "2"), ("--loads", "0.5,1"), ("--loads", "x"),
    ("--closed", "-1"), ("--count", "0"), ("--request-bytes", "0"), ("--rate", "auto"),
    ("--rate", "inf")])
def test_gpuless_retrieval_refuses_bad_arguments(flag, value, tmp_path):
    bad = _script("gpuless_retrieval", flag, value, "--results", str(tmp_path))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert flag in bad.stderr
    assert not list(tmp_path.iterdir())


def test_every_mix_and_mode_is_a_valid_run(tmp_path):
    """Each of the script's runs validates, with the workload and the settings it names."""
    for mix in MIXES:
        for mode, settings in SETTINGS.items():
            exp = from_toml(None, mix_experiment(tmp_path, mix, mode, MixKnobs()))
            assert exp.workload == ("permutation" if mix == "elephants" else "flows")
            assert exp.flow_background == ("elephants" if mix == "both" else "none")
            for name, value in settings.items():
                assert getattr(exp, name) == value, (mix, mode, name)
            assert len(exp.resolve_topology().endpoints()) == 8


def test_retrieval_fabrics_have_the_same_endpoints_and_the_same_offered_load(tmp_path):
    """The three fabrics have the knobs' endpoint count, the leaf-spine's and the
    rail-optimized fabric's uplinks carry their hosts, and every fabric is offered the
    same rate: f x servers x B / response over the clients."""
    knobs = RetrievalKnobs(endpoints=8, response_bytes=16384, rate_mbps=100)
    assert knobs.servers_bound_per_s() == pytest.approx(4 * 12.5e6 / 16384)
    assert knobs.client_rate_per_s(0.5) == pytest.approx(0.5 * 4 * 12.5e6 / 16384 / 4)
    names = set()
    for fabric in FABRICS:
        exp = from_toml(None, retrieval_experiment(tmp_path, fabric, 0.5, 0, knobs))
        topo = exp.resolve_topology()
        assert len(topo.endpoints()) == 8 and exp.rpc_servers == 4
        assert exp.rpc_rate == pytest.approx(knobs.client_rate_per_s(0.5))
        names.add(exp.name)
        for leaf in topo.nodes_with_role("leaf"):
            edges = topo.graph.edges(leaf, data=True)
            down = sum(d["rate_mbps"] for _, n, d in edges if topo.role(n) != "spine")
            up = sum(d["rate_mbps"] for _, n, d in edges if topo.role(n) == "spine")
            assert up >= down, (fabric, leaf)
        closed = from_toml(None, retrieval_experiment(tmp_path, fabric, None, 3, knobs))
        assert closed.rpc_rate == 0 and closed.rpc_concurrency == 3
    assert len(names) == 3


@pytest.mark.root
def test_mice_vs_elephants_smoke(tmp_path, host_untouched):
    """Mice, elephants and both under ECMP on a 2 x 2 x 2 leaf-spine: every row, the
    table, the PS and collision rows, the plot and the page."""
    out = _script("mice_vs_elephants", "--modes", "ecmp", "--controls", "none",
                  "--hosts-per-leaf", "2", "--flows", "16", "--sizes", "ali_storage",
                  "--message-bytes", "262144", "--results", str(tmp_path), timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    (folder,) = tmp_path.glob("mice_vs_elephants-*")
    for name in ("summary.md", "index.html", "metrics.json"):
        assert (folder / name).exists(), name
    assert_png(folder / "plots" / "mice_vs_elephants.png")
    data = json.loads((folder / "metrics.json").read_text())
    runs = data["runs"]
    assert set(runs) == {"mice/ecmp", "elephants/ecmp", "both/ecmp"}
    assert runs["mice/ecmp"]["mice"]["mice_done"] == 16
    assert runs["mice/ecmp"]["elephants_s"] is None
    for k in ("elephants/ecmp", "both/ecmp"):
        r = runs[k]
        assert r["exactly_once"] and r["elephants_over_ideal"] >= 0.9, k
        assert r["model_s"] >= r["ideal_s"] * 0.99, k
    assert runs["both/ecmp"]["mice"]["all_p99"] >= 0.95
    summary = (folder / "summary.md").read_text()
    assert_tables(summary)
    assert "**Finding:**" in summary and "| both | ecmp |" in summary
    whats = [e["what"] for e in data["expected"]]
    assert whats == ["mice alone, mean slowdown, ecmp", "elephants alone, JCT, ecmp"]
    assert data["expected"][0]["low"] == runs["mice/ecmp"]["mice"]["ps_slowdown"]
    assert "## Expected vs measured" in summary and "mice alone, mean slowdown" in summary


@pytest.mark.root
def test_gpuless_retrieval_smoke(tmp_path, host_untouched):
    """One open-loop load and a closed loop on each fabric of 4 endpoints: every RPC
    answered, the costs read, the expected rows (alone, offered, bound, Little)."""
    out = _script("gpuless_retrieval", "--endpoints", "4", "--loads", "0.3", "--closed",
                  "1", "--count", "8", "--results", str(tmp_path), timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    (folder,) = tmp_path.glob("gpuless_retrieval-*")
    for name in ("summary.md", "index.html", "metrics.json"):
        assert (folder / name).exists(), name
    assert_png(folder / "plots" / "gpuless_retrieval.png")
    data = json.loads((folder / "metrics.json").read_text())
    runs = data["runs"]
    assert [(r["fabric"], r["fraction"]) for r in runs] == [
        (f, x) for f in FABRICS for x in (0.3, None)]
    for r in runs:
        assert r["rpcs_done"] == r["rpcs_asked"] == 16 and r["exactly_once"], r["fabric"]
        # not p50 >= alone: a port's shaper burst (about 1 ms of its rate) lets a small
        # response cross an idle fabric faster than its frames' wire time
        assert 0 < r["p50_s"] <= r["p99_s"] and r["alone_s"] > 0
    mesh = next(r for r in runs if r["fabric"] == "full_mesh")
    assert mesh["switches"] == 0 and mesh["links"] == 6
    assert all(r["switches"] > 0 for r in runs if r["fabric"] != "full_mesh")
    summary = (folder / "summary.md").read_text()
    assert_tables(summary)
    assert "**Finding:**" in summary and "## Expected vs measured" in summary
    for fabric in FABRICS:
        assert summary.count(f"| {fabric} |") == 2
        for what in ("RPC latency p50 at load 0.3", "RPCs/s at load 0.3", "RPCs in flight"):
            assert any(e["what"].startswith(f"{fabric}: {what}")
                       for e in data["expected"]), what
