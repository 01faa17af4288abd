"""Message-size sweeps: the sizes a sweep's text stands for, the refusals, the run of
every size at one rate, and the nccl-tests table of the results."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys

import pytest

from fabric import netns
from fabric.state import mark_failed
from testbed import rate, sweep
from testbed.experiment import from_toml
from testbed.results import RunFailedError, new_folder
from testbed.sizes import MAX_SWEEP_SIZES, is_sweep, parse_sizes, size_text
from topologies.spec import SpecError

from .test_bad_input import one_line_naming, run_cli_pid
from .test_calibrate import cal
from .test_cli import ROOT

KEY = "experiment.message_bytes"


# -- the sizes ---------------------------------------------------------------------------
def test_a_factor_sweep_doubles_from_begin_to_end():
    sizes = parse_sizes(KEY, "1K:64M:x2")
    assert len(sizes) == 17 and sizes[0] == 1024 and sizes[-1] == 67108864
    assert all(b == 2 * a for a, b in zip(sizes, sizes[1:], strict=False))
    assert parse_sizes(KEY, "1K:100K:x4") == [1024, 4096, 16384, 65536]   # end not hit


def test_a_step_sweep_adds_the_step():
    assert parse_sizes(KEY, "64K:256K:+64K") == [65536, 131072, 196608, 262144]
    assert parse_sizes(KEY, "1000:3500:+1000") == [1000, 2000, 3000]
    assert parse_sizes(KEY, "4K:4K:x2") == [4096]                 # begin = end: one size


def test_one_size_with_or_without_a_suffix():
    assert parse_sizes(KEY, 4096) == [4096]
    assert parse_sizes(KEY, "64K") == [65536] and parse_sizes(KEY, "2m") == [2 << 20]
    assert parse_sizes(KEY, "1G") == [1 << 30]
    assert not is_sweep("64K") and not is_sweep(4096) and is_sweep("1K:2K:x2")
    assert [size_text(s) for s in (65536, 1 << 30, 1536, 3 << 20)] == \
        ["64K", "1G", "1536", "3M"]


@pytest.mark.parametrize(("text", "words"), [
    ("64M:1K:x2", "more than the last"),
    ("1K:64M:x1", "factor must be a whole number > 1"),
    ("1K:64M:x1.5", "factor must be a whole number > 1"),
    ("1K:64M:+0", "step must be > 0"),
    ("1K:64M", "is not a size in bytes"),
    ("1K:64M:x2:x2", "is not a size in bytes"),
    ("1K:64M:*2", "is not a size in bytes"),
    ("1T:2T:x2", "is not a size in bytes"),
    ("0:1K:x2", "at least 1 B"),
    ("1:1G:+1", f"more than {MAX_SWEEP_SIZES} sizes"),
    ("1:4G:x2", f"more than {MAX_SWEEP_SIZES} sizes"),     # 33 sizes
    ("abc", "is not a size in bytes"),
])
def test_bad_sweeps_name_the_setting(text, words):
    with pytest.raises(SpecError) as err:
        from_toml(None, {"message_bytes": text})
    assert err.value.field == KEY and words in str(err.value)


def test_each_size_keeps_the_single_values_limits():
    assert from_toml(None, {"message_bytes": "64K"}).message_bytes == 65536
    assert from_toml(None, {"message_bytes": "1K:64M:x2"}).message_bytes == "1K:64M:x2"
    for value, words in (("1K:64G:x2", "largest message"), (0, "less than 1"),
                         (1.5, "is not a size in bytes"), (True, "is not a size in bytes")):
        with pytest.raises(SpecError, match=words) as err:
            from_toml(None, {"message_bytes": value})
        assert err.value.field == KEY
    with pytest.raises(SpecError, match="not train_step") as err:
        from_toml(None, {"message_bytes": "1K:4K:x2", "workload": "train_step"})
    with pytest.raises(SpecError, match="on this machine") as err:
        from_toml(None, {"message_bytes": "1K:4K:x2", "servers": ["a", "b"]})


def test_a_sweep_in_the_experiment_file(tmp_path):
    toml = tmp_path / "e.toml"
    toml.write_text('[experiment]\nmessage_bytes = "64K:1M:x4"\n')
    exp = from_toml(toml)
    assert parse_sizes(KEY, exp.message_bytes) == [65536, 262144, 1048576]


@pytest.mark.parametrize("args", [
    ["--message-bytes", "64M:1K:x2"], ["--message-bytes", "1K:64M:x1"],
    ["--message-bytes", "1K:64M:+0"], ["--message-bytes", "1:1G:+1"],
    ["--message-bytes", "1K-64M-x2"], ["--message-bytes", "1K:64G:x2"],
])
def test_the_cli_refuses_a_bad_sweep_in_one_line(tmp_path, args):
    out, pid = run_cli_pid("run", "--topology", "one_tier", "--set", "nodes=2",
                           "--results", str(tmp_path / "res"), *args)
    assert one_line_naming(out, KEY), out.stderr
    assert not (tmp_path / "res").exists() and netns.named(f"run{pid}") == []


def test_the_cli_refuses_a_bad_sweep_in_a_file(tmp_path):
    toml = tmp_path / "e.toml"
    toml.write_text('[experiment]\nmessage_bytes = "1K:64M:x0"\n'
                    '[topology]\nkind = "one_tier"\n[topology.params]\nnodes = 2\n')
    out = subprocess.run([sys.executable, "-m", "testbed", "run", str(toml), "--results",
                          str(tmp_path / "res")], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert one_line_naming(out, KEY, "BEGIN:END:xFACTOR"), out.stderr
    assert not (tmp_path / "res").exists()


# -- the table ---------------------------------------------------------------------------
def metrics_of(size: int, time_s: float, ranks: int = 4, exactly_once: bool = True) -> dict:
    """What a run's metrics.json holds that the table reads (testbed.results)."""
    return {"ranks": ranks, "scale_factor": 4000.0, "link_mbps": 100.0,
            "jct_mean_s": time_s, "ideal_s": 2 * (ranks - 1) / ranks * size / 12.5e6,
            "jct_over_ideal": None, "flows": {"exactly_once": exactly_once}}


