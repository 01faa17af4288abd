"""Draw a topology spec as a PNG: layered like a network diagram. No root needed.

Spines (or planes) on top, leaves below them, endpoints (GPUs, CPUs) below those,
grouped by server (or by leaf), and each NVSwitch under its server's GPUs. A topology
without switches (full mesh) is drawn on a circle. Uses matplotlib's Agg canvas
directly, so it never opens a window and leaves pyplot's global state alone.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from itertools import pairwise
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from testbed.outputs import make_folder
from topologies import units
from topologies.spec import ENDPOINT_ROLES, SWITCH_ROLES, SpecError, Topology

ROLE_COLORS = {"spine": "#b03a2e", "plane": "#b7950b", "leaf": "#1b4f72",
               "gpu": "#76b900", "cpu": "#aab7b8", "nvswitch": "#424949"}
LAYERS = [("spine", "plane"), ("leaf",), ("gpu", "cpu"), ("nvswitch",)]  # top to bottom
TECH_STYLES = {"nvlink": {"color": "#2e8b3e", "width": 2.6},
               "laser": {"color": "#2e86c1", "width": 1.2},
               "copper": {"color": "#e67e22", "width": 1.4},
               "microled": {"color": "#8e44ad", "width": 1.2}}
LABEL_ALL_MAX = 40  # above this many nodes only switches get labels
MAX_WIDTH_IN, MIN_WIDTH_IN, SLOT_IN = 24.0, 8.0, 0.62
DPI = 120


def _natural(name: str) -> tuple:
    """'s10g2' sorts after 's9g2'."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def _real_rate(rate_mbps: float, scale: float) -> str:
    return units.rate_text(units.real_mbps(rate_mbps, scale))


def rate_text(topo: Topology) -> str:
    """'100 Mbit/s emulated = 400 Gb/s real at x4000; leaf-spine 400 Mbit/s = 1.6 Tb/s'."""
    net: Counter = Counter()
    where: dict[float, set[str]] = {}
    for a, b, d in topo.graph.edges(data=True):
        rate = d["rate_mbps"]
        if d["tech"] != "nvlink":
            net[rate] += 1
        pair = sorted((topo.role(a), topo.role(b)), key=lambda r: -list(ROLE_COLORS).index(r))
        where.setdefault(rate, set()).add("NVLink" if d["tech"] == "nvlink" else "-".join(pair))
    s = topo.scale_factor
    main = float(topo.params.get("rate_mbps") or (net.most_common(1)[0][0] if net else
                                                  min(where)))
    parts = [f"{main:g} Mbit/s emulated = {_real_rate(main, s)} real at x{s:g}"]
    parts += [f"{', '.join(sorted(where[r]))} {r:g} Mbit/s = {_real_rate(r, s)}"
              for r in sorted(where) if r != main]
    return "; ".join(parts)


def _group(topo: Topology, node: str) -> tuple:
    """Endpoints sit together by server, else by the single switch they hang off."""
    server = topo.graph.nodes[node].get("server")
    if server is not None:
        return (0, server)
    ups = sorted((n for n in topo.graph.adj[node] if topo.role(n) in SWITCH_ROLES),
                 key=_natural)
    return (1, _natural(ups[0])) if len(ups) == 1 else (2,)


def layered_positions(topo: Topology) -> tuple[dict[str, tuple[float, float]], float]:
    """Node -> (x, y) in slot units, and the width in slots of the widest layer."""
    layers = [sorted((n for r in roles for n in topo.nodes_with_role(r)), key=_natural)
              for roles in LAYERS]
    layers = [layer for layer in layers if layer]
    ends = sorted(topo.endpoints(), key=lambda n: (_group(topo, n), _natural(n)))
    ex: dict[str, float] = {}
    x, prev = 0.0, None
    for n in ends:
        g = _group(topo, n)
        x += 0.0 if prev is None else (1.0 if g == prev else 2.0)  # one empty slot per group
        ex[n], prev = x, g
    width = max([x + 1] + [len(layer) for layer in layers])
    shift = (width - 1 - x) / 2  # centre the endpoints under the switches
    pos: dict[str, tuple[float, float]] = {}
    for depth, layer in enumerate(layers):
        y = float(len(layers) - 1 - depth)
        if topo.role(layer[0]) in ENDPOINT_ROLES:
            pos.update({n: (ex[n] + shift, y) for n in layer})
            continue
        xs = [(i + 0.5) * width / len(layer) - 0.5 for i in range(len(layer))]
        # A switch serving exactly one endpoint group (NVSwitch, ToR leaf) sits over it.
        under = {}
        for n in layer:
            down = [m for m in topo.graph.adj[n] if m in ex]
            if down and len({_group(topo, m) for m in down}) == 1:
                under[n] = sum(ex[m] for m in down) / len(down) + shift
        if len(under) == len(layer) and len(set(under.values())) == len(layer):
            xs = [under[n] for n in layer]
        pos.update({n: (xv, y) for n, xv in zip(layer, xs, strict=True)})
    return pos, float(width)


