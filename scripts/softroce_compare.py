#!/usr/bin/env python3
"""Soft-RoCE (the kernel's rdma_rxe) as a real RDMA peer beside the testbed's agents.

    leaf_spine 2 leaves x 2 hosts, 1 spine ─ the same fabric three times:
    1. the agents:  testbed run, p2p l0h0 > l1h0, RoCE (go-back-N)      ─▶ agents.pcap
    2. rxe:         rdma link add on l0h0-eth0 and l1h0-eth0 (in their namespaces),
                    ib_write_bw l0h0 > l1h0                              ─▶ rxe.pcap
    3. PFC:         ib_write_bw l0h0 > l1h0 and l0h1 > l1h0 (2:1 at the spine uplink) in
                    the lossless class, pfc off then on                  ─▶ rxe-pfc-*.pcap

Each capture is taken at l0h0's port, decoded by tshark (BTH, AETH, IP, UDP) and its ICRCs
checked by traffic.parse; the table puts what the kernel's RDMA stack does beside what the
agents do, field by field. The PFC part reads rxe's own counters (its go-back-N
retransmissions, out-of-sequence packets) beside the controller's pauses and drops: the
kernel's RDMA stack does not know the pauses are emulated, it sees its port stop.

rdma_rxe needs a kernel whose rxe opens its UDP socket in the network namespace of the
netdev it is bound to (rxe_ns.c: Debian's 7.3 from trixie-backports has it, and
`setup.sh --guest` installs it in the VM); older ones (Debian 12's 6.1, bookworm-backports'
6.12) route rxe's packets in the initial namespace only, and the script says so and exits
3 there. Writes softroce.md, softroce.json and the pcaps to --out; exit 1 if a check
failed, 2 on bad input.

    sudo .venv/bin/python scripts/softroce_compare.py [--out DIR] [--rate 50]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fabric.core import Fabric  # noqa: E402
from fabric.switch_control import controller_running  # noqa: E402
from fabric.wire import tshark_lua_args  # noqa: E402
from testbed.collect import Pcaps  # noqa: E402
from testbed.experiment import from_toml  # noqa: E402
from testbed.outputs import make_folder  # noqa: E402
from testbed.rate import rescaled  # noqa: E402
from testbed.run import run  # noqa: E402
from testbed.script_args import add_rate  # noqa: E402
from testbed.softnet import delta as softnet_delta  # noqa: E402
from testbed.softnet import read as softnet_read  # noqa: E402
from topologies.spec import SpecError  # noqa: E402
from traffic.packets import ROCE_UDP_PORT, Opcode  # noqa: E402
from traffic.parse import parse  # noqa: E402

TOPOLOGY = {"kind": "leaf_spine", "params": {"leaves": 2, "spines": 1, "hosts_per_leaf": 2}}
SENDER, SECOND, RECEIVER = "l0h0", "l0h1", "l1h0"
FIELDS = ("frame.len", "ip.src", "ip.dsfield.dscp", "ip.dsfield.ecn", "udp.srcport",
          "infiniband.bth.opcode", "infiniband.bth.destqp", "infiniband.bth.psn",
          "infiniband.bth.a", "infiniband.aeth.syndrome", "infiniband.aeth.msn")
# rxe's counters (drivers/infiniband/sw/rxe/rxe_hw_counters.c) that say what loss did
RXE_COUNTERS = ("sent_pkts", "rcvd_pkts", "out_of_seq_request", "duplicate_request",
                "rcvd_seq_err", "completer_retry_err", "retry_exceeded_err", "ack_deferred",
                "send_err")
MESSAGES = 5                    # perftest's least
MESSAGE_BYTES = 256 * 1024
RXE_WINDOW_PACKETS = 64         # RXE_INFLIGHT_SKBS_PER_QP_HIGH
ROCE_FRAME_BYTES = 4170         # a 4096 B payload in Ethernet, IP, UDP, BTH and ICRC
# An endpoint's own port queue stands in for its NIC's send queue, which never drops its
# host's packets: the agents retry a refused frame, but rxe keeps up to 64 packets per QP
# in the kernel's queues (RXE_INFLIGHT_SKBS_PER_QP_HIGH) and a drop there fails its QP.
# So the rxe endpoints' links get queues that hold that (x 2 for a margin), and PFC's
# thresholds are set for the switches' own buffers (DEFAULT_QUEUE_BYTES, fan-in 2 at a
# leaf: 2 x (XOFF + headroom) = 128 KiB; the headroom covers 63 ms at 4 Mbit/s).
NIC_QUEUE_BYTES = 2 * RXE_WINDOW_PACKETS * ROCE_FRAME_BYTES
PFC_THRESHOLDS = {"pfc_xoff_bytes": 24 * 1024, "pfc_headroom_bytes": 40 * 1024}
PERFTEST_PORT = 18515


def sh(args: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, **kw)


def rxe_unavailable(module: Path = Path("/sys/module/rdma_rxe"),
                    kallsyms: Path = Path("/proc/kallsyms")) -> str | None:
    """Why two rxe endpoints in two namespaces cannot be had here, or None."""
    for tool in ("rdma", "ib_write_bw", "tshark"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (sudo bash scripts/setup.sh --guest)"
    if not module.exists() and shutil.which("modprobe"):
        sh(["modprobe", "rdma_rxe"])
    if not module.exists():
        return "the kernel has no rdma_rxe module (CONFIG_RDMA_RXE)"
    # rxe_ns.c's per-namespace sockets (a module's symbols are listed once it is loaded)
    if "rxe_ns_pernet_sk4" not in kallsyms.read_text(errors="replace"):
        return (f"rdma_rxe of kernel {Path('/proc/sys/kernel/osrelease').read_text().strip()} "
                "opens its UDP socket in the initial network namespace only, so an rxe "
                "device on a fabric endpoint's port cannot send or receive; it needs a kernel "
                "whose rxe has per-namespace sockets (Debian's 7.3 from trixie-backports: "
                "setup.sh --guest)")
    return None


class Rxe:
    """An rxe device on one endpoint's port, made in its namespace, deleted on close."""

    def __init__(self, fab: Fabric, node: str):
        self.fab, self.node = fab, node
        self.port = fab.plan.ports[node][0]
        self.name = f"rxe_{node}"
        # rxe's GIDs are its netdev's addresses: the endpoint's own (its loopback, which
        # the fabric routes) goes on the port too, so the RDMA traffic is the agents'
        self.ip = fab.plan.loopback[node].split("/")[0]
        with fab.ipr(node) as ipr:
            index = ipr.link_lookup(ifname=self.port.ifname)[0]
            ipr.addr("add", index=index, address=self.ip, prefixlen=32)
        out = self.exec(["rdma", "link", "add", self.name, "type", "rxe",
                         "netdev", self.port.ifname])
        if out.returncode != 0:
            raise RuntimeError(f"rdma link add {self.name}: {out.stderr.strip()}")
        self.gid = self._gid_index()

    def exec(self, args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
        proc = self.fab.popen(self.node, args, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(args, proc.returncode, out, err)

    def _gid_index(self) -> int:
        """The RoCE v2 GID of the port's IPv4 address (its table fills in the background)."""
        base = Path(f"/sys/class/infiniband/{self.name}/ports/1")
        want = "0000:0000:0000:0000:0000:ffff:" + "".join(
            f"{int(a):02x}{int(b):02x}:" for a, b in [self.ip.split(".")[0:2],
                                                      self.ip.split(".")[2:4]]).rstrip(":")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            for gid in sorted((base / "gids").iterdir(), key=lambda p: int(p.name)):
                with contextlib.suppress(OSError):
                    kind = (base / "gid_attrs" / "types" / gid.name).read_text().strip()
                    if gid.read_text().strip() == want and kind == "RoCE v2":
                        return int(gid.name)
            time.sleep(0.2)
        raise RuntimeError(f"{self.name}: no RoCE v2 GID for {self.ip} after 20 s")

    def counters(self) -> dict[str, int]:
        base = Path(f"/sys/class/infiniband/{self.name}/ports/1/hw_counters")
        return {c: int((base / c).read_text()) for c in RXE_COUNTERS if (base / c).exists()}

    def close(self) -> None:
        self.exec(["rdma", "link", "delete", self.name])


def qp_timeout(rate_mbps: float) -> int:
    """perftest's -u: the QP's retransmission timeout, 4.096 us x 2^u (IBA 9.7.6.1.3), at
    least twice the time rxe's window takes to leave at the emulated link rate. The
    emulated links are slower than real ones by the fabric's scale factor, and rxe's
    timers run in real time: at its default (u = 14, 67 ms) a window still queued at the
    sender's port times out and is sent again without a loss (the agents stretch their
    RTO the same way, testbed.rate.scaled_rto_ms)."""
    drain_s = RXE_WINDOW_PACKETS * ROCE_FRAME_BYTES * 8 / (rate_mbps * 1e6)
    return min(31, max(14, math.ceil(math.log2(2 * drain_s / 4.096e-6))))


def perftest(server: Rxe, clients: list[Rxe], size: int, iters: int, tclass: int,
             rate_mbps: float, timeout_s: float) -> list[dict]:
    """ib_write_bw from each client to `server` (one server process per client, each on
    its own port), all at once; each client's bandwidth as perftest reports it."""
    common = ["-s", str(size), "-n", str(iters), "-F", "--report_gbits",
              "--tclass", str(tclass), "-u", str(qp_timeout(rate_mbps))]
    servers = [server.fab.popen(server.node, ["ib_write_bw", "-d", server.name, "-x",
                                              str(server.gid), "-p", str(PERFTEST_PORT + i),
                                              *common], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
               for i in range(len(clients))]
    time.sleep(2.0)                  # the servers listen for perftest's TCP handshake
    procs = [c.fab.popen(c.node, ["ib_write_bw", "-d", c.name, "-x", str(c.gid), "-p",
                                  str(PERFTEST_PORT + i), *common, server.ip],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i, c in enumerate(clients)]
    results = []
    for c, proc in zip(clients, procs, strict=True):
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        row = [ln.split() for ln in out.splitlines() if re.match(r"^\s*\d+\s+\d+\s+[\d.]", ln)]
        results.append({"client": c.node, "rc": proc.returncode,
                        "gbps": float(row[-1][3]) if row else None,
                        "output": out.strip().splitlines()})
    for proc in servers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=20)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return results


def complaint(output: list[str]) -> str:
    """What perftest said went wrong (its errors go to stderr, ahead of its buffered
    stdout), or its last line."""
    bad = [ln.strip() for ln in output if re.search(r"error|fail|couldn|unable", ln, re.I)]
    return "; ".join(bad[:3]) or (output[-1].strip() if output else "no output")


def decode(pcap: Path) -> list[dict]:
    """Every RoCEv2 frame of a capture: tshark's fields and traffic.parse's ICRC check."""
    from scapy.utils import rdpcap

    out = sh(["tshark", "-r", str(pcap), *tshark_lua_args(),
              "-d", f"udp.port=={ROCE_UDP_PORT},infiniband",
              "-Y", f"udp.dstport=={ROCE_UDP_PORT}", "-T", "fields", "-E", "separator=,",
              *[a for f in FIELDS for a in ("-e", f)]], check=True, timeout=120).stdout
    rows = [dict(zip(FIELDS, ln.split(","), strict=True)) for ln in out.splitlines() if ln]
    frames = [bytes(p) for p in rdpcap(str(pcap))
              if len(bytes(p)) > 42 and int.from_bytes(bytes(p)[36:38], "big") == ROCE_UDP_PORT]
    if len(frames) != len(rows):
        raise RuntimeError(f"{pcap.name}: tshark decoded {len(rows)} RoCE frames, "
                           f"the capture holds {len(frames)}")
    for row, frame in zip(rows, frames, strict=True):
        row["icrc_ok"] = parse(frame)["icrc_ok"]
    return rows


FIRST_OPCODES = frozenset({Opcode.RC_SEND_FIRST, Opcode.RC_SEND_ONLY,
                           Opcode.RC_RDMA_WRITE_FIRST, Opcode.RC_RDMA_WRITE_ONLY})


def opname(code: int) -> str:
    with contextlib.suppress(ValueError):
        return Opcode(code).name.removeprefix("RC_")
    return f"0x{code:02x}"


def traits(rows: list[dict], sender_ip: str) -> dict:
    """What a capture shows of a transport: the sender's data and the receiver's ACKs."""
    data = [r for r in rows if r["ip.src"] == sender_ip and int(r["infiniband.bth.opcode"])
            != Opcode.RC_ACK]
    acks = [r for r in rows if int(r["infiniband.bth.opcode"]) == Opcode.RC_ACK]
    steps, starts = Counter(), Counter()
    last: dict[tuple, int] = {}      # per QP and UDP source port (an agents' flow)
    for r in data:
        psn, key = int(r["infiniband.bth.psn"]), (r["infiniband.bth.destqp"], r["udp.srcport"])
        first = int(r["infiniband.bth.opcode"]) in FIRST_OPCODES
        before = last.get(key, last.get(("qp", key[0])))
        if first:
            starts["continues the QP's PSNs" if before is not None and (psn - before) &
                   0xFFFFFF == 1 else "starts anew"] += 1
        if key in last:
            d = (psn - last[key]) & 0xFFFFFF
            steps["+1" if d == 1 else "back (resent)" if d > 0x800000 or d == 0
                  else "jump"] += 1
        last[key] = last[("qp", key[0])] = psn
    ackreq = [r for r in data if r["infiniband.bth.a"] in ("1", "True")]
    syndromes = Counter(f"0x{int(r['infiniband.aeth.syndrome'], 0):02x}" for r in acks)
    return {
        "frames": len(rows),
        "data packets": len(data),
        "opcodes (data)": dict(Counter(opname(int(r["infiniband.bth.opcode"])) for r in data)),
        "largest frame, B": max((int(r["frame.len"]) for r in data), default=0),
        "PSN steps (per QP and flow)": dict(steps),
        "PSN of a message's first packet": dict(starts),
        "AckReq set on": f"{len(ackreq)} of {len(data)}: "
                         + ", ".join(sorted({opname(int(r['infiniband.bth.opcode']))
                                             for r in ackreq})),
        "ACKs": len(acks),
        "data packets per ACK": round(len(data) / len(acks), 1) if acks else None,
        "AETH syndromes": dict(syndromes),
        "NAKs": sum(1 for r in acks if int(r["infiniband.aeth.syndrome"], 0) >> 5 == 3),
        "ICRC valid": f"{sum(r['icrc_ok'] for r in rows)} of {len(rows)}",
        "UDP source ports (data)": len({r["udp.srcport"] for r in data}),
        "destination QPs": len({r["infiniband.bth.destqp"] for r in rows}),
        "DSCP (data)": sorted({int(r["ip.dsfield.dscp"]) for r in data}),
        "ECN (data)": sorted({int(r["ip.dsfield.ecn"]) for r in data}),
    }


# why the two may differ, where they do (what each implementation does, from its source)
WHY = {
    "opcodes (data)": "perftest posts RDMA WRITEs; the agents' roce transport SENDs each "
                      "message (FIRST, MIDDLE, LAST)",
    "largest frame, B": "an RDMA WRITE's first packet carries a 16 B RETH (address, key, "
                        "length); the agents SEND",
    "AckReq set on": "rxe asks for an ACK on a message's last packet only (and on a "
                     "window's last when its send queue fills); the agents on every "
                     "ack_every-th packet (8) and a message's last, to clock their window",
    "PSN of a message's first packet": "rxe numbers a QP's packets in one sequence across "
                                       "messages (IBA 9.7.1); the agents give each message "
                                       "a flow of its own, its PSNs from its own start",
    "data packets per ACK": "rxe's responder answers AckReq only (one ACK per message "
                            "here); the agents' receiver every ack_every packets",
    "ACKs": "as the packets per ACK",
    "UDP source ports (data)": "rxe takes one source port per QP (a hash of its number); "
                               "the agents per flow (ecmp) or per packet (spray)",
    "ECN (data)": "the agents mark every data packet ECT(0), as DCQCN senders do (so a "
                  "switch can mark CE); rxe sends Not-ECT unless the traffic class asks",
    "destination QPs": "perftest makes its own QPs (and one for its control channel)",
}
SAME_KEYS = ("ICRC valid", "NAKs")


def table(rxe: dict, ours: dict) -> list[str]:
    lines = ["| field | the kernel's RDMA stack (rxe + perftest) | the testbed's agents "
             "| same | where they differ, why |", "|---|---|---|---|---|"]
    for key in rxe:
        a, b = rxe[key], ours.get(key)
        # of a tally, the kinds seen (the counts follow from the workload)
        same = set(a) == set(b) if isinstance(a, dict) and isinstance(b, dict) else a == b
        ok = "yes" if same else ("both valid" if key == "ICRC valid" and
                                 _all_valid(a) and _all_valid(b) else "no")
        why = "" if same or ok == "both valid" else WHY.get(key, "")
        lines.append(f"| {key} | {_fmt(a)} | {_fmt(b)} | {ok} | {why} |")
    return lines


def _all_valid(text: str) -> bool:
    got, _, total = str(text).partition(" of ")
    return got == total


def _fmt(v) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k} {n}" for k, n in v.items()) or "none"
    if isinstance(v, list):
        return ", ".join(map(str, v)) or "none"
    return str(v)


def agents_run(out: Path, rate: float, say) -> Path:
    exp = from_toml(None, {"name": "softroce_agents", "workload": "p2p",
                           "pairs": [f"{SENDER}>{RECEIVER}"], "message_bytes": MESSAGE_BYTES,
                           "iterations": MESSAGES, "transport": "roce", "rate": rate,
                           "pcap": [f"{SENDER}-eth0"], "results_dir": str(out),
                           "topology": {"name": "leaf_spine", **TOPOLOGY}})
    folder, metrics = run(exp, progress=lambda m: say(f"  agents: {m}"))
    pcap = folder / "pcaps" / f"{SENDER}-eth0.pcap"
    shutil.copyfile(pcap, out / "agents.pcap")
    return out / "agents.pcap"


@contextlib.contextmanager
def rxe_fabric(rate: float, lab: str, pfc: str | None):
    """The same fabric, built by hand, with rxe devices on the three endpoints used."""
    exp = from_toml(None, {"rate": rate, "topology": {"name": "leaf_spine", **TOPOLOGY},
                           **({"pfc": pfc, **PFC_THRESHOLDS} if pfc else {})})
    topo = rescaled(exp.resolve_topology(), rate)
    for host in (SENDER, SECOND, RECEIVER):
        for peer in topo.graph[host]:
            topo.graph.edges[host, peer]["queue_bytes"] = NIC_QUEUE_BYTES
    fab = Fabric(topo, lab=lab)
    devices: list[Rxe] = []
    with contextlib.ExitStack() as stack:
        fab.start()
        stack.callback(fab.stop)
        ctl = stack.enter_context(controller_running(fab, exp.switch_settings())) if pfc else None
        for node in (SENDER, SECOND, RECEIVER):
            devices.append(Rxe(fab, node))
            stack.callback(devices[-1].close)
        yield fab, {d.node: d for d in devices}, ctl, exp


def qdisc_drops(fab: Fabric) -> dict[str, int]:
    """Every port queue of the fabric that dropped, with its drops: where loss happened."""
    out = {}
    for node in fab.topo.graph.nodes:
        with fab.ipr(node) as ipr:
            names = {link["index"]: link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
            for q in ipr.get_qdiscs():
                drops = q.get_attr("TCA_STATS2").get_attr("TCA_STATS_QUEUE")["drops"]
                if drops:
                    key = f"{names.get(q['index'], q['index'])} {q.get_attr('TCA_KIND')} " \
                          f"{q['handle'] >> 16:x}:"
                    out[key] = drops
    return out


def pfc_frames(pcap: Path) -> int:
    out = sh(["tshark", "-r", str(pcap), *tshark_lua_args(), "-Y", "macc.cbfc.enbv",
              "-T", "fields", "-e", "frame.number"], timeout=120).stdout
    return len(out.split())


def incast(out: Path, rate: float, pfc: str, tclass: int, size: int, iters: int,
           timeout_s: float, say) -> dict:
    """Two rxe writers into one receiver through the spine uplink, pfc off or on."""
    lab = f"rxe{pfc}"
    with rxe_fabric(rate, lab, pfc) as (fab, dev, ctl, exp):
        pcaps = Pcaps(fab, [f"{SENDER}-eth0"], out / f"pcap-{pfc}").start()
        before = {n: d.counters() for n, d in dev.items()}
        backlog0 = softnet_read()
        t0 = time.monotonic()
        flows = perftest(dev[RECEIVER], [dev[SENDER], dev[SECOND]], size, iters, tclass,
                         rate, timeout_s)
        took = time.monotonic() - t0
        backlog = softnet_delta(backlog0, softnet_read())
        after = {n: d.counters() for n, d in dev.items()}
        captured = pcaps.stop()
        dropped_at = qdisc_drops(fab)
    full = ctl.report()      # the controller's process hands its counts over as it stops
    report = full["totals"]
    pcap = out / f"rxe-pfc-{pfc}.pcap"
    shutil.move(captured[0], pcap)
    shutil.rmtree(out / f"pcap-{pfc}", ignore_errors=True)
    delta = {n: {k: after[n][k] - before[n].get(k, 0) for k in after[n]} for n in after}
    say(f"  pfc {pfc}: {[f['gbps'] for f in flows]} Gbit/s, drops {report['drops']}, "
        f"pauses {report['xoff_frames']}")
    to_sender = full["ports"].get(f"leaf0:{fab.plan.port('leaf0', SENDER).ifname}", {})
    return {"pfc": pfc, "flows": flows, "seconds": round(took, 2), "drops": report["drops"],
            "pause_frames_sent": report["xoff_frames"], "paused_s": report["paused_s"],
            "pfc_frames_to_sender": to_sender.get("frames_sent", 0),
            "pfc_frames_at_sender": pfc_frames(pcap), "rxe_counters": delta,
            "reaction_p99_ms": (full.get("reaction_ms") or {}).get("p99"),
            "host_backlog_drops": backlog["backlog_drops"] if backlog else None,
            # the data queues' (htb counts its children's drops again; the kick class
            # drops its frames by design)
            "queue_drops": {k: v for k, v in dropped_at.items()
                            if k.split()[1] in ("tbf", "bfifo")},
            "controller": full,
            "pcap": pcap.name}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "results" / "softroce"))
    add_rate(ap, type=float, default=4.0,
             help="the links' rate, Mbit/s: below what one rxe writer reaches on "
             "this machine, so the fabric, not rxe, is the bottleneck")
    ap.add_argument("--timeout-s", type=float, default=300.0)
    args = ap.parse_args(argv)
    try:
        if not 1 <= args.rate_mbps <= 10_000:
            raise SpecError("--rate", f"{args.rate_mbps:g} is outside 1-10000")
        out = make_folder("--out", Path(args.out))
    except SpecError as exc:
        print(f"softroce_compare: {exc}", file=sys.stderr)
        return 2
    why = rxe_unavailable()
    if why:
        print(f"softroce_compare: unavailable: {why}")
        (out / "softroce.md").write_text(f"# Soft-RoCE beside the agents\n\nunavailable: {why}\n")
        return 3

    def say(text: str) -> None:
        print(text, flush=True)

    failures: list[str] = []
    # the agents' DSCP (the lossless class's), as perftest's traffic class (DSCP << 2)
    tclass = from_toml(None, {"pfc": "on"}).switch_settings().traffic_class.dscp << 2
    say(f"1. the agents: p2p {SENDER} > {RECEIVER}, {MESSAGES} x {MESSAGE_BYTES >> 10} KiB, roce, "
        f"{args.rate_mbps:g} Mbit/s")
    ours_pcap = agents_run(out, args.rate_mbps, say)
    say(f"2. rxe: ib_write_bw {SENDER} > {RECEIVER}, {MESSAGES} x {MESSAGE_BYTES >> 10} KiB, "
        f"traffic class {tclass}")
    with rxe_fabric(args.rate_mbps, "rxe", None) as (fab, dev, _ctl, _exp):
        pcaps = Pcaps(fab, [f"{SENDER}-eth0"], out / "pcap-rxe").start()
        single = perftest(dev[RECEIVER], [dev[SENDER]], MESSAGE_BYTES, MESSAGES, tclass,
                          args.rate_mbps, args.timeout_s)
        captured = pcaps.stop()
    shutil.move(captured[0], out / "rxe.pcap")
    shutil.rmtree(out / "pcap-rxe", ignore_errors=True)
    rxe_ip = dev[SENDER].ip
    rxe_t, ours_t = (traits(decode(out / "rxe.pcap"), rxe_ip),
                     traits(decode(ours_pcap), rxe_ip))
    for name, t in (("rxe", rxe_t), ("agents", ours_t)):
        if not t["data packets"]:
            failures.append(f"{name}: no RoCE data packet captured")
        if not _all_valid(t["ICRC valid"]):
            failures.append(f"{name}: ICRC invalid on some frames ({t['ICRC valid']})")
    if single[0]["rc"] != 0:
        failures.append(f"ib_write_bw exited {single[0]['rc']}: {complaint(single[0]['output'])}")
    say("3. PFC: rxe incast, 2 writers into 1 receiver, the lossless class")
    incasts = [incast(out, args.rate_mbps, mode, tclass, MESSAGE_BYTES, MESSAGES,
                      args.timeout_s, say)
               for mode in ("off", "on")]
    off, on = incasts
    if on["drops"] != 0 or on["queue_drops"]:
        failures.append(f"pfc on: packets dropped ({on['drops']} in the lossless class; "
                        f"port queues {on['queue_drops']})")
    for inc in incasts:
        for f in inc["flows"]:
            if f["rc"] != 0:
                failures.append(f"pfc {inc['pfc']}: ib_write_bw from {f['client']} exited "
                                f"{f['rc']}: {complaint(f['output'])}")

    def resent(inc: dict) -> int:
        return sum(inc["rxe_counters"][n].get("rcvd_seq_err", 0)
                   + inc["rxe_counters"][n].get("completer_retry_err", 0)
                   for n in (SENDER, SECOND))

    def oos(inc: dict) -> int:
        return inc["rxe_counters"][RECEIVER].get("out_of_seq_request", 0)

    share = args.rate_mbps / 2 / 1000
    md = ["# Soft-RoCE beside the agents", "",
          f"Kernel {Path('/proc/sys/kernel/osrelease').read_text().strip()}; fabric "
          f"leaf_spine 2x2, 1 spine, {args.rate_mbps:g} Mbit/s links; captures at "
          f"{SENDER}-eth0 (agents.pcap, rxe.pcap, rxe-pfc-off.pcap, rxe-pfc-on.pcap).", "",
          "## One flow, field by field", "", *table(rxe_t, ours_t), "",
          f"ib_write_bw {SENDER} > {RECEIVER}: {single[0]['gbps']} Gbit/s "
          f"(the link: {args.rate_mbps / 1000:g}).", "",
          "## What PFC does to the kernel's RDMA stack", "",
          f"Two ib_write_bw writers ({SENDER}, {SECOND}) into {RECEIVER} through the spine, "
          f"traffic class {tclass} (the lossless DSCP {tclass >> 2}).", "",
          "Expected (IEEE 802.1Qbb; IBTA 9.7.5 go-back-N): pfc on, no drop in the class, so "
          "no out-of-sequence packet at the receiver and no NAK, each writer near "
          f"half the link ({share:g} Gbit/s); pfc off, the 2:1 queue overflows, the "
          "receiver sees PSN gaps and NAKs them, the writers go back N.", "",
          "| | pfc off | pfc on |", "|---|---|---|"]
    rows = [("writers, Gbit/s", lambda i: ", ".join(str(f["gbps"]) for f in i["flows"])),
            ("seconds for both", lambda i: i["seconds"]),
            ("dropped in the lossless queues (controller)", lambda i: i["drops"]),
            ("port queues that dropped (tc)", lambda i: ", ".join(
                f"{k} {v}" for k, v in i["queue_drops"].items()) or "none"),
            ("dropped at the hosts' input backlogs (softnet)",
             lambda i: i["host_backlog_drops"]),
            ("pauses (XOFF frames) to the writers (controller)",
             lambda i: i["pause_frames_sent"]),
            (f"PFC frames to {SENDER}: sent by leaf0 (controller) / decoded at {SENDER} "
             "(tshark)", lambda i: f"{i['pfc_frames_to_sender']} / "
                                   f"{i['pfc_frames_at_sender']}"),
            ("the controller's reaction, p99 ms", lambda i: i["reaction_p99_ms"]),
            ("ports held paused, s (summed)", lambda i: i["paused_s"]),
            ("receiver: out-of-sequence packets (rxe)", oos),
            ("writers: NAKs and timeouts that made them go back N (rxe)", resent)]
    md += [f"| {name} | {f(off)} | {f(on)} |" for name, f in rows]
    # PFC's promise is no loss: nothing dropped, no PSN gap at the receiver. A resend with
    # nothing lost is a timeout: a pause held a window at the sender past the QP's timeout
    # (more likely the busier the machine: the controller reacts later, pauses last longer)
    agree = on["drops"] == 0 and not on["queue_drops"] and oos(on) == 0
    def mean_mbps(inc: dict) -> float | None:
        got = [f["gbps"] for f in inc["flows"] if f["gbps"] is not None]
        return 1000 * sum(got) / len(got) if got else None

    off_mbps, on_mbps = mean_mbps(off), mean_mbps(on)
    md += ["", ("PFC on: no drop, no out-of-sequence packet: agrees with 802.1Qbb"
                if agree else "PFC on: the kernel's RDMA stack saw loss: DISAGREES with "
                "802.1Qbb") + f" ({on['pause_frames_sent']} pauses"
           + (f"; {resent(on)} retransmission timeouts with nothing lost: a pause held a "
              "window past the QP's timeout" if resent(on) else "")
           + ("; no pause was needed: the writers did not fill the uplink, and PFC was not "
              "exercised in this run" if not on["pause_frames_sent"] else "") + ").",
           f"PFC off: {sum(off['queue_drops'].values())} drops at the congested port, "
           f"{oos(off)} out-of-sequence packets at the receiver, {resent(off)} go-back-N "
           "events at the writers"
           + (": agrees (loss makes rxe go back N)." if off["queue_drops"] and resent(off)
              else ".")]
    if off_mbps and on_mbps:
        md.append(f"Each writer's mean rate: {off_mbps:.2f} Mbit/s with PFC off, "
                  f"{on_mbps:.2f} with it on ({on_mbps / off_mbps:.1f}x; the fair share is "
                  f"{args.rate_mbps / 2:g}): go-back-N resends whole windows, and a lost "
                  "message tail waits out the QP's retransmission timeout "
                  f"({4.096e-6 * 2 ** qp_timeout(args.rate_mbps):.2f} s here).")
    if not agree:
        failures.append("pfc on: rxe saw loss (drops or out-of-sequence packets)")
    if failures:
        md += ["", "## FAILED", ""] + [f"- {f}" for f in failures]
    (out / "softroce.md").write_text("\n".join(md) + "\n")
    (out / "softroce.json").write_text(json.dumps(
        {"rxe": rxe_t, "agents": ours_t, "single": single, "incast": incasts,
         "failures": failures}, indent=1) + "\n")
    print("\n".join(md))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
