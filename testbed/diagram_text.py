"""A topology as a text diagram: Graphviz DOT or a Mermaid flowchart. No root needed.

Both carry every node (with its role) and every link, each link labelled with its rate
and both ends' interface names (leaf0-eth3, what `--pcap` takes):

    testbed graph rail_optimized --format dot -o - | dot -Tsvg > fabric.svg
    testbed graph leaf_spine --format mermaid -o fabric.mmd
"""

from __future__ import annotations

import sys
from pathlib import Path

from testbed.draw import IMAGE_FORMATS, LAYERS, ROLE_COLORS, draw, natural_key, rate_text
from testbed.outputs import check_output_file
from topologies.spec import SpecError, Topology

TEXT_FORMATS = ("dot", "mermaid")
DEFAULT_IMAGE = "topology.png"
STDOUT = "-"
# Words a Mermaid flowchart reads as syntax: a node named so gets a suffix as its id
MERMAID_RESERVED = frozenset({"end", "graph", "flowchart", "subgraph", "class", "classdef",
                              "style", "click", "direction", "linkstyle", "default"})


def _links(topo: Topology) -> list[tuple[str, str, dict]]:
    """Links in a stable order: by their upper end, then its port order."""
    return sorted(topo.graph.edges(data=True),
                  key=lambda e: (natural_key(e[0]), topo.ports(e[0]).index(e[1])))


def _layers(topo: Topology) -> list[tuple[str, list[str]]]:
    """('spine', [nodes]) top to bottom, empty layers left out."""
    out = []
    for roles in LAYERS:
        nodes = sorted((n for r in roles for n in topo.nodes_with_role(r)), key=natural_key)
        if nodes:
            out.append(("/".join(r for r in roles if topo.nodes_with_role(r)), nodes))
    return out


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(topo: Topology) -> str:
    """An undirected Graphviz graph: a rank per layer, links with their rate as label and
    each end's interface as tail and head label."""
    lines = [f"graph {_quote(topo.name)} {{",
             f"  // {topo.kind}: {rate_text(topo)}",
             f"  label={_quote(f'{topo.name}: ' + rate_text(topo))};",
             "  labelloc=t; rankdir=TB; splines=false;",
             '  node [shape=box, style="rounded,filled", fontname="Helvetica"];',
             '  edge [fontsize=8, labelfontsize=7];']
    for layer, nodes in _layers(topo):
        lines.append(f"  {{ rank=same; // {layer}")
        for n in nodes:
            role = topo.role(n)
            lines.append(f"    {_quote(n)} [role={_quote(role)}, "
                         f"fillcolor={_quote(ROLE_COLORS[role])}];")
        lines.append("  }")
    for a, b, d in _links(topo):
        lines.append(f"  {_quote(a)} -- {_quote(b)} [label={_quote(_rate(d))}, "
                     f"taillabel={_quote(topo.ifname(a, b))}, "
                     f"headlabel={_quote(topo.ifname(b, a))}, tech={_quote(d['tech'])}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _rate(d: dict) -> str:
    return f"{d['rate_mbps']:g} Mbit/s"


def mermaid_id(node: str) -> str:
    return f"{node}_" if node.lower() in MERMAID_RESERVED else node


def to_mermaid(topo: Topology) -> str:
    """A top-down Mermaid flowchart: a subgraph per layer, a class (colour) per role,
    each link labelled 'leaf0-eth0 / s0g0-eth1, 100 Mbit/s'."""
    lines = ["flowchart TB", f"  %% {topo.name} ({topo.kind}): {rate_text(topo)}"]
    for layer, nodes in _layers(topo):
        lines.append(f"  subgraph layer_{layer.replace('/', '_')} [{layer}]")
        lines += [f'    {mermaid_id(n)}["{n}"]' for n in nodes]
        lines.append("  end")
    for a, b, d in _links(topo):
        lines.append(f'  {mermaid_id(a)} ---|"{topo.ifname(a, b)} / {topo.ifname(b, a)}, '
                     f'{_rate(d)}"| {mermaid_id(b)}')
    for role, color in ROLE_COLORS.items():
        nodes = sorted(topo.nodes_with_role(role), key=natural_key)
        if nodes:
            lines.append(f"  classDef {role} fill:{color},stroke:#000")
            lines.append(f"  class {','.join(mermaid_id(n) for n in nodes)} {role}")
    return "\n".join(lines) + "\n"


def to_text(topo: Topology, fmt: str) -> str:
    return to_dot(topo) if fmt == "dot" else to_mermaid(topo)


def write_diagram(topo: Topology, output: str | None, fmt: str | None,
                  field: str = "--output") -> Path | None:
    """`testbed graph`: a picture (fmt None: .png, .svg or .pdf by the output's suffix,
    default topology.png) or a text diagram (fmt "dot" or "mermaid") to `output`, or to
    stdout for "-" (the text default). The path written, None for stdout. A bad output is a
    SpecError naming `field`, and nothing is written."""
    if fmt is None:
        if output == STDOUT:
            raise SpecError(field, "'-' (stdout) is for text: add --format dot|mermaid, or "
                            f"name a file ending in {', '.join(IMAGE_FORMATS)}")
        return draw(topo, output or DEFAULT_IMAGE, field=field)
    if output in (None, STDOUT):
        sys.stdout.write(to_text(topo, fmt))
        return None
    path = Path(output)
    if path.suffix.lower() in IMAGE_FORMATS:
        raise SpecError(field, f"{path} names a picture, --format {fmt} writes text: drop "
                        "--format, or name a text file (.dot, .mmd, ...)")
    check_output_file(field, path)
    try:
        path.write_text(to_text(topo, fmt))
    except OSError as exc:
        raise SpecError(field, f"{path} cannot be written: {exc.strerror}") from None
    return path
