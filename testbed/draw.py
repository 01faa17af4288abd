"""Draw a topology spec as a PNG, SVG or PDF (the output's suffix says which): layered like
a network diagram. No root needed.

Spines (or planes) on top, leaves below them, endpoints (GPUs, CPUs) below those, and
NVSwitches at the bottom. On a rail fabric the GPUs are grouped by rail (GPU index),
then by server, each rail under its leaf; elsewhere by server (or by leaf). A topology
without switches (full mesh) is drawn on a circle. Every node is named (on big fabrics
the endpoints' names are turned upright under their dots); a switch's port carries its
interface name (leaf0-eth3, what `--pcap` takes) on its link where there is room for it;
each link class (the roles it joins, its technology, its rate) has a line width and a
legend entry with its emulated and real rate. In SVG, hovering a node or a port label
shows its ports and peers (a <title>). Uses matplotlib's figure canvases directly, so it
never opens a window and leaves pyplot's global state alone.
"""

from __future__ import annotations

import io
import math
import re
import xml.etree.ElementTree as ET
from collections import Counter
from itertools import pairwise
from pathlib import Path

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from testbed.outputs import check_output_file
from topologies import units
from topologies.spec import ENDPOINT_ROLES, SWITCH_ROLES, SpecError, Topology

ROLE_COLORS = {"spine": "#b03a2e", "plane": "#b7950b", "leaf": "#1b4f72",
               "gpu": "#76b900", "cpu": "#aab7b8", "nvswitch": "#424949"}
LAYERS = [("spine", "plane"), ("leaf",), ("gpu", "cpu"), ("nvswitch",)]  # top to bottom
TECH_STYLES = {"nvlink": {"color": "#2e8b3e", "width": 1.6},
               "laser": {"color": "#2e86c1", "width": 1.2},
               "copper": {"color": "#e67e22", "width": 1.4},
               "microled": {"color": "#8e44ad", "width": 1.2}}
LABEL_ALL_MAX = 40  # above this many nodes endpoints are dots, named upright below
IMAGE_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}   # suffix -> canvas format
PORT_FONT_PT = 5.5
PORT_SPOTS = {"down": (0.72, 0.82, 0.58, 0.45, 0.32), "up": (0.22, 0.32, 0.42)}  # from switch
SVG_NS = "http://www.w3.org/2000/svg"
MAX_WIDTH_IN, MIN_WIDTH_IN, SLOT_IN = 24.0, 8.0, 0.62
DPI = 120


def natural_key(name: str) -> tuple:
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


def rail_fabric(topo: Topology) -> bool:
    """Leaves, and every endpoint has a server and a rail (rail_optimized, rail_only)."""
    nodes = topo.graph.nodes
    return bool(topo.nodes_with_role("leaf")) and all(
        nodes[n].get("server") is not None and nodes[n].get("rail") is not None
        for n in topo.endpoints())


def _group(topo: Topology, node: str, by_rail: bool = False) -> tuple:
    """Endpoints sit together by rail (`by_rail`), else by server, else by the single
    switch they hang off."""
    data = topo.graph.nodes[node]
    if by_rail:
        return (0, data["rail"])
    if data.get("server") is not None:
        return (0, data["server"])
    ups = sorted((n for n in topo.graph.adj[node] if topo.role(n) in SWITCH_ROLES),
                 key=natural_key)
    return (1, natural_key(ups[0])) if len(ups) == 1 else (2,)


def layered_positions(topo: Topology) -> tuple[dict[str, tuple[float, float]], float]:
    """Node -> (x, y) in slot units, and the width in slots of the widest layer."""
    layers = [sorted((n for r in roles for n in topo.nodes_with_role(r)), key=natural_key)
              for roles in LAYERS]
    layers = [layer for layer in layers if layer]
    by_rail = rail_fabric(topo)
    ends = sorted(topo.endpoints(), key=lambda n: (_group(topo, n, by_rail),
                                                   topo.graph.nodes[n].get("server") or 0,
                                                   natural_key(n)))
    ex: dict[str, float] = {}
    x, prev = 0.0, None
    for n in ends:
        g = _group(topo, n, by_rail)
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
            if down and len({_group(topo, m, by_rail) for m in down}) == 1:
                under[n] = sum(ex[m] for m in down) / len(down) + shift
        if len(under) == len(layer) and len(set(under.values())) == len(layer):
            xs = [under[n] for n in layer]
        pos.update({n: (xv, y) for n, xv in zip(layer, xs, strict=True)})
    return pos, float(width)