def circular_positions(topo: Topology) -> dict[str, tuple[float, float]]:
    """Node -> (x, y) on the unit circle, first node at the top, clockwise."""
    nodes = sorted(topo.graph.nodes, key=_natural)
    step = 2 * math.pi / len(nodes)
    return {n: (math.sin(i * step), math.cos(i * step)) for i, n in enumerate(nodes)}


def _text_color(color: str) -> str:
    r, g, b = to_rgb(color)
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "white"


def draw(topo: Topology, path: str | Path, title: str | None = None) -> Path:
    """Write a PNG drawing of `topo` to `path` (parent directories are created)."""
    path = Path(path)
    if path.is_dir():
        raise SpecError("output", f"{path} is a folder; name the PNG file to write")
    make_folder("output", path.parent)
    g = topo.graph
    n_nodes = g.number_of_nodes()
    circular = not topo.switches()
    if circular:
        pos, width = circular_positions(topo), 2.0
        side = min(14.0, max(7.0, 4 + 0.15 * n_nodes))
        size, slot_pt = (side, side), 72 * side * 3.2 / max(n_nodes, 3)
    else:
        pos, width = layered_positions(topo)
        n_layers = len({y for _, y in pos.values()})
        w_in = min(MAX_WIDTH_IN, max(MIN_WIDTH_IN, SLOT_IN * width + 1.5))
        size, slot_pt = (w_in, 1.7 * n_layers + 1.2), 72 * (w_in - 1) / width
    fig = Figure(figsize=size, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_axis_off()
    big = n_nodes > LABEL_ALL_MAX
    thin = (0.6 if big else 1.0) * (0.5 if g.number_of_edges() > 500 else 1.0)
    techs = Counter(d["tech"] for _, _, d in g.edges(data=True))
    for tech in sorted(techs):
        style = TECH_STYLES[tech]
        segs = [(pos[a], pos[b]) for a, b, d in g.edges(data=True) if d["tech"] == tech]
        ax.add_collection(LineCollection(
            segs, colors=style["color"], linewidths=style["width"] * thin,
            alpha=0.55 if big else 0.85, zorder=1))
    roles = Counter(d["role"] for _, d in g.nodes(data=True))
    longest = max(len(str(n)) for n in g.nodes)
    font = max(5.0, min(9.0, 0.85 * slot_pt / (0.7 * longest + 0.7)))  # bold box fits slot
    for role in roles:
        nodes = [n for n in g.nodes if g.nodes[n]["role"] == role]
        color = ROLE_COLORS[role]
        if big and role in ENDPOINT_ROLES:
            ax.scatter([pos[n][0] for n in nodes], [pos[n][1] for n in nodes],
                       s=min(60.0, (0.6 * slot_pt) ** 2), c=color, edgecolors="black",
                       linewidths=0.4, zorder=3)
            continue
        sw_font = font
        if big:  # switches only: size the label to the gap between this row's switches
            row = sorted(pos[n][0] for n in nodes)
            gap = min([b - a for a, b in pairwise(row)] or [width]) * slot_pt
            sw_font = max(5.0, min(9.0, 0.85 * gap / (0.7 * max(map(len, nodes)) + 0.7)))
        for n in nodes:
            ax.text(*pos[n], str(n), ha="center", va="center", fontsize=sw_font,
                    color=_text_color(color), zorder=3, fontweight="bold",
                    bbox={"boxstyle": "round,pad=0.35", "fc": color, "ec": "black",
                          "lw": 0.6})
    xs = [p[0] for p in pos.values()]
    ys = [p[1] for p in pos.values()]
    pad = 0.25 if circular else 0.6
    ax.set_xlim(min(xs) - pad, max(xs) + pad)
    ax.set_ylim(min(ys) - (0.25 if circular else 0.4), max(ys) + (0.25 if circular else 0.4))
    role_handles = [Line2D([], [], ls="", marker="o" if big and r in ENDPOINT_ROLES else "s",
                           ms=10, mfc=ROLE_COLORS[r], mec="black", label=f"{r} ({roles[r]})")
                    for r in sorted(roles, key=list(ROLE_COLORS).index)]
    tech_handles = [Line2D([], [], color=TECH_STYLES[t]["color"], lw=TECH_STYLES[t]["width"],
                           label=f"{t} ({techs[t]})") for t in sorted(techs)]
    legend = ax.legend(handles=role_handles, title="nodes", loc="upper left", fontsize=9,
                       bbox_to_anchor=(0.0, 0.0), ncol=len(role_handles), frameon=False)
    ax.add_artist(legend)
    ax.legend(handles=tech_handles, title="links", loc="upper right", fontsize=9,
              bbox_to_anchor=(1.0, 0.0), ncol=len(tech_handles), frameon=False)
    name = topo.name if topo.name == topo.kind else f"{topo.name} ({topo.kind})"
    head = title or f"{name}: {n_nodes} nodes, {g.number_of_edges()} links"
    ax.set_title(f"{head}\n{rate_text(topo)}", fontsize=12)
    try:
        fig.savefig(path, format="png", dpi=DPI, bbox_inches="tight", pad_inches=0.2,
                    facecolor="white")
    except OSError as exc:
        raise SpecError("output", f"{path} cannot be written: {exc.strerror}") from None
    return path
