"""The shaping timers' watch (fabric.shaping_timers, testbed.kernel_timers): its parts
without root; the kernel's own watchdogs seen firing, and counted consistently, as root."""

from __future__ import annotations

import contextlib
import os

import pytest

from fabric import netns, shaping_timers
from fabric.shaping import burst_s
from fabric.shaping_timers import (
    BIN_SHIFT,
    BINS,
    FIRINGS,
    HEAD,
    LATE_MAX,
    LATE_SUM,
    OVER,
    OVER_SUM,
    ShapingTimers,
    TimersUnavailableError,
    shaped_burst,
    summarize,
)
from testbed import kernel_timers
from topologies.spec import MTU_BYTES

START_FORMAT = """name: hrtimer_start
ID: 460
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:void * hrtimer;\toffset:8;\tsize:8;\tsigned:0;
\tfield:void * function;\toffset:16;\tsize:8;\tsigned:0;
\tfield:s64 expires;\toffset:24;\tsize:8;\tsigned:1;
\tfield:s64 softexpires;\toffset:32;\tsize:8;\tsigned:1;
\tfield:enum hrtimer_mode mode;\toffset:40;\tsize:4;\tsigned:0;
"""


def test_fields_come_from_the_events_format():
    fields = shaping_timers.parse_format(START_FORMAT)
    assert fields["hrtimer"] == 8 and fields["function"] == 16
    assert fields["expires"] == 24 and fields["softexpires"] == 32 and fields["mode"] == 40


def test_the_watchdogs_address_comes_from_kallsyms_or_it_says_why_not():
    text = "ffffffff81f31d40 t qdisc_watchdog\nffffffff81f31e00 t qdisc_watchdog_init\n"
    assert shaping_timers.symbol("qdisc_watchdog", text) == 0xFFFFFFFF81F31D40
    with pytest.raises(TimersUnavailableError, match="qdisc_watchdog is not in"):
        shaping_timers.symbol("qdisc_watchdog", "ffffffff81f31e00 t qdisc_watchdog_init\n")
    with pytest.raises(TimersUnavailableError, match="kptr_restrict"):   # hidden: zeros
        shaping_timers.symbol("qdisc_watchdog", "0000000000000000 t qdisc_watchdog\n")


def test_online_cpus():
    assert shaping_timers.online_cpus("0-3,6\n") == [0, 1, 2, 3, 6]
    assert shaping_timers.online_cpus("0\n") == [0]


def counts(lates_ns: list[int], burst_ns: int) -> list[int]:
    """What the expire program would have counted for these firings."""
    c = [0] * (HEAD + BINS)
    for late in lates_ns:
        c[FIRINGS] += 1
        c[LATE_SUM] += late
        c[LATE_MAX] = max(c[LATE_MAX], late)
        if late > burst_ns:
            c[OVER] += 1
            c[OVER_SUM] += late - burst_ns
        c[HEAD + min(BINS - 1, late >> BIN_SHIFT)] += 1
    return c


def test_lateness_percentiles_and_the_wire_time_lost_beyond_the_burst():
    lates = [10_000] * 97 + [1_500_000, 3_000_000, 40_000_000]   # the last past the bins
    got = summarize([0] * (HEAD + BINS), counts(lates, 1_000_000), 1e-3)
    assert got["firings"] == 100 and got["beyond_burst"] == 3
    assert got["late_p50_us"] == 16.4                   # the upper edge of the first bin
    assert got["late_p99_us"] == 3014.7           # 3 ms: the upper edge of its 16.4 us bin
    assert got["late_max_us"] == 40_000.0
    assert got["lost_ms"] == pytest.approx(0.5 + 2.0 + 39.0)
    assert got["burst_ms"] == 1.0 and got["unmatched"] == 0
    # a difference of two readings: only what happened between them
    first = counts(lates[:50], 1_000_000)
    got = summarize(first, counts(lates, 1_000_000), 1e-3)
    assert got["firings"] == 50 and got["beyond_burst"] == 3
    empty = summarize(first, first, 1e-3)
    assert empty["firings"] == 0 and empty["late_p99_us"] is None and empty["lost_ms"] == 0


def test_the_programs_take_the_events_offsets_the_watchdog_and_the_burst():
    start = {"hrtimer": 8, "function": 16, "expires": 24}
    expire = {"hrtimer": 8, "function": 24, "now": 16}
    cfg = shaping_timers.timers_config(start, expire, 0xFFFFFFFF81F31D40, 1_442_240)
    assert (cfg.watchdog, cfg.burst_ns) == (0xFFFFFFFF81F31D40, 1_442_240)
    assert (cfg.start_hrtimer, cfg.start_function, cfg.start_expires) == (8, 16, 24)
    assert (cfg.expire_hrtimer, cfg.expire_function, cfg.expire_now) == (8, 24, 16)


