#!/usr/bin/env python3
"""Profile: where a delivered data packet's CPU goes (measure before optimising).

Runs one experiment through testbed.run.run (default: ring all-reduce, 8 ranks, one-tier
non-blocking fabric at 100 Mbit/s, RoCE, static ECMP, as scripts/bench_scale.py builds
it) and splits the machine's CPU over the workload window (the first iteration's start
to the last one's end, from the agents' own clocks) per delivered data packet:

- agents_user, agents_sys: the agent processes in user mode and in the kernel outside
  softirq/irq (their syscalls: sendto, recv, select, the qdisc and veth transmit);
- kernel_softirq_irq: softirq and hardirq work of the whole machine, whichever process
  it interrupted (veth delivery, forwarding in the switch namespaces, tc, the receive
  path up to the socket): kernel forwarding; also per packet and hop (links crossed);
- pfc_controller: the run's forked helpers (the PFC/ECN controller) when PFC is on;
- run_process: the run's own process (its link and CPU samplers, waiting on agents);
- profiler: perf and this script's /proc sampler (the measurement's own cost);
- rest: everything else the machine ran (other users of a shared machine included).

The split comes from `perf record -a -e cpu-clock -g` (sampled on every core at --freq
Hz, monotonic clock): a sample counts as softirq/irq when its kernel stack holds the
softirq or interrupt entry, else as its process's user or kernel time, so the parts
partition the busy samples and add up to the total by construction. Each busy sample
weighs its period (~1 ms); idle is what is left of cores x window, not counted from
idle samples (an idle core in NO_HZ is barely sampled here). (cpu-clock is a
timer: it cannot fire inside a hardirq handler, so hardirq time itself is missed and
lands on what runs next; veth has no device interrupts, only timers). /proc alone cannot
do this here: without CONFIG_IRQ_TIME_ACCOUNTING a tick in softirq is charged to the
interrupted task's stime as well as to /proc/stat's softirq, so the agents' stime and
the machine's softirq overlap. /proc is still sampled (every 50 ms, interpolated at the
window's edges) and reported beside the split as a check ("proc": /proc/stat busy and
softirq+irq, the agents' utime/stime from /proc/<pid>/stat, 10 ms ticks).

The kernel's share (the agents' system calls and softirq/irq) is named per part by its
samples' stacks (testbed.kernel_split: timer interrupts, qdisc, classifier, eBPF, veth,
forwarding, the sockets, ...), and `perf stat -a` counts, over the same window, timer
interrupts, system calls, context switches and device transmits per packet.
`--layout plain` runs the same fabric with no qdisc on any port (fabric.shaping): the
kernel's floor, to set the shaped layout's share against (docs/kernel_cost.md).

Also: wake-ups per packet (the agents' select() returns until their flows were done),
and with --cprofile a second, separate run with the first rank's agent under cProfile
(traffic.agent_cprofile) and its top functions by cumulative CPU time (cProfile slows that
agent, so the breakdown never comes from that run). Prints the machine's calibration
line; writes profile.json into the run's results folder (or --out).

    sudo .venv/bin/python scripts/profile_packet.py [--ranks 8] [--pfc] [--cprofile]
        [--layout plain]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from fabric.shaping import PLAIN, PORT_LAYOUTS, SHAPED, layout_env
from testbed import kernel_split
from testbed.benchmarks import machine_line
from testbed.experiment import finite_float, from_toml
from testbed.run import run
from testbed.script_args import add_rate
from traffic import launch
from traffic.transport import packet_count
from traffic.transport_settings import COALESCE_FRAMES

ROOT = Path(__file__).resolve().parent.parent

PARTS = ("agents_user", "agents_sys", "kernel_softirq_irq", "pfc_controller",
         "run_process", "profiler", "rest")
SOFTIRQ_FRAMES = {"handle_softirqs", "__do_softirq", "do_softirq", "net_rx_action",
                  "net_tx_action", "run_ksoftirqd"}
# an interrupt's handler proper; not its entry/exit (a reschedule on the way back out)
IRQ_FRAME = re.compile(r"^(__sysvec_|__common_interrupt|handle_irq_event|handle_\w+_irq$)")
HEADER = re.compile(r"^(.*?)\s+(\d+)/(\d+)\s+\[(\d+)\]\s+(\d+\.\d+):\s+(\d+)")
TICK = os.sysconf("SC_CLK_TCK")
STAT_INTERVAL_MS = 20           # perf stat's interval: the window's edges are cut in it


def experiment(args, base: str, name: str):
    return from_toml(None, {
        "name": name, "workload": "allreduce", "message_bytes": args.message_bytes,
        "iterations": args.iterations, "transport": "roce", "entropy": "ecmp",
        "pfc": "on" if args.pfc else "", "results_dir": base, "timeout_s": 600.0,
        "rto_ms": 200.0, "agent_processes": args.processes,
        "coalesce_frames": args.coalesce_frames,
        "topology": {"name": f"nonblocking{args.ranks}", "kind": "one_tier",
                     "params": {"nodes": args.ranks, "planes": 1,
                                "rate_mbps": args.rate_mbps}}})


def process_wakeups(agents: dict) -> int:
    """select() returns of the agents' processes until their agents were done: one
    count per process (each agent's results carry its process's, `host`)."""
    by_process: dict[tuple, int] = {}
    for node, a in agents.items():
        key = tuple((a.get("host") or {}).get("nodes") or [node])
        by_process[key] = max(by_process.get(key, 0),
                              a.get("wakeups_until_done") or a.get("wakeups") or 0)
    return sum(by_process.values())


class ProcSampler:
    """Every `period_s`: /proc/stat's cpu line and each agent's utime/stime (ticks);
    finds the agents' processes (cmdline: traffic.host or traffic.agent_cprofile, and
    `marker`) and this process's forked
    helpers (same cmdline as this one)."""

    def __init__(self, marker: str, period_s: float = 0.05):
        self.marker, self.period_s = marker.encode(), period_s
        self.samples: list[tuple[float, list[int], dict[int, tuple[int, int]]]] = []
        self.agents: set[int] = set()
        self.helpers: set[int] = set()
        self.tid = None
        self.cpu_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="proc-sampler", daemon=True)
        self._me = Path("/proc/self/cmdline").read_bytes()

    def start(self) -> ProcSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _scan(self) -> None:
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or int(d.name) in self.agents | self.helpers:
                continue
            try:
                cmd = (d / "cmdline").read_bytes()
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if (b"traffic.host" in cmd or b"traffic.agent" in cmd) and self.marker in cmd:
                self.agents.add(int(d.name))
            elif ppid == os.getpid() and cmd == self._me:
                self.helpers.add(int(d.name))

    def _run(self) -> None:
        self.tid = threading.get_native_id()
        k = 0
        while not self._stop.wait(self.period_s):
            if k % 10 == 0:        # twice a second: agents start seconds before the work
                self._scan()
            k += 1
            t = time.monotonic()
            stat = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
            tasks = {}
            for pid in self.agents:
                try:
                    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                    tasks[pid] = (int(f[11]), int(f[12]))
                except (OSError, IndexError, ValueError):
                    pass
            self.samples.append((t, stat, tasks))
        self.cpu_s = time.thread_time()

    def at(self, t: float) -> tuple[list[float], dict[int, tuple[float, float]]]:
        """/proc/stat fields and agents' (utime, stime), in seconds, interpolated at t."""
        s = self.samples
        i = next((j for j, x in enumerate(s) if x[0] >= t), len(s) - 1)
        a, b = s[max(0, i - 1)], s[i]
        w = 0.0 if b[0] == a[0] else min(1.0, max(0.0, (t - a[0]) / (b[0] - a[0])))
        stat = [(x + w * (y - x)) / TICK for x, y in zip(a[1], b[1], strict=False)]
        tasks = {}
        for pid, (ub, sb) in b[2].items():     # an agent that exited: its last reading
            ua, sa = a[2].get(pid, (ub, sb))
            tasks[pid] = ((ua + w * (ub - ua)) / TICK, (sa + w * (sb - sa)) / TICK)
        return stat, tasks


