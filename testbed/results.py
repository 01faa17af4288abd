"""Results of a run: metrics computed from what the agents and collectors measured, and
the results folder (config.toml, metrics.json, CSV tables, plots, pcaps, summary.md).

A folder is complete or carries FAILED with the reason; never half-written silently.
Times and rates are reported as measured and, beside them, scaled to the real fabric by
the topology's scale factor (real time = measured / factor, real rate = measured x factor).
"""

from __future__ import annotations

import contextlib
import csv
import json
import time
from pathlib import Path

from fabric.state import mark_failed
from testbed import attribution, flow_run
from testbed.expect import Expectation, expectation_lines
from testbed.features import summary_lines as feature_lines
from testbed.fidelity import summary_line as fidelity_line
from testbed.interrupts import exit_code, failure_reason, stop_on_signals
from testbed.outputs import check_output_folder, make_folder, save_plot
from testbed.page_index import write_index
from testbed.run_result import SCHEMA_VERSION, RunResult
from topologies import units
from topologies.stats import percentile
from traffic.workloads import bandwidths, nccl_table, workload_named

# What set an auto rate (testbed.rate.pick_rate's bound_by)
BOUNDS = {"cpu": "the machine's CPU budget",
          "port": "a frame on the fastest flow must last 12 packets' worth of the "
                  "machine: the agents keep fast ports fed no faster",
          "topology": "auto never runs links faster than the topology's own rates",
          "pfc headroom": "with PFC on, every switch ingress's XOFF and headroom must fit "
                          "its buffer for the controller's reaction time"}


def controller_note(choice: dict) -> str:
    """What the switch controller's polls take off the CPU budget (testbed.rate.predict's
    figures), if any."""
    got = choice.get("controller_cores")
    return (f"; the switch controller's polls take {got:g} of the {choice['cores']} cores off the "
            "budget while queues are busy" if got else "")


def new_folder(base: str | Path, name: str, field: str = "--results") -> Path:
    """A new folder `<name>-<UTC stamp>` under `base` (created with its parents); a base
    that cannot hold it is a SpecError naming `field` (testbed.outputs)."""
    check_output_folder(field, base)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    folder = Path(base) / f"{name}-{stamp}"
    k = 2
    while folder.exists():
        folder = Path(base) / f"{name}-{stamp}-{k}"
        k += 1
    return make_folder(field, folder)


def ideal_jct(exp, topo, ranks: list[str]) -> tuple[float | None, float]:
    """The workload's time on an ideal fabric at the ranks' slowest NIC rate (seconds,
    emulated; traffic.workloads.Workload.ideal_s: None for a job, whose ideal is its
    analytic step, testbed.train_run) and that rate (Mbit/s)."""
    link_mbps = min(topo.nic_rate_mbps(r) for r in ranks)
    workload = workload_named(exp.workload)
    return workload.ideal_s(len(ranks), exp.message_bytes, link_mbps), link_mbps


