"""A flow's time split as a bar: flows.csv's parts of one flow (testbed.attribution),
left to right, never past its measured FCT. The flow-time plot (testbed.plots) and the
results page (testbed.page) draw the same bars from these."""

from __future__ import annotations

from testbed.attribution import PARTS

SPLIT = (*PARTS, "unexplained_s")      # a flow's bar, left to right
SCALE_SHOWN = 0.005       # a bar's parts scaled by less than this are drawn unmarked


def bar_parts(row: dict) -> tuple[dict[str, float], float]:
    """A flows.csv row's parts as the plot draws them, and the factor they were scaled
    by: negative parts are not drawn, and parts that add up past the measured FCT are
    scaled down to end at it."""
    parts = {p: max(0.0, float(row[p])) for p in SPLIT}
    total = sum(parts.values())
    scale = min(1.0, float(row["fct_s"]) / total) if total > 0 else 1.0
    return {p: v * scale for p, v in parts.items()}, scale


def bar_note(row: dict, scale: float) -> str:
    """Beside a flow's name, why its parts were scaled: its bytes at its max-min fair
    share and store-and-forward alone took longer than its FCT (it went faster than its
    share: the split charges the other causes nothing then), or its causes overlapped
    (a split that did not charge them once); nothing for a bar drawn to scale."""
    if scale >= 1 - SCALE_SHOWN:
        return ""
    physics = float(row["serialization_s"]) + float(row["hops_s"])
    why = "faster than its share" if physics > float(row["fct_s"]) else "causes overlap"
    return f" (x{scale:.2f}, {why})"


def bar_rows(rows: list[dict], k: int) -> list[tuple[dict, list[tuple[str, float, float]], str]]:
    """The `k` slowest flows as the plot draws them, slowest last: each flow's row, its
    segments (part, left, width) from 0 to at most its FCT, and its bar_note."""
    out = []
    for row in sorted(rows, key=lambda r: float(r["fct_s"]))[-k:]:
        parts, scale = bar_parts(row)
        left, segments = 0.0, []
        for part in SPLIT:
            segments.append((part, left, parts[part]))
            left += parts[part]
        out.append((row, segments, bar_note(row, scale)))
    return out