def test_busy_time_and_the_tolerance_come_from_the_links_rates():
    import networkx as nx

    from topologies.spec import Topology
    g = nx.Graph()
    for n, role in (("h0", "host"), ("h1", "host"), ("s0", "leaf")):
        g.add_node(n, role=role)
    g.add_edge("h0", "s0", rate_mbps=100.0)
    g.add_edge("h1", "s0", rate_mbps=400.0)
    topo = Topology.__new__(Topology)
    topo.graph = g
    assert kernel_timers.tolerance_s(topo) == burst_s(400.0) == pytest.approx(1e-3)
    assert burst_s(100.0) == pytest.approx(2 * (MTU_BYTES + 14) / 12.5e6)
    totals = {("h0", "h0-eth0"): {"tx_bytes": 12_500_000},    # 1 s at 100 Mbit/s
              ("s0", "s0-eth1"): {"tx_bytes": 25_000_000}}    # 0.5 s at 400 Mbit/s
    assert kernel_timers.busy_s(topo, totals) == pytest.approx(1.5)


def test_a_kernel_that_refuses_is_reported_not_faked(monkeypatch):
    def refuse(self):
        raise TimersUnavailableError("no tracefs with timer events (/sys/kernel/tracing)")
    monkeypatch.setattr(ShapingTimers, "open", refuse)
    watch = kernel_timers.TimerWatch(1e-3).start()
    watch.stop()
    assert watch.summary(2.0) == {"available": False, "reason":
                                  "no tracefs with timer events (/sys/kernel/tracing)"}


def test_a_mounted_tracefs_is_read_first(tmp_path, monkeypatch):
    folder = tmp_path / "events" / "timer" / "hrtimer_start"
    folder.mkdir(parents=True)
    (folder / "id").write_text("460\n")
    (folder / "format").write_text(START_FORMAT)
    monkeypatch.setattr(shaping_timers, "TRACEFS", (tmp_path,))

    def private(*a, **k):
        raise AssertionError("a private mount while one is mounted")
    monkeypatch.setattr(shaping_timers, "private_events", private)
    ident, fields = shaping_timers.timer_events("hrtimer_start")["hrtimer_start"]
    assert ident == 460 and fields["expires"] == 24


def test_with_no_tracefs_mounted_a_private_mount_that_fails_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(shaping_timers, "TRACEFS", (tmp_path / "none",))
    with pytest.raises(TimersUnavailableError, match="no tracefs mounted, and a private"
                       ".*(unshare|No such file)"):
        shaping_timers.timer_events("hrtimer_start", mountpoint=str(tmp_path / "absent"))


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_a_private_tracefs_reads_the_events_and_leaves_the_mounts_as_they_were():
    """Some VMs boot with no tracefs mounted: the events are read through one mounted in
    a child's own mount namespace, and this process's mounts do not change."""
    from pathlib import Path
    before = Path("/proc/self/mountinfo").read_text()
    try:
        events = shaping_timers.private_events(["hrtimer_start", "hrtimer_expire_entry"])
    except TimersUnavailableError as exc:
        pytest.skip(f"the kernel refuses a private tracefs: {exc}")
    assert Path("/proc/self/mountinfo").read_text() == before
    (start_id, start), (expire_id, expire) = (events["hrtimer_start"],
                                              events["hrtimer_expire_entry"])
    assert start_id > 0 and expire_id > 0 and start_id != expire_id
    assert {"hrtimer", "function", "expires"} <= set(start)
    assert {"hrtimer", "function", "now"} <= set(expire)


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_a_shaped_ports_timers_are_seen_and_counted_consistently(host_untouched):
    """40 frames through a veth shaped at 10 Mbit/s: the port waits on its watchdog for
    most of them. Against a tolerance of 1 ns every late firing is past it, so the lost
    wire time is the lateness summed, and the histogram holds every firing once."""
    from pyroute2 import IPRoute
    try:
        timers = ShapingTimers(1e-9).open()
    except TimersUnavailableError as exc:
        pytest.skip(f"the kernel will not let its timers be watched: {exc}")
    name = f"aft-tmr-{os.getpid()}"
    netns.create(name)
    try:
        with contextlib.closing(timers), IPRoute(netns=name) as ipr:
            before, after = shaped_burst(timers, name, ipr, settle_s=0.2)
    finally:
        from pyroute2 import netns as pr_netns
        pr_netns.remove(name)
    d = [b - a for a, b in zip(before, after, strict=True)]
    # 60 kB, the first 18 kB within the burst: the rest waits on the timer, a frame or
    # more per firing (other qdiscs of the machine may add theirs)
    assert d[FIRINGS] >= 10 and d[shaping_timers.UNMATCHED] == 0
    assert sum(d[HEAD:]) == d[FIRINGS]
    assert d[OVER] <= d[FIRINGS] and d[OVER_SUM] == d[LATE_SUM] - d[OVER]
    assert after[LATE_MAX] > 0 and d[LATE_SUM] <= d[FIRINGS] * after[LATE_MAX]
