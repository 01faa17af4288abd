"""The results pages (testbed.page, testbed.page_index): what they hold, from real runs,
and what a real browser shows of them (tests/browser.py; skipped with a reason where no
chromium is installed)."""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testbed import page, page_index, page_model
from testbed.experiment import from_toml
from testbed.results import finish_script
from testbed.run import run
from testbed.split_bars import SPLIT
from topologies.files import build

from . import browser

ROOT = Path(__file__).resolve().parent.parent
NEEDS_BROWSER = pytest.mark.skipif(browser.skip_reason() is not None,
                                   reason=str(browser.skip_reason()))
# where a test keeps its screenshots for a person to look at (else the test's tmp folder)
SHOTS = os.environ.get("AFT_SCREENSHOTS")


# -- without a run ------------------------------------------------------------------

def test_every_port_is_one_directed_link_drawn_once():
    topo = build("leaf_spine", {"leaves": 2, "spines": 2, "hosts_per_leaf": 3})
    fab = page_model.fabric(topo)
    ids = [lk["id"] for lk in fab["links"]]
    assert len(ids) == len(set(ids)) == 2 * topo.graph.number_of_edges()
    for lk in fab["links"]:
        assert lk["ifname"] == topo.ifname(lk["src"], lk["dst"])
    svg = page.fabric_svg(fab)
    assert svg.count('class="link"') == len(ids)
    assert svg.count('class="node"') == topo.graph.number_of_nodes()
    # the two directions of a link are two lines, apart
    one = re.search(r'data-link="leaf0&gt;spine0" x1="([\d.]+)" y1="([\d.]+)"', svg)
    other = re.search(r'data-link="spine0&gt;leaf0" x1="[\d.]+" y1="[\d.]+" '
                      r'x2="([\d.]+)" y2="([\d.]+)"', svg)
    assert one and other and one.groups() != other.groups()


def test_a_mesh_without_switches_is_drawn_on_a_circle():
    topo = build("full_mesh", {"nodes": 4})
    fab = page_model.fabric(topo)
    assert fab["circular"] and len(fab["links"]) == 12
    assert page.fabric_svg(fab).count('class="link"') == 12


def test_nothing_in_a_results_file_becomes_markup():
    text = page.markdown_html("# run\n\n<script>alert(1)</script> `<b>` | a |\n")
    assert "<script>" not in text and "&lt;script&gt;" in text
    data = page._json_script({"name": "</script><script>alert(1)</script>"})
    assert data.count("</script>") == 1 and data.endswith("</script>")


def test_the_colour_scale_runs_from_grey_to_dark_red():
    assert page_index.colour(0) == page_index.colour(-1) == "#d5d8dc"
    assert page_index.colour(1) == page_index.colour(3) == "rgb(128,0,38)"
    assert page_index.colour(1e-6) == "rgb(255,237,160)"


def test_resampling_keeps_counters_and_the_highest_queue():
    pts = [(0.0, {"sent": 0, "drops": 0, "paused": 0.0, "queue": 0}),
           (0.1, {"sent": 100, "drops": 0, "paused": 0.0, "queue": 900}),
           (0.2, {"sent": 300, "drops": 2, "paused": 0.05, "queue": 10}),
           (0.9, {"sent": 400, "drops": 2, "paused": 0.05, "queue": 0})]
    s = page_model._resample(pts, [0.0, 0.5, 1.0])
    assert s["sent"] == [0, 343, 400]     # 300 + 100 x 0.3 / 0.7: spread between samples
    assert s["drops"] == [0, 2, 2]
    assert s["queue"] == [0, 900, 0]      # the 900 between 0 and 0.5 is not lost
    assert page_model._resample(pts, [-1.0])["sent"] == [0]


