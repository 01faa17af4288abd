"""What a server of a fabric spread over several machines does, on its orchestrator's
request (testbed.spread): `python -m testbed.remote VERB`, started over ssh in the server's
clone of the testbed, reads one JSON request line on standard input and prints its JSON
answer as the last line of standard output; progress and errors go to standard error.

    digest     the testbed code this server runs (the orchestrator refuses a mismatch),
               and whether a fabric of the lab is deployed there already
    build      its part of the fabric: its nodes, the veth links between them, and a VXLAN
               port for each link to another server (fabric.core, fabric.vxlan); the
               namespaces stay when it returns, as `testbed deploy` leaves them
    destroy    that part removed (the lab's namespaces and processes, staging ports)
    clean      everything of the testbed on this server (`testbed clean`, here only)
    clock      its clock read once per input line (the orchestrator's offset probe)
    ping       from its endpoints to addresses of the fabric, in parallel
    counters   packets and bytes per port of its nodes
    agents     its ranks' agents started ("ready"), released at the instant the
               orchestrator sends ("go <ns on this server's clock>"), with the run's
               features (testbed.features) over its part; results returned

Nothing here takes a command line from the request: node names become namespace names
(fabric.netns) and addresses are checked as IPv4 addresses before ping sees them.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import ipaddress
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pyroute2 import IPRoute

from fabric import netns

REPO_ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIRS = ("fabric", "testbed", "traffic", "topologies")
SOURCE_SUFFIXES = (".py", ".pxd", ".bpf.c", ".h", ".toml", ".cdf")
VERBS = ("digest", "build", "destroy", "clean", "clock", "ping", "counters", "agents")


def source_digest(root: Path = REPO_ROOT) -> str:
    """sha256 over the testbed's sources (relative paths and contents): Python, Cython
    declarations, eBPF programs, topology files, flow-size CDFs; Cython's generated C
    follows from them."""
    h = hashlib.sha256()
    for d in SOURCE_DIRS:
        for path in sorted((root / d).rglob("*")):
            if path.is_file() and path.name.endswith(SOURCE_SUFFIXES):
                h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Deployed:
    """A part of a fabric deployed on this server, by lab: what launch(), the samplers and
    ping need (its nodes, `here`, from the lab's record)."""

    def __init__(self, lab: str):
        from fabric.state import read_state
        self.lab = lab
        record = read_state(lab) or {}
        names = set(record.get("namespaces", []))
        self.here = sorted(n[len(self.ns("")):] for n in names if n.startswith(self.ns("")))
        self.record = record

    def whole(self) -> Deployed:
        """With the whole fabric's topology, addresses and routes (the PFC controller's
        and the captures' view of its part), from the lab's record."""
        if hasattr(self, "routes"):
            return self
        from fabric.addressing import plan
        from fabric.routing import compute_routes
        from topologies.spec import Topology
        self.topo = Topology.from_data(self.record["topology"])
        self.plan = plan(self.topo)
        self.routes = compute_routes(self.topo)
        return self

    def ipr(self, node: str):
        return netns.iproute(self.ns(node))

    def route_entries(self, node: str) -> list[tuple[str, tuple[str, ...]]]:
        """The routes `node` holds, as the fabric that built it installed them (a link
        back up after a failure gets them again: fabric.impair)."""
        from fabric.core import Fabric
        return Fabric.route_entries(self.whole(), node)

    def ns(self, node: str) -> str:
        return netns.name_of(node, self.lab)

    def netns_path(self, node: str) -> str:
        path = netns.RUN_DIR / self.ns(node)
        if not path.exists():
            raise ValueError(f"node {node} is not deployed on this server")
        return str(path)

    def popen(self, node: str, args: list[str], **kwargs) -> subprocess.Popen:
        from fabric.state import MARKER_ENV
        kwargs.setdefault("env", {**os.environ, MARKER_ENV: self.ns(node)})
        self.netns_path(node)
        with netns.entered(self.ns(node)):     # the child is forked inside it
            return subprocess.Popen(args, **kwargs)


def deployed(lab: str) -> int:
    """How many namespaces of `lab` the testbed holds on this server (0: free to build)."""
    return len(netns.ours(lab))


def underlay_toward(remote: str) -> tuple[int, str, int]:
    """(interface index, local address, MTU) of this server's route toward `remote`."""
    with IPRoute() as ipr:
        (route,) = ipr.route("get", dst=str(ipaddress.IPv4Address(remote)))
        index = route.get_attr("RTA_OIF")
        local = route.get_attr("RTA_PREFSRC")
        mtu = ipr.get_links(index)[0].get_attr("IFLA_MTU")
    if not local:
        raise ValueError(f"no local address on the route toward {remote}")
    return index, local, mtu


def build(req: dict) -> dict:
    from fabric.core import Fabric, detach_shells
    from fabric.vxlan import CutEnd
    from topologies.spec import Topology
    topo = Topology.from_data(req["topology"])
    here = set(req["here"])
    ends = []
    for a, b, vni, remote in req["cut"]:
        node, peer = (a, b) if a in here else (b, a)
        index, local, mtu = underlay_toward(remote)
        ends.append(CutEnd(node, peer, vni, local, remote, index, mtu))
    fab = Fabric(topo, seed=req.get("seed", 1), lab=req.get("lab", ""), here=req["here"],
                 cut=ends, progress=_say)
    fab.check_free()
    fab.start()
    detach_shells(fab)
    return {"nodes": len(fab.here), "cut": len(ends), "timings_s": fab.timings,
            "underlay_mtu": sorted({e.underlay_mtu for e in ends}),
            "host": os.uname().nodename}


def _remove_staging() -> list[str]:
    """Cut ports left here between creation and their move (a build killed right then)."""
    from fabric.vxlan import STAGING_PREFIX
    gone = []
    with IPRoute() as ipr:
        for link in ipr.get_links():
            name = link.get_attr("IFLA_IFNAME")
            info = link.get_attr("IFLA_LINKINFO")
            kind = info.get_attr("IFLA_INFO_KIND") if info else None
            if name.startswith(STAGING_PREFIX) and kind == "vxlan":
                ipr.link("del", index=link["index"])
                gone.append(name)
    return gone


def destroy(req: dict) -> dict:
    from fabric.clean import destroy as destroy_lab
    report = destroy_lab(req.get("lab", ""))
    return {"namespaces": len(report.namespaces), "processes": len(report.processes),
            "staging_ports": len(_remove_staging())}


def clean(req: dict) -> dict:
    from fabric.clean import clean as clean_all
    report = clean_all()
    return {"namespaces": len(report.namespaces), "processes": len(report.processes),
            "staging_ports": len(_remove_staging()), "failed_runs": report.failed_runs}


def ping(req: dict) -> dict:
    """{"lab", "pairs": [[node, address], ...]} -> {"ok": [bool ...], "rtt_ms": [...]}."""
    fab = Deployed(req.get("lab", ""))

    def one(pair) -> tuple[bool, float | None]:
        node, addr = pair[0], str(ipaddress.IPv4Address(pair[1]))
        for _ in range(3):      # a shaped queue may hold a first probe past its wait
            proc = fab.popen(node, ["ping", "-n", "-c", "1", "-W", "2", addr],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            out, _ = proc.communicate(timeout=10)
            if proc.returncode == 0:
                rtt = out.split("time=")[1].split()[0] if "time=" in out else None
                return True, float(rtt) if rtt else None
        return False, None

    with ThreadPoolExecutor(max_workers=8) as pool:
        got = list(pool.map(one, req["pairs"]))
    return {"ok": [g[0] for g in got], "rtt_ms": [g[1] for g in got]}


def counters(req: dict) -> dict:
    fab = Deployed(req.get("lab", ""))
    out = {}
    for node in req["nodes"]:
        with netns.iproute(fab.ns(node)) as ipr:
            out[node] = {}
            for link in ipr.get_links():
                name, stats = link.get_attr("IFLA_IFNAME"), link.get_attr("IFLA_STATS64")
                if name != "lo" and stats:
                    out[node][name] = {k: stats[k] for k in (
                        "tx_packets", "rx_packets", "tx_bytes", "rx_bytes", "tx_dropped",
                        "rx_dropped")}
    return out


def agents(req: dict) -> dict:
    """{"lab", "configs": {node: config}, "processes", "features": {name: options},
    "ranks"} -> {"agents": {node: results}, "features": what each feature measured here,
    "fidelity": this server's verdict, "files": {path: base64} of what the features wrote}.
    Prints "ready" once every agent is and waits for "go <start ns>"; prints "done" when
    they are and waits for "end <from ns> <to ns>", the window its CPU load is graded
    over. The features are `testbed run`'s (testbed.features), entered over this server's
    nodes the same way; a server without ranks (it only forwards) is sampled and graded
    all the same."""
    from testbed.features import Part, entered, grade
    from traffic.launch import launch
    fab = Deployed(req.get("lab", ""))
    with tempfile.TemporaryDirectory(prefix="aft-agents-") as tmp:
        out = Path(tmp) / "out"
        part = Part(fab.whole(), out, _say, ranks=req.get("ranks", []), spread=True)
        with entered(part, req.get("features") or {}) as live:
            configs = {n: {**c, "results_path": str(Path(tmp) / f"agent-{n}.json")}
                       for n, c in req["configs"].items()}
            if part.path_delay_ns:   # the receivers' delay lines (fabric.impair)
                for n, c in configs.items():
                    c["rx_delay_ns"] = {p: int(part.path_delay_ns[p, n]) for p in c["peers"]}
            results = launch(fab, configs, tmp, processes=req.get("processes"),
                             progress=_say, start_gate=_gate, on_start=part.on_start,
                             helpers=part.helpers)
            print("done", flush=True)
            window = _graded_window()
        measured = live.measure(window)
        files = {str(f.relative_to(out)): base64.b64encode(f.read_bytes()).decode()
                 for f in sorted(out.rglob("*")) if f.is_file()}
    return {"agents": results, "features": measured, "fidelity": grade(results, measured),
            "files": files}


def _gate() -> int:
    """Every agent here is ready: say so, and take the start instant (this server's
    clock) from the orchestrator."""
    print("ready", flush=True)
    line = sys.stdin.readline().split()
    if len(line) != 2 or line[0] != "go":
        raise RuntimeError(f"expected 'go <ns>' from the orchestrator, got {line!r}")
    return int(line[1])


def _graded_window() -> tuple[float, float]:
    """The samplers run on until every server is done; the window graded is the
    workload's on all of them, from the agreed start to the last one done."""
    line = sys.stdin.readline().split()
    if len(line) != 3 or line[0] != "end":
        raise RuntimeError(f"expected 'end <from ns> <to ns>', got {line!r}")
    return int(line[1]) / 1e9, int(line[2]) / 1e9


def clock(_req: dict) -> None:
    """One `time.monotonic_ns()` per input line, until the input ends."""
    for _ in sys.stdin:
        print(time.monotonic_ns(), flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] not in VERBS:
        _say(f"usage: python -m testbed.remote {{{','.join(VERBS)}}}")
        return 2
    verb = argv[0]
    req = json.loads(sys.stdin.readline() or "{}")
    if verb == "digest":
        print(json.dumps({"digest": source_digest(), "host": os.uname().nodename,
                          "deployed": deployed(req.get("lab", ""))}))
        return 0
    if verb == "clock":
        clock(req)
        return 0
    try:
        answer = {"build": build, "destroy": destroy, "clean": clean, "ping": ping,
                  "counters": counters, "agents": agents}[verb](req)
    except Exception as exc:   # one line for the orchestrator to show
        _say(f"{verb}: {type(exc).__name__}: {exc}".replace("\n", " ")[:800])
        return 1
    with contextlib.suppress(BrokenPipeError):
        print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
