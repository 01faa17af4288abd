"""summary.html: a results folder as a page a browser opens from disk, beside summary.md.

The fabric is drawn as SVG where `testbed graph` puts its nodes, one line per directed
link (a port and the way it sends), coloured by what it carried: utilization, bytes,
time paused, drops or CE marks (a selector), at a time a slider picks among the run's
samples or over the whole run. A click on a link draws its rate, queue, paused time and
drops against time; a click on a node lists its ports. Below: the FCT CDF, the slowest
flows with their time split (a click highlights the flow's path on the drawing), the
fidelity verdict with each graded figure, summary.md itself (its expected-vs-measured
table, a training step's sections) and the run's plots.

Self-contained: the style, the script (testbed/page_assets) and the data (JSON from
testbed.page_model) are inline; the plots are the folder's own PNGs, linked by relative
path. No network and no third-party script. summary.md is rendered with markdown-it-py
with raw HTML off, so nothing in a results file becomes markup.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from markdown_it import MarkdownIt

from testbed import page_model
from testbed.draw import ROLE_COLORS
from testbed.outputs import replace_file

ASSETS = Path(__file__).with_name("page_assets")
PAGE = "summary.html"
VIEW_W = 1000.0             # the drawing's user units across
PART_COLORS = {"serialization_s": "#5dade2", "hops_s": "#48c9b0", "paused_s": "#e74c3c",
               "acks_s": "#f5b041", "recovery_s": "#af7ac5", "cc_s": "#ec7063",
               "starved_s": "#7f8c8d", "unexplained_s": "#d5d8dc"}
_MD = MarkdownIt("commonmark", {"html": False}).enable("table")


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def markdown_html(text: str) -> str:
    """Markdown as HTML, raw HTML in it shown as text."""
    return _MD.render(text)


def asset_text(name: str) -> str:
    return (ASSETS / name).read_text()


def _json_script(data: dict) -> str:
    """`data` as a JSON script element that no string in it can close."""
    text = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    return f'<script id="page-data" type="application/json">{text}</script>'


def layout(fab: dict, width: float = VIEW_W) -> tuple[dict[str, tuple[float, float]], float]:
    """Each node's position in the drawing's units (y down) and the drawing's height."""
    xs = [n["x"] for n in fab["nodes"]]
    ys = [n["y"] for n in fab["nodes"]]
    pad = 40.0
    span_x = (max(xs) - min(xs)) or 1.0
    span_y = (max(ys) - min(ys)) or 1.0
    sx = (width - 2 * pad) / span_x
    sy = sx if fab["circular"] else min(130.0, max(70.0, sx * 1.2))
    height = 2 * pad + span_y * sy
    return ({n["id"]: (pad + (n["x"] - min(xs)) * sx, pad + (max(ys) - n["y"]) * sy)
             for n in fab["nodes"]}, height)


