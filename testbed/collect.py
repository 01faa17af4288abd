"""Collectors that run beside a workload: link/queue counters, CPU load, pcaps.

Each is started before the agents and stopped after them (start()/stop()). Samplers
keep one netlink socket per node, opened inside its namespace, so a sample is one
dump per node and never a process. Byte counters come from each node's /proc/net/dev,
opened once inside its namespace and read again per sample: parsing every link's
netlink attributes took 22 ms of CPU per sample of a 17-node fabric (a tenth of a core
at 4 samples/s, taken from the emulation), the file 0.1 ms.

The link sampler holds itself to SAMPLER_SHARE of a core, half of it for each of its two
reads. The byte counters (one read of a file per node) come every `period_s` unless that
read costs more than its half. The queues' drops and backlog come from qdisc dumps, which
cost per port (pyroute2 parses every message: 210 ms a dump on the 128-GPU rail fabric,
14 ms on a 10-node one), so a dump waits until its own cost fits its half; a sample
between dumps carries the last dump's queue figures. So a short incast still gets a
rate point every 50 ms on a small fabric, where dumps alone came every 0.28 s.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from fabric import netns
from fabric.inspect import dev_counters
from fabric.lossless import LOSSLESS_HANDLE
from fabric.shaping import handle_int
from testbed import softnet

LOW_FIDELITY_CPU_PERCENT = 90.0
SAMPLER_SHARE = 0.05                          # of a core, at most, for the link sampler
LOSSLESS = handle_int(LOSSLESS_HANDLE)       # a port's lossless queue (tbf 13:), if any


@dataclass
class LinkSample:
    t_s: float
    node: str
    ifname: str
    tx_bytes: int
    rx_bytes: int
    tx_packets: int
    drops: int
    backlog_bytes: int


class LinkSampler:
    """Every fabric port's byte counters and egress queue, every `period_s`: drops and
    backlog are the lossy queue's (bfifo) plus the lossless one's where PFC runs."""

    def __init__(self, fabric, period_s: float = 0.05):
        self.fabric = fabric
        self.period_s = period_s
        self._queues: dict[str, dict[int, tuple[int, int]]] = {}   # node -> the last dump
        self.samples: list[LinkSample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._iprs: dict = {}
        self._devs: dict[str, int] = {}               # node -> its /proc/net/dev, open
        self._names: dict[str, dict[int, str]] = {}   # node -> ifindex -> ifname
        self._first_rx: dict[str, int] = {}           # node -> its ports' rx bytes at start
        self._last_rx: dict[str, int] = {}            # ... at the latest sample

    def start(self) -> LinkSampler:
        self.t0 = time.monotonic()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="link-sampler", daemon=True)
        self._thread.start()
        self._ready.wait(timeout=30)
        if self._error:
            raise self._error
        return self

    def _run(self) -> None:
        # pyroute2 sockets belong to the thread that made them: open them here.
        from pyroute2 import IPRoute
        try:
            for node in self.fabric.here:      # this machine's nodes
                with netns.entered(self.fabric.ns(node)):
                    self._iprs[node] = ipr = IPRoute()
                    self._devs[node] = os.open("/proc/thread-self/net/dev", os.O_RDONLY)
                self._names[node] = {lk["index"]: lk.get_attr("IFLA_IFNAME")
                                     for lk in ipr.get_links()}
            self.sample()
        except BaseException as exc:  # reported by start()
            self._error = exc
            return
        finally:
            self._ready.set()
        try:
            wait, next_dump = self.period_s, 0.0
            while not self._stop.wait(wait):
                dump = time.monotonic() >= next_dump
                cpu = time.thread_time()
                self.sample(dump_queues=dump)
                spent = (time.thread_time() - cpu) / (SAMPLER_SHARE / 2)
                if dump:
                    next_dump = time.monotonic() + spent
                else:
                    wait = max(self.period_s, spent)
            self.sample()
        finally:
            for ipr in self._iprs.values():
                ipr.close()
            self._iprs.clear()
            for fd in self._devs.values():
                os.close(fd)
            self._devs.clear()

    def sample(self, dump_queues: bool = True) -> None:
        """Every port's counters now; its queues' too, or as the last dump had them."""
        t = time.monotonic() - self.t0
        for node, ipr in self._iprs.items():
            if dump_queues or node not in self._queues:
                self._queues[node] = queue_stats(ipr)
            queues = self._queues[node]
            names = self._names[node]
            counters = dev_counters(os.pread(self._devs[node], 1 << 20, 0))
            rx = 0
            for index, q in queues.items():
                c = counters.get(names.get(index))
                if c is None:  # a port going away at teardown
                    continue
                self.samples.append(LinkSample(t, node, names[index], c[8], c[0], c[9], *q))
                rx += c[0]
            self._first_rx.setdefault(node, rx)
            self._last_rx[node] = rx

    def rx_bytes(self, nodes) -> int:
        """Bytes the ports of `nodes` received since the first sample (at the latest)."""
        return sum(self._last_rx.get(n, 0) - self._first_rx.get(n, 0) for n in nodes)

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)

    def period_s_mean(self) -> float | None:
        """The time between samples, on average (longer than `period_s` where a sample's
        cost held the sampler to its share of a core)."""
        times = sorted({s.t_s for s in self.samples})
        return (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None

    def totals(self) -> dict[tuple[str, str], dict]:
        """Per port: bytes and drops between the first and the last sample."""
        return port_totals(self.samples)


def queue_stats(ipr) -> dict[int, tuple[int, int]]:
    """Per interface index: drops and backlog bytes of its lossy and lossless queues."""
    queues: dict[int, tuple[int, int]] = {}
    for q in ipr.get_qdiscs():
        kind = q.get_attr("TCA_KIND")
        if kind == "bfifo" or (kind == "tbf" and q["handle"] == LOSSLESS):
            got = q.get_attr("TCA_STATS2").get_attr("TCA_STATS_QUEUE")
            drops, backlog = queues.get(q["index"], (0, 0))
            queues[q["index"]] = (drops + got["drops"], backlog + got["backlog"])
    return queues


def port_totals(samples) -> dict[tuple[str, str], dict]:
    """Per port of `samples` (LinkSample, in time order): bytes and drops between its
    first and its last sample, and its peak backlog."""
    first: dict = {}
    last: dict = {}
    peak: dict = {}
    for s in samples:
        key = (s.node, s.ifname)
        first.setdefault(key, s)
        last[key] = s
        peak[key] = max(peak.get(key, 0), s.backlog_bytes)
    return {k: {"tx_bytes": last[k].tx_bytes - first[k].tx_bytes,
                "rx_bytes": last[k].rx_bytes - first[k].rx_bytes,
                "tx_packets": last[k].tx_packets - first[k].tx_packets,
                "drops": last[k].drops - first[k].drops,
                "max_backlog_bytes": peak[k]} for k in first}


def load_and_steal(before, after) -> tuple[float, float]:
    """Machine load and steal, percent, between two psutil.cpu_times() readings: load as
    psutil.cpu_percent counts it (all but idle and iowait, so steal too), steal the time
    the hypervisor ran something else while a virtual CPU had work (0 on bare metal).

    Not psutil.cpu_times_percent(): it scales by 100 / max(1, seconds elapsed summed
    over the CPUs), so any interval shorter than a second of CPU time (0.25 s on 2 cores)
    reads idle too low: 50 % plus half the true load, and steal halved (psutil #1586)."""
    delta = {f: getattr(after, f) - getattr(before, f) for f in after._fields
             if f not in ("guest", "guest_nice")}      # already counted in user and nice
    total = sum(delta.values())
    if total <= 0:
        return 0.0, 0.0
    idle = delta["idle"] + delta.get("iowait", 0.0)
    return (round(100.0 * (total - idle) / total, 1),
            round(100.0 * delta.get("steal", 0.0) / total, 1))


class CpuSampler:
    """Machine CPU load and the hypervisor's steal (all cores, percent) every `period_s`."""

    def __init__(self, period_s: float = 0.25):
        self.period_s = period_s
        self.samples: list[tuple[float, float, float]] = []      # t, load, steal
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> CpuSampler:
        self.softnet_at_start = softnet.read()      # the kernel's forwarding, over the run
        self.softnet_at_stop: softnet.Softnet | None = None
        self._last = psutil.cpu_times()
        self.t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._sample()
        self._sample()   # the last part period: a short workload may lie wholly in it

    def _sample(self) -> None:
        now = psutil.cpu_times()
        self.samples.append((time.monotonic() - self.t0, *load_and_steal(self._last, now)))
        self._last = now

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
            self.softnet_at_stop = softnet.read()

    def recent_percent(self, span_s: float = 2.0) -> float | None:
        """The mean load of the samples of the last `span_s` (None before the first)."""
        recent = self.samples[-max(1, round(span_s / self.period_s)):]
        return sum(s[1] for s in recent) / len(recent) if recent else None

    def summary(self, window_s: tuple[float, float] | None = None) -> dict:
        """Mean and peak load over `window_s` (monotonic seconds, e.g. the workload's
        first start to last end) when given: from the samples (each the load since the
        one before) wholly inside it, or where none is, each weighed by its part inside.
        Counted whole, the samples that straddle a short workload's edges, partly idle,
        pulled a 0.9 s ring's mean to 69 % while the samples inside read 98-100 %."""
        whole, part = [], []                          # (weight s, load, steal)
        start = 0.0
        for t, load, steal in self.samples:
            lo, hi = self.t0 + start, self.t0 + t
            if window_s is None or window_s[0] <= lo and hi <= window_s[1]:
                whole.append((hi - lo, load, steal))
            elif min(hi, window_s[1]) > max(lo, window_s[0]):
                part.append((min(hi, window_s[1]) - max(lo, window_s[0]), load, steal))
            start = t
        inside = whole or part
        weight = sum(w for w, _, _ in inside)
        mean = sum(w * load for w, load, _ in inside) / weight if weight else 0.0
        steal = sum(w * st for w, _, st in inside) / weight if weight else 0.0
        loads = [load for _, load, _ in inside]
        steals = [st for _, _, st in inside]
        return {"cpu_mean_percent": round(mean, 1),
                # the machine's own work: the load less what the hypervisor took
                "work_mean_percent": round(max(0.0, mean - steal), 1),
                "cpu_max_percent": round(max(loads), 1) if loads else 0.0,
                "steal_mean_percent": round(steal, 1) if steals else None,
                "steal_max_percent": max(steals) if steals else None,
                "low_fidelity": mean >= LOW_FIDELITY_CPU_PERCENT,
                "cores": psutil.cpu_count(),
                "period_s": self.period_s,
                "softnet": softnet.delta(self.softnet_at_start, self.softnet_at_stop)}


@dataclass
class Capture:
    """tcpdump on one port of one node, written to `path`."""

    node: str
    ifname: str
    path: Path
    proc: subprocess.Popen | None = None
    errors: list[str] = field(default_factory=list)


class Pcaps:
    def __init__(self, fabric, ifnames: list[str], folder: Path):
        self.fabric = fabric
        self.captures: list[Capture] = []
        owners = {p.ifname: node for node, ports in fabric.plan.ports.items() for p in ports}
        for ifname in ifnames:
            if ifname not in owners:
                raise ValueError(f"pcap: {ifname!r} is not a port of this fabric "
                                 f"(ports are named <node>-eth<k>, e.g. {next(iter(owners))})")
            self.captures.append(Capture(owners[ifname], ifname, folder / f"{ifname}.pcap"))

    def start(self, timeout_s: float = 10.0) -> Pcaps:
        for cap in self.captures:
            cap.path.parent.mkdir(parents=True, exist_ok=True)
            # --immediate-mode: each frame reaches the file as it arrives; in libpcap's
            # default the kernel hands frames over in blocks, and the block still
            # filling when tcpdump is stopped (a run's last ~100 ms) was never written
            cap.proc = self.fabric.popen(cap.node, ["tcpdump", "-i", cap.ifname, "-w",
                                                    str(cap.path), "-U", "-n",
                                                    "--immediate-mode"],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for cap in self.captures:  # wait until each is really listening
            line = ""
            deadline = time.monotonic() + timeout_s
            while "listening on" not in line and time.monotonic() < deadline:
                line = cap.proc.stderr.readline().decode(errors="replace")
                if not line and cap.proc.poll() is not None:
                    raise RuntimeError(f"tcpdump on {cap.ifname} exited: "
                                       f"{cap.proc.returncode}")
        return self

    def helpers(self) -> dict[int, str]:
        """The capturing processes, {pid: what} (traffic.launch watches them)."""
        return {c.proc.pid: f"the capture of {c.ifname} (tcpdump)" for c in self.captures
                if c.proc is not None}

    def stop(self) -> list[Path]:
        for cap in self.captures:
            if cap.proc and cap.proc.poll() is None:
                cap.proc.terminate()
        for cap in self.captures:
            if cap.proc:
                try:
                    cap.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    cap.proc.kill()
                    cap.proc.wait(timeout=5)
        return [c.path for c in self.captures if c.path.exists()]
