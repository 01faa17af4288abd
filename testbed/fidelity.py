"""The fidelity verdict: did the emulator keep up, or did it set the pace of the run?

CPU load is only a proxy. What breaks fidelity is measured where it happens, per agent:

- wire starvation: a port had frames to send (its socket was full, or a flow had data and
  window) and the agent came back to it only after its queue had drained, so the wire
  stood idle through no fault of the network. Reported as a fraction of the port's busy
  time (frames' wire time at the port's rate) plus the idle time so caused. A flow that
  waited on a receive (a collective's next step) had data from the moment the datagram
  that completed that receive reached the host (its kernel stamp), not from when the
  agent read it: the agent's reaction on the critical path counts too.
- starvation on the critical path: a ring's step k+1 waits on its neighbour's step k,
  so the job is late by the most starved rank at every step, while the fraction above
  averages over the ranks (16 ranks at 1.42x ideal: 4.7 % starved). Summed over the
  steps, the most starved rank's idle wire in each, as a fraction of the job's time (an
  upper bound: the critical path crosses one rank per step).
- step lag: from the datagram that opened a step's gate, or the port's last frame if
  later, to the step's start, p50/p99 and, summed over the steps as above, its share of
  the job (its wire idle is in the starvation already, so it is not graded again).
- timer lag: how late an agent woke against the time it asked to (its moderation naps,
  retransmission and delayed-ACK timers), p50 and p99.
- host drops: datagrams the receiving host dropped because its socket buffer was full
  (UDP RcvbufErrors in the agent's namespace), and frames the kernel refused onto a
  CPU's full input backlog at any hop (testbed.softnet: no qdisc counts them), both
  counted apart from fabric drops.
- the kernel's receive path: how often its forwarding softirq stopped with frames still
  waiting (time_squeeze, per 1000 frames it forwarded; testbed.softnet), shown, not
  graded: 0 in ring all-reduces of 8, 16 and 32 ranks here, the last at 3.2x ideal, so
  what the agents' figures miss is not there.
- the kernel's send side: how late the shaped ports' timers fired (each qdisc
  watchdog: fabric.shaping_timers) and the wire time that cost, as a fraction of the
  ports' busy time. A port with frames queued and no tokens waits on its timer; HTB
  makes up for a timer late by less than the port's burst (at least 1 ms of its rate),
  beyond it the wire stood idle with frames waiting: the agents' figures cannot see
  it, since their queue was not empty. Measured here before it was graded: an 8-rank
  ring at 100 Mbit/s at 1.42x ideal with 16 % steal had 806 of 17,933 firings past
  the burst, p99 3.0 ms, about a tenth of the ports' busy time lost.
- the hypervisor's steal: the share of the virtual CPUs' time the host ran something
  else while they had work (/proc/stat), over the workload, shown, not graded: it is
  the machine, not the testbed, and the figures above already carry what it did to the
  run. Measured here in 0.5 s windows during PFC incasts: 4 % at the median, 27 % at
  p90, up to 51 %; the "slow spells" in which one machine ran a benchmark at half its
  speed.
- the busiest agent process: its CPU (its Python, its syscalls and the forwarding
  softirqs run in its context) from the start to its last agent's workload done, a
  share of one core (traffic.host busy_fraction), shown. Each process is one thread, so
  near a whole core it, not the network, sets the pace, whatever the machine's mean
  load says: a 32-rank ring on 2 processes here ran at 1.33-1.43x ideal with both 94 %
  busy and the machine's load read at 68-88 %; 16 ranks at 1.05x with 70 %.
- the PFC controller's own lag, where it pauses (PFC on; with PFC off it watches, ECN
  marks and trims are the kernel's at every frame, and its lag only delays taking a
  queue's drops out of the occupancy they read): the p99 gap between its polls.
- the lossless class (PFC on): lossless drops at the switches (testbed.pfc_results
  totals), and whether some ingress took more than its headroom after XOFF (its
  peak charge; the headroom verdict "exceeded"). With PFC off, drops are the lossy
  class's: physics, not graded.
  An agent's wait on its retransmission timer after a drop is not starvation: a
  go-back-N sender with its window full has nothing it may send, so it registers no
  demand on its port (traffic.agent asks tx.ready()); a 16-host PFC incast with 2,861
  timeouts read 0 ns starved.

Each figure is set against two thresholds (faithful / degraded, beyond: unfaithful), and
the worst of them is the run's verdict. Why these thresholds:

- starvation 2 % / 10 %: an idle wire lengthens a collective by about the idle time on
  its critical path; the fidelity goal is JCT within 10 % of ideal, of which headers and
  store-and-forward already take a few percent. Past 10 % the emulator alone could
  explain a 10 % miss.
- shaping timers' lost wire time 2 % / 10 % of the ports' busy time: the same idle
  wire as starvation, caused by the kernel instead of an agent.
- starvation on the critical path 5 % / 10 % of the job's time: it lengthens the job by
  itself (an upper bound), against the same 10 % goal.
- timer lag p99 5 ms / 20 ms: a tenth of the default 50 ms RTO (a quiet 2-core machine
  shows 1-3 ms at p99: wake-ups behind other agents); past 20 ms, two fifths of the RTO,
  timeouts that no network caused become likely.
- host drops 0 / 0.1 % of delivered packets: a real NIC does not drop what its host is
  too slow to read; any drop is a deviation, a few per thousand change go-back-N runs.
- PFC poll gap p99 3 ms / 10 ms: the reaction-time goal is under 3 ms at p99; beyond
  10 ms headroom sized for the measured reaction no longer covers the gap.
- lossless drops with PFC on: none, and any makes the run unfaithful: the thresholds
  were sized so that every ingress's XOFF plus the headroom its reaction needs fits
  the buffer, so a drop means the emulator (the controller, a late poll) let the class
  lose what a real switch would not. Unless some ingress's thresholds do not fit
  (`ok` false: a given XOFF or headroom, or a rate the run was forced to): then drops
  are the physics the user chose, named beside the figures and not graded. Measured
  here: a 16-host incast at 25 Mbit/s whose thresholds fitting left the upstreams'
  bursts out of the headroom (docs/lossless.md) lost 86,073 lossless frames with every
  agent figure faithful.
- an ingress past its headroom without drops: degraded, the class held by luck (the
  buffer's other ingresses left it room). A late reaction whose bytes the headroom
  held is noted, not graded.
  Both are measured, not proxies: they decide alone and corroborate nothing.
- CPU mean 90 % can make a run degraded, never faithful or unfaithful on its own: a
  saturated machine is a warning, the figures above are the evidence.
- an agent process busy 90 % of its core corroborates, as the CPU at 90 % does, and is
  never graded alone: a process that busy has no slack left for the next burst.
- a figure past its faithful limit together with another, with the CPU at 90 % or with
  an agent process busy 90 % of its core, makes the run unfaithful: each figure
  undercounts an agent that is awake but too slow (here 6.5-8.8 % starved on a
  saturated machine for a job at about 2x ideal).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from fabric.shaping import PLAIN, PORT_LAYOUT_ENV, port_layout
from topologies.stats import percentile

FAITHFUL, DEGRADED, UNFAITHFUL = "faithful", "degraded", "unfaithful"
VERDICTS = (FAITHFUL, DEGRADED, UNFAITHFUL)


@dataclass(frozen=True)
class Limit:
    """A figure is faithful up to `faithful`, degraded up to `degraded`, else unfaithful."""

    faithful: float
    degraded: float
    unit: str

    def grade(self, value: float | None) -> str:
        if value is None or value <= self.faithful:
            return FAITHFUL
        return DEGRADED if value <= self.degraded else UNFAITHFUL


LIMITS = {
    "starved_fraction": Limit(0.02, 0.10, "of port busy time"),
    "starved_critical_fraction": Limit(0.05, 0.10, "of the job's time"),
    "timer_lag_p99_ms": Limit(5.0, 20.0, "ms"),
    "shaping_lost_fraction": Limit(0.02, 0.10, "of port busy time"),
    "host_drop_fraction": Limit(0.0, 0.001, "of delivered packets"),
    "pfc_poll_gap_p99_ms": Limit(3.0, 10.0, "ms"),
}
CPU_DEGRADED_PERCENT = 90.0
PROCESS_BUSY_PINNED = 0.9          # of one core: an agent process with no time to spare


def _ms(us: float | None) -> float | None:
    return None if us is None else us / 1e3


def _keep_most(most: dict[int, float], by_step: list) -> None:
    """Per step, the largest of the ranks' figures ([step, us] pairs) so far."""
    for k, us in by_step:
        most[k] = max(us, most.get(k, 0.0))