def fabric_svg(fab: dict, colours: dict[str, str] | None = None, labels: bool = True,
               width: float = VIEW_W) -> str:
    """The fabric as SVG: a <line class="link" data-link="a>b"> per directed link (the two
    directions side by side, each offset to its right), a <g class="node"> per node.
    `colours` (by link id) fixes the links' colours, for a drawing with no script."""
    pos, height = layout(fab, width)
    many = len(fab["nodes"]) > 60
    stroke = 1.6 if many else 3.0
    gap = stroke * 0.75
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:g} {height:.0f}" '
           'role="img">']
    for link in fab["links"]:
        (x1, y1), (x2, y2) = pos[link["src"]], pos[link["dst"]]
        dx, dy = x2 - x1, y2 - y1
        length = (dx * dx + dy * dy) ** 0.5 or 1.0
        ox, oy = -dy / length * gap, dx / length * gap     # to the right of travel
        colour = (colours or {}).get(link["id"], "#d5d8dc")
        out.append(f'<line class="link" data-link="{esc(link["id"])}" '
                   f'x1="{x1 + ox:.1f}" y1="{y1 + oy:.1f}" x2="{x2 + ox:.1f}" '
                   f'y2="{y2 + oy:.1f}" stroke="{colour}" stroke-width="{stroke}">'
                   f'<title>{esc(link["tip"])}</title></line>')
    for node in fab["nodes"]:
        x, y = pos[node["id"]]
        colour = ROLE_COLORS.get(node["role"], "#7f8c8d")
        tip = f'{node["id"]} ({node["role"]}): ports {", ".join(node["ports"])}'
        out.append(f'<g class="node" data-node="{esc(node["id"])}"><title>{esc(tip)}</title>')
        if node["endpoint"]:
            r = 4 if many else 7
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="{colour}" '
                       'stroke="#17202a" stroke-width="0.8"/>')
            if labels and not many:
                out.append(f'<text x="{x:.1f}" y="{y + 20:.1f}" text-anchor="middle">'
                           f'{esc(node["id"])}</text>')
        else:
            w = max(34.0, 7.0 * len(node["id"]) + 8) if labels and not many else 18.0
            out.append(f'<rect x="{x - w / 2:.1f}" y="{y - 10:.1f}" width="{w:.1f}" '
                       f'height="20" rx="4" fill="{colour}"/>')
            if labels and not many:
                out.append(f'<text x="{x:.1f}" y="{y + 4:.1f}" text-anchor="middle" '
                           f'fill="#fff">{esc(node["id"])}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)


def verdict_badge(verdict: str | None) -> str:
    v = verdict or "none"
    return f'<span class="verdict {esc(v)}">{esc(verdict or "no verdict")}</span>'


def fidelity_html(fid: dict | None) -> str:
    """The verdict, why, and each graded figure beside its thresholds."""
    if not fid:
        return "<p>This run recorded no fidelity verdict.</p>"
    rows = "".join(
        f"<tr><td>{esc(r['figure'])}</td><td>{esc(r['value'])}</td>"
        f"<td>{esc(r['grade'])}</td><td>&le; {esc(r['faithful'])}</td>"
        f"<td>&le; {esc(r['degraded'])}</td><td>{esc(r['unit'])}</td></tr>"
        for r in fid["rows"])
    reasons = "".join(f"<li>{esc(x)}</li>" for x in fid["reasons"])
    return (f"<p>Did the emulator keep up? {verdict_badge(fid['verdict'])}</p>"
            + (f"<ul>{reasons}</ul>" if reasons else "")
            + "<table class=\"small\"><tr><th>figure</th><th>measured</th><th>grade</th>"
              "<th>faithful</th><th>degraded</th><th>unit</th></tr>" + rows + "</table>")


def split_bar(flow: dict, longest_s: float, width: float = 360.0) -> str:
    """A flow's time split as one stacked bar, the measured FCT its full length."""
    if not flow["split"] or longest_s <= 0:
        return ""
    x, parts = 0.0, []
    for part, seconds in flow["split"].items():
        w = seconds / longest_s * width
        if w > 0:
            parts.append(f'<rect x="{x:.1f}" y="2" width="{w:.1f}" height="12" '
                         f'fill="{PART_COLORS.get(part, "#aab7b8")}"><title>'
                         f'{esc(part.removesuffix("_s"))} {seconds:.4f} s</title></rect>')
            x += w
    fct = flow["fct_s"] / longest_s * width
    parts.append(f'<line x1="{fct:.1f}" x2="{fct:.1f}" y1="0" y2="16" stroke="#17202a"/>')
    return (f'<svg class="splitbar" viewBox="0 0 {width + 2:g} 16" width="{width + 2:g}" '
            f'height="16">{"".join(parts)}</svg>')


def flows_html(fl: dict) -> str:
    """The FCT CDF's place (the script draws it) and the slowest flows, split."""
    longest = max((f["fct_s"] for f in fl["slowest"]), default=0.0)
    legend = "".join(f'<span class="swatch" style="background:{c}"></span>'
                     f'{esc(p.removesuffix("_s"))}' for p, c in PART_COLORS.items())
    rows = "".join(
        f'<tr class="flow" data-flow="{i}"><td><code>{esc(f["flow"])}</code></td>'
        f'<td>{f["size_bytes"]}</td><td>{f["fct_s"]:.4f}</td>'
        f'<td>{esc(f["bottleneck"])}</td><td>{split_bar(f, longest)}'
        + (f' <span class="tip">({esc(f["split_note"])})</span>' if f["split_note"] else "")
        + "</td></tr>"
        for i, f in enumerate(fl["slowest"]))
    return ('<div id="fct-cdf"></div>'
            f'<h3>The slowest flows</h3><p class="headline">A click on a flow shows its '
            'path on the drawing. Its time, part by part (testbed.attribution; a bar whose '
            f'parts add up past the FCT is scaled to end at it, and says why): {legend}</p>'
            '<table id="slowest" class="small"><tr><th>flow</th><th>bytes</th>'
            '<th>FCT (s)</th><th>bottleneck</th><th>time split (| = measured FCT)</th></tr>'
            + rows + "</table>")


def number_text(value) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) else "n/a"


