"""testbed.draw and testbed.diagram_text: every builder (small) and rail128 draw to a real,
non-blank PNG; SVG, PDF, DOT and Mermaid carry the same fabric; bad outputs are refused
in one line with nothing written. No root."""

from __future__ import annotations

import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.figure import Figure
from matplotlib.image import imread

import topologies
from testbed.diagram_text import mermaid_id, to_dot, to_mermaid
from testbed.draw import LABEL_ALL_MAX, draw, layered_positions, nvswitch_rule, rate_text

ROOT = Path(__file__).resolve().parent.parent

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

SMALL = {
    "rail_optimized": lambda: topologies.rail_optimized(2, 2, 2),
    "rail_only": lambda: topologies.rail_only(2, 2),
    "one_tier": lambda: topologies.one_tier(4, 2),
    "full_mesh": lambda: topologies.full_mesh(4),
    "leaf_spine": lambda: topologies.leaf_spine(2, 2, 2),
    "rail128": lambda: topologies.resolve("rail128"),
}


def check_png(path: Path) -> np.ndarray:
    assert path.exists()
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = imread(path)
    height, width = image.shape[:2]
    assert 300 <= width <= 24 * 120 + 200 and 300 <= height <= 2000, image.shape
    rgb = image[..., :3]
    assert float(rgb.std()) > 0.01, "image is a single flat colour"
    return image


@pytest.fixture
def figures(monkeypatch) -> list[Figure]:
    """The figures draw() makes, kept to look into."""
    made: list[Figure] = []

    class Kept(Figure):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr("testbed.draw.Figure", Kept)
    return made


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_draw_writes_png(tmp_path: Path, kind: str, figures: list[Figure]) -> None:
    topo = SMALL[kind]()
    out = draw(topo, tmp_path / f"{kind}.png")
    assert out == tmp_path / f"{kind}.png"
    check_png(out)
    (fig,) = figures
    (ax,) = fig.axes
    g = topo.graph
    # every link is a line; every node a label, or above LABEL_ALL_MAX nodes an endpoint
    # is a dot and only switches are labelled
    lines = [c for c in ax.collections if isinstance(c, LineCollection)]
    assert sum(len(c.get_segments()) for c in lines) == g.number_of_edges()
    dots = sum(len(c.get_offsets()) for c in ax.collections if isinstance(c, PathCollection))
    endpoints = set(topo.endpoints())
    # every node is named (a big fabric's endpoints under their dots as well)
    names = sorted(t.get_text() for t in ax.texts if (t.get_gid() or "").startswith("node-"))
    assert names == sorted(g.nodes)
    assert dots == (len(endpoints) if g.number_of_nodes() > LABEL_ALL_MAX else 0)
    # port labels are real switch interfaces, each on the link it names
    ports = [t for t in ax.texts if (t.get_gid() or "").startswith("port-")]
    for t in ports:
        node, k = t.get_text().rsplit("-eth", 1)
        assert topo.role(node) not in ("gpu", "cpu")
        assert topo.ifname(node, topo.ports(node)[int(k)]) == t.get_text()
    if topo.switches():
        assert ports, "no switch port is named"
    assert ax.get_title().startswith(f"{topo.name}")
    assert f"{g.number_of_nodes()} nodes, {g.number_of_edges()} links" in ax.get_title()


def test_draw_accepts_str_path_and_title(tmp_path: Path, figures: list[Figure]) -> None:
    out = draw(topologies.leaf_spine(), str(tmp_path / "ls.png"), title="my fabric")
    assert out == tmp_path / "ls.png"
    check_png(out)
    assert figures[0].axes[0].get_title().startswith("my fabric\n100 Mbit/s emulated")


def test_rail128_is_wide_and_names_its_ports(tmp_path: Path, figures: list[Figure]) -> None:
    topo = topologies.resolve("rail128")
    out = draw(topo, tmp_path / "rail128.png")
    image = check_png(out)
    assert image.shape[1] > image.shape[0]  # a wide fabric makes a wide picture
    (ax,) = figures[0].axes
    ports = {t.get_text() for t in ax.texts if (t.get_gid() or "").startswith("port-")}
    leaf_down = {p for p in ports if p.startswith("leaf") and int(p.rsplit("eth")[1]) < 16}
    assert len(leaf_down) >= 8 * 6, sorted(leaf_down)   # most leaves' GPU ports, readable
    assert not any(p.startswith("nvs") for p in ports)  # named by the rule in the title
    assert nvswitch_rule(topo) in ax.get_title()
    # one legend entry per link class, with its rate
    texts = [t.get_text() for legend in (ax.get_legend(), *ax.artists) if legend
             for t in legend.get_texts()]
    assert "gpu-leaf laser: 100 Mbit/s = 400 Gb/s (128)" in texts
    assert "leaf-spine laser: 400 Mbit/s = 1.6 Tb/s (32)" in texts