def _share(most: dict[int, float], job_ns: int) -> float | None:
    """Those per-step figures (us) summed over the steps, as a share of the job."""
    return sum(most.values()) * 1e3 / job_ns if job_ns else None


def agent_figures(agents: dict[str, dict], kernel_drops: int = 0) -> dict:
    """Sum and pool what every agent measured of itself (see traffic.agent results);
    `kernel_drops`: the host's frames lost outside any agent's socket (testbed.softnet)."""
    starved = busy = delivered = 0
    drops = kernel_drops
    lags: list[float] = []
    step_lags: list[float] = []
    slowest: dict[int, float] = {}      # step -> the slowest rank's lag (us)
    starved_most: dict[int, float] = {}  # step -> the most starved rank's idle wire (us)
    spans: list[dict] = []
    per_agent = {}
    for node, a in agents.items():
        fid = a.get("fidelity") or {}
        s, b = fid.get("starved_ns", 0), fid.get("busy_ns", 0)
        starved, busy = starved + s, busy + b
        lags += fid.get("timer_lag_us", [])
        step_lags += [lag for _, lag in fid.get("step_lag_us", [])]
        _keep_most(slowest, fid.get("step_lag_us", []))
        _keep_most(starved_most, fid.get("step_starved_us", []))
        spans += a.get("iterations", [])
        d = a.get("rx_socket_drops")    # the agent's own socket; else its namespace's UDP
        d = (a.get("udp_rcvbuf_errors", 0) or 0) if d is None else d
        drops += d
        delivered += sum(f.get("packets", 0) for f in a.get("flows", [])
                         if f.get("role") == "recv")
        per_agent[node] = {"starved_fraction": round(s / (s + b), 4) if s + b else 0.0,
                           "host_drops": d}
    busy_processes = [h["busy_fraction"] for a in agents.values()
                      if (h := a.get("host")) and h.get("busy_fraction") is not None]
    p50, p99 = percentile(lags, 50), percentile(lags, 99)
    job_ns = (max(s["end_ns"] for s in spans) - min(s["start_ns"] for s in spans)
              if spans else 0)
    return {
        "starved_s": starved / 1e9, "busy_s": busy / 1e9,
        "starved_fraction": starved / (starved + busy) if starved + busy else 0.0,
        "timer_lag_p50_ms": _ms(p50),
        "timer_lag_p99_ms": _ms(p99),
        "timer_lag_samples": len(lags),
        "step_lag_p50_ms": _ms(percentile(step_lags, 50)),
        "step_lag_p99_ms": _ms(percentile(step_lags, 99)),
        "step_lag_samples": len(step_lags),
        "step_lag_critical_fraction": _share(slowest, job_ns),
        "starved_critical_fraction": _share(starved_most, job_ns),
        "host_drops": drops, "delivered_packets": delivered,
        "host_drop_fraction": drops / delivered if delivered else (1.0 if drops else 0.0),
        "process_busy_max": max(busy_processes, default=None),
        "worst_agents": dict(sorted(per_agent.items(),
                                    key=lambda kv: -kv[1]["starved_fraction"])[:4]),
    }


