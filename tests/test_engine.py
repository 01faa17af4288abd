"""Tests for the compiled data path (traffic.engine): the build, the AFT_ENGINE switch, the
same decisions and bytes from both engines (tests/engine_trace.py), the doctor's check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fabric import doctor
from traffic import engine as engine_mod
from traffic.engine import COMPILED_MODULES

ROOT = Path(__file__).resolve().parent.parent
PROBE = """
import importlib, json
from traffic import engine
mods = {m: importlib.import_module(m).__file__ for m in engine.COMPILED_MODULES}
print(json.dumps({"engine": engine.engine(), "files": mods}))
"""


def run_python(args: list[str], engine: str) -> str:
    env = {**os.environ, "AFT_ENGINE": engine}
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def traces() -> dict[str, dict]:
    """tests/engine_trace.py's log from each engine."""
    return {e: json.loads(run_python(["-m", "tests.engine_trace"], e))
            for e in ("compiled", "interpreted")}


def test_every_listed_module_is_built_and_up_to_date():
    done = subprocess.run([sys.executable, "scripts/build_compiled.py", "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"run scripts/build_compiled.py: {done.stdout}"


def test_compiled_engine_loads_every_extension():
    got = json.loads(run_python(["-c", PROBE], "compiled"))
    assert got["engine"] == "compiled"
    assert set(got["files"]) == set(COMPILED_MODULES)
    assert all(f.endswith(".so") for f in got["files"].values()), got["files"]


def test_interpreted_engine_loads_every_source():
    got = json.loads(run_python(["-c", PROBE], "interpreted"))
    assert got["engine"] == "interpreted"
    assert all(f.endswith(".py") for f in got["files"].values()), got["files"]


def test_engine_says_what_is_missing(monkeypatch):
    monkeypatch.setenv("AFT_ENGINE", "compiled")
    monkeypatch.setattr(engine_mod, "not_compiled", lambda: ["traffic.agent"])
    assert engine_mod.engine() == ("interpreted (compiled path not built: traffic.agent not "
                                   "built (bash scripts/setup.sh builds them in a checkout; "
                                   "an installed package has none))")
    monkeypatch.setattr(engine_mod, "not_compiled", lambda: list(COMPILED_MODULES))
    assert engine_mod.engine().startswith("interpreted (compiled path not built: no ext")
    monkeypatch.setenv("AFT_ENGINE", "interpreted")
    assert engine_mod.engine() == "interpreted"
    monkeypatch.setenv("AFT_ENGINE", "fast")
    with pytest.raises(ValueError, match="AFT_ENGINE"):
        engine_mod.requested()


def test_both_engines_decide_the_same(traces):
    compiled, interpreted = traces["compiled"], traces["interpreted"]
    assert (compiled.pop("engine"), interpreted.pop("engine")) == ("compiled", "interpreted")
    for a, b in zip(compiled["transports"], interpreted["transports"], strict=True):
        assert a == b, f"{a['kind']} seed {a['seed']} loss {a['loss']}: the engines differ"
    assert compiled == interpreted


def test_the_scenarios_are_not_trivial(traces):
    runs = traces["interpreted"]["transports"]
    assert {(r["kind"], r["loss"]) for r in runs} == {
        (k, p) for k in ("roce", "uet", "nscc") for p in (0.0, 0.01, 0.1)}
    for r in runs:
        assert r["rx"]["exactly_once"] and r["tx"]["done"], (r["kind"], r["seed"], r["loss"])
        assert any(e[0] == "take" for e in r["log"]) and any(e[0] == "on_ack" for e in r["log"])
    lossy = [r for r in runs if r["loss"] == 0.1]
    assert all(r["tx"]["retransmits"] > 0 for r in lossy)
    assert all(r["rx"]["naks"] > 0 for r in lossy if r["kind"] == "roce")       # NAKs
    assert all(r["rx"]["trimmed"] > 0 for r in lossy if r["kind"] != "roce")    # trim NAKs
    assert any(r["tx"]["timeouts"] > 0 for r in lossy)                         # RTOs
    sacks = [e for r in runs if r["kind"] == "uet" for e in r["log"]
             if e[0] == "ack_fields" and e[3][3]]
    assert sacks, "no SACK carried a bitmap"
    assert all(r["tx"]["cuts"] > 0 for r in runs if r["kind"] == "nscc")
    assert all(d["results"]["cuts"] > 0 for d in traces["interpreted"]["dcqcn"])


def test_patchers_write_the_same_valid_frames(traces):
    for engine in ("compiled", "interpreted"):
        for run in traces[engine]["patchers"]:
            assert len(run["frames"]) == 350 and all(run["icrc_valid"])
    assert traces["compiled"]["patchers"] == traces["interpreted"]["patchers"]


@pytest.mark.parametrize("built", [True, False])
def test_doctor_reports_the_compiled_data_path(monkeypatch, built):
    said = "compiled" if built else ("interpreted (compiled path not built: no extension "
                                     "built (bash scripts/setup.sh builds them))")
    monkeypatch.setattr(doctor, "_engine_of_agents", lambda: said)
    ok, detail = doctor._probe_compiled()
    assert ok is built
    if built:
        assert detail.startswith("compiled")
    else:
        assert detail.startswith("interpreted (compiled path not built")
        assert detail.endswith("fix: bash scripts/setup.sh")
    assert "bash scripts/setup.sh" in doctor.DISABLES["compiled_data_path"]


@pytest.mark.parametrize("engine", ["compiled", "interpreted"])
def test_doctor_asks_a_fresh_interpreter(monkeypatch, engine):
    monkeypatch.setenv("AFT_ENGINE", engine)
    ok, detail = doctor._probe_compiled()
    assert ok is (engine == "compiled")
    assert detail.startswith(engine)
