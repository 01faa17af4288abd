"""testbed.draw: every builder (small) and rail128 draw to a real, non-blank PNG. No root."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.figure import Figure
from matplotlib.image import imread

import topologies
from testbed.draw import LABEL_ALL_MAX, draw, layered_positions, rate_text

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
    out = draw(topo, tmp_path / "sub" / f"{kind}.png")
    assert out == tmp_path / "sub" / f"{kind}.png"
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
    labelled = sorted(t.get_text() for t in ax.texts)
    if g.number_of_nodes() > LABEL_ALL_MAX:
        assert labelled == sorted(set(g.nodes) - endpoints) and dots == len(endpoints)
    else:
        assert labelled == sorted(g.nodes) and dots == 0
    assert ax.get_title().startswith(f"{topo.name}")
    assert f"{g.number_of_nodes()} nodes, {g.number_of_edges()} links" in ax.get_title()


def test_draw_accepts_str_path_and_title(tmp_path: Path, figures: list[Figure]) -> None:
    out = draw(topologies.leaf_spine(), str(tmp_path / "ls.png"), title="my fabric")
    assert out == tmp_path / "ls.png"
    check_png(out)
    assert figures[0].axes[0].get_title().startswith("my fabric\n100 Mbit/s emulated")


def test_rail128_is_wide(tmp_path: Path) -> None:
    topo = topologies.resolve("rail128")
    out = draw(topo, tmp_path / "rail128.png")
    image = check_png(out)
    assert image.shape[1] > image.shape[0]  # a wide fabric makes a wide picture


def test_layers_top_to_bottom() -> None:
    topo = topologies.rail_optimized(2, 2, 2)
    pos, width = layered_positions(topo)
    rows = {role: {pos[n][1] for n in topo.nodes_with_role(role)} for role in
            ("spine", "leaf", "gpu", "nvswitch")}
    assert all(len(v) == 1 for v in rows.values())  # one row per role
    y = {role: v.pop() for role, v in rows.items()}
    assert y["spine"] > y["leaf"] > y["gpu"] > y["nvswitch"]
    assert width >= 4
    # A server's GPUs sit together, and its NVSwitch sits under them.
    for s in range(2):
        gpu_x = [pos[f"s{s}g{k}"][0] for k in range(2)]
        assert min(gpu_x) <= pos[f"nvs{s}"][0] <= max(gpu_x)
    assert max(pos[f"s0g{k}"][0] for k in range(2)) < min(pos[f"s1g{k}"][0] for k in range(2))


def test_rate_text_states_the_scale() -> None:
    text = rate_text(topologies.resolve("rail128"))
    assert text.startswith("100 Mbit/s emulated = 400 Gb/s real at x4000")
    assert "NVLink 900 Mbit/s = 3.6 Tb/s" in text
    assert "leaf-spine 400 Mbit/s = 1.6 Tb/s" in text