def _late(room: dict, max_poll_gap_ms: float | None) -> str:
    """What went beyond the headroom ("" if nothing did): the report's own notes (an
    ingress's peak past XOFF + headroom, drops), else what outlasted the reaction it
    was sized for."""
    sized = room.get("sized_for_reaction_ms")
    if room.get("verdict") != "exceeded":
        return ""
    notes = [n for n in room.get("notes") or [] if "than their headroom" in n]
    if notes or sized is None:
        return "; ".join(notes) or "beyond the headroom"
    slowest = room.get("slowest_reaction_ms")
    late = []
    if slowest is not None and slowest > sized:
        late.append(f"slowest reaction {slowest:g} ms")
    if max_poll_gap_ms is not None and max_poll_gap_ms > sized:
        late.append(f"longest poll gap {max_poll_gap_ms:g} ms")
    return f"{' and '.join(late) or 'a reaction'} > {sized:g} ms the headroom was sized for"


def _not_lossless(pfc: dict) -> str | None:
    """Why the thresholds could not be lossless, "switch: note" of one ingress whose XOFF
    plus headroom does not fit its buffer (one on a switch that dropped, if any); None
    when every one fits. From pfc.json's `thresholds`, else its headroom's notes."""
    thresholds = pfc.get("thresholds")
    if thresholds is None:
        room = pfc.get("headroom") or {}
        notes = room.get("notes") or ["a switch ingress's XOFF + headroom exceed its buffer"]
        return None if room.get("thresholds_fit", True) else notes[0]
    bad = sorted(port for port, t in thresholds.items() if not t.get("ok", True))
    if not bad:
        return None
    dropped = {port.split(":")[0] for port, c in (pfc.get("ports") or {}).items()
               if c.get("drops")}
    first = min(bad, key=lambda port: port.split(":")[0] not in dropped)
    more = f"; {len(bad) - 1} more ingresses" if len(bad) > 1 else ""
    return f"{first.split(':')[0]}: {thresholds[first].get('note', '')}{more}"