def headline_html(h: dict) -> str:
    parts = [f"{esc(h['workload'])}, {esc(h['ranks'])} ranks, transport "
             f"{esc(h['transport'])}, entropy {esc(h['entropy'])}, endpoint links "
             f"{number_text(h['link_mbps'])} Mbit/s (the real fabric's rates scaled down "
             f"{number_text(h['scale_factor'])}x)"]
    if isinstance(h.get("jct_mean_s"), (int, float)):
        ideal, ratio = h.get("ideal_s"), h.get("jct_over_ideal")
        parts.append(f"JCT {h['jct_mean_s']:.4f} s"
                     + (f" against an ideal {ideal:.4f} s: {ratio:.3f}x"
                        if isinstance(ideal, (int, float)) and isinstance(ratio, (int, float))
                        else ""))
    if not h.get("ok", True):
        parts.append(f"FAILED: {esc(json.dumps(h.get('errors')))}")
    return '<p class="headline">' + "; ".join(parts) + "</p>"


def render_run(model: dict, summary_md: str) -> str:
    """The page of one run."""
    options = "".join(f'<option value="{k}">{esc(v[0])}</option>'
                      for k, v in model["metrics"].items())
    plots = "".join(f'<p><img src="{esc(p)}" alt="{esc(p)}" loading="lazy"></p>'
                    for p in model["plots"])
    files = ", ".join(f'<a href="{esc(n)}">{esc(n)}</a>' for n in
                      ("summary.md", "metrics.json", "config.toml", "links.csv", "flows.csv")
                      + tuple(model["pcaps"]))
    verdict = (model["fidelity"] or {}).get("verdict")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(model["name"])}</title>
<style>{asset_text("page.css")}</style></head>
<body>
<h1>{esc(model["name"])} {verdict_badge(verdict)}</h1>
<p class="headline">{esc(model["topology"])} ({esc(model["kind"])})</p>
{headline_html(model["headline"])}
<h2>The fabric</h2>
<div class="controls">
<label>colour by <select id="metric">{options}</select></label>
<label>time <input id="slider" type="range" min="0" step="1"></label>
<span id="slider-time"></span>
<span class="legend">0 <span class="bar"></span> <span id="legend-max"></span>
<span id="legend-label"></span></span>
</div>
<p class="headline">One line per port, on the right of its direction of travel; hover for
its name, click for its time series; click a switch or an endpoint for its ports.</p>
<div class="fabric-row"><div id="fabric">{fabric_svg(model["fabric"])}</div>
<div id="detail"><p>Click a link or a node.</p></div></div>
<h2>Flows</h2>
{flows_html(model["flows"])}
<h2>Fidelity</h2>
{fidelity_html(model["fidelity"])}
<h2>Summary</h2>
<div class="summary">{markdown_html(summary_md)}</div>
<h2>Plots</h2>
<div class="plots">{plots or "<p>No plots.</p>"}</div>
<p class="headline">Files: {files}</p>
{_json_script(model)}
<script>{asset_text("page.js")}</script>
</body></html>
"""


def write_run_page(folder: Path) -> Path:
    """`folder`/summary.html from the folder's files (summary.md written first)."""
    model = page_model.run_model(folder)
    text = render_run(model, (folder / "summary.md").read_text())
    return replace_file(folder / PAGE, lambda tmp: tmp.write_text(text))