def proc_check(sampler: ProcSampler, window: tuple[float, float]) -> dict:
    (s0, t0), (s1, t1) = sampler.at(window[0]), sampler.at(window[1])
    d = [y - x for x, y in zip(s0, s1, strict=False)]   # user nice system idle iowait irq
    user = sum(t1[p][0] - t0.get(p, t1[p])[0] for p in t1)   # softirq steal ...
    syst = sum(t1[p][1] - t0.get(p, t1[p])[1] for p in t1)
    return {"machine_busy_s": sum(d[:3]) + sum(d[5:8]), "softirq_irq_s": d[5] + d[6],
            "system_s": d[2], "agents_utime_s": user,
            "agents_stime_s": syst, "samples": len(sampler.samples),
            "agent_processes_seen": len(sampler.agents)}


def perf_split(data: Path, window: tuple[float, float], agents: set[int], helpers: set[int],
               own: set[int]) -> dict:
    """CPU seconds in the window per part (each sample weighs its period), the samples
    per part (and idle's), the top kernel symbols of the softirq/irq samples, and the
    kernel's share (the agents' system calls and softirq/irq) per named kernel part
    (testbed.kernel_split)."""
    out = subprocess.run(["perf", "script", "-i", str(data), "-F",
                          "comm,pid,tid,cpu,time,period,ip,sym"], capture_output=True, text=True)
    counts = dict.fromkeys((*PARTS, "idle"), 0)
    seconds = dict.fromkeys(PARTS, 0.0)
    kernel_syms: dict[str, int] = {}
    named: dict[str, float] = {}
    for block in out.stdout.split("\n\n"):
        lines = block.strip("\n").split("\n")
        m = HEADER.match(lines[0]) if lines and lines[0] else None
        if not m or not window[0] <= float(m[5]) <= window[1]:
            continue
        pid, tid = int(m[2]), int(m[3])
        frames = [ln.split(None, 1) for ln in lines[1:] if ln.strip()]
        syms = [f[1] if len(f) > 1 else "" for f in frames]
        kernel = bool(frames) and frames[0][0].startswith("ffff")
        if any(s in SOFTIRQ_FRAMES or IRQ_FRAME.match(s) for s in syms) \
                or m[1].strip().startswith("ksoftirqd"):
            part = "kernel_softirq_irq"
            top = syms[0].split("+", 1)[0] if syms else "?"
            kernel_syms[top] = kernel_syms.get(top, 0) + 1
        elif pid == 0:
            part = "idle"
        elif pid in agents:
            part = "agents_sys" if kernel else "agents_user"
        elif pid in helpers:
            part = "pfc_controller"
        elif pid in own or tid in own:
            part = "profiler"
        elif pid == os.getpid():
            part = "run_process"
        else:
            part = "rest"
        counts[part] += 1
        if part != "idle":
            seconds[part] += int(m[6]) / 1e9
        if part in ("kernel_softirq_irq", "agents_sys"):
            k = kernel_split.classify([s.split("+", 1)[0] for s in syms])
            named[k] = named.get(k, 0.0) + int(m[6]) / 1e9
    top = sorted(kernel_syms.items(), key=lambda kv: -kv[1])[:10]
    return {"seconds": seconds, "counts": counts, "kernel_named_s": named,
            "softirq_top_symbols": [{"symbol": s, "samples": n} for s, n in top]}