def flows_csv(folder, rows: list[tuple[str, str, bool]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "flows.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["node", "role", "exactly_once"])
        w.writerows(rows)


def column_ends(line: str) -> list[int]:
    """Where each whitespace-separated field of a table line ends (the first character,
    "#" or " ", is the line's own)."""
    return [m.end() for m in re.finditer(r"\S+", line[1:])]


def data_rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if not line.startswith("#")]


def test_the_table_has_a_row_per_size_in_fixed_columns(tmp_path):
    exp = from_toml(None, {"message_bytes": "64K:256K:x2", "ranks": 4})
    bad = tmp_path / "t_131072B"
    flows_csv(bad, [("r1", "recv", True), ("r2", "recv", False), ("r2", "recv", False),
                    ("r3", "recv", False), ("r3", "send", False)])
    runs = [sweep.SizeRun(65536, tmp_path / "t_65536B", metrics_of(65536, 0.0125)),
            sweep.SizeRun(131072, bad, metrics_of(131072, 0.025, exactly_once=False)),
            sweep.SizeRun(262144, tmp_path / "t_262144B", None, "agent died")]
    sweep.write_sweep(tmp_path, exp, [65536, 131072, 262144], runs, 4000.0)
    text = (tmp_path / "sweep.md").read_text()
    measured, real = text.split("# scaled to the real fabric (x4000)\n")
    rows = data_rows(measured)
    assert [r[0] for r in rows] == ["65536", "131072", "262144"]
    assert all(len(r) == len(sweep.MEASURED) for r in rows)
    # 64 KiB in 12.5 ms: algbw 5.243 MB/s, busbw x 2(n-1)/n = 1.5: 7.864 MB/s
    assert rows[0][1:4] == ["16384", "float", "sum"]
    assert rows[0][4:8] == ["12500.0", "5.243", "7.864", "0"]
    assert rows[1][7] == "2"                       # r2 and r3 received a flow wrongly
    assert rows[2][4:] == ["n/a"] * 6              # the failed size: nothing measured
    # fixed widths: every value ends where its column's header and unit end
    lines = measured.splitlines()
    header = next(line for line in lines if "#wrong" in line)
    unit_row = lines[lines.index(header) + 1]
    ends = column_ends(header)
    assert len(ends) == len(sweep.MEASURED)
    assert set(column_ends(unit_row)) <= set(ends)
    assert all(column_ends(line) == ends for line in lines if not line.startswith("#"))
    assert "# Avg bus bandwidth    : 7.8643 MB/s" in measured    # over the sizes measured
    # the real fabric: x4000 the rates, /4000 the time
    assert data_rows(real)[0][4:7] == ["3.125", "20.97", "31.46"]
    assert "# Avg bus bandwidth    : 31.4573 GB/s" in real
    saved = json.loads((tmp_path / "sweep.json").read_text())
    assert saved["sizes_bytes"] == [65536, 131072, 262144] and not saved["ok"]
    assert list(saved["rows"][0]) == sweep.FIELDS
    assert saved["rows"][0]["busbw_mb_per_s"] == pytest.approx(65536 / 0.0125 * 1.5 / 1e6)
    assert saved["rows"][0]["ideal_us_real"] == pytest.approx(
        1.5 * 65536 / 12.5e6 * 1e6 / 4000)
    with open(tmp_path / "sweep.csv") as fh:
        table = list(csv.DictReader(fh))
    assert [int(r["size_bytes"]) for r in table] == [65536, 131072, 262144]
    assert table[1]["wrong"] == "2" and table[2]["time_us"] == ""
    assert (tmp_path / "plots" / "busbw.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_busbw_factor_and_redop_follow_the_collective(tmp_path):
    for workload, redop, factor in (("allgather", "none", 0.75), ("alltoall", "none", 0.75),
                                    ("reducescatter", "sum", 0.75), ("p2p", "none", 1.0)):
        exp = from_toml(None, {"message_bytes": "4K:8K:x2", "workload": workload})
        rows = [sweep.row_of(sweep.SizeRun(4096, None, metrics_of(4096, 0.001)), workload)]
        info = sweep.sweep_info(exp, [4096], [sweep.SizeRun(4096, None, metrics_of(4096, 1))],
                                4000.0)
        assert rows[0]["redop"] == redop and info["busbw_factor"] == factor
        assert rows[0]["busbw_mb_per_s"] == pytest.approx(4.096 * factor)
        assert f"busbw = algbw * {factor:g}" in sweep.sweep_table(info, rows)


# -- the runs, with a stand-in for testbed.run.run -----------------------------------------
class FakeRuns:
    """testbed.run.run as the sweep sees it: a folder with metrics and flows per size;
    sizes in `fail` fail as a run whose agents died."""

    def __init__(self, fail: tuple[int, ...] = ()):
        self.ran: list[tuple[int, object, str]] = []
        self.fail = fail

    def __call__(self, exp, progress=None, force=True):
        self.ran.append((exp.message_bytes, exp.rate, exp.name))
        folder = new_folder(exp.results_dir, exp.name)
        if exp.message_bytes in self.fail:
            mark_failed(folder, "agent died")
            raise RunFailedError("agent died", folder)
        metrics = metrics_of(exp.message_bytes, exp.message_bytes / 5e6)
        (folder / "metrics.json").write_text(json.dumps(metrics))
        flows_csv(folder, [("r1", "recv", True)])
        return folder, metrics


def sweep_experiment(tmp_path, **settings):
    return from_toml(None, {"name": "t_sweep", "message_bytes": "64K:256K:x2",
                            "results_dir": str(tmp_path), "topology": {
                                "kind": "one_tier", "params": {"nodes": 4, "planes": 1}},
                            **settings})


def test_every_size_runs_in_order_at_one_rate_in_one_folder(tmp_path, monkeypatch):
    fake = FakeRuns()
    monkeypatch.setattr(sweep, "run", fake)
    said: list[str] = []
    folder, runs = sweep.run_sweep(sweep_experiment(tmp_path, rate=50.0), said.append)
    assert fake.ran == [(65536, 50.0, "t_sweep_65536B"), (131072, 50.0, "t_sweep_131072B"),
                        (262144, 50.0, "t_sweep_262144B")]
    assert folder.parent == tmp_path and folder.name.startswith("t_sweep-sweep-")
    assert [r.folder.parent for r in runs] == [folder] * 3
    assert [line for line in said if line.startswith("size ")] == [
        "size 1 of 3: 65536 B", "size 2 of 3: 131072 B", "size 3 of 3: 262144 B"]
    assert not (folder / "FAILED").exists()
    assert from_toml(folder / "config.toml").message_bytes == "64K:256K:x2"
    assert sweep.size_name("a" * 32, 1 << 26) == "a" * 22 + "_67108864B"


def test_a_failed_size_marks_the_sweep_and_the_others_still_run(tmp_path, monkeypatch,
                                                               capsys):
    monkeypatch.setattr(sweep, "run", FakeRuns(fail=(131072,)))
    exp = sweep_experiment(tmp_path)
    assert sweep.main(exp, lambda msg: None, force=True) == 1
    (folder,) = tmp_path.iterdir()
    assert "131072 B (t_sweep_131072B-" in (folder / "FAILED").read_text()
    out = capsys.readouterr()
    rows = data_rows(out.out)
    assert [r[0] for r in rows] == ["65536", "131072", "262144"] * 2
    assert rows[1][4] == "n/a" and rows[2][7] == "0"
    assert "1 of 3 sizes did not complete" in out.err


def test_a_refusal_by_the_first_run_leaves_nothing(tmp_path, monkeypatch):
    def refuse(exp, progress=None, force=True):
        raise SpecError("experiment.rate", "100 Mbit/s is 9x what this machine carries")
    monkeypatch.setattr(sweep, "run", refuse)
    with pytest.raises(SpecError):
        sweep.run_sweep(sweep_experiment(tmp_path, rate=100.0))
    assert list(tmp_path.iterdir()) == []


def test_rate_auto_is_picked_once_for_the_largest_size(tmp_path, monkeypatch):
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(cal(cost_us=10.0)))
    monkeypatch.setattr(rate, "CACHE", path)
    picked = []
    real_pick = sweep.pick_link_rate

    def pick(exp, *args):
        picked.append(exp.message_bytes)
        return real_pick(exp, *args)
    monkeypatch.setattr(sweep, "pick_link_rate", pick)
    fake = FakeRuns()
    monkeypatch.setattr(sweep, "run", fake)
    said: list[str] = []
    results = tmp_path / "res"
    exp = sweep_experiment(results, rate="auto")
    sweep.run_sweep(exp, said.append)
    assert picked == [262144]
    rates = {r for _, r, _ in fake.ran}
    assert len(rates) == 1 and isinstance(rates.pop(), float)
    assert any("for every size (auto, picked for the largest, 262144 B)" in s for s in said)


# -- one sweep on real packets ---------------------------------------------------------------
@pytest.mark.root
def test_a_sweep_runs_every_size_end_to_end(tmp_path, host_untouched):
    results = tmp_path / "res"
    proc = subprocess.Popen(
        [sys.executable, "-m", "testbed", "run", "--topology", "leaf_spine", "--set",
         "leaves=2", "--set", "spines=2", "--set", "hosts_per_leaf=2", "--workload",
         "allreduce", "--ranks", "4", "--iterations", "1", "--message-bytes", "64K:256K:x2",
         "--rate", "100", "--force", "--rto-ms", "200", "--name", "t_sweep", "--results",
         str(results)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        assert netns.named(f"run{proc.pid}") == []
    assert proc.returncode == 0, err
    (folder,) = results.iterdir()
    assert (folder / "sweep.md").read_text() == out            # stdout: the table
    assert "size 3 of 3: 262144 B" in err
    measured = out.split("# scaled to the real fabric")[0]
    rows = data_rows(measured)
    assert len(rows) == 3 and all(len(r) == len(sweep.MEASURED) for r in rows)
    assert [r[7] for r in rows] == ["0", "0", "0"]                 # #wrong
    assert all(float(r[6]) > 0 for r in rows)                      # busbw
    index = (folder / "index.html").read_text()            # the sizes side by side
    assert index.count('class="card"') == 3 and "<table>" not in index.split("<h2>")[-1]
    saved = json.loads((folder / "sweep.json").read_text())
    assert saved["sizes_bytes"] == [r["size_bytes"] for r in saved["rows"]] == \
        [65536, 131072, 262144]
    assert saved["ok"] and saved["link_mbps"] == 100.0
    for row in saved["rows"]:
        metrics = json.loads((folder / row["folder"] / "metrics.json").read_text())
        assert metrics["message_bytes"] == row["size_bytes"] and metrics["ok"]
    assert not (folder / "FAILED").exists()
    assert (folder / "plots" / "busbw.png").stat().st_size > 0
