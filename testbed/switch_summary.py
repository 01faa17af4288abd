"""What a run's switches did, in its results: the PFC, ECN, balancing and trimming
figures of metrics.json gathered over the servers of a run on several machines, and
their lines in summary.md (testbed.features.Switches)."""

from __future__ import annotations

from fabric.trimming import TRIM_DSCP


def spread_pfc_metrics(merged: dict) -> dict:
    """The run's PFC figures over several servers: frames, pauses, drops, ECN marks,
    steered and trimmed frames summed over every server's controller, times held by the
    controllers and by the receivers of pauses from other servers; the rest from the
    server that paused most."""
    reports = merged["per_server"]
    ctls = {s: rep["controller"] for s, rep in reports.items()}
    busiest = max(ctls, key=lambda s: ctls[s]["totals"]["frames_sent"])
    totals = {k: sum(c["totals"][k] for c in ctls.values()) for k in ctls[busiest]["totals"]}
    received = {k: sum(rep["receiver"]["totals"][k] for rep in reports.values())
                for k in ("frames_received", "xoff_frames", "xon_frames", "expired")}
    totals["paused_s"] = round(totals["paused_s"] + sum(
        rep["receiver"]["totals"]["paused_s"] for rep in reports.values()), 4)
    out = {k: ctls[busiest].get(k) for k in ("enabled", "headroom", "reaction_ms", "storms",
                                             "controller")}
    for key, count in (("ecn", "marks"), ("switch_lb", "steered"), ("trimming", "trimmed")):
        out[key] = summed(ctls, busiest, key, count)
    out |= {"totals": totals, "from_other_servers": received,
            "files": ", ".join(f"pfc-{s}.json" for s in reports),
            "per_server": {s: {"sent": c["totals"]["frames_sent"],
                               "received_from_others":
                                   reports[s]["receiver"]["totals"]["frames_received"]}
                           for s, c in ctls.items()}}
    return out | {k: ctls[busiest]["calibration"].get(k)
                  for k in ("occupancy_from", "poll_ms", "sleep")}


def summed(ctls: dict[str, dict], busiest: str, key: str, count: str) -> dict | None:
    """A mechanism's report (ecn, switch_lb, trimming) with `count` and its by-port
    counts summed over the servers (ports are named by node: they never collide)."""
    got = ctls[busiest].get(key)
    if not got or count not in got:
        return got
    parts = [c[key] for c in ctls.values() if c.get(key)]
    out = {**got, count: sum(p.get(count) or 0 for p in parts)}
    if isinstance(got.get("by_port"), dict):
        out["by_port"] = {k: v for p in parts for k, v in (p.get("by_port") or {}).items()}
    return out


def switch_lines(m: dict) -> list[str]:
    """summary.md's lines on PFC, ECN, balancing and trimming."""
    pfc, f = m.get("pfc"), m["flows"]
    if not pfc:
        return []
    t = pfc.get("totals") or {}
    room = pfc.get("headroom") or {}
    lines = [f"- PFC {'on' if pfc['enabled'] else 'off'} (lossless class): "
             f"{t.get('frames_sent', 0)} pause frames sent ({t.get('xoff_frames', 0)} "
             f"XOFF), {t.get('paused_s', 0)} s paused in all, {t.get('drops', 0)} "
             f"lossless drops; headroom {room.get('verdict', 'n/a')}"
             + (f" ({room['notes'][0]})" if room.get("notes") else "")
             + f" ({pfc.get('files') or 'pfc.json, pfc_timeline.csv, `plots/pfc_*.png`'})"]
    r = pfc.get("reaction_ms") or {}
    if pfc.get("occupancy_from"):
        lines.append(f"  - queues read from {pfc['occupancy_from']} every "
                     f"{pfc.get('poll_ms')} ms; reaction (XOFF crossing to the upstream "
                     f"held) p50 {r.get('p50', 'n/a')} ms, p99 {r.get('p99', 'n/a')} ms")
        c = pfc.get("controller") or {}
        if c.get("sleeps"):
            lag = c["wake_lag_ms"]
            woken = (f"the first one enqueued woke it {lag['count']} times, awake within "
                     f"{lag['max']} ms of it" if lag["count"] else "no byte woke it")
            lines.append(f"  - the controller slept {c['slept_s']} s of {c['wall_s']} s "
                         f"while no switch held a lossless byte; {woken} ({pfc['sleep']})")
        elif pfc.get("sleep"):
            lines.append(f"  - the controller polled every period all along "
                         f"(sleep: {pfc['sleep']})")
    ecn = pfc.get("ecn") or {}
    if ecn.get("enabled"):
        lines.append(f"  - ECN: {ecn['marks']} frames marked CE (kmin {ecn['kmin_bytes']} "
                     f"B, kmax {ecn['kmax_bytes']} B, pmax {ecn['pmax']:g}) by "
                     f"{ecn['mechanism']}; the pcaps show them as ip.dsfield.ecn == 3")
    lb = pfc.get("switch_lb") or {}
    if lb.get("mode", "ecmp") != "ecmp":
        lines.append(f"  - switch load balancing {lb['mode']}: {lb['steered']} frames "
                     f"steered ({lb['mechanism']})")
    trim = pfc.get("trimming") or {}
    if trim.get("enabled"):
        lines.append(f"  - trimming: {trim['trimmed']} frames trimmed by the switches, "
                     f"{f['trimmed']} arrived trimmed and were NAKed at once "
                     f"({trim['mechanism']}); the pcaps show them as ip.dsfield.dscp == "
                     f"{TRIM_DSCP}")
    return lines