@pytest.mark.parametrize("kind", ["rail_optimized", "rail128"])
def test_rail_fabrics_sit_by_rail_then_server(kind: str) -> None:
    topo = topologies.resolve(kind)
    pos, _ = layered_positions(topo)
    nodes = topo.graph.nodes
    gpus = sorted(topo.nodes_with_role("gpu"), key=lambda n: pos[n][0])
    assert [(nodes[n]["rail"], nodes[n]["server"]) for n in gpus] == sorted(
        (nodes[n]["rail"], nodes[n]["server"]) for n in gpus)
    for leaf in topo.nodes_with_role("leaf"):   # each rail's leaf over its GPUs
        xs = [pos[n][0] for n in topo.ports(leaf) if n in nodes and nodes[n]["role"] == "gpu"]
        assert min(xs) <= pos[leaf][0] <= max(xs)


def test_layers_top_to_bottom() -> None:
    topo = topologies.rail_optimized(2, 2, 2)
    pos, width = layered_positions(topo)
    rows = {role: {pos[n][1] for n in topo.nodes_with_role(role)} for role in
            ("spine", "leaf", "gpu", "nvswitch")}
    assert all(len(v) == 1 for v in rows.values())  # one row per role
    y = {role: v.pop() for role, v in rows.items()}
    assert y["spine"] > y["leaf"] > y["gpu"] > y["nvswitch"]
    assert width >= 4
    # Rail k's GPUs sit together under leaf k, server by server.
    for k in range(2):
        gpu_x = [pos[f"s{s}g{k}"][0] for s in range(2)]
        assert gpu_x == sorted(gpu_x)
        assert min(gpu_x) <= pos[f"leaf{k}"][0] <= max(gpu_x)
    assert max(pos[f"s{s}g0"][0] for s in range(2)) < min(pos[f"s{s}g1"][0] for s in range(2))


def test_one_tier_groups_by_server() -> None:
    """Endpoints without rails still sit by server (or by the switch they hang off)."""
    topo = topologies.leaf_spine(2, 2, 2)
    pos, _ = layered_positions(topo)
    for leaf in topo.nodes_with_role("leaf"):
        xs = [pos[n][0] for n in topo.ports(leaf) if topo.role(n) not in ("spine",)]
        assert min(xs) <= pos[leaf][0] <= max(xs)


def test_rate_text_states_the_scale() -> None:
    text = rate_text(topologies.resolve("rail128"))
    assert text.startswith("100 Mbit/s emulated = 400 Gb/s real at x4000")
    assert "NVLink 900 Mbit/s = 3.6 Tb/s" in text
    assert "leaf-spine 400 Mbit/s = 1.6 Tb/s" in text


# -- formats -------------------------------------------------------------------------
def test_svg_is_xml_with_hover_titles(tmp_path: Path) -> None:
    topo = topologies.rail_optimized(2, 2, 2)
    out = draw(topo, tmp_path / "f.svg")
    root = ET.parse(out).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    titles = {t.text for t in root.iter("{http://www.w3.org/2000/svg}title")}
    assert any(t.startswith("s0g0 (gpu, server 0, rail 0): s0g0-eth0 -> nvs0") for t in titles)
    assert any(t.startswith(f"leaf0-eth0 -> s0g0 ({topo.ifname('s0g0', 'leaf0')}): 100 Mbit/s")
               for t in titles)


