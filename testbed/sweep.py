"""A message-size sweep (nccl-tests' -b/-e/-f): the experiment run once per size, then
one nccl-tests table of every size.

    message_bytes = "64K:256K:x2" ─▶ one link rate for every size (auto: the one a run
      of the largest size would pick) ─▶ testbed.run.run at 64 KiB, 128 KiB, 256 KiB, one
      after the other, each its own results folder inside
      results/<name>-sweep-<UTC stamp>/ ─▶ there: sweep.md (the table, as measured and
      scaled to the real fabric), sweep.csv, sweep.json, plots/busbw.png, config.toml

A row's time is the mean JCT of the size's iterations; algbw and busbw as nccl-tests
(traffic.workloads.bandwidths); #wrong is 0 when every flow of the size was delivered
exactly once, else the number of receivers with a flow that was not; the ideal time is
traffic.workloads.ideal_time_s at the ranks' link rate (ring all-reduce 2(n-1)/n * S / B).
A size whose run fails leaves its own folder FAILED and the sweep goes on; the sweep
folder then carries FAILED naming the sizes. Ctrl-C or a stop signal ends the sweep: the
running size comes down and both folders say FAILED.
"""

from __future__ import annotations

import csv
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from fabric.state import mark_failed
from testbed.experiment import Experiment, to_toml
from testbed.interrupts import Terminated, stop_on_signals
from testbed.outputs import save_plot
from testbed.page_index import write_index
from testbed.results import RunFailedError, marks_failure, new_folder
from testbed.run import ensure_calibration, pick_endpoints, pick_link_rate, run
from testbed.sizes import parse_sizes, size_text
from topologies import units
from topologies.spec import NAME_MAX_CHARS
from traffic.workloads import bandwidths, busbw_factor, workload_named

KEY = "experiment.message_bytes"
ELEMENT_BYTES = 4            # nccl-tests' count: elements of type float
# (name, header, unit, width, format) of the table's columns; a row's values by name
MEASURED = [("size_bytes", "size", "(B)", 12, "d"), ("count", "count", "(elements)", 12, "d"),
            ("type", "type", "", 6, "s"), ("redop", "redop", "", 6, "s"),
            ("time_us", "time", "(us)", 12, ".1f"),
            ("algbw_mb_per_s", "algbw", "(MB/s)", 10, ".3f"),
            ("busbw_mb_per_s", "busbw", "(MB/s)", 10, ".3f"), ("wrong", "#wrong", "", 7, "d"),
            ("ideal_us", "ideal", "(us)", 12, ".1f"),
            ("time_over_ideal", "time/ideal", "", 11, ".3f")]
REAL = [*MEASURED[:4], ("time_us_real", "time", "(us)", 12, ".3f"),
        ("algbw_gb_per_s_real", "algbw", "(GB/s)", 10, ".2f"),
        ("busbw_gb_per_s_real", "busbw", "(GB/s)", 10, ".2f"), MEASURED[7],
        ("ideal_us_real", "ideal", "(us)", 12, ".3f"), MEASURED[9]]
FIELDS = [c[0] for c in MEASURED] + [c[0] for c in REAL[4:7]] + ["ideal_us_real", "ok",
                                                                  "folder"]


@dataclass
class SizeRun:
    """One size's run: its folder and metrics (None where it wrote none), and why it
    failed ("" when it completed)."""

    size_bytes: int
    folder: Path | None = None
    metrics: dict | None = None
    failed: str = ""


def size_name(name: str, size_bytes: int) -> str:
    """A size's run name: the sweep's with the size, within a name's length."""
    suffix = f"_{size_bytes}B"
    return name[:NAME_MAX_CHARS - len(suffix)] + suffix


def sweep_rate(exp: Experiment, sizes: list[int], progress) -> str | float:
    """The rate every size runs at: the experiment's, or for "auto" the one
    testbed.run.pick_link_rate gives the largest size (after the machine's calibration,
    cached or measured now, as a single run has it), so the sizes compare at one rate."""
    if exp.rate != "auto":
        return exp.rate
    largest = replace(exp, message_bytes=sizes[-1])
    topo = largest.resolve_topology()
    ranks, pairs = pick_endpoints(largest, topo)
    pick_link_rate(largest, topo, ranks, pairs, progress,
                   ensure_calibration(progress))           # sets largest.rate
    progress(f"rate {largest.rate:g} Mbit/s for every size (auto, picked for the largest, "
             f"{sizes[-1]} B)")
    return largest.rate


