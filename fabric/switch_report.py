"""What the switch controller did: `report(ctl)` turns a stopped
fabric.switch_control.SwitchController into JSON-ready data (settings, calibration,
thresholds, reaction times, per-port counters, storms, controller cost). Its timeline's
rows have the columns TIMELINE_FIELDS. testbed.pfc_results writes both to a run's
results folder (pfc.json, pfc_timeline.csv).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict

# a timeline row (fabric.switch_ports.PortCounters.row): one port at one poll
TIMELINE_FIELDS = ["t_s", "node", "ifname", "backlog_bytes", "sent_bytes", "drops", "paused",
                   "paused_s", "frames_sent", "frames_received"]


def summary(values: list[float]) -> dict:
    """count, mean, p50, p99, max of `values` (only count when there are none)."""
    if not values:
        return {"count": 0}
    s = sorted(values)
    return {"count": len(s), "mean": round(statistics.fmean(s), 3),
            "p50": round(s[len(s) // 2], 3),
            "p99": round(s[min(len(s) - 1, int(0.99 * len(s)))], 3),
            "max": round(s[-1], 3)}


def headroom(ctl, reaction: dict, drops: int, max_poll_gap_ms: float | None = None) -> dict:
    """The one headroom verdict a run reports (pfc.json, metrics.json and summary.md all
    print this, so they cannot disagree):

    - too_small: XOFF + headroom of some port's ingresses does not fit its buffer;
    - exceeded: the thresholds fit, but some ingress took more after XOFF than its
      headroom (its peak charge, `peaks`), or a lossless frame was dropped (what no
      poll saw: a crossing inside a stalled controller's gap);
    - ok: the thresholds fit and every ingress's peak stayed within XOFF + headroom.

    The slowest reaction and the longest gap between polls are set against the reaction
    the headroom was sized for in the notes: a late one whose bytes the headroom held
    (its bursts' part is rarely all used) is not a breach. Judged by time alone, 6 of
    9 runs of bench_lossless read "exceeded" with every peak inside its headroom.
    """
    bad = [i for i in ctl.ingress if not i.thresholds.ok]
    # the reaction the thresholds were sized for: what their headroom covers, the least
    # over the ingresses (the assumed reaction where the headroom was derived from it)
    covers = min((i.thresholds.covers_ms for i in ctl.ingress), default=math.inf)
    assumed = (round(covers, 3) if math.isfinite(covers)
               else ctl.calibration.get("reaction_ms_assumed", 0.0))
    slowest = reaction.get("max") if reaction["count"] else None
    late = []
    if slowest is not None and slowest > assumed:
        late.append(f"slowest reaction {slowest} ms")
    if max_poll_gap_ms is not None and max_poll_gap_ms > assumed:
        late.append(f"longest poll gap {max_poll_gap_ms:g} ms")
    beyond = [i for i in ctl.ingress if getattr(i, "peak_occupancy", 0)
              > i.thresholds.xoff_bytes + i.thresholds.headroom_bytes]
    if bad:
        verdict = "too_small"
    elif beyond or drops:
        verdict = "exceeded"
    else:
        verdict = "ok"
    notes = sorted({f"{i.switch}: {i.thresholds.note}" for i in bad})
    if beyond:
        worst = max(beyond, key=lambda i: i.peak_occupancy - i.thresholds.xoff_bytes)
        notes.append(f"{len(beyond)} ingresses took more than their headroom after XOFF "
                     f"(the most: {worst.switch}:{worst.ifname}, "
                     f"{int(worst.peak_occupancy - worst.thresholds.xoff_bytes)} B against "
                     f"{worst.thresholds.headroom_bytes} B); {drops} lossless drops")
    elif drops and not bad:
        notes.append(f"{drops} lossless drops past every ingress's headroom")
    if late:
        notes.append(f"{' and '.join(late)} > {assumed:g} ms the headroom was sized for"
                     + ("" if beyond or drops or bad else
                        "; every ingress's peak stayed within its headroom"))
    return {"verdict": verdict, "thresholds_fit": not bad,
            "sized_for_reaction_ms": assumed, "slowest_reaction_ms": slowest,
            "notes": notes}


def peaks(ingress) -> dict:
    """The most lossless bytes ever charged to each switch ingress against its XOFF and
    headroom: what arrived after XOFF is the headroom a reaction really used
    (`over_xoff_bytes`, the largest over the ports, and the ports that went past
    XOFF + headroom, `beyond_headroom`)."""
    by_port = {f"{i.switch}:{i.ifname}": {
        "peak_bytes": int(i.peak_occupancy),
        "over_xoff_bytes": max(0, int(i.peak_occupancy) - i.thresholds.xoff_bytes),
        "headroom_bytes": i.thresholds.headroom_bytes} for i in ingress if i.peak_occupancy}
    beyond = sorted(k for k, v in by_port.items() if v["over_xoff_bytes"] > v["headroom_bytes"])
    return {"max_over_xoff_bytes": max((v["over_xoff_bytes"] for v in by_port.values()),
                                       default=0),
            "beyond_headroom": beyond, "by_port": by_port}


def ecn(ctl) -> dict:
    """Whether the switches marked CE, how, with which profile, and how many frames."""
    s = ctl.settings
    marks = ctl.ecn_marks
    return {"enabled": s.ecn == "on",
            "mechanism": ctl.calibration.get("ecn", "off"),
            "kmin_bytes": s.ecn_kmin_bytes, "kmax_bytes": s.ecn_kmax_bytes,
            "pmax": s.ecn_pmax, "marks": sum(marks.values()),
            "marks_by_port": {k: v for k, v in sorted(marks.items()) if v}}


def report(ctl) -> dict:
    """What ran and what happened (the timeline is `ctl.timeline`)."""
    reaction = summary([r.reaction_ms for r in ctl.reactions])
    # a queue that drops is a forwarding node's; at an endpoint's own NIC the qdisc
    # "drops" are frames it refused (ENOBUFS), which the agent keeps and sends again
    fabric = [c for (n, _), c in ctl.counters.items() if n in ctl.switches]
    counters = ctl.counters.values()
    ports = {f"{n}:{i}": {k: (round(v, 4) if isinstance(v, float) else v)
                          for k, v in asdict(c).items() if k != "drops_at_start"}
             for (n, i), c in ctl.counters.items()}
    return {
        "enabled": ctl.settings.enabled,
        "config": {**ctl.settings.to_keys(), "tuning": asdict(ctl.tuning)},
        "calibration": ctl.calibration,
        "thresholds": {f"{i.switch}:{i.ifname}": asdict(i.thresholds) for i in ctl.ingress},
        "peaks": peaks(ctl.ingress),
        "headroom": headroom(ctl, reaction, sum(c.drops for c in fabric),
                             ctl.clock.max_gap_s * 1e3),
        "reaction_ms": reaction,
        "reaction_upper_ms": summary([r.upper_ms for r in ctl.reactions]),
        "frame_ms": summary([r.frame_ms for r in ctl.reactions]),
        "ports": ports,
        "totals": {"frames_sent": sum(c.frames_sent for c in counters),
                   "xoff_frames": sum(c.xoff_frames for c in counters),
                   "send_errors": sum(c.send_errors for c in counters),
                   "drops": sum(c.drops for c in fabric),
                   "host_refused": sum(c.drops for c in counters) - sum(c.drops
                                                                       for c in fabric),
                   "paused_s": round(sum(c.paused_s for c in counters), 4)},
        "storms": ctl.storms,
        "ecn": ecn(ctl),
        "trimming": {"enabled": ctl.settings.trimming == "on",
                     "mechanism": ctl.calibration.get("trimming", "off"),
                     "trimmed": sum(ctl.trims.values()),
                     "trimmed_by_port": {k: v for k, v in sorted(ctl.trims.items()) if v}},
        "switch_lb": {"mode": ctl.settings.switch_lb,
                      "mechanism": ctl.calibration.get("switch_lb", "ecmp"),
                      "steered": sum(ctl.lb_steered.values()),
                      "steered_by_port": {k: v for k, v in sorted(ctl.lb_steered.items())
                                          if v}},
        "t0_monotonic_s": ctl.t0,        # pfc_timeline.csv's t_s = 0 (CLOCK_MONOTONIC)
        "controller": {"cpu_s": round(ctl.cpu_s, 3), "wall_s": round(ctl.wall_s, 3),
                       "cpu_percent_of_core": round(100 * ctl.cpu_s / ctl.wall_s, 1)
                       if ctl.wall_s else 0.0,
                       "polls": ctl.clock.polls, "late_polls": ctl.clock.late_polls,
                       "max_poll_gap_ms": round(ctl.clock.max_gap_s * 1e3, 3),
                       "poll_gap_p99_ms": _round3(ctl.clock.gap_p99_ms()),
                       "late_poll_gaps": ctl.clock.gaps,
                       "sleeps": ctl.sleeps, "slept_s": round(ctl.slept_s, 3),
                       "kernel_wakes": ctl.kernel_wakes,
                       "wake_lag_ms": summary([lag * 1e3 for lag in ctl.wake_lags]),
                       "switches": len(ctl.switches)},
        "errors": ctl.errors,
    }


def _round3(x: float | None) -> float | None:
    return None if x is None else round(x, 3)