def test_pdf_and_png_are_what_they_say(tmp_path: Path) -> None:
    topo = topologies.leaf_spine(2, 2, 2)
    assert draw(topo, tmp_path / "f.pdf").read_bytes()[:5] == b"%PDF-"
    assert draw(topo, tmp_path / "f.PNG").read_bytes()[:8] == PNG_SIGNATURE


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_dot_has_every_node_and_link(kind: str, tmp_path: Path) -> None:
    topo = SMALL[kind]()
    text = to_dot(topo)
    assert text.startswith(f'graph "{topo.name}" {{') and text.rstrip().endswith("}")
    assert text.count("{") == text.count("}")
    nodes = set(re.findall(r'^\s+"(\w+)" \[role=', text, re.M))
    assert nodes == set(topo.graph.nodes)
    edges = re.findall(r'^\s+"(\w+)" -- "(\w+)" \[label="([\d.]+) Mbit/s", '
                       r'taillabel="([\w-]+)", headlabel="([\w-]+)"', text, re.M)
    assert len(edges) == topo.graph.number_of_edges()
    for a, b, rate, tail, head in edges:
        assert topo.graph.has_edge(a, b)
        assert float(rate) == topo.graph.edges[a, b]["rate_mbps"]
        assert (tail, head) == (topo.ifname(a, b), topo.ifname(b, a))
    try:
        import pydot  # noqa: F401  (networkx reads DOT through it)
    except ImportError:
        return  # without pydot the structure check above stands
    from networkx.drawing.nx_pydot import read_dot
    path = tmp_path / "f.dot"
    path.write_text(text)
    parsed = read_dot(path)
    assert set(parsed.nodes) == set(topo.graph.nodes)
    assert parsed.number_of_edges() == topo.graph.number_of_edges()


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_mermaid_has_every_node_and_link(kind: str) -> None:
    topo = SMALL[kind]()
    text = to_mermaid(topo)
    assert text.startswith("flowchart TB\n")
    declared = set(re.findall(r'^\s+(\w+)\["(\w+)"\]$', text, re.M))
    assert declared == {(mermaid_id(n), n) for n in topo.graph.nodes}
    links = re.findall(r'^\s+(\w+) ---\|"([\w-]+) / ([\w-]+), [\d.]+ Mbit/s"\| (\w+)$',
                       text, re.M)
    assert len(links) == topo.graph.number_of_edges()
    assert {frozenset((a, b)) for a, _, _, b in links} == {
        frozenset((mermaid_id(a), mermaid_id(b))) for a, b in topo.graph.edges}
    assert mermaid_id("end") == "end_" and mermaid_id("leaf0") == "leaf0"


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_cli_text_to_stdout_and_to_a_file(tmp_path: Path) -> None:
    out = run_cli("graph", "leaf_spine", "--format", "mermaid", "-o", "-")
    assert out.returncode == 0 and out.stdout.startswith("flowchart")
    out = run_cli("graph", "leaf_spine", "--format", "dot")
    assert out.returncode == 0 and out.stdout.startswith('graph "leaf_spine"')
    path = tmp_path / "f.dot"
    out = run_cli("graph", "leaf_spine", "--format", "dot", "-o", str(path))
    assert out.returncode == 0 and path.read_text().startswith('graph "leaf_spine"')


def test_cli_draws_an_experiment_with_its_settings(tmp_path: Path) -> None:
    exp = tmp_path / "e.toml"
    exp.write_text('[experiment]\nname = "x"\nrate = 25\ntopology = "leaf_spine"\n')
    out = run_cli("graph", str(exp), "--format", "dot")
    assert out.returncode == 0, out.stderr
    assert '"leaf0" -- ' in out.stdout and 'label="25 Mbit/s"' in out.stdout
    assert 'label="100 Mbit/s"' not in out.stdout     # the experiment's rate applied


@pytest.mark.parametrize(("args", "words"), [
    (["-o", "{d}/x.txt"], "--output: {d}/x.txt ends in .txt; allowed: .png, .svg, .pdf"),
    (["-o", "{d}/x"], "ends in no suffix; allowed"),
    (["-o", "{d}/none/x.svg"], "--output: {d}/none does not exist: the folder must exist"),
    (["--format", "dot", "-o", "{d}/none/x.dot"], "{d}/none does not exist"),
    (["--format", "mermaid", "-o", "{d}/x.png"], "names a picture"),
    (["-o", "-"], "'-' (stdout) is for text"),
])
def test_cli_refuses_a_bad_output_writing_nothing(tmp_path: Path, args, words) -> None:
    out = run_cli("graph", "leaf_spine", *[a.format(d=tmp_path) for a in args])
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert lines[0].startswith("testbed graph: --output: ")
    assert words.format(d=tmp_path) in lines[0]
    assert list(tmp_path.iterdir()) == [] and out.stdout == ""