def lossless(pfc: dict | None) -> dict | None:
    """How the emulated lossless class held: None with PFC off or unknown (drops are
    then the lossy class's, physics); else its grade, the reason when not faithful, and
    its figures. `pfc`: pfc.json's report (or metrics.json's "pfc").

    A lossless drop is the emulator's failure (unfaithful), unless some switch ingress's
    thresholds could not be lossless (XOFF + headroom of its fan-in beyond the buffer: a
    given XOFF or headroom, or a rate the run was forced to): then it is the physics the
    user chose, named, not graded. Without drops, a reaction or a poll gap beyond the
    reaction the headroom was sized for is degraded: the lossless class held by luck."""
    if not pfc or not pfc.get("enabled"):
        return None
    drops = (pfc.get("totals") or {}).get("drops") or 0
    gap = (pfc.get("controller") or {}).get("max_poll_gap_ms")
    room = pfc.get("headroom") or {}
    late = _late(room, gap)
    physics = _not_lossless(pfc) if drops else None
    grade, reason = FAITHFUL, None
    if drops and not physics:
        grade, reason = UNFAITHFUL, f"{drops} lossless drops with PFC on" + (
            f" ({late})" if late else "")
    elif not drops and late:
        grade, reason = DEGRADED, f"PFC reacted beyond its headroom: {late} (no drops)"
    return {"grade": grade, "reason": reason,
            "figures": {"lossless_drops": drops, "lossless_physics": physics,
                        "pfc_max_poll_gap_ms": gap,
                        "pfc_slowest_reaction_ms": room.get("slowest_reaction_ms"),
                        "pfc_sized_for_reaction_ms": room.get("sized_for_reaction_ms")}}


def verdict(agents: dict[str, dict], cpu_mean_percent: float | None = None,
            pfc_poll_gap_p99_ms: float | None = None, kernel: dict | None = None,
            steal_percent: float | None = None, shaping: dict | None = None,
            pfc: dict | None = None) -> dict:
    """The run's verdict, with the figures and thresholds that decided it (`kernel`:
    testbed.softnet.delta over the run, None where unknown; `steal_percent`: the
    hypervisor's mean steal over the workload, shown; `shaping`: the shaping timers'
    testbed.kernel_timers summary, not graded where unavailable; `pfc`: the PFC
    controller's report, graded by `lossless`)."""
    # frames the kernel refused onto a full input backlog: the host's loss, not the fabric's
    figures = agent_figures(agents, kernel["backlog_drops"] if kernel else 0)
    figures["pfc_poll_gap_p99_ms"] = pfc_poll_gap_p99_ms
    figures["kernel_backlog_drops"] = kernel["backlog_drops"] if kernel else None
    figures["kernel_squeezes_per_1k_frames"] = (kernel["squeezes_per_1k_frames"]
                                                if kernel else None)
    figures["cpu_mean_percent"] = cpu_mean_percent
    figures["steal_percent"] = steal_percent
    measured = bool(shaping and shaping.get("available"))
    figures["shaping_late_p99_ms"] = (_ms(shaping["late_p99_us"]) if measured
                                      and shaping["late_p99_us"] is not None else None)
    figures["shaping_lost_fraction"] = shaping.get("lost_fraction") if measured else None
    grades = {name: limit.grade(figures.get(name)) for name, limit in LIMITS.items()}
    worst = max(grades.values(), key=VERDICTS.index)
    reasons = [f"{name} {_show(figures[name])} > {LIMITS[name].faithful:g} "
               f"{LIMITS[name].unit}" for name, g in grades.items() if g != FAITHFUL]
    saturated = cpu_mean_percent is not None and cpu_mean_percent >= CPU_DEGRADED_PERCENT
    busy = figures["process_busy_max"]
    pinned = busy is not None and busy >= PROCESS_BUSY_PINNED
    past = sum(g != FAITHFUL for g in grades.values())
    held = lossless(pfc)   # measured, not a proxy: decides alone, corroborates nothing
    if held is not None:
        figures.update(held["figures"])
        grades["lossless"] = held["grade"]
        worst = max(worst, held["grade"], key=VERDICTS.index)
        if held["reason"]:
            reasons.append(held["reason"])
    if past and past + (saturated or pinned) >= 2:
        # Each figure sees only part of the emulator's delay (frames held at the host,
        # late wake-ups; not an agent that is awake but too slow): a figure past its
        # limit with another, on a saturated machine or with an agent process that had
        # no time to spare, is corroborated, not noise. Measured: 6.5-8.8 % starved on a
        # saturated machine when the job took ~2x ideal.
        worst = UNFAITHFUL
        reasons.append("corroborated: " + (
            "two figures past their limits" if past >= 2 else "on a saturated machine"
            if saturated else f"an agent process busy {busy:.0%} of its core"))
    if saturated:
        reasons.append(f"cpu_mean_percent {cpu_mean_percent:.0f} >= {CPU_DEGRADED_PERCENT:g}")
        if worst == FAITHFUL:
            worst = DEGRADED
    if port_layout() == PLAIN:     # the kernel's floor (docs/kernel_cost.md), no emulation
        worst = UNFAITHFUL
        reasons.append(f"{PORT_LAYOUT_ENV}={PLAIN}: no port is shaped, so no link rate, "
                       "queue or lossless class was emulated")
    return {"verdict": worst, "reasons": reasons, "grades": grades,
            "figures": {k: _round(v) for k, v in figures.items()},
            "thresholds": {**{k: asdict(v) for k, v in LIMITS.items()},
                           "lossless": {"faithful": "no drops, reactions within the "
                                        "headroom", "degraded": "no drops",
                                        "unit": "lossless frames with PFC on"},
                           "cpu_mean_percent": {"degraded": CPU_DEGRADED_PERCENT},
                           "process_busy_max": {"corroborates": PROCESS_BUSY_PINNED,
                                                "unit": "of one core"}}}