def cprofile_top(path: Path, n: int = 15) -> list[dict]:
    import pstats
    stats = pstats.Stats(str(path))
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][3])[:n]
    return [{"function": f"{Path(f).name}:{line}({name})", "ncalls": nc,
             "tottime_s": round(tt, 4), "cumtime_s": round(ct, 4)}
            for (f, line, name), (_, nc, tt, ct, _) in rows]


def agent_results(folder: Path) -> dict[str, dict]:
    return {p.name[6:-5]: json.loads(p.read_text())
            for p in sorted((folder / "agents").glob("agent-*.json"))
            if not p.name.endswith(".config.json")}


def measure(args, base: Path) -> tuple[Path, dict]:
    exp = experiment(args, str(base), f"profile_packet{args.ranks}")
    topo = exp.resolve_topology()
    sampler = ProcSampler(str(base)).start()
    data = base / f".perf-{os.getpid()}.data"
    perf = subprocess.Popen(["perf", "record", "-q", "-a", "-g", "-e", "cpu-clock",
                             "-F", str(args.freq), "-k", "monotonic", "-o", str(data)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stat_out = base / f".perf-stat-{os.getpid()}.csv"
    # perf mounts tracefs to resolve tracepoints where none is mounted: in a mount
    # namespace of its own (unshare execs perf, which keeps the pid SIGINT goes to), so
    # the machine's mounts stay as they were; -a counts every CPU whatever the namespace
    stat = subprocess.Popen(["unshare", "--mount", "--propagation", "private",
                             "perf", "stat", "-a", "-x", ",", "-I", str(STAT_INTERVAL_MS),
                             "-o", str(stat_out), "-e", ",".join(kernel_split.EVENTS.values())],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stat_start = time.monotonic()
    try:
        with layout_env(args.layout):
            folder, m = run(exp, progress=lambda s: print(f"  {s}", file=sys.stderr))
    except BaseException:        # a failed run leaves no perf file behind
        data.unlink(missing_ok=True)
        stat_out.unlink(missing_ok=True)
        raise
    finally:
        for p in (perf, stat):
            p.send_signal(signal.SIGINT)
            p.wait(timeout=60)
        sampler.stop()
    agents = agent_results(folder)
    spans = [it for a in agents.values() for it in a["iterations"] if it.get("end_ns")]
    window = (min(s["start_ns"] for s in spans) / 1e9, max(s["end_ns"] for s in spans) / 1e9)
    recvs = [f for a in agents.values() for f in a["flows"]
             if f["role"] == "recv" and f.get("end_ns")]
    import networkx as nx
    packets = hop_packets = 0
    for f in recvs:
        n = packet_count(int(f["size_bytes"]), exp.payload_bytes)
        packets += n
        hop_packets += n * nx.shortest_path_length(topo.graph, f["src"], f["dst"])
    split = perf_split(data, window, sampler.agents, sampler.helpers,
                       {perf.pid, sampler.tid or -1})
    data.unlink(missing_ok=True)          # tens of MB: the split above is what it holds
    events = kernel_split.window_counts(
        kernel_split.parse_stat_intervals(stat_out.read_text() if stat_out.exists() else ""),
        stat_start, window, STAT_INTERVAL_MS / 1000)
    stat_out.unlink(missing_ok=True)
    counts = split["counts"]
    seconds = window[1] - window[0]
    cores = os.cpu_count() or 1
    parts = {k: 1e6 * split["seconds"][k] / packets for k in PARTS}
    total = sum(parts.values())
    proc = proc_check(sampler, window)
    wakeups = process_wakeups(agents)
    ctl = ((m.get("pfc") or {}).get("controller") or {})
    rec = {
        "experiment": {"workload": "allreduce", "ranks": args.ranks,
                       "rate_mbps": args.rate_mbps, "message_bytes": args.message_bytes,
                       "iterations": args.iterations, "transport": "roce", "pfc": args.pfc,
                       "agent_processes": args.processes,
                       "coalesce_frames": args.coalesce_frames,
                       "topology": "one_tier", "layout": args.layout},
        "machine": machine_line(), "cores": cores, "window_s": round(seconds, 4),
        "packets": packets, "hops_per_packet": round(hop_packets / packets, 3),
        "parts_us_per_packet": {k: round(v, 3) for k, v in parts.items()},
        "total_us_per_packet": round(total, 3),
        "busy_percent": round(100 * sum(split["seconds"].values()) / (seconds * cores), 1),
        "kernel_us_per_packet_hop": round(parts["kernel_softirq_irq"] * packets
                                          / hop_packets, 3),
        "kernel_us_per_packet": round(parts["agents_sys"] + parts["kernel_softirq_irq"], 3),
        "kernel_parts_us_per_packet": kernel_split.per_packet(split["kernel_named_s"],
                                                              packets),
        "events_per_packet": {k: round(v / packets, 4) for k, v in sorted(events.items())},
        "qdisc_watchdog_firings_per_packet": round(
            (m.get("shaping_timers") or {}).get("firings", 0) / packets, 4),
        "wakeups_per_packet": round(wakeups / packets, 4),
        "turns_per_packet": round(sum(a.get("turns") or 0 for a in agents.values())
                                  / packets, 4),
        "agents_cpu_run_s": round(sum(a.get("cpu_run_s") or 0 for a in agents.values()), 4),
        "pfc_controller_cpu_s": ctl.get("cpu_s"),
        "perf": {"freq_hz": args.freq, "samples": counts,
                 "busy_s": round(sum(split["seconds"].values()), 4),
                 "softirq_top_symbols": split["softirq_top_symbols"]},
        "proc": {**{k: round(v, 4) if isinstance(v, float) else v for k, v in proc.items()},
                 "softirq_irq_us_per_packet": round(1e6 * proc["softirq_irq_s"] / packets, 3),
                 "machine_busy_us_per_packet": round(1e6 * proc["machine_busy_s"] / packets,
                                                     3)},
        "jct_over_ideal": m.get("jct_over_ideal"), "fidelity": m["fidelity"]["verdict"],
        "engines": m.get("engine", "").split(", "),
        "results": str(folder), "cprofile": None,
    }
    return folder, rec


def profiled_agent(args, base: Path, out: Path) -> list[dict]:
    """A separate run with the first rank's agent under cProfile: its top functions."""
    exp = experiment(args, str(base), f"profile_packet{args.ranks}_cprofile")
    node = exp.resolve_topology().endpoints()[0]
    launch.CPROFILE_AGENTS[node] = out
    try:
        run(exp, progress=lambda s: print(f"  {s}", file=sys.stderr))
    finally:
        launch.CPROFILE_AGENTS.clear()
    return [{"node": node, **row} for row in cprofile_top(out)]


def report(rec: dict) -> str:
    p, proc = rec["parts_us_per_packet"], rec["proc"]
    lines = [f"# where a delivered data packet's CPU goes: ring all-reduce, "
             f"{rec['experiment']['ranks']} ranks, one-tier, "
             f"{rec['experiment']['rate_mbps']:g} Mbit/s; {rec['machine']}",
             f"# {rec['packets']} data packets in {rec['window_s']} s on {rec['cores']} "
             f"cores ({rec['busy_percent']}% busy), {rec['hops_per_packet']} hops each; "
             f"JCT/ideal {rec['jct_over_ideal']:.3f}, {rec['fidelity']}"]
    for k in PARTS:
        share = 100 * p[k] / rec["total_us_per_packet"] if rec["total_us_per_packet"] else 0
        lines.append(f"  {k:20s} {p[k]:8.2f} us/packet  {share:5.1f}%")
    lines += [f"  {'total':20s} {rec['total_us_per_packet']:8.2f} us/packet",
              f"kernel forwarding per packet and hop: {rec['kernel_us_per_packet_hop']} us; "
              f"wake-ups per packet: {rec['wakeups_per_packet']}; agents' turns per "
              f"packet: {rec['turns_per_packet']}",
              f"check (/proc, 10 ms ticks): machine busy {proc['machine_busy_us_per_packet']}"
              f" us/packet, softirq+irq {proc['softirq_irq_us_per_packet']} us/packet; "
              f"agents utime {proc['agents_utime_s']} s, stime {proc['agents_stime_s']} s "
              f"(stime includes softirq ticks that hit them)"]
    k = rec["kernel_parts_us_per_packet"]
    lines.append(f"the kernel's share, {rec['kernel_us_per_packet']} us/packet, named "
                 "(testbed.kernel_split): " + ", ".join(
                     f"{name} {v:.2f}" for name, v in sorted(k.items(), key=lambda kv: -kv[1])
                     if v >= 0.05))
    lines.append("events per packet (perf stat, whole machine): " + ", ".join(
        f"{name} {v}" for name, v in rec["events_per_packet"].items())
        + f"; qdisc watchdog firings {rec['qdisc_watchdog_firings_per_packet']}")
    if rec["perf"]["softirq_top_symbols"]:
        lines.append("softirq/irq top symbols: " + ", ".join(
            f"{r['symbol']} {r['samples']}" for r in rec["perf"]["softirq_top_symbols"][:6]))
    for row in rec["cprofile"] or []:
        lines.append(f"  cProfile {row['node']}: {row['cumtime_s']:8.3f} s cum "
                     f"{row['tottime_s']:8.3f} s own {row['ncalls']:>8} calls  "
                     f"{row['function']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    add_rate(ap, type=finite_float, default=100.0)
    ap.add_argument("--message-bytes", type=int, default=2 << 20, help="bytes per rank")
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--freq", type=int, default=997, help="perf samples per second per core")
    ap.add_argument("--processes", type=int, default=0,
                    help="agent processes (0: one per core; >= ranks: one per rank)")
    ap.add_argument("--coalesce-frames", type=finite_float, default=COALESCE_FRAMES,
                    help="the agents' interrupt moderation, in frame times")
    ap.add_argument("--layout", choices=PORT_LAYOUTS, default=SHAPED,
                    help="the ports' qdiscs: shaped (the testbed's), or plain (none: the "
                         "kernel's floor, links at CPU speed; fabric.shaping)")
    ap.add_argument("--pfc", action="store_true",
                    help="PFC on (the controller's CPU becomes a part of its own)")
    ap.add_argument("--cprofile", action="store_true",
                    help="also a second run with the first rank's agent under cProfile")
    ap.add_argument("--results-dir", default=str(ROOT / "results"))
    ap.add_argument("--out", help="profile JSON (default: profile.json in the run's folder)")
    args = ap.parse_args(argv)
    if shutil.which("perf") is None:
        print("error: needs perf (linux-perf / linux-tools) to split softirq from the "
              "agents' kernel time", file=sys.stderr)
        return 2
    if args.layout == PLAIN and args.pfc:
        print("error: --pfc needs the shaped layout (a lossless class is a qdisc; "
              "--layout plain has none)", file=sys.stderr)
        return 2
    base = Path(args.results_dir).resolve()
    base.mkdir(parents=True, exist_ok=True)
    folder, rec = measure(args, base)
    if args.cprofile:
        rec["cprofile"] = profiled_agent(args, base, folder / "agent-cprofile.prof")
    out = Path(args.out) if args.out else folder / "profile.json"
    out.write_text(json.dumps(rec, indent=1) + "\n")
    print(report(rec))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from testbed.results import script_exit
    sys.exit(script_exit(main))