def circular_positions(topo: Topology) -> dict[str, tuple[float, float]]:
    """Node -> (x, y) on the unit circle, first node at the top, clockwise."""
    nodes = sorted(topo.graph.nodes, key=natural_key)
    step = 2 * math.pi / len(nodes)
    return {n: (math.sin(i * step), math.cos(i * step)) for i, n in enumerate(nodes)}


def _text_color(color: str) -> str:
    r, g, b = to_rgb(color)
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "white"


def image_format(path: Path, field: str = "--output") -> str:
    """The canvas format the path's suffix names; SpecError naming `field` otherwise."""
    fmt = IMAGE_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise SpecError(field, f"{path} ends in {path.suffix or 'no suffix'}; allowed: "
                        f"{', '.join(IMAGE_FORMATS)} (or --format dot|mermaid for text)")
    return fmt


def link_class(topo: Topology, a: str, b: str) -> tuple[str, str, float]:
    """('gpu-leaf', 'laser', 100.0): the roles a link joins (upper layer last), its
    technology and rate."""
    d = topo.graph.edges[a, b]
    order = list(ROLE_COLORS)
    pair = sorted((topo.role(a), topo.role(b)), key=lambda r: -order.index(r))
    return "-".join(pair), d["tech"], float(d["rate_mbps"])


def link_classes(topo: Topology) -> dict[tuple[str, str, float], list[tuple[str, str]]]:
    """Each link class (link_class) and its links, fastest class first."""
    classes: dict[tuple[str, str, float], list[tuple[str, str]]] = {}
    for a, b in topo.graph.edges:
        classes.setdefault(link_class(topo, a, b), []).append((a, b))
    return dict(sorted(classes.items(), key=lambda kv: (-kv[0][2], kv[0][0])))


def _line_width(tech: str, rate_mbps: float, slowest_mbps: float) -> float:
    """The technology's width, thicker with the rate (x1.4 at 4x, x1.7 at 9x)."""
    return TECH_STYLES[tech]["width"] * (rate_mbps / slowest_mbps) ** 0.25


def _class_text(topo: Topology, key: tuple[str, str, float], count: int) -> str:
    pair, tech, rate = key
    return (f"{pair} {tech}: {rate:g} Mbit/s = {_real_rate(rate, topo.scale_factor)} "
            f"({count})")


def node_tip(topo: Topology, node: str) -> str:
    """A node's hover text: its role, server and rail, and each port with its peer."""
    data = topo.graph.nodes[node]
    where = "".join(f", {k} {data[k]}" for k in ("server", "rail") if data.get(k) is not None)
    ports = "; ".join(f"{topo.ifname(node, p)} -> {p} "
                      f"{topo.graph.edges[node, p]['rate_mbps']:g} Mbit/s"
                      for p in topo.ports(node))
    return f"{node} ({data['role']}{where}): {ports}"


def port_tip(topo: Topology, node: str, peer: str) -> str:
    """A port's hover text: the link it starts, its far end and its rate."""
    d = topo.graph.edges[node, peer]
    return (f"{topo.ifname(node, peer)} -> {peer} ({topo.ifname(peer, node)}): "
            f"{d['rate_mbps']:g} Mbit/s emulated = "
            f"{_real_rate(d['rate_mbps'], topo.scale_factor)} real, {d['tech']} "
            f"{d['length_m']:g} m")


def nvswitch_rule(topo: Topology) -> str | None:
    """'nvsS-ethK faces GPU K of server S' when every NVSwitch port does (the rail
    builders' port order), else None."""
    nodes = topo.graph.nodes
    nvs = topo.nodes_with_role("nvswitch")
    holds = nvs and all(nodes[p].get("rail") == k and nodes[p].get("server") == nodes[s]["server"]
                        for s in nvs for k, p in enumerate(topo.ports(s)))
    return f"{nvs[0][:-1]}S-ethK faces GPU K of server S" if holds and nvs[0][-1] == "0" \
        else None