def summary_line(fid: dict) -> str:
    f = fid["figures"]
    text = (f"fidelity: **{fid['verdict']}** (wire starved {_pct(f['starved_fraction'])} of "
            f"busy time, on the critical path {_pct(f.get('starved_critical_fraction'))} "
            f"of the job; timer lag p50/p99 {_show(f['timer_lag_p50_ms'])}/"
            f"{_show(f['timer_lag_p99_ms'])} ms; host drops {f['host_drops']}")
    if f.get("kernel_squeezes_per_1k_frames") is not None:
        text += (f" ({_show(f['kernel_backlog_drops'])} at the kernel's input backlogs); "
                 f"kernel forwarding squeezed {_show(f['kernel_squeezes_per_1k_frames'])} "
                 f"times per 1000 frames")
    if f.get("step_lag_samples"):
        text += (f"; step lag p50/p99 {_show(f['step_lag_p50_ms'])}/"
                 f"{_show(f['step_lag_p99_ms'])} ms, on the critical path "
                 f"{_pct(f['step_lag_critical_fraction'])} of the job")
    if f.get("shaping_lost_fraction") is not None:
        text += (f"; shaping timers late p99 {_show(f['shaping_late_p99_ms'])} ms, "
                 f"{_pct(f['shaping_lost_fraction'])} of port busy time lost")
    if f.get("pfc_poll_gap_p99_ms") is not None:
        text += f"; PFC poll gap p99 {_show(f['pfc_poll_gap_p99_ms'])} ms"
    if f.get("lossless_drops") is not None:
        text += f"; lossless drops {f['lossless_drops']}"
        if f.get("lossless_physics"):
            text += (": the buffers cannot hold fan-in x (XOFF + headroom) at this rate "
                     f"({f['lossless_physics']}), physics, not the emulator")
    if f.get("process_busy_max") is not None:
        text += f"; busiest agent process {_pct(f['process_busy_max'])} of a core"
    if f.get("steal_percent"):
        text += f"; the hypervisor stole {_show(f['steal_percent'])} % of the CPUs' time"
    text += ")"
    if fid["reasons"]:
        text += ": " + "; ".join(fid["reasons"])
    return text


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


def _show(x) -> str:
    return "n/a" if x is None else f"{x:.3g}" if isinstance(x, float) else str(x)


def _round(v):
    return round(v, 6) if isinstance(v, float) else v


def worst_verdict(metrics) -> str:
    """The worst verdict of several runs' metrics (a script's rows of many runs)."""
    return max((m["fidelity"]["verdict"] for m in metrics), key=VERDICTS.index,
               default=FAITHFUL)
