"""The fidelity verdict as a pure function: figures in, verdict and reasons out."""

import errno

import pytest

from testbed import fidelity


def agent(starved_ns=0, busy_ns=10**9, lags_us=(50.0,), drops=0, packets=1000):
    return {"fidelity": {"starved_ns": starved_ns, "busy_ns": busy_ns,
                         "timer_lag_us": list(lags_us)},
            "udp_rcvbuf_errors": drops,
            "flows": [{"role": "recv", "packets": packets}]}


def test_a_run_that_kept_up_is_faithful():
    v = fidelity.verdict({"a": agent(), "b": agent(starved_ns=10**7)}, cpu_mean_percent=40)
    assert v["verdict"] == "faithful" and v["reasons"] == []
    assert v["figures"]["starved_fraction"] < 0.01
    assert "faithful" in fidelity.summary_line(v)


def test_each_figure_can_decide_the_verdict():
    assert fidelity.verdict({"a": agent(starved_ns=5 * 10**7)})["verdict"] == "degraded"
    assert fidelity.verdict({"a": agent(starved_ns=5 * 10**8)})["verdict"] == "unfaithful"
    assert fidelity.verdict({"a": agent(lags_us=[8_000.0] * 10)})["verdict"] == "degraded"
    assert fidelity.verdict({"a": agent(lags_us=[30_000.0] * 10)})["verdict"] == "unfaithful"
    assert fidelity.verdict({"a": agent(drops=1)})["verdict"] == "degraded"
    assert fidelity.verdict({"a": agent(drops=50)})["verdict"] == "unfaithful"
    v = fidelity.verdict({"a": agent()}, pfc_poll_gap_p99_ms=5.0)
    assert v["verdict"] == "degraded" and "pfc_poll_gap_p99_ms" in v["reasons"][0]


def test_the_kernels_backlog_drops_are_the_hosts_and_its_squeezes_are_shown():
    """Frames refused onto a full CPU input backlog (testbed.softnet) were lost in the
    host, not in a switch: they count as host drops. Squeezes are shown, not graded."""
    quiet = {"processed": 40_000, "backlog_drops": 0, "squeezes": 4,
             "squeezes_per_1k_frames": 0.1}
    v = fidelity.verdict({"a": agent()}, kernel=quiet)
    assert v["verdict"] == "faithful" and v["figures"]["kernel_squeezes_per_1k_frames"] == 0.1
    assert "squeezed 0.1 times per 1000 frames" in fidelity.summary_line(v)
    lost = {**quiet, "backlog_drops": 3}
    v = fidelity.verdict({"a": agent(drops=1)}, kernel=lost)
    assert v["figures"]["host_drops"] == 4 and v["figures"]["host_drop_fraction"] == 0.004
    assert v["verdict"] == "unfaithful" and "host_drop_fraction" in v["reasons"][0]
    assert "host drops 4 (3 at the kernel's input backlogs)" in fidelity.summary_line(v)
    unknown = fidelity.verdict({"a": agent()}, kernel=None)
    assert unknown["figures"]["kernel_backlog_drops"] is None
    assert "squeezed" not in fidelity.summary_line(unknown)


def test_wire_time_lost_to_late_shaping_timers_is_graded_where_measured():
    """The kernel's send side (testbed.kernel_timers): a port's timer later than its
    burst idles a wire with frames queued, graded as starvation is; unmeasured (the
    kernel refused the tracepoints) it decides nothing and the line leaves it out."""
    def timers(lost):
        return {"available": True, "late_p99_us": 2048.0, "lost_fraction": lost}
    v = fidelity.verdict({"a": agent()}, shaping=timers(0.01))
    assert v["verdict"] == "faithful" and v["figures"]["shaping_late_p99_ms"] == 2.048
    assert "shaping timers late p99 2.05 ms, 1.0 % of port busy time lost" in \
        fidelity.summary_line(v)
    v = fidelity.verdict({"a": agent()}, shaping=timers(0.05))
    assert v["verdict"] == "degraded" and "shaping_lost_fraction" in v["reasons"][0]
    assert fidelity.verdict({"a": agent()}, shaping=timers(0.2))["verdict"] == "unfaithful"
    # with the agents' own starvation past its limit too: corroborated
    assert fidelity.verdict({"a": agent(starved_ns=5 * 10**7)},
                            shaping=timers(0.05))["verdict"] == "unfaithful"
    for off in (None, {"available": False, "reason": "no tracefs"}):
        v = fidelity.verdict({"a": agent()}, shaping=off)
        assert v["verdict"] == "faithful" and v["figures"]["shaping_lost_fraction"] is None
        assert "shaping" not in fidelity.summary_line(v)