def _port_labels(fig: Figure, ax, topo: Topology, pos: dict, tips: dict[str, str],
                 skip_roles: frozenset[str] = frozenset()) -> int:
    """Name each switch port on its link, at the first spot along the link where the
    name overlaps no other text (none where there is no room); the number named.
    Switches of `skip_roles` are left out (their ports still have hover text)."""
    renderer = fig.canvas.get_renderer()
    taken = [t.get_window_extent(renderer) for t in ax.texts]
    named = 0
    for sw in sorted(topo.switches(), key=natural_key):
        if topo.role(sw) in skip_roles:
            continue
        for peer in topo.ports(sw):
            spots = PORT_SPOTS["down" if topo.role(peer) in ENDPOINT_ROLES else "up"]
            (x0, y0), (x1, y1) = pos[sw], pos[peer]
            (u0, v0), (u1, v1) = ax.transData.transform([(x0, y0), (x1, y1)])
            angle = math.degrees(math.atan2(v1 - v0, u1 - u0))
            angle = angle - 180 if angle > 90 else angle + 180 if angle <= -90 else angle
            name = topo.ifname(sw, peer)
            for t in spots:
                text = ax.text(x0 + t * (x1 - x0), y0 + t * (y1 - y0), name, rotation=angle,
                               rotation_mode="anchor", ha="center", va="center",
                               fontsize=PORT_FONT_PT, color="#1c2833", zorder=2,
                               gid=f"port-{name}",
                               bbox={"boxstyle": "round,pad=0.12", "fc": "white",
                                     "ec": "none", "alpha": 0.85})
                box = text.get_window_extent(renderer)
                if not any(box.overlaps(other) for other in taken):
                    taken.append(box)
                    tips[f"port-{name}"] = port_tip(topo, sw, peer)
                    named += 1
                    break
                text.remove()
    return named