def run_sweep(exp: Experiment, progress=None, force: bool = True) -> tuple[Path, list[SizeRun]]:
    """Run `exp` once per size of its sweep; the sweep folder and each size's run. A bad
    setting found by the first run (a SpecError) leaves nothing behind."""
    progress = progress or (lambda msg: None)
    sizes = parse_sizes(KEY, exp.message_bytes)
    with stop_on_signals():
        rate = sweep_rate(exp, sizes, progress)
        folder = new_folder(exp.results_dir, f"{exp.name}-sweep", "experiment.results_dir")
        progress(f"sweep of {len(sizes)} sizes, {sizes[0]} to {sizes[-1]} B: {folder}")
        done: list[SizeRun] = []
        with marks_failure(folder):
            for k, size in enumerate(sizes, 1):
                progress(f"size {k} of {len(sizes)}: {size} B")
                one = replace(exp, message_bytes=size, rate=rate, results_dir=str(folder),
                              name=size_name(exp.name, size))
                try:
                    got, metrics = run(one, progress=progress, force=force)
                    done.append(SizeRun(size, got, metrics))
                except RunFailedError as exc:
                    done.append(SizeRun(size, exc.folder, read_metrics(exc.folder), str(exc)))
                    progress(f"size {k} of {len(sizes)}: {size} B FAILED: {exc}")
            topo = exp.resolve_topology()
            (folder / "config.toml").write_text(to_toml(replace(exp, rate=rate), topo))
            write_sweep(folder, exp, sizes, done, topo.scale_factor)
        failed = [r for r in done if r.failed]
        if failed:
            mark_failed(folder, f"{len(failed)} of {len(done)} sizes did not complete: "
                        + ", ".join(f"{r.size_bytes} B ({r.folder.name})" for r in failed))
    return folder, done


def read_metrics(folder: Path | None) -> dict | None:
    """A run's metrics.json, None where it wrote none."""
    try:
        return json.loads((folder / "metrics.json").read_text()) if folder else None
    except (OSError, json.JSONDecodeError):
        return None


def wrong_receivers(folder: Path | None, metrics: dict | None) -> int | None:
    """0 when every flow was delivered exactly once, else the receivers (ranks) with a
    flow that was not (from flows.csv); None where the run left no metrics."""
    if metrics is None:
        return None
    if metrics["flows"]["exactly_once"]:
        return 0
    try:
        with open(folder / "flows.csv") as fh:
            return len({f["node"] for f in csv.DictReader(fh)
                        if f["role"] == "recv" and f["exactly_once"] != "True"})
    except OSError:
        return None


def row_of(r: SizeRun, workload: str) -> dict:
    """One size's row (the FIELDS), its numbers None where its run measured no time."""
    m = r.metrics or {}
    row = {"size_bytes": r.size_bytes, "count": r.size_bytes // ELEMENT_BYTES,
           "type": "float", "redop": "sum" if workload_named(workload).reducing else "none",
           "ok": not r.failed, "folder": r.folder.name if r.folder else None,
           "wrong": wrong_receivers(r.folder, r.metrics)}
    time_s = m.get("jct_mean_s")
    if time_s:
        row.update(measured(m, workload, r.size_bytes, time_s))
    return {f: row.get(f) for f in FIELDS}


def measured(m: dict, workload: str, size_bytes: int, time_s: float) -> dict:
    """A row's times and bandwidths, as measured and scaled to the real fabric."""
    factor = m["scale_factor"]
    algbw, busbw = bandwidths(workload, m["ranks"], size_bytes, time_s)
    ideal_s = m.get("ideal_s")
    return {"time_us": time_s * 1e6, "algbw_mb_per_s": algbw / 1e6,
            "busbw_mb_per_s": busbw / 1e6,
            "ideal_us": ideal_s * 1e6 if ideal_s else None,
            "time_over_ideal": time_s / ideal_s if ideal_s else None,
            "time_us_real": units.real_s(time_s, factor) * 1e6,
            "algbw_gb_per_s_real": algbw * factor / 1e9,
            "busbw_gb_per_s_real": busbw * factor / 1e9,
            "ideal_us_real": units.real_s(ideal_s, factor) * 1e6 if ideal_s else None}


def table_lines(columns, rows: list[dict]) -> list[str]:
    """The header, units row and a row per size in fixed-width columns ("n/a" where a
    value is missing), then nccl-tests' footer: the mean busbw of the sizes measured."""
    out = ["#" + "".join(f"{head:>{w}s} " for _, head, _, w, _ in columns).rstrip(),
           "#" + "".join(f"{unit:>{w}s} " for _, _, unit, w, _ in columns).rstrip()]
    for row in rows:
        out.append(" " + "".join(
            (f"{'n/a':>{w}s} " if row[name] is None else f"{row[name]:>{w}{fmt}} ")
            for name, _, _, w, fmt in columns).rstrip())
    busbw_key, unit = columns[6][0], columns[6][2].strip("()")
    busbws = [row[busbw_key] for row in rows if row[busbw_key] is not None]
    avg = sum(busbws) / len(busbws) if busbws else 0.0
    return [*out, f"# Avg bus bandwidth    : {avg:.4f} {unit}"]


