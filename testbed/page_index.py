"""index.html of a script's folder (or a message-size sweep's): its runs side by side.

The script's own summary.md (a sweep's sweep.md) first (the claim's table, expected vs
measured), its plots, then a card per run: the run's fabric drawn small with each
directed link coloured by its utilization over the workload (the run page's scale), its
verdict and headline figures, and a link to the run's own summary.html. Self-contained
like the run pages (testbed.page); written by the script (or the sweep) when it
finishes and by `testbed report`.
"""

from __future__ import annotations

import json
from pathlib import Path

from testbed import page_model
from testbed.outputs import replace_file
from testbed.page import (
    asset_text,
    esc,
    fabric_svg,
    markdown_html,
    number_text,
    verdict_badge,
)

INDEX = "index.html"
SUMMARIES = ("summary.md", "sweep.md")     # a script's, a message-size sweep's
STOPS = ((255, 237, 160), (254, 178, 76), (240, 59, 32), (128, 0, 38))


def colour(frac: float) -> str:
    """The run page's colour scale (page.js `colour`): grey for nothing, then yellow to
    dark red at 1."""
    if not frac > 0:
        return "#d5d8dc"
    x = min(1.0, frac) * (len(STOPS) - 1)
    i = min(len(STOPS) - 2, int(x))
    r = x - i
    c = [round(a + (b - a) * r) for a, b in zip(STOPS[i], STOPS[i + 1], strict=True)]
    return f"rgb({c[0]},{c[1]},{c[2]})"


def run_folders(folder: Path) -> list[Path]:
    """The folder's runs: subfolders holding a run's metrics.json and config.toml."""
    return sorted((p for p in folder.iterdir() if p.is_dir() and not p.is_symlink()
                   and (p / "metrics.json").is_file() and (p / "config.toml").is_file()),
                  key=lambda p: p.name)


def card(run: Path) -> str:
    """One run: its small fabric, verdict and figures, linked to its page."""
    metrics = json.loads((run / "metrics.json").read_text())
    topo = page_model.topology(run)
    fab = page_model.fabric(topo)
    ser = {"ports": {}}
    totals = page_model.totals(run, metrics, topo, ser)
    colours = {lk["id"]: colour(totals[lk["ifname"]]["util"]) for lk in fab["links"]}
    verdict = (metrics.get("fidelity") or {}).get("verdict")
    ratio = metrics.get("jct_over_ideal")
    drops = sum(t["drops"] for t in totals.values())
    page = f"{run.name}/summary.html"
    link = (f'<a href="{esc(page)}">{esc(run.name)}</a>' if (run / "summary.html").exists()
            else esc(run.name))
    return (f'<div class="card"><h3>{link} {verdict_badge(verdict)}</h3>'
            f'{fabric_svg(fab, colours, labels=False, width=600.0)}'
            f'<p class="headline">JCT {number_text(metrics.get("jct_mean_s"))} s'
            + (f", {ratio:.3f}x ideal" if isinstance(ratio, (int, float)) else "")
            + f"; drops {drops}; links coloured by utilization over the workload</p></div>")


def render_index(folder: Path) -> str:
    runs = run_folders(folder)
    md = next((folder / n for n in SUMMARIES if (folder / n).is_file()), None)
    summary = md.read_text() if md else ""
    plots = "".join(f'<p><img src="{esc(p.relative_to(folder).as_posix())}" alt="plot"></p>'
                    for p in sorted((folder / "plots").glob("*.png")))
    cards = "".join(card(r) for r in runs)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(folder.name)}</title>
<style>{asset_text("page.css")}</style></head>
<body>
<h1>{esc(folder.name)}</h1>
<div class="summary">{markdown_html(summary) if summary else "<p>No summary.</p>"}</div>
<div class="plots">{plots}</div>
<h2>The runs ({len(runs)})</h2>
<p class="headline">Each run's fabric, every port's link coloured by its utilization over
the workload (grey: idle; yellow to dark red: up to its line rate). A run's name opens
its page.</p>
<div class="cards" id="runs">{cards or "<p>No run folders here.</p>"}</div>
</body></html>
"""


def write_index(folder: Path) -> Path:
    """`folder`/index.html from the folder's files."""
    text = render_index(folder)
    return replace_file(folder / INDEX, lambda tmp: tmp.write_text(text))