def test_the_hypervisors_steal_is_shown_not_graded():
    v = fidelity.verdict({"a": agent()}, cpu_mean_percent=60, steal_percent=27.5)
    assert v["verdict"] == "faithful" and v["figures"]["steal_percent"] == 27.5
    assert "the hypervisor stole 27.5 % of the CPUs' time" in fidelity.summary_line(v)
    bare = fidelity.verdict({"a": agent()}, steal_percent=0.0)
    assert "hypervisor" not in fidelity.summary_line(bare)


def test_load_less_steal_is_the_machines_own_work():
    from collections import namedtuple

    from testbed.collect import CpuSampler, load_and_steal
    vm = namedtuple("t", "user system idle iowait steal guest guest_nice")
    metal = namedtuple("t", "user system idle")
    # 0.25 s on 2 cores: 0.5 s of CPU time, of which 0.3 s busy (steal 0.05 s of it);
    # guest time is already inside user, so it is not counted twice
    t0 = vm(100.0, 50.0, 900.0, 10.0, 5.0, 20.0, 0.0)
    t1 = vm(100.2, 50.05, 900.15, 10.05, 5.05, 20.1, 0.0)
    assert load_and_steal(t0, t1) == (60.0, 10.0)
    # psutil.cpu_times_percent() read this as 80 % load and 5 % steal (psutil #1586)
    assert load_and_steal(metal(1.0, 1.0, 1.0), metal(1.3, 1.1, 1.6)) == (40.0, 0.0)
    assert load_and_steal(t0, t0) == (0.0, 0.0)
    s = CpuSampler()
    s.t0, s.softnet_at_start, s.softnet_at_stop = 100.0, None, None
    s.samples = [(0.25, 50.0, 10.0), (0.5, 70.0, 30.0), (5.0, 99.0, 0.0)]
    got = s.summary(window_s=(100.0, 100.5))          # the third sample is outside
    assert (got["cpu_mean_percent"], got["steal_mean_percent"]) == (60.0, 20.0)
    assert got["work_mean_percent"] == 40.0 and got["steal_max_percent"] == 30.0
    # the samples wholly inside the window; a sample straddling its edge is partly idle
    assert s.summary(window_s=(100.2, 100.5))["cpu_mean_percent"] == 70.0
    # none wholly inside: each weighs its part inside, 0.05 s of 50 % (10 % steal) and
    # 0.05 s of 70 % (30 %)
    edge = s.summary(window_s=(100.2, 100.3))
    assert edge["cpu_mean_percent"] == 60.0 and edge["steal_mean_percent"] == 20.0
    assert s.summary()["cpu_mean_percent"] == round((0.25 * 50 + 0.25 * 70 + 4.5 * 99) / 5, 1)


def test_cpu_alone_only_warns_but_corroborates_a_figure():
    v = fidelity.verdict({"a": agent()}, cpu_mean_percent=97)
    assert v["verdict"] == "degraded" and "cpu_mean_percent" in v["reasons"][0]
    v = fidelity.verdict({"a": agent(starved_ns=5 * 10**7)}, cpu_mean_percent=97)
    assert v["verdict"] == "unfaithful" and "saturated" in " ".join(v["reasons"])


def test_thresholds_are_reported_beside_the_figures():
    v = fidelity.verdict({"a": agent()})
    assert set(v["thresholds"]) >= set(fidelity.LIMITS)
    assert v["thresholds"]["starved_fraction"]["degraded"] == 0.10


def test_two_signs_together_are_unfaithful():
    one = agent(starved_ns=5 * 10**7)
    assert fidelity.verdict({"a": one}, cpu_mean_percent=50)["verdict"] == "degraded"
    two = agent(starved_ns=5 * 10**7, lags_us=[8000.0] * 10)
    v = fidelity.verdict({"a": two}, cpu_mean_percent=50)
    assert v["verdict"] == "unfaithful" and "two figures" in v["reasons"][-1]


