"""`testbed run --dry-run` and `testbed validate EXPERIMENT.toml` (testbed.dry_run): the
plan is printed without root, nothing is built, nothing is written. No root needed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import pytest

from testbed import cli, dry_run
from testbed.experiment import from_toml
from testbed.run import REFUSE_OVER_FAITHFUL
from traffic.workloads import ideal_time_s

ROOT = Path(__file__).resolve().parent.parent
NETNS_DIR = Path("/run/netns")
# A calibration as testbed.calibrate caches it (the fields testbed.rate reads)
CALIBRATION = {"cost_us_per_packet": 40.0, "cost_us_per_hop": 4.0,
               "date_utc": "2026-01-01T00:00:00Z", "budget_pps_direct": 25000, "runs": {}}


def namespaces_of(pid: int) -> list[str]:
    """The namespaces a run in process `pid` would have made (its lab, testbed.run.run_lab):
    others on this machine may build fabrics meanwhile."""
    tag = f"run{pid}."
    return sorted(n for n in os.listdir(NETNS_DIR) if tag in n) if NETNS_DIR.is_dir() else []


@pytest.fixture
def no_namespaces(monkeypatch):
    """Creating a namespace fails the test."""
    from fabric import netns

    def refuse(*args, **kwargs):
        raise AssertionError("a dry run created a namespace")
    monkeypatch.setattr(netns, "create", refuse)


@pytest.fixture
def experiment(tmp_path: Path) -> Path:
    path = tmp_path / "exp.toml"
    path.write_text(f'[experiment]\nname = "dry"\nworkload = "allreduce"\nranks = 8\n'
                    f'message_bytes = 65536\niterations = 2\npcap = ["leaf0-eth0"]\n'
                    f'results_dir = "{tmp_path / "results"}"\ntopology = "rail_optimized"\n')
    return path


def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def no_calibration(monkeypatch):
    monkeypatch.setattr(dry_run, "load_cached", lambda *a, **k: None)


@pytest.fixture
def calibrated(monkeypatch):
    monkeypatch.setattr(dry_run, "load_cached", lambda *a, **k: dict(CALIBRATION))


@pytest.fixture
def not_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)


def test_dry_run_prints_the_plan_and_builds_nothing(capsys, experiment, tmp_path,
                                                    no_calibration, not_root, no_namespaces):
    code, out, err = run_main(capsys, "run", str(experiment), "--dry-run")
    assert code == 0, err
    assert err == ""
    # the resolved experiment, every setting, as config.toml holds it
    config = out.split("## experiment (as the run's config.toml would hold it)\n\n", 1)[1]
    config = tomllib.loads(config.split("\n## fabric", 1)[0])
    assert config["experiment"]["ranks"] == 8 and config["experiment"]["ecn"] == "off"
    assert config["topology"]["kind"] == "rail_optimized"
    assert "26 nodes (4 nvswitch, 16 gpu, 4 leaf, 2 spine), 40 links" in out
    assert "16 x gpu-leaf laser: 100 Mbit/s emulated = 400 Gb/s real" in out
    ideal = ideal_time_s("allreduce", 8, 65536, 100.0)
    assert f"allreduce of 65536 B per rank on 8 ranks at 100 Mbit/s per rank: {ideal:.4g} s" \
        in out
    assert "## would be refused: nothing" in out and "you are not root" in out
    assert namespaces_of(os.getpid()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp.toml"]   # no results folder


def test_validate_takes_an_experiment_and_says_the_same(capsys, experiment, no_calibration):
    code, run_out, _ = run_main(capsys, "run", str(experiment), "--dry-run")
    code2, validate_out, _ = run_main(capsys, "validate", str(experiment))
    assert code == code2 == 0
    assert run_out == validate_out


def test_flags_apply_as_in_run(capsys, experiment, no_calibration):
    code, out, _ = run_main(capsys, "validate", str(experiment), "--ranks", "4",
                            "--rate", "50", "--format", "json", "--set", "servers=2")
    assert code == 0
    plan = json.loads(out)
    assert plan["experiment"]["experiment"]["ranks"] == 4
    assert plan["experiment"]["topology"]["params"]["servers"] == 2
    assert plan["rate"]["rate_mbps"] == 50.0 and plan["fabric"]["nodes"] == 2 * 4 + 4 + 2 + 2
    assert plan["ideal"]["ideal_s"] == pytest.approx(ideal_time_s("allreduce", 4, 65536, 50.0))
    assert plan["ranks"] == ["s0g0", "s0g1", "s0g2", "s0g3"]


def test_a_sweep_is_planned_at_its_largest_size_and_keeps_its_sizes(capsys, experiment,
                                                                      no_calibration):
    code, out, _ = run_main(capsys, "validate", str(experiment), "--ranks", "4",
                            "--message-bytes", "64K:256K:x2", "--rate", "50", "--format",
                            "json")
    assert code == 0
    plan = json.loads(out)
    assert plan["experiment"]["experiment"]["message_bytes"] == "64K:256K:x2"
    assert plan["sweep_sizes"] == [65536, 131072, 262144]
    assert plan["ideal"]["ideal_s"] == pytest.approx(ideal_time_s("allreduce", 4, 262144, 50.0))
    code, text, _ = run_main(capsys, "validate", str(experiment), "--ranks", "4",
                             "--message-bytes", "64K:256K:x2", "--rate", "50")
    assert code == 0 and "a sweep of 3 sizes, 65536 to 262144 B" in text


def test_auto_without_calibration_says_a_run_measures_one(capsys, experiment,
                                                           no_calibration):
    code, out, _ = run_main(capsys, "run", str(experiment), "--dry-run", "--rate", "auto",
                            "--format", "json")
    plan = json.loads(out)
    assert code == 0 and plan["rate"]["calibration"] is None
    assert "a run first measures one (about 25 s, needs root" in plan["rate"]["why"]
    assert "the topology's own 100 Mbit/s" in plan["rate"]["why"]
    assert plan["experiment"]["experiment"]["rate"] == "auto"


def test_auto_with_calibration_picks_and_says_why(capsys, experiment, calibrated):
    code, out, _ = run_main(capsys, "run", str(experiment), "--dry-run", "--rate", "auto",
                            "--format", "json")
    plan = json.loads(out)
    rate = plan["rate"]
    assert code == 0 and rate["bound_by"] in ("cpu", "port", "topology", "pfc headroom")
    assert rate["rate_mbps"] <= 100 and rate["why"].startswith(f"set by {rate['bound_by']}")
    assert plan["experiment"]["experiment"]["rate"] == rate["rate_mbps"]  # as config.toml
    assert plan["ideal"]["link_mbps"] == rate["rate_mbps"]


def test_auto_with_pfc_says_what_its_controller_takes(capsys, experiment, calibrated):
    code, out, _ = run_main(capsys, "run", str(experiment), "--dry-run", "--rate", "auto",
                            "--format", "json")
    plain = json.loads(out)["rate"]
    code, out, _ = run_main(capsys, "run", str(experiment), "--dry-run", "--rate", "auto",
                            "--pfc", "on", "--format", "json")
    rate = json.loads(out)["rate"]
    assert code == 0 and plain["controller_cores"] == 0 < rate["controller_cores"] <= 1
    assert rate["max_cpu_mbps"] < plain["max_cpu_mbps"]
    assert "the switch controller's polls take" in rate["why"]


def test_a_rate_far_above_the_calibration_is_refused_unless_forced(capsys, experiment,
                                                                   calibrated):
    code, out, _ = run_main(capsys, "run", str(experiment), "--dry-run", "--rate", "auto",
                            "--format", "json")
    cpu = json.loads(out)["rate"]["max_packets_mbps"]  # what refuses: the packets' budget
    too_fast = f"{min(32000.0 / 9, REFUSE_OVER_FAITHFUL * cpu * 2):g}"
    code, out, err = run_main(capsys, "run", str(experiment), "--dry-run", "--rate", too_fast)
    assert code == 2
    assert "## would be refused: 1" in out and "--force to run it anyway" in out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("testbed run: would be refused: "
                                                   "experiment.rate: ")
    code, out, err = run_main(capsys, "run", str(experiment), "--dry-run", "--rate", too_fast,
                              "--force")
    assert code == 0 and err == "" and "## would be refused: nothing" in out


def test_a_bad_key_is_one_line_and_exit_2(capsys, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[experiment]\nname = "x"\nbogus = 1\n')
    for argv in (["run", str(bad), "--dry-run"], ["validate", str(bad)]):
        code, out, err = run_main(capsys, *argv)
        lines = err.strip().splitlines()
        assert code == 2 and out == "" and len(lines) == 1
        assert ": experiment.bogus: 'bogus' is an unknown setting" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.toml"]


def test_settings_flags_on_a_topology_are_refused(capsys):
    code, out, err = run_main(capsys, "validate", "leaf_spine", "--ranks", "4")
    assert code == 2 and out == ""
    assert err.strip() == ("testbed validate: ranks: settings are checked with an experiment "
                           "file (a .toml with an [experiment] table); leaf_spine is a topology")


def test_the_shipped_experiments_dry_run(capsys, no_calibration):
    for path in sorted((ROOT / "experiments").glob("*.toml")):
        code, out, err = run_main(capsys, "validate", str(path), "--results", "/tmp")
        assert code == 0, (path, err)
        assert from_toml(path).name in out.splitlines()[0]
        assert "## ideal job time" in out


@pytest.fixture
def open_folder():
    """A folder any user may write (pytest's tmp_path is root's alone), removed after."""
    folder = Path(tempfile.mkdtemp(prefix="aft-dry-run-"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root to drop to nobody")
def test_as_nobody(open_folder):
    """A real non-root user: no root check trips, nothing is built or written."""
    experiment = open_folder / "exp.toml"
    experiment.write_text(f'[experiment]\nname = "dry"\nranks = 4\n'
                          f'results_dir = "{open_folder / "results"}"\n')
    experiment.chmod(0o644)
    home = open_folder / "home"     # matplotlib's caches go here
    home.mkdir(mode=0o777)
    proc = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                          sys.executable, "-m", "testbed", "run", str(experiment),
                          "--dry-run", "--format", "json"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "HOME": str(home), "PYTHONPATH": str(ROOT),
                              "AFT_CALIBRATION": str(open_folder / "none.json")})
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    plan = json.loads(stdout)
    assert plan["is_root"] is False and plan["refused"] == []
    assert plan["ideal"]["ideal_s"] == pytest.approx(ideal_time_s("allreduce", 4, 1 << 20,
                                                                  100.0))
    assert namespaces_of(proc.pid) == []
    assert sorted(p.name for p in open_folder.iterdir()) == ["exp.toml", "home"]