def test_a_flows_bar_ends_at_its_measured_fct(tmp_path):
    """Causes that overlapped add up past the FCT; the bar is scaled to end at it."""
    head = ["node", "tag", "iteration", "role", "src", "dst", "size_bytes", "fct_s",
            "goodput_mbps", "path", "bottleneck", *SPLIT]
    rows = [["a", "x", "0", "send", "a", "b", "1000", "1.0", "8", "a>s>b", "s>b",
             "0.9", "0.1", "0.5", "0", "0", "0", "0", "-0.5"],
            ["b", "y", "0", "send", "b", "a", "1000", "0.5", "16", "b>s>a", "s>a",
             "0.4", "0.05", "0", "0", "0", "0", "0", "0.05"],
            ["a", "x", "0", "recv", "a", "b", "1000", "", "", "", "", *[""] * 8]]
    with open(tmp_path / "flows.csv", "w", newline="") as fh:
        csv.writer(fh).writerows([head, *rows])
    fl = page_model.flows(tmp_path)
    assert fl["fct_s"] == [0.5, 1.0]
    slow = fl["slowest"][0]
    assert slow["path"] == ["a", "s", "b"] and slow["split_scale"] < 1
    assert sum(slow["split"].values()) == pytest.approx(slow["fct_s"], rel=1e-3)
    bar = page.split_bar(slow, 1.0, width=100.0)
    widths = [float(w) for w in re.findall(r'<rect x="[\d.]+" y="2" width="([\d.]+)"', bar)]
    assert sum(widths) <= 100.0 + 0.5


# -- from real runs ------------------------------------------------------------------

def _settings(tmp: Path, name: str, **extra) -> dict:
    s = {"name": name, "results_dir": str(tmp), "timeout_s": 60.0, "rto_ms": 200.0,
         "topology": {"kind": "leaf_spine",
                      "params": {"leaves": 2, "spines": 2, "hosts_per_leaf": 2}}}
    return {**s, **extra}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A script's folder holding two real runs: an incast with PFC, an all-reduce."""
    if os.geteuid() != 0:
        pytest.skip("builds real namespaces: needs root")
    from .conftest import root_snapshot
    before = root_snapshot()
    folder = tmp_path_factory.mktemp("script")
    incast, _ = run(from_toml(None, _settings(folder, "incast", workload="incast",
                                              pfc="on", message_bytes=1 << 20,
                                              iterations=1)))
    ring, _ = run(from_toml(None, _settings(folder, "ring", workload="allreduce",
                                            message_bytes=256 * 1024, iterations=2)))
    assert root_snapshot() == before
    finish_script(folder, "# a claim\n\n| run | figure |\n|---|---|\n| incast | 1 |\n",
                  {"runs": 2}, [])
    return folder, incast, ring


def _self_contained(text: str) -> None:
    """Nothing fetched from elsewhere: no URL but the SVG namespace, no external script
    or style sheet."""
    urls = set(re.findall(r"https?://[^\s\"'<>)]+", text))
    assert urls <= {"http://www.w3.org/2000/svg"}, urls
    assert not re.search(r"<script[^>]+src=", text)
    assert not re.search(r"<link[^>]+stylesheet", text)


@pytest.mark.root
def test_every_run_and_script_folder_has_its_page(runs):
    folder, incast, ring = runs
    for r in (incast, ring):
        text = (r / "summary.html").read_text()
        _self_contained(text)
        topo = page_model.topology(r)
        assert text.count('class="link"') == 2 * topo.graph.number_of_edges()
        # summary.md inside it: each of its sections a heading
        for line in (r / "summary.md").read_text().splitlines():
            if line.startswith("## "):
                assert f"<h2>{line[3:]}</h2>" in text, line
        assert "Did the emulator keep up?" in text
    assert "<h2>Expected vs measured</h2>" in (incast / "summary.html").read_text()
    index = (folder / "index.html").read_text()
    _self_contained(index)
    assert index.count('class="card"') == 2
    assert f'href="{incast.name}/summary.html"' in index
    assert "<table>" in index        # the script's own table, rendered
    # the incast's data: the receiver's port carried the bytes, PFC's samples are used
    model = page_model.run_model(incast)
    assert model["series"]["source"] == "pfc_timeline.csv"
    busiest = max(model["totals"], key=lambda k: model["totals"][k]["bytes"])
    assert busiest.startswith("leaf") and model["totals"][busiest]["bytes"] >= 1 << 20