def sweep_table(info: dict, rows: list[dict]) -> str:
    """sweep.md: the nccl-tests table of every size, as measured and scaled to the real
    fabric (x the scale factor)."""
    real_gbps = units.real_mbps(info["link_mbps"], info["scale_factor"]) / 1e3 \
        if info["link_mbps"] else None
    link = (f"{info['link_mbps']:g} Mbit/s per rank (x{info['scale_factor']:g}: "
            f"{real_gbps:g} Gbit/s real)" if real_gbps else "no size measured")
    lines = [f"# {info['workload']} sweep: {info['ranks']} ranks, {len(rows)} sizes, "
             f"{info['iterations']} iterations each, {info['transport']}, "
             f"{info['entropy']}; {link}",
             f"# algbw = size / time, busbw = algbw * {info['busbw_factor']:.4g}; time: the "
             "mean JCT of an iteration; MB/s = 10^6 B/s, GB/s = 10^9 B/s",
             "#", "# as measured", *table_lines(MEASURED, rows), "#",
             f"# scaled to the real fabric (x{info['scale_factor']:g})",
             *table_lines(REAL, rows)]
    return "\n".join(lines) + "\n"


def sweep_info(exp: Experiment, sizes: list[int], runs: list[SizeRun],
               scale_factor: float) -> dict:
    """What the table's header says, from the first size that wrote metrics (the
    topology's scale factor and no link rate when none did)."""
    m = next((r.metrics for r in runs if r.metrics), None) or {}
    ranks = m.get("ranks") or exp.ranks
    return {"workload": exp.workload, "ranks": ranks, "iterations": exp.iterations,
            "transport": exp.transport, "entropy": exp.entropy,
            "message_bytes": exp.message_bytes, "sizes_bytes": sizes,
            "link_mbps": m.get("link_mbps"), "scale_factor": m.get("scale_factor", scale_factor),
            "busbw_factor": busbw_factor(exp.workload, ranks) if ranks else 1.0}


def write_sweep(folder: Path, exp: Experiment, sizes: list[int], runs: list[SizeRun],
                scale_factor: float) -> None:
    """sweep.md, sweep.csv, sweep.json, plots/busbw.png and index.html in the sweep
    folder."""
    info = sweep_info(exp, sizes, runs, scale_factor)
    rows = [row_of(r, exp.workload) for r in runs]
    (folder / "sweep.md").write_text(sweep_table(info, rows))
    with open(folder / "sweep.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, FIELDS)
        w.writeheader()
        w.writerows(rows)
    busbws = [r["busbw_mb_per_s"] for r in rows if r["busbw_mb_per_s"] is not None]
    avg = sum(busbws) / len(busbws) if busbws else None
    (folder / "sweep.json").write_text(json.dumps({
        **info, "ok": all(r["ok"] for r in rows), "rows": rows,
        "avg_busbw_mb_per_s": avg,
        "avg_busbw_gb_per_s_real": avg * info["scale_factor"] / 1e3 if avg else None,
        "units": {"MB/s": "10^6 B/s", "GB/s": "10^9 B/s", "K, M, G": "KiB, MiB, GiB"}},
        indent=1) + "\n")
    if busbws:
        plot_busbw(folder, info, rows)
    write_index(folder)      # index.html: the sizes' runs side by side


def plot_busbw(folder: Path, info: dict, rows: list[dict]) -> Path:
    """busbw against size (log2 axis), the ranks' link rate as a line; the right axis
    the same busbw scaled to the real fabric."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    done = [r for r in rows if r["busbw_mb_per_s"] is not None]
    fig = Figure(figsize=(7, 4), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot([r["size_bytes"] for r in done], [r["busbw_mb_per_s"] for r in done],
            marker="o", label="busbw")
    link = units.mbps_to_bytes_per_s(info["link_mbps"]) / 1e6
    ax.axhline(link, color="grey", linestyle="--",
               label=f"link rate {info['link_mbps']:g} Mbit/s = {link:g} MB/s")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: size_text(round(x))))
    ax.set_ylim(0, link * 1.15)
    ax.set_xlabel("message size (B, per rank)")
    ax.set_ylabel("busbw (MB/s, measured)")
    factor = info["scale_factor"]
    right = ax.secondary_yaxis("right", functions=(lambda y: y * factor / 1e3,
                                                   lambda y: y * 1e3 / factor))
    right.set_ylabel(f"busbw (GB/s, real fabric x{factor:g})")
    ax.set_title(f"{info['workload']} sweep, {info['ranks']} ranks: bus bandwidth by size")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(True, alpha=0.3)
    return save_plot(fig, folder, "busbw.png")


def main(exp: Experiment, progress, force: bool) -> int:
    """`testbed run` of a sweep: the table on stdout, progress on stderr; exit 0 when
    every size completed, 1 when one did not, 128 + a stop signal's number."""
    try:
        folder, runs = run_sweep(exp, progress, force)
    except Terminated as exc:
        print(f"testbed run: {exc.reason}; cleaned up, results marked FAILED",
              file=sys.stderr)
        return exc.exit_code
    print((folder / "sweep.md").read_text(), end="")
    progress(f"results: {folder}")
    failed = [r for r in runs if r.failed]
    if failed:
        print(f"testbed run: FAILED: {len(failed)} of {len(runs)} sizes did not complete "
              f"(see {folder})", file=sys.stderr)
        return 1
    return 0
