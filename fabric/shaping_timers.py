"""How late the kernel's shaping timers fire: the send side of fidelity, measured in eBPF.

A shaped port with frames queued and no tokens left sets a timer (the qdisc watchdog,
an hrtimer) for when it may send its next frame. On a busy or preempted machine the
timer fires late, and the port stays idle that long with frames waiting: the kernel,
not the network, set the pace. The agents' figures (testbed.fidelity) cannot see it:
their port's queue was never empty.

    hrtimer_start (function == qdisc_watchdog)        ─▶ hash[timer] = its expiry
    hrtimer_expire_entry (function == qdisc_watchdog) ─▶ late = now - hash[timer]
        ─▶ counts, sum, max, the firings later than the burst and by how much,
           and a histogram of `late` in 16.384 us bins (one array value, mmapped)

Two tracepoint programs in C (fabric/bpf/shaping_timers.bpf.c, loaded through libbpf;
classic tracepoints: the record's field offsets come from the event's format file, so
no kernel structure layout is assumed), attached through one perf event each (its
programs then run on every CPU); the watchdog's address comes from /proc/kallsyms.

What a late firing costs: HTB refills a class's tokens up to its burst while the timer
is late, then sends what it owes back to back, so a port loses no capacity to a timer
late by less than its burst time (fabric.shaping: at least 1 ms of the rate). Beyond
that, `late - burst` of wire time is lost. The figures cover every qdisc watchdog of the
machine (during a run, the fabric's); they do not include the NET_TX softirq that the
firing schedules.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import mmap
import os
import re
import struct
from pathlib import Path

from fabric import libbpf

SYS_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}.get(os.uname().machine, 298)
PERF_TYPE_TRACEPOINT = 2
PERF_FLAG_FD_CLOEXEC = 8
PERF_EVENT_IOC_ENABLE, PERF_EVENT_IOC_SET_BPF = 0x2400, 0x40042408
TRACEFS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))
KALLSYMS = Path("/proc/kallsyms")
WATCHDOG = "qdisc_watchdog"
TIMERS = 16384                        # armed watchdogs tracked at once (one per qdisc)
BIN_SHIFT = 14                        # histogram bins of 2^14 ns = 16.384 us
BINS = 1024                           # up to 16.8 ms; the last bin holds everything later
HEAD = 8                              # u64s before the histogram
FIRINGS, LATE_SUM, LATE_MAX, OVER, OVER_SUM, UNMATCHED = range(6)
VALUE_BYTES = 8 * (HEAD + BINS)
_LIBC = ctypes.CDLL(None, use_errno=True)


class TimersUnavailableError(RuntimeError):
    """The kernel would not let the shaping timers be watched (the message says why)."""


def tracefs() -> Path:
    for root in TRACEFS:
        if (root / "events" / "timer").is_dir():
            return root
    raise TimersUnavailableError("no tracefs with timer events (/sys/kernel/tracing)")


def timer_events(*names: str, mountpoint: str | None = None
                 ) -> dict[str, tuple[int, dict[str, int]]]:
    """Each timer event's id and field offsets: from the tracefs the machine has
    mounted, or where none is (some VMs boot without it), from a tracefs mounted in a
    private mount namespace of a child process, so the machine's mounts stay as they
    were (the ids are the kernel's, wherever tracefs is mounted)."""
    try:
        root = tracefs()
    except TimersUnavailableError:
        return private_events(names, mountpoint)
    return {name: event_format(name, root) for name in names}


_PRIVATE_READ = r"""
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def check(rc, what):
    if rc != 0:
        sys.exit(f"{what}: {os.strerror(ctypes.get_errno())}")
mountpoint, names = sys.argv[1], sys.argv[2:]
check(libc.unshare(0x20000), "unshare(CLONE_NEWNS)")                  # CLONE_NEWNS
check(libc.mount(b"none", b"/", None, 0x4000 | 0x40000, None),        # MS_REC|MS_PRIVATE
      "making / private")
check(libc.mount(b"tracefs", mountpoint.encode(), b"tracefs", 0, None),
      f"mounting tracefs on {mountpoint}")
out = {}
for name in names:
    folder = os.path.join(mountpoint, "events", "timer", name)
    try:
        with open(folder + "/id") as f, open(folder + "/format") as g:
            out[name] = [int(f.read()), g.read()]
    except (OSError, ValueError) as exc:
        sys.exit(f"tracepoint timer:{name}: {exc}")
print(json.dumps(out))
"""


def private_events(names, mountpoint: str | None = None
                   ) -> dict[str, tuple[int, dict[str, int]]]:
    """`timer_events` read through a tracefs mounted in a child's own mount namespace
    (needs CAP_SYS_ADMIN); TimersUnavailableError says why where that is refused."""
    import subprocess
    import sys
    point = mountpoint or str(TRACEFS[0])
    proc = subprocess.run([sys.executable, "-c", _PRIVATE_READ, point, *names],
                          capture_output=True, text=True, timeout=30, check=False)
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise TimersUnavailableError(f"no tracefs mounted, and a private one failed: {why}")
    return {name: (ident, parse_format(text))
            for name, (ident, text) in json.loads(proc.stdout).items()}


def event_format(name: str, root: Path | None = None) -> tuple[int, dict[str, int]]:
    """A timer event's id and its fields' offsets in the record (its format file)."""
    folder = (root or tracefs()) / "events" / "timer" / name
    try:
        ident = int((folder / "id").read_text())
        text = (folder / "format").read_text()
    except (OSError, ValueError) as exc:
        raise TimersUnavailableError(f"tracepoint timer:{name}: {exc}") from None
    return ident, parse_format(text)


def parse_format(text: str) -> dict[str, int]:
    """Field name -> offset, from a tracepoint's format text."""
    return {m[1]: int(m[2]) for m in re.finditer(
        r"field:[^;]*?([A-Za-z_]\w*)(?:\[\d*\])?;\s*offset:(\d+);", text)}


def symbol(name: str, text: str | None = None) -> int:
    """A kernel function's address (/proc/kallsyms; root sees the real ones)."""
    if text is None:
        try:
            text = KALLSYMS.read_text()
        except OSError as exc:
            raise TimersUnavailableError(f"{KALLSYMS}: {exc}") from None
    m = re.search(rf"^([0-9a-f]+) [tT] {re.escape(name)}$", text, re.M)
    if m is None or int(m[1], 16) == 0:
        raise TimersUnavailableError(f"{name} is not in {KALLSYMS} (or its address "
                                     "is hidden: kptr_restrict)")
    return int(m[1], 16)


class TimersConfig(ctypes.Structure):
    """The `cfg` of fabric/bpf/shaping_timers.bpf.c, field for field."""

    _fields_ = [("watchdog", ctypes.c_uint64), ("burst_ns", ctypes.c_uint64)] + [
        (name, ctypes.c_uint32) for name in (
            "start_hrtimer", "start_function", "start_expires",
            "expire_hrtimer", "expire_function", "expire_now")]


def timers_config(start_fields: dict[str, int], expire_fields: dict[str, int],
                  watchdog: int, burst_ns: int) -> TimersConfig:
    """The programs' offsets (from the events' format files), the watchdog and burst."""
    return TimersConfig(
        watchdog=watchdog, burst_ns=burst_ns, start_hrtimer=start_fields["hrtimer"],
        start_function=start_fields["function"], start_expires=start_fields["expires"],
        expire_hrtimer=expire_fields["hrtimer"], expire_function=expire_fields["function"],
        expire_now=expire_fields["now"])


def online_cpus(text: str | None = None) -> list[int]:
    """The CPUs the kernel has online ("0-3,6" in /sys/devices/system/cpu/online)."""
    if text is None:
        text = Path("/sys/devices/system/cpu/online").read_text()
    cpus: list[int] = []
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def _perf_open(event_id: int, cpu: int) -> int:
    attr = struct.pack("=IIQQQQQIIQ", PERF_TYPE_TRACEPOINT, 64, event_id, 1, 0, 0, 0,
                       0, 0, 0)
    buf = ctypes.create_string_buffer(attr, len(attr))
    fd = _LIBC.syscall(SYS_PERF_EVENT_OPEN, buf, -1, cpu, -1, PERF_FLAG_FD_CLOEXEC)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return fd


def _ioctl(fd: int, request: int, arg: int) -> None:
    if _LIBC.ioctl(fd, ctypes.c_ulong(request), ctypes.c_ulong(arg)) < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


class ShapingTimers:
    """Watch every qdisc watchdog of the machine while it is open (`open` raises
    TimersUnavailableError with the kernel's reason where it cannot)."""

    def __init__(self, burst_s: float):
        self.burst_ns = max(1, int(burst_s * 1e9))
        self._fds: list[int] = []
        self._map: mmap.mmap | None = None

    def open(self) -> ShapingTimers:
        try:
            self._open()
        except OSError as exc:
            self.close()
            raise TimersUnavailableError(f"the kernel refused: {exc}") from None
        except BaseException:
            self.close()
            raise
        return self

    def _open(self) -> None:
        events = timer_events("hrtimer_start", "hrtimer_expire_entry")
        start_id, start_fields = events["hrtimer_start"]
        expire_id, expire_fields = events["hrtimer_expire_entry"]
        for need, fields in ((("hrtimer", "function", "expires"), start_fields),
                             (("hrtimer", "function", "now"), expire_fields)):
            if not set(need) <= set(fields):
                raise TimersUnavailableError(f"timer events lack {need}: {sorted(fields)}")
        cfg = timers_config(start_fields, expire_fields, symbol(WATCHDOG), self.burst_ns)
        fds = self._fds
        with libbpf.BpfObject("shaping_timers", ["aft_wd_start", "aft_wd_fire"], cfg) as obj:
            fds.append(start := obj.keep("aft_wd_start"))
            fds.append(expire := obj.keep("aft_wd_fire"))
            fds.append(stats := os.dup(obj.map_fd("stats")))
        self._map = mmap.mmap(stats, mmap.PAGESIZE * -(-VALUE_BYTES // mmap.PAGESIZE),
                              mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        # A tracepoint's programs run on every CPU once one perf event carries them
        # (attaching the same program on a second CPU's event is refused: EEXIST).
        cpu = online_cpus()[0]
        for event_id, prog in ((start_id, start), (expire_id, expire)):
            fds.append(fd := _perf_open(event_id, cpu))
            _ioctl(fd, PERF_EVENT_IOC_SET_BPF, prog)
            _ioctl(fd, PERF_EVENT_IOC_ENABLE, 0)

    def counts(self) -> list[int]:
        """The stats value now: HEAD counters, then the histogram's BINS bins."""
        if self._map is None:
            raise RuntimeError("ShapingTimers is not open")
        return list(struct.unpack_from(f"={HEAD + BINS}Q", self._map))

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        for fd in reversed(self._fds):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()

    def __enter__(self) -> ShapingTimers:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()


def shaped_burst(timers: ShapingTimers, namespace: str, ipr, settle_s: float = 0.1
                 ) -> tuple[list[int], list[int]]:
    """Make a shaped port's watchdog fire, for `testbed doctor` and tests: a veth in
    `namespace` (`ipr` its netlink socket) shaped at 10 Mbit/s, then 40 frames of 1500
    B (60 kB, 48 ms at the rate; all but the burst wait on the timer). The counts before
    and `settle_s` after."""
    import socket
    import time

    from fabric import netns
    from fabric.shaping import shape
    ipr.link("add", ifname="aftw0", kind="veth", peer="aftw1")
    index = ipr.link_lookup(ifname="aftw0")[0]
    for i in (index, ipr.link_lookup(ifname="aftw1")[0]):
        ipr.link("set", index=i, state="up")
    shape(ipr, index, 10.0, 1 << 20)
    before = timers.counts()
    with netns.entered(namespace):
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    with sock:
        sock.bind(("aftw0", 0))
        for _ in range(40):
            sock.send(bytes(12) + b"\x88\xb5" + bytes(1486))
        time.sleep(settle_s)
    return before, timers.counts()


def summarize(before: list[int], after: list[int], burst_s: float) -> dict:
    """What the watchdogs did between two `counts()`: firings, lateness p50/p99/max,
    and the firings later than the burst with the wire time they lost (the max is the
    largest since the watch opened: testbed.kernel_timers opens one per run)."""
    d = [b - a for a, b in zip(before, after, strict=True)]
    firings = d[FIRINGS]
    bins = d[HEAD:]

    def pct(q: float) -> float | None:      # the upper edge of the bin holding it
        if not firings:
            return None
        need, seen = q / 100 * firings, 0
        for i, n in enumerate(bins):
            seen += n
            if seen >= need:
                return round(((i + 1) << BIN_SHIFT) / 1e3, 1)
        return None

    return {"firings": firings, "late_p50_us": pct(50), "late_p99_us": pct(99),
            "late_max_us": round(after[LATE_MAX] / 1e3, 1) if firings else None,
            "late_mean_us": round(d[LATE_SUM] / firings / 1e3, 1) if firings else None,
            "burst_ms": round(burst_s * 1e3, 3),
            "beyond_burst": d[OVER], "lost_ms": round(d[OVER_SUM] / 1e6, 3),
            "unmatched": d[UNMATCHED]}