def test_an_agent_process_with_no_time_to_spare_corroborates_a_figure():
    """32 ranks on 2 processes here: 1.33x ideal, starved on the critical path 9.6 % of
    the job (one figure: degraded), each process 94 % busy: unfaithful. Alone, a busy
    process is shown, not graded (16 ranks ran at 1.05x with 70 %)."""
    def hosted(busy, **kw):
        return {**agent(**kw), "host": {"busy_fraction": busy}}
    one = {"a": hosted(0.94, starved_ns=5 * 10**7), "b": hosted(0.5)}
    v = fidelity.verdict(one, cpu_mean_percent=67)
    assert v["figures"]["process_busy_max"] == 0.94
    assert v["verdict"] == "unfaithful" and "agent process busy 94%" in v["reasons"][-1]
    alone = fidelity.verdict({"a": hosted(0.97)}, cpu_mean_percent=67)
    assert alone["verdict"] == "faithful" and alone["reasons"] == []
    assert "busiest agent process 97.0 % of a core" in fidelity.summary_line(alone)
    assert alone["thresholds"]["process_busy_max"]["corroborates"] == 0.9
    calm = fidelity.verdict({"a": hosted(0.7, starved_ns=5 * 10**7)})
    assert calm["verdict"] == "degraded"
    assert fidelity.verdict({"a": agent()})["figures"]["process_busy_max"] is None


def clock_port(rate_mbps: float, kernel_full: list[bool], queued: list[int]):
    """A Port with its wire clock and a stand-in socket: sends fail while kernel_full[0]
    (True: EAGAIN, the socket buffer full; or that errno, e.g. ENOBUFS for a full queue);
    queued[0] is what SIOCOUTQ would say."""
    from collections import deque

    from topologies import units
    from traffic.port import Port

    sent = []

    def send(frame):
        if kernel_full[0] is True:
            raise BlockingIOError(errno.EAGAIN, "the socket buffer is full")
        if kernel_full[0]:
            raise OSError(kernel_full[0], "refused")
        sent.append(bytes(frame))

    p = Port.__new__(Port)
    p.ifname, p.blocking, p.send_frame, p.pending = "x-eth0", False, send, deque()
    p.direct = False                    # through send_frame, not send(2) on a socket
    p.pending_ns = deque()
    p.outq = lambda: queued[0]
    p.blocked, p.retry_ns = False, 0
    p.frames = p.eagain = p.enobufs = p.down_drops = 0
    p.ns_per_byte = units.ns_per_byte(rate_mbps)
    p.free_at, p.busy_ns, p.starved_ns, p.demand_since = 0, 0.0, 0.0, 0
    p.drain_at = 0
    p.wire, p.members, p.name = p, [p], "x-eth0"   # its own wire's clocks
    return p, sent


def test_a_wire_the_agent_leaves_idle_is_starved_a_wire_the_kernel_holds_is_not():
    frame = bytearray(1250)                    # 100 us at 100 Mbit/s
    full, queued = [False], [0]
    p, sent = clock_port(100.0, full, queued)
    p.push(frame, 0)
    assert p.free_at == 100_000
    p.waiting(100_000, ready=True)             # a flow could send; the agent went away
    p.push(frame, 1_100_000)                   # and came back 1 ms late
    assert p.starved_ns == 1_000_000 and len(sent) == 2
    # the kernel refuses; when the agent flushes 48.8 ms later the kernel still holds
    # 100 kB (a PFC pause): the wait was the network's
    full[0] = True
    p.push(frame, 1_200_000)
    p.waiting(1_200_000)
    assert p.blocked and p.pending and p.demand_since == 1_200_000
    full[0], queued[0] = False, 100_000
    assert p.flush(50_000_000)
    assert p.starved_ns == 1_000_000 and len(sent) == 3 and not p.blocked
    assert p.free_at == 50_000_000 + 8_000_000 + 100_000    # the queue, then this frame
    # refused again (the socket buffer full), and the queue ran dry before select found
    # room: how long the kernel held it is the network's (a pause), not the agent's
    full[0] = True
    p.push(frame, 58_200_000)
    p.waiting(58_200_000)
    full[0], queued[0] = False, 0
    assert p.flush(70_000_000)
    assert p.starved_ns == 1_000_000
    # a full queue (ENOBUFS): the agent retries at its own time, 0.2 ms on; coming back
    # 3 ms after that with the queue dry, it left the wire idle for those 3 ms
    full[0] = errno.ENOBUFS
    p.push(frame, 80_000_000)
    assert p.blocked and p.retry_ns == 80_200_000
    p.waiting(80_000_000)
    full[0] = False
    assert p.flush(83_200_000)
    assert p.starved_ns == 1_000_000 + 3_000_000