def compute_metrics(exp, topo, ranks: list[str], agents: dict[str, dict],
                    link_totals: dict, cpu: dict, timings: dict) -> dict:
    n = len(ranks)
    factor = topo.scale_factor
    ideal, link_mbps = ideal_jct(exp, topo, ranks)
    iterations = []
    for i in range(exp.iterations):  # agents list completed iterations only
        spans = [a["iterations"][i] for a in agents.values() if len(a["iterations"]) > i]
        if len(spans) < len(agents) or any(s.get("end_ns") is None for s in spans):
            break
        start = min(s["start_ns"] for s in spans)
        end = max(s["end_ns"] for s in spans)
        jct = (end - start) / 1e9
        algbw, busbw = bandwidths(exp.workload, n, exp.message_bytes, jct)
        iterations.append({"iteration": i, "jct_s": jct, "jct_s_real": jct / factor,
                           "algbw_bytes_per_s": algbw, "busbw_bytes_per_s": busbw})
    flows = [f for a in agents.values() for f in a["flows"]]
    sends = [f for f in flows if f["role"] == "send"]
    recvs = [f for f in flows if f["role"] == "recv"]
    fcts = [(f["end_ns"] - f["start_ns"]) / 1e9 for f in sends
            if f.get("end_ns") and f.get("start_ns")]
    lat_us = [ns / 1e3 for a in agents.values() for _, _, ns in a.get("latency_ns", [])]
    jcts = [it["jct_s"] for it in iterations]
    jct_mean = sum(jcts) / len(jcts) if jcts else None
    busbw = [it["busbw_bytes_per_s"] for it in iterations]
    metrics = {
        "ok": all(a.get("ok") for a in agents.values()) and len(iterations) == exp.iterations,
        "errors": {node: a["error"] for node, a in agents.items() if a.get("error")},
        "workload": exp.workload, "ranks": n, "message_bytes": exp.message_bytes,
        "transport": exp.transport, "entropy": exp.entropy, "seed": exp.seed,
        "scale_factor": factor, "link_mbps": link_mbps,
        "link_mbps_real": link_mbps * factor,
        "iterations": iterations,
        "jct_mean_s": jct_mean,
        "jct_mean_s_real": jct_mean / factor if jct_mean else None,
        "ideal_s": ideal,
        "jct_over_ideal": jct_mean / ideal if jct_mean and ideal else None,
        "busbw_over_link": units.bytes_per_s_to_mbps(sum(busbw) / len(busbw)) / link_mbps
        if busbw and workload_named(exp.workload).collective else None,
        "flows": {"count": len(sends),
                  "exactly_once": all(f["exactly_once"] for f in recvs),
                  "bytes_delivered": sum(f["bytes_delivered"] for f in recvs),
                  "bytes_expected": sum(f["size_bytes"] for f in recvs),
                  "retransmits": sum(f["retransmits"] for f in sends),
                  "naks": sum(f["naks"] for f in sends),
                  "timeouts": sum(f["timeouts"] for f in sends),
                  "trimmed": sum(f.get("trimmed", 0) for f in recvs),
                  "ooo_packets": sum(f["ooo_packets"] for f in recvs),
                  "dup_packets": sum(f["dup_packets"] for f in recvs),
                  "max_reorder": max((f["max_reorder"] for f in recvs), default=0),
                  "fct_p50_s": percentile(fcts, 50), "fct_p99_s": percentile(fcts, 99),
                  "fct_max_s": max(fcts) if fcts else None},
        "latency_us": {"samples": len(lat_us), "p50": percentile(lat_us, 50),
                       "p99": percentile(lat_us, 99), "p999": percentile(lat_us, 99.9)},
        "links": link_metrics(topo, link_totals),
        "cpu": cpu,
        "agent_cpu_s": {node: a.get("cpu_s") for node, a in agents.items()},
        "timings_s": timings,
    }
    return metrics


def link_metrics(topo, totals: dict) -> dict:
    """Drops over the run, and how evenly each leaf spread its traffic over its spine
    uplinks (ECMP): max/mean per leaf, the worst of the leaves that carried at least a
    tenth of the busiest leaf's uplink bytes (a leaf sending only ACKs does not count).

    `drops` are the fabric's: at the ports of nodes that forward. At an endpoint's own
    NIC a qdisc "drop" is a frame the queue refused (ENOBUFS) and the agent kept and sent
    again (traffic.port): `host_refused`, never loss."""
    up: dict[str, dict[str, int]] = {}
    for (node, ifname), t in totals.items():
        if topo.role(node) != "leaf":
            continue
        peer = topo.peer(node, ifname)
        if topo.role(peer) == "spine":
            up.setdefault(node, {})[peer] = t["tx_bytes"]
    ratios = {}
    busiest = max((sum(v.values()) for v in up.values()), default=0)
    for leaf, loads in up.items():
        mean = sum(loads.values()) / len(loads)
        if busiest and sum(loads.values()) >= busiest / 10 and mean:
            ratios[leaf] = max(loads.values()) / mean
    forwards = {n for n in topo.graph if topo.graph.nodes[n].get("forwards")}
    return {"drops": sum(t["drops"] for (n, _), t in totals.items() if n in forwards),
            "host_refused": sum(t["drops"] for (n, _), t in totals.items()
                                if n not in forwards),
            "max_backlog_bytes": max((t["max_backlog_bytes"] for t in totals.values()),
                                     default=0),
            "uplink_bytes": up,
            "uplink_max_over_mean_per_leaf": ratios,
            "uplink_max_over_mean": max(ratios.values()) if ratios else None}