def figure(topo: Topology, title: str | None = None) -> tuple[Figure, dict[str, str]]:
    """The drawing, on an Agg canvas, and the hover text of its node and port labels
    (by the labels' gid)."""
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
    # A big rail fabric's GPUs sit by rail: each NVSwitch's links cross the whole
    # width, drawn faint, their ports named by one rule in the title instead of on them
    by_rail = big and not circular and rail_fabric(topo)
    rule = nvswitch_rule(topo) if by_rail else None
    classes = link_classes(topo)
    slowest = min(rate for _, _, rate in classes)
    for (_, tech, rate), links in classes.items():
        faint = by_rail and tech == "nvlink"
        ax.add_collection(LineCollection(
            [(pos[a], pos[b]) for a, b in links], colors=TECH_STYLES[tech]["color"],
            linewidths=_line_width(tech, rate, slowest) * thin * (0.5 if faint else 1.0),
            alpha=0.3 if faint else 0.55 if big else 0.85, zorder=1))
    xs = [p[0] for p in pos.values()]
    ys = [p[1] for p in pos.values()]
    pad = 0.25 if circular else 0.6
    ax.set_xlim(min(xs) - pad, max(xs) + pad)
    ax.set_ylim(min(ys) - (0.25 if circular else 0.4), max(ys) + (0.25 if circular else 0.4))
    roles = Counter(d["role"] for _, d in g.nodes(data=True))
    longest = max(len(str(n)) for n in g.nodes)
    font = max(5.0, min(9.0, 0.85 * slot_pt / (0.7 * longest + 0.7)))  # bold box fits slot
    tips: dict[str, str] = {}
    for role in roles:
        nodes = [n for n in g.nodes if g.nodes[n]["role"] == role]
        tips.update({f"node-{n}": node_tip(topo, n) for n in nodes})
        color = ROLE_COLORS[role]
        if big and role in ENDPOINT_ROLES:  # a dot each, the name upright below it
            ax.scatter([pos[n][0] for n in nodes], [pos[n][1] for n in nodes],
                       s=min(60.0, (0.6 * slot_pt) ** 2), c=color, edgecolors="black",
                       linewidths=0.4, zorder=3)
            for n in nodes:
                ax.annotate(str(n), pos[n], xytext=(0, -0.35 * slot_pt),
                            textcoords="offset points", rotation=90, ha="center", va="top",
                            fontsize=max(4.0, min(7.0, 0.7 * slot_pt)), zorder=3,
                            gid=f"node-{n}")
            continue
        sw_font = font
        if big:  # switches: size the label to the gap between this row's switches
            row = sorted(pos[n][0] for n in nodes)
            gap = min([b - a for a, b in pairwise(row)] or [width]) * slot_pt
            sw_font = max(5.0, min(9.0, 0.85 * gap / (0.7 * max(map(len, nodes)) + 0.7)))
        for n in nodes:
            ax.text(*pos[n], str(n), ha="center", va="center", fontsize=sw_font,
                    color=_text_color(color), zorder=3, fontweight="bold", gid=f"node-{n}",
                    bbox={"boxstyle": "round,pad=0.35", "fc": color, "ec": "black",
                          "lw": 0.6})
    role_handles = [Line2D([], [], ls="", marker="o" if big and r in ENDPOINT_ROLES else "s",
                           ms=10, mfc=ROLE_COLORS[r], mec="black", label=f"{r} ({roles[r]})")
                    for r in sorted(roles, key=list(ROLE_COLORS).index)]
    class_handles = [Line2D([], [], color=TECH_STYLES[k[1]]["color"],
                            lw=_line_width(k[1], k[2], slowest), label=_class_text(topo, k, len(v)))
                     for k, v in classes.items()]
    legend = ax.legend(handles=role_handles, title="nodes", loc="upper left", fontsize=9,
                       bbox_to_anchor=(0.0, 0.0), ncol=len(role_handles), frameon=False)
    ax.add_artist(legend)
    ax.legend(handles=class_handles, title="links (emulated rate = real rate)",
              loc="upper right", fontsize=9, bbox_to_anchor=(1.0, 0.0),
              frameon=False)
    name = topo.name if topo.name == topo.kind else f"{topo.name} ({topo.kind})"
    head = title or f"{name}: {n_nodes} nodes, {g.number_of_edges()} links"
    ports = "" if circular else "switch ports named on their links where there is room"
    ports += f"; {rule}" if rule else ""
    ax.set_title(f"{head}\n{rate_text(topo)}\n{ports}", fontsize=12)
    _port_labels(fig, ax, topo, pos, tips, frozenset({"nvswitch"}) if rule else frozenset())
    return fig, tips


SAVE = {"dpi": DPI, "bbox_inches": "tight", "pad_inches": 0.2, "facecolor": "white"}


def svg_with_titles(fig: Figure, tips: dict[str, str]) -> bytes:
    """The figure as SVG (text kept as text), each labelled group given its hover text as
    a <title> (matplotlib writes an artist's gid as its group's id)."""
    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", **SAVE)
    ET.register_namespace("", SVG_NS)
    ET.register_namespace("xlink", "http://www.w3.org/1999/xlink")
    root = ET.fromstring(buf.getvalue())
    for group in root.iter(f"{{{SVG_NS}}}g"):
        tip = tips.get(group.get("id", ""))
        if tip:
            element = ET.Element(f"{{{SVG_NS}}}title")
            element.text = tip
            group.insert(0, element)
    return b'<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root)


def draw(topo: Topology, path: str | Path, title: str | None = None,
         field: str = "--output") -> Path:
    """Write a drawing of `topo` to `path` in the format its suffix names (.png, .svg,
    .pdf); its folder must exist. A bad path is a SpecError naming `field`, before
    anything is written."""
    path = check_output_file(field, path)
    fmt = image_format(path, field)
    fig, tips = figure(topo, title)
    try:
        if fmt == "svg":
            path.write_bytes(svg_with_titles(fig, tips))
        else:
            fig.savefig(path, format=fmt, **SAVE)
    except OSError as exc:
        raise SpecError(field, f"{path} cannot be written: {exc.strerror}") from None
    return path