def test_frames_the_kernel_took_but_still_holds_are_not_starvation():
    """A port paused by PFC (or sharing its wire with forwarded traffic) drains later than
    the wire clock says, without refusing a frame: the kernel is asked before any idle
    time is counted (rail-only GPUs under PFC showed 61 % starved without this)."""
    frame = bytearray(1250)                    # 100 us at 100 Mbit/s
    full, queued = [False], [0]
    p, sent = clock_port(100.0, full, queued)
    p.push(frame, 0)
    p.waiting(100_000, ready=True)
    queued[0] = 1250                           # the frame still sits in the held queue
    p.push(frame, 5_000_000)
    assert p.starved_ns == 0 and not p.blocked and len(sent) == 2
    assert p.free_at == 5_000_000 + 100_000 + 100_000     # the held frame, then this one
    p.waiting(5_200_000, ready=True)           # now the queue ran dry: the agent's fault
    queued[0] = 0
    p.push(frame, 6_200_000)
    assert p.starved_ns == 1_000_000


def test_a_fast_port_is_judged_by_its_paths_bottleneck():
    """An NVLink hop at 1800 Mbit/s whose path then crosses a 25 Mbit/s rail: the agent
    coming back after the NVLink wire went quiet but before the rail ran dry left
    nothing idle (rail-only read 61-69 % starved when this was clocked at the port)."""
    from topologies import units
    frame = bytearray(1250)                    # 5.6 us at 1800 Mbit/s, 400 us at 25
    rail = units.ns_per_byte(25.0)
    full, queued = [False], [0]
    p, sent = clock_port(1800.0, full, queued)
    p.push(frame, 0, rail)
    assert p.free_at == 5_555 and p.drain_at == 400_000     # flowlets ask the port's clock
    p.waiting(10_000, ready=True)
    p.push(frame, 300_000, rail)                # the rail still had 100 us to go
    assert p.starved_ns == 0 and p.busy_ns == 800_000
    p.waiting(700_000, ready=True)             # the rail drains at 800 us
    p.push(frame, 1_800_000, rail)              # and the agent is back 1 ms later
    assert p.starved_ns == 1_000_000
    p.push(frame, 1_900_000)                    # no path given: the port's own rate
    assert p.drain_at == 2_200_000 + 5_555 and len(sent) == 4
    # a frame held by the kernel keeps its path's rate until it goes
    full[0] = True
    p.push(frame, 3_000_000, rail)
    full[0] = False
    assert p.flush(3_100_000) and p.drain_at == 3_500_000 and not p.pending_ns


def test_a_step_gated_on_a_receive_has_demand_from_the_datagrams_arrival():
    """The next step of a ring may go once the datagram completing this step's receive
    arrived (the kernel's stamp), not when the agent read it: the idle wire between the
    two is the emulator's (traffic.agent._steps_started backdates the demand so)."""
    frame = bytearray(1250)                    # 100 us at 100 Mbit/s
    full, queued = [False], [0]
    p, sent = clock_port(100.0, full, queued)
    p.push(frame, 0)                           # the wire is free again at 100 us
    p.waiting(500_000, ready=True)             # the gate's datagram arrived at 500 us
    p.push(frame, 2_500_000)                   # the agent read it and sent at 2.5 ms
    assert p.starved_ns == 2_000_000
    p.waiting(2_550_000, ready=True)           # arrived while the wire was still busy:
    p.push(frame, 2_580_000)                   # only the time after the drain counts
    assert p.starved_ns == 2_000_000