def write_tables(folder: Path, agents: dict, samples, cpu_samples,
                 split: dict | None = None) -> None:
    """flows.csv (with each send flow's time split, testbed.attribution, where `split`
    has it), links.csv, cpu.csv, latency.csv."""
    keys = ["node", "tag", "iteration", "role", "src", "dst", "size_bytes", "start_ns",
            "end_ns", "fct_s", "goodput_mbps", "packets", "retransmits", "naks", "timeouts",
            "ooo_packets", "dup_packets", "max_reorder", "bytes_delivered", "exactly_once",
            "flowlet_changes", "trimmed", "sport", "arrival_s", *attribution.COLUMNS]
    split = split or {}
    with open(folder / "flows.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, keys, extrasaction="ignore")
        w.writeheader()
        for node, a in sorted(agents.items()):
            for f in a["flows"]:
                fct = ((f["end_ns"] - f["start_ns"]) / 1e9
                       if f.get("end_ns") and f.get("start_ns") else None)
                parts = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in
                         split.get(attribution.flow_id(node, f), {}).items()}
                w.writerow({**f, **parts, "node": node, "fct_s": fct,
                            "goodput_mbps": units.mbps(f["size_bytes"], fct) if fct else None})
    with open(folder / "links.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["t_s", "node", "ifname", "tx_bytes", "rx_bytes", "tx_packets", "drops",
                    "backlog_bytes"])
        for s in samples:
            w.writerow([f"{s.t_s:.3f}", s.node, s.ifname, s.tx_bytes, s.rx_bytes,
                        s.tx_packets, s.drops, s.backlog_bytes])
    with open(folder / "cpu.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["t_s", "cpu_percent", "steal_percent"])
        for t, load, steal in cpu_samples:
            w.writerow([f"{t:.3f}", load, steal])
    with open(folder / "latency.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["node", "tag", "iteration", "one_way_us"])
        for node, a in sorted(agents.items()):
            for tag, it, ns in a.get("latency_ns", []):
                w.writerow([node, tag, it, f"{ns / 1e3:.1f}"])


def collective_tables(result: RunResult) -> str:
    rows = [{"size_bytes": result.message_bytes, "time_us": it.jct_s * 1e6}
            for it in result.iterations]
    real = [{"size_bytes": r["size_bytes"], "time_us": r["time_us"] / result.scale_factor}
            for r in rows]
    return (nccl_table(result.workload, result.ranks, rows, unit="MB/s",
                       title=f"{result.workload} as measured")
            + "\n\n" + nccl_table(result.workload, result.ranks, real, unit="GB/s",
                                  title=f"{result.workload} scaled to the real fabric "
                                  f"(x{result.scale_factor:g})"))


def _fmt(value, spec: str = ".3f", none: str = "n/a") -> str:
    return none if value is None else format(value, spec)


def summary_md(name: str, metrics: RunResult | dict, topo_summary: dict,
               pcaps: list[Path]) -> str:
    """summary.md of a run's results (a RunResult, or the table it reads from)."""
    m = metrics if isinstance(metrics, RunResult) else RunResult.from_dict(metrics)
    f, lat, train = m.flows, m.latency_us, m.is_train
    lines = [f"# {name}", "",
             f"{m.workload} on {topo_summary['name']} ({topo_summary['kind']}), "
             f"{m.ranks} ranks, "
             + (f"{m.message_bytes} B per rank, " if not train else "")
             +
             f"{len(m.iterations)} iterations, transport {m.transport}, "
             f"entropy {m.entropy}, seed {m.seed}.", "",
             f"- result: {'completed' if m.ok else 'FAILED: ' + json.dumps(m.errors)}",
             (f"- JCT mean {_fmt(m.jct_mean_s)} s measured "
              f"(= {_fmt(m.jct_mean_s_real, '.6f')} s at x{m.scale_factor:g}); "
              f"ideal {_fmt(m.ideal_s)} s at {m.link_mbps:g} Mbit/s per rank: "
              f"JCT / ideal = {_fmt(m.jct_over_ideal)}" if not train else
              f"- step mean {_fmt(m.jct_mean_s)} s measured; scaled back, expected and "
              "split: the Training step section")]
    if m.busbw_over_link is not None:
        lines.append(f"- busbw / link rate = {_fmt(m.busbw_over_link)}")
    lines += [f"- bytes delivered {f.bytes_delivered} of {f.bytes_expected}, exactly "
              f"once: {'yes' if f.exactly_once else 'NO'}; retransmissions "
              f"{f.retransmits}, NAKs {f.naks}, timeouts {f.timeouts}"
              + (f" (RTO {m.rto_ms:g} ms)" if m.rto_ms is not None else "") + ", "
              f"out-of-order packets {f.ooo_packets} (max reorder {f.max_reorder})",
              f"- FCT p50 {_fmt(f.fct_p50_s)} s, p99 {_fmt(f.fct_p99_s)} s; one-way "
              f"latency p50 {_fmt(lat.p50, '.0f')} us, p99 {_fmt(lat.p99, '.0f')} us, "
              f"p99.9 {_fmt(lat.p999, '.0f')} us ({lat.samples} samples)"]
    links = m.links
    if links.uplink_max_over_mean is not None:
        lines.append(f"- leaf->spine uplinks: max load {links.uplink_max_over_mean:.2f}x "
                     "the mean")
    lines.append(f"- fabric drops {links.drops} (frames the endpoints' own NIC queues "
                 f"refused and their agents sent again: {links.host_refused}); "
                 f"CPU mean {m.cpu['cpu_mean_percent']}% of {m.cpu['cores']} cores")
    rc = m.rate_choice
    if rc:
        lines.append(f"- rate auto: {rc['rate_mbps']:g} Mbit/s per endpoint link (scale factor "
                     f"x{m.scale_factor:g}); the workload offers {rc['offered_mbps']:g} "
                     f"Mbit/s at {rc['base_mbps']:g} Mbit/s links over "
                     f"{rc['mean_switch_hops']:.1f} switch hops on average, which this "
                     f"machine (calibrated at {rc['budget_pps_direct']} packets/s on "
                     f"{rc['calibrated_utc']}) should carry faithfully up to "
                     f"{rc['max_faithful_mbps']:g} Mbit/s links (testbed.calibrate); "
                     f"set by {rc.get('bound_by', 'cpu')} ({BOUNDS[rc.get('bound_by', 'cpu')]})"
                     + controller_note(rc))
    ck = m.rate_check
    if ck:
        lines.append(f"- rate {ck['rate_mbps']:g} Mbit/s per endpoint link (set, not auto): "
                     f"this machine (calibrated at {ck['budget_pps_direct']} packets/s on "
                     f"{ck['calibrated_utc']}) should carry this workload faithfully up to "
                     f"{ck['max_faithful_mbps']:g} Mbit/s links (testbed.calibrate), so "
                     + ("it is within that" if ck["within"] else
                        "it is beyond that: the fidelity verdict says whether the emulator "
                        "kept up all the same"))
    if m.fidelity:
        lines.append("- " + fidelity_line(m.fidelity.to_dict()))
    if m.engine:
        lines.append(f"- agents' engine: {m.engine} (docs/compiled.md)")
    energy = m.link_energy
    if energy:
        job = next(iter(energy["jobs"].values()), None)
        lines.append(f"- link energy ({energy['run']['power_w']:.0f} W of links at the real "
                     f"rates): run {energy['run']['energy_j']:.3g} J on the real fabric "
                     f"({energy['run']['energy_j_at_measured_time']:.3g} J over the measured "
                     "time)" + (f"; job {job['energy_j']:.3g} J" if job else ""))
    lines += feature_lines(m.to_dict())   # what each feature the run used says
    if m.iterations and not train:
        lines += ["", "```", collective_tables(m), "```"]
    if train:        # a training step: its own section and collectives table
        from testbed.train_run import summary_lines
        lines += summary_lines(m.train)
    lines += flow_run.summary_lines(m.open_loop)   # open-loop flows, RPCs
    lines += attribution.summary_lines(m.attribution)
    if m.expected:   # what physics or the literature predicts (testbed.expect)
        lines += expectation_lines([Expectation.from_dict(e) for e in m.expected])
    if pcaps:
        lines += ["", "pcaps (open in Wireshark; UDP 4791 decodes as InfiniBand): "
                  + ", ".join(f"pcaps/{p.name}" for p in pcaps)]
    return "\n".join(lines) + "\n"


def read_tables(folder: Path) -> tuple[list[float], list]:
    """Latencies and link samples back from a results folder's CSV tables."""
    from testbed.collect import LinkSample
    with open(folder / "latency.csv") as fh:
        lat = [float(row["one_way_us"]) for row in csv.DictReader(fh)]
    with open(folder / "links.csv") as fh:
        samples = [LinkSample(float(r["t_s"]), r["node"], r["ifname"], int(r["tx_bytes"]),
                              int(r["rx_bytes"]), int(r["tx_packets"]), int(r["drops"]),
                              int(r["backlog_bytes"])) for r in csv.DictReader(fh)]
    return lat, samples


def port_series(samples, t_from: float, t_to: float) -> dict:
    """Per port, (time since t_from, tx bytes) from the last sample before the workload
    to the first after it: a sampler that came late (0.6 s apart on a busy machine, not
    0.25) still brackets the workload."""
    by_port: dict = {}
    for s in samples:                      # in time order
        by_port.setdefault((s.node, s.ifname), []).append(s)
    series = {}
    for key, pts in by_port.items():
        before = [p for p in pts if p.t_s <= t_from][-1:]
        after = [p for p in pts if p.t_s >= t_to][:1]
        chosen = before + [p for p in pts if t_from < p.t_s < t_to] + after
        series[key] = [(p.t_s - t_from, p.tx_bytes) for p in chosen]
    return series


def write_plots(folder: Path, metrics: dict, latencies: list[float], samples) -> list[Path]:
    """Latency CDF and per-port throughput of the busiest ports over time."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = []
    lat = sorted(latencies)
    if lat:
        fig = Figure(figsize=(6, 4), dpi=110)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        ax.plot(lat, [(i + 1) / len(lat) for i in range(len(lat))])
        ax.set_xscale("log")
        ax.set_xlabel("one-way latency (us, measured)")
        ax.set_ylabel("CDF")
        ax.set_title(f"{metrics['workload']}: packet latency ({len(lat)} samples)")
        ax.grid(True, alpha=0.3)
        out.append(save_plot(fig, folder, "latency_cdf.png"))
    t_from, t_to = metrics.get("workload_window_s") or (0.0, float("inf"))
    series = port_series(samples, t_from, t_to)
    rates = {}
    for key, pts in series.items():
        r = [(t1, units.mbps(b1 - b0, t1 - t0)) for (t0, b0), (t1, b1) in
             zip(pts, pts[1:], strict=False) if t1 > t0]
        if r and max(v for _, v in r) > 0:
            rates[key] = r
    if rates:
        top = sorted(rates, key=lambda k: -sum(v for _, v in rates[k]))[:8]
        fig = Figure(figsize=(7, 4), dpi=110)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        for key in top:
            ax.plot([t for t, _ in rates[key]], [v for _, v in rates[key]], label=key[1])
        ax.set_xlabel("time since the workload started (s)")
        ax.set_ylabel("egress rate (Mbit/s, measured)")
        period = metrics.get("link_sample_period_s")
        ax.set_title(f"{metrics['workload']}: the 8 busiest ports"
                     + (f" (sampled every {period:.2g} s)" if period else ""))
        ax.legend(fontsize=7, ncol=2)
        ax.grid(True, alpha=0.3)
        out.append(save_plot(fig, folder, "port_rates.png"))
    return out


# -- experiment scripts: one folder holding several runs -------------------------------
@contextlib.contextmanager
def marks_failure(folder: Path):
    """Run a script's cases; if they do not all complete, leave FAILED with the reason
    (Ctrl-C and SIGTERM included) and let the exception go on."""
    from topologies.spec import SpecError
    try:
        yield
    except (KeyboardInterrupt, Exception) as exc:
        if isinstance(exc, SpecError) and not any(folder.iterdir()):
            folder.rmdir()           # a bad setting before any run: nothing left behind
        else:
            mark_failed(folder, failure_reason(exc))
        raise


# metrics.json's layout (testbed.run_result): a reader (`testbed report`) takes folders of
# this version and older ones, which carry no schema_version.
METRICS_SCHEMA_VERSION = SCHEMA_VERSION
# the keys every run's results have (RunResult's required fields)
RUN_KEYS = frozenset(RunResult.required_keys())


def write_metrics(folder: Path, metrics: RunResult | dict | list) -> None:
    """metrics.json, schema_version first. A run's results (a RunResult, or the table of
    one: compute_metrics' keys and what the run added) are written through RunResult,
    which refuses a value of the wrong type; a script's own table of several runs (no
    run's keys, or a list of rows) is written as it is."""
    if isinstance(metrics, dict) and metrics.keys() >= RUN_KEYS:
        metrics = RunResult.from_dict(metrics)
    if isinstance(metrics, RunResult):
        metrics.save(folder)
        return
    if isinstance(metrics, dict):
        metrics = {"schema_version": METRICS_SCHEMA_VERSION, **metrics}
    (folder / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")


def read_metrics(folder: Path) -> dict:
    """A results folder's metrics.json as a table, of this schema version or an older one
    (without schema_version); ValueError for one this code does not know (newer, or not a
    table). A run's folder reads typed with RunResult.load."""
    metrics = json.loads((folder / "metrics.json").read_text())
    if not isinstance(metrics, dict):
        raise ValueError("metrics.json is not a table")
    version = metrics.get("schema_version", 0)
    if not isinstance(version, int) or isinstance(version, bool) \
            or not 0 <= version <= METRICS_SCHEMA_VERSION:
        raise ValueError(f"metrics.json has schema_version {version!r}; this testbed reads "
                         f"versions up to {METRICS_SCHEMA_VERSION}")
    return metrics


def finish_script(folder: Path, text: str, metrics, plots: list[Path]) -> int:
    """summary.md, metrics.json and index.html (its runs side by side) of a script's
    folder; print where everything is."""
    (folder / "summary.md").write_text(text)
    write_metrics(folder, metrics)
    page = write_index(folder)
    print(text)
    print("plots: " + ", ".join(str(p.relative_to(folder)) for p in plots))
    print(f"page: {page}")
    print(f"results: {folder}")
    return 0


class RunFailedError(RuntimeError):
    """The run did not complete; the results folder carries FAILED with the reason."""

    def __init__(self, message: str, folder: Path):
        super().__init__(message)
        self.folder = folder


def script_exit(main) -> int:
    """Exit code of an experiment script, each failure one line, not a traceback: a bad
    setting 2 (SpecError names it), a run that did not complete 1 (its folder says why),
    SIGTERM and SIGHUP stop it as Ctrl-C does (testbed.interrupts): 130 after Ctrl-C,
    143 after SIGTERM."""
    import sys

    from topologies.spec import SpecError
    try:
        with stop_on_signals():
            return main()
    except KeyboardInterrupt as exc:
        print(f"{failure_reason(exc)}; the fabric was taken down and the folder marked "
              "FAILED", file=sys.stderr)
        return exit_code(exc)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RunFailedError as exc:
        print(f"FAILED: {exc} (see {exc.folder}); the fabric was taken down",
              file=sys.stderr)
        return 1