@pytest.mark.root
def test_report_rewrites_the_pages_and_prints_their_url(runs):
    folder, incast, _ = runs
    for p in (incast / "summary.html", folder / "index.html"):
        p.unlink()
    out = subprocess.run([sys.executable, "-m", "testbed", "report", str(incast), "--open"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"page: {(incast / 'summary.html').as_uri()}" in out.stdout
    out = subprocess.run([sys.executable, "-m", "testbed", "report", str(folder)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"page: {folder / 'index.html'}" in out.stdout
    assert (folder / "index.html").exists() and (incast / "summary.html").exists()


def _shot(tmp_path: Path, name: str) -> Path:
    where = Path(SHOTS) if SHOTS else tmp_path
    where.mkdir(parents=True, exist_ok=True)
    return where / name


@pytest.mark.root
@NEEDS_BROWSER
def test_a_browser_shows_the_run_and_its_links_series(runs, tmp_path):
    _, incast, _ = runs
    model = page_model.run_model(incast)
    n_links = len(model["fabric"]["links"])
    with browser.Browser() as b:
        b.open((incast / "summary.html").as_uri())
        assert b.evaluate("document.querySelectorAll('#fabric .link').length") == n_links
        # the busiest link is coloured, an idle one grey
        busiest = max(model["fabric"]["links"],
                      key=lambda lk: model["totals"][lk["ifname"]]["bytes"])["id"]
        sel = f'#fabric .link[data-link="{busiest}"]'
        assert b.evaluate(f"document.querySelector('{sel}').getAttribute('stroke')") \
            != "#d5d8dc"
        b.click(sel)
        b.wait_for("!!document.querySelector('#detail svg.chart.rate polyline')")
        points = b.evaluate("document.querySelector('#detail svg.chart.rate polyline')"
                            ".getAttribute('points').split(' ').length")
        assert points == len(model["series"]["t"])
        assert busiest.replace(">", " → ") in b.evaluate(
            "document.querySelector('#detail h3').textContent")
        # another metric, another time: the colours follow
        before = b.evaluate("[...document.querySelectorAll('#fabric .link')]"
                            ".map(x => x.getAttribute('stroke')).join()")
        b.evaluate("(() => { const m = document.getElementById('metric'); m.value = "
                   "'bytes'; m.dispatchEvent(new Event('change')); })()")
        b.evaluate("(() => { const s = document.getElementById('slider'); s.value = '1'; "
                   "s.dispatchEvent(new Event('input')); })()")
        assert "t = " in b.evaluate("document.getElementById('slider-time').textContent")
        after = b.evaluate("[...document.querySelectorAll('#fabric .link')]"
                           ".map(x => x.getAttribute('stroke')).join()")
        assert after != before
        # a node lists its ports; a flow highlights its path
        b.click('#fabric .node[data-node="leaf0"]')
        rows = b.evaluate("document.querySelectorAll('#detail table tr').length")
        leaf0 = next(n for n in model["fabric"]["nodes"] if n["id"] == "leaf0")
        assert rows == 1 + len(leaf0["ports"])
        b.click("#slowest tr.flow")
        path = model["flows"]["slowest"][0]["path"]
        assert b.evaluate("document.querySelectorAll('#fabric .link.onpath').length") \
            == len(path) - 1
        b.click(sel)
        b.evaluate("window.scrollTo(0, 0)")
        shot = b.screenshot(_shot(tmp_path, "run_page.png"))
        assert b.errors == []
    assert browser.not_blank(shot)


@pytest.mark.root
@NEEDS_BROWSER
def test_a_browser_shows_the_scripts_runs_side_by_side(runs, tmp_path):
    folder, _, _ = runs
    with browser.Browser() as b:
        b.open((folder / "index.html").as_uri())
        assert b.evaluate("document.querySelectorAll('#runs .card').length") == 2
        per_card = b.evaluate("[...document.querySelectorAll('#runs .card')]"
                              ".map(c => c.querySelectorAll('.link').length)")
        assert per_card == [16, 16]      # 2 leaves x 2 spines + 4 hosts, both directions
        href = b.evaluate("document.querySelector('#runs .card a').href")
        shot = b.screenshot(_shot(tmp_path, "index_page.png"))
        assert b.errors == []
        b.open(href)                     # the link opens the run's page
        assert b.evaluate("document.querySelectorAll('#fabric .link').length") == 16
        assert b.errors == []
    assert browser.not_blank(shot)


def test_report_refuses_a_folder_with_a_damaged_page_source(tmp_path):
    """A script folder whose run lost its config.toml's topology is one line, exit 2."""
    run_dir = tmp_path / "script" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.json").write_text("{}")
    (run_dir / "config.toml").write_text("[experiment\n")
    out = subprocess.run([sys.executable, "-m", "testbed", "report", str(tmp_path / "script")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "folder" in lines[0], out.stderr
    shutil.rmtree(tmp_path / "script")