def test_the_most_starved_rank_at_each_step_adds_up_on_the_critical_path():
    def ranked(lags_us, starved_us):
        return {"fidelity": {"starved_ns": int(sum(starved_us) * 1e3), "busy_ns": 10**9,
                             "timer_lag_us": [100.0],
                             "step_lag_us": [[k, us] for k, us in enumerate(lags_us, 1)],
                             "step_starved_us": [[k, us] for k, us in enumerate(starved_us)]},
                "flows": [], "iterations": [{"start_ns": 0, "end_ns": 100_000_000}]}
    # 3 steps of a 100 ms job. Starved: the most starved rank's 0.4, 3 and 0.4 ms: 3.8 %
    # (over the ranks' busy time, 0.2 %)
    fid = fidelity.verdict({"r0": ranked([200.0, 3000.0, 400.0], [200.0, 3000.0, 400.0]),
                            "r1": ranked([400.0, 100.0, 100.0], [400.0, 100.0, 100.0])})
    f = fid["figures"]
    assert f["step_lag_samples"] == 6 and f["step_lag_p50_ms"] == 0.2
    assert f["step_lag_p99_ms"] == 3.0
    assert f["step_lag_critical_fraction"] == pytest.approx(0.038)
    assert f["starved_critical_fraction"] == pytest.approx(0.038)
    assert fid["verdict"] == "faithful" and f["starved_fraction"] < 0.01
    line = fidelity.summary_line(fid)
    assert "on the critical path 3.8 % of the job" in line
    assert "step lag p50/p99 0.2/3 ms, on the critical path 3.8 % of the job" in line
    # one rank starved 8 ms in one step of it: degraded (past 5 %, within 10 %), though
    # its starvation over its busy time (0.86 %) is within 2 %
    late = fidelity.verdict({"r0": ranked([200.0], [200.0, 8000.0, 400.0])})
    assert late["grades"]["starved_critical_fraction"] == "degraded"
    assert late["grades"]["starved_fraction"] == "faithful"


def test_only_the_ports_a_flow_takes_wait_on_it():
    """An ECMP flow on a host with a port per plane takes one of them: marking the other
    as waiting made its idle wire 'starved' (22 % of a 4-rank ring on 2 planes)."""
    from types import SimpleNamespace

    from traffic.agent import used_ports
    a, b = object(), object()

    def flow(ports, fixed):
        return SimpleNamespace(ports=ports, entropy=SimpleNamespace(fixed=fixed))
    assert used_ports(flow([a, b], 49153)) == [b]          # 49153 % 2: the second plane
    assert used_ports(flow([a, b], None)) == [a, b]        # sprayed: every plane
    assert used_ports(flow([a], 49152)) == [a]


def test_an_agents_starvation_is_split_by_step():
    """What its ports were starved of between one step's start and the next is that
    step's (the run then takes the most starved rank's, step by step)."""
    from types import SimpleNamespace

    from traffic.agent import Agent
    a = Agent.__new__(Agent)
    ports = [SimpleNamespace(starved_ns=0.0), SimpleNamespace(starved_ns=0.0)]
    a.port_list, a.step_starved_ns, a._step_mark = ports, [], (0, 0.0)
    ports[0].starved_ns = 1000.0         # during step 0
    a._mark_step(1)
    ports[1].starved_ns = 5000.0         # during step 1
    a._mark_step(2)
    a._mark_step(None)                   # the run ends in step 2, nothing starved in it
    assert a.step_starved_ns == [(0, 1000), (1, 5000), (2, 0)]


def test_a_run_on_unshaped_ports_is_never_faithful(monkeypatch):
    """AFT_PORT_LAYOUT=plain measures the kernel's floor: links at CPU speed, nothing
    emulated, whatever the agents' figures say."""
    monkeypatch.delenv("AFT_PORT_LAYOUT", raising=False)
    assert fidelity.verdict({"a": agent()})["verdict"] == "faithful"
    monkeypatch.setenv("AFT_PORT_LAYOUT", "plain")
    v = fidelity.verdict({"a": agent()})
    assert v["verdict"] == "unfaithful"
    assert any("AFT_PORT_LAYOUT=plain: no port is shaped" in r for r in v["reasons"])
