"""testbed.draw: every builder (small) and rail128 draw to a real, non-blank PNG. No root."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

import topologies
from testbed.draw import draw, layered_positions, rate_text

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


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_draw_writes_png(tmp_path: Path, kind: str) -> None:
    topo = SMALL[kind]()
    out = draw(topo, tmp_path / "sub" / f"{kind}.png")
    assert out == tmp_path / "sub" / f"{kind}.png"
    check_png(out)


def test_draw_accepts_str_path_and_title(tmp_path: Path) -> None:
    out = draw(topologies.leaf_spine(), str(tmp_path / "ls.png"), title="my fabric")
    assert isinstance(out, Path)
    check_png(out)


def test_rail128_is_fast_and_wide(tmp_path: Path) -> None:
    topo = topologies.resolve("rail128")
    start = time.perf_counter()
    out = draw(topo, tmp_path / "rail128.png")
    assert time.perf_counter() - start < 5.0
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
