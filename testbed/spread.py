"""One fabric spread over several machines, driven from an orchestrator over ssh.

    orchestrator: partition (topologies.partition) ─▶ every server reached, same code
        ─▶ each server builds its part (testbed.remote build: its nodes, veth inside,
           one VXLAN port per cut link, made on its underlay and moved into its node)
        ─▶ ping / counters / agents on each, results gathered here ─▶ destroy on each

Each server runs the testbed from its own clone (the same code: its source digest must
be the orchestrator's, `AFT_REMOTE_DIR` where it lives if not at the orchestrator's
path), as root or through passwordless sudo, and keeps its part's namespaces under its
own marks, so `destroy` and `clean` on one server touch nothing of another. A cut link
is VXLAN between the two servers' addresses as ssh reaches them (`ssh -G`: HostName),
VNI = its place among the cut links + 1. Agents start together: each server's clock is
measured against the orchestrator's (clock_offset) and the start instant sent in its
own clock.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import socket
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from fabric.addressing import AddressPlan, plan
from fabric.cluster import ServerError, Ssh, reach
from fabric.routing import Routes, compute_routes
from testbed.features import SAMPLERS
from testbed.remote import REPO_ROOT, VERBS, source_digest
from topologies.partition import Partition, partition
from topologies.spec import Topology

# The command a server runs: its clone's directory is the first line of its standard
# input, the verb one of testbed.remote's (a fixed word of this module, never input).
REMOTE = ("read -r d; cd \"$d\" 2>/dev/null || {{ echo \"no testbed at $d on $(hostname)\" "
          ">&2; exit 3; }}; [ -x .venv/bin/python ] || {{ echo \"no .venv in $d on "
          "$(hostname): run scripts/setup.sh there\" >&2; exit 3; }}; "
          "if [ \"$(id -u)\" = 0 ]; then exec .venv/bin/python -m testbed.remote {verb}; "
          "else exec sudo -n .venv/bin/python -m testbed.remote {verb}; fi")
BUILD_TIMEOUT_S = 900
CLOCK_SAMPLES = 16
READY_TIMEOUT_S = 120


def remote_dir() -> str:
    """Where each server's clone of the testbed is: AFT_REMOTE_DIR, else this one's path."""
    return os.environ.get("AFT_REMOTE_DIR") or str(REPO_ROOT)


def address_of(ssh: Ssh) -> str:
    """The server's IPv4 address as ssh reaches it (its underlay address)."""
    host = ssh.hostname()
    try:
        return socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0]
    except socket.gaierror as exc:
        raise ServerError(f"server {ssh.server}: {host} has no IPv4 address ({exc})") from None


def call(ssh: Ssh, verb: str, request: dict | None = None, timeout_s: float = 120) -> dict:
    """testbed.remote `verb` on the server; its JSON answer (ServerError, one line)."""
    assert verb in VERBS
    try:
        out = ssh.run(REMOTE.format(verb=verb), timeout_s=timeout_s,
                      stdin=remote_dir() + "\n" + json.dumps(request or {}) + "\n")
    except subprocess.TimeoutExpired:
        raise ServerError(f"server {ssh.server}: {verb} took over {timeout_s:g} s") from None
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        why = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
        raise ServerError(f"server {ssh.server}: {why}")
    return json.loads(lines[-1])


def clock_offset(ssh: Ssh, samples: int = CLOCK_SAMPLES) -> tuple[int, int]:
    """(offset, uncertainty) in ns of the server's monotonic clock against ours: its
    reading minus ours at the midpoint of the exchange with the shortest round trip, and
    half that round trip (NTP's estimate; chrony or PTP make it small on real machines)."""
    proc = ssh.popen(REMOTE.format(verb="clock"), stdin=subprocess.PIPE,
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    best: tuple[int, int] | None = None
    try:
        proc.stdin.write(remote_dir() + "\n{}\n")
        for _ in range(samples):
            t0 = time.monotonic_ns()
            proc.stdin.write("t\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
            t1 = time.monotonic_ns()
            if not line.strip().isdigit():
                raise ServerError(f"server {ssh.server}: clock: "
                                  f"{proc.stderr.read().strip() or 'no reading'}")
            if best is None or t1 - t0 < 2 * best[1]:     # the shortest round trip yet
                best = (int(line) - (t0 + t1) // 2, (t1 - t0) // 2)
    finally:
        with contextlib.suppress(OSError):
            proc.stdin.close()
        proc.wait(timeout=10)
    return best


class SpreadFabric:
    """`topo` placed on `servers` (a partition), built and driven over ssh. Use as a
    context manager, or connect()/start()/stop()."""

    def __init__(self, topo: Topology, servers: list[str], *, ssh_config: str | None = None,
                 via_netns: str | None = None, lab: str = "", seed: int = 1, progress=None,
                 placement: Partition | None = None):
        self.topo = topo
        self.lab = lab
        self.seed = seed
        self.servers = list(servers)
        self.placement = placement or partition(topo, self.servers, seed=seed)
        self.plan: AddressPlan = plan(topo)
        self.routes: Routes = compute_routes(topo)
        self.conns = {s: Ssh(s, ssh_config, via_netns) for s in self.servers}
        self.addresses: dict[str, str] = {}
        self.built: dict[str, dict] = {}
        self.timings: dict[str, float] = {}
        self.last_run: dict[str, dict] = {}
        self._progress = progress or (lambda msg: None)

    # -- where things are ----------------------------------------------------------------
    def server_of(self, node: str) -> str:
        return self.placement.placement[node]

    def cut_links(self) -> list[tuple[str, str, int]]:
        """(a, b, VNI) of each link between two servers."""
        return [(c.a, c.b, i + 1) for i, c in enumerate(self.placement.cut)]

    def port_macs(self, node: str) -> dict[str, str]:
        """Port name -> MAC of `node`: the address plan's, which the build sets."""
        return {p.ifname: p.mac for p in self.plan.ports[node]}

    def _each(self, fn) -> dict:
        """fn(server) on every server at once (one thread each); {server: result}."""
        with ThreadPoolExecutor(max_workers=len(self.servers)) as pool:
            futures = {s: pool.submit(fn, s) for s in self.servers}
            return {s: f.result() for s, f in futures.items()}

    # -- lifecycle -----------------------------------------------------------------------
    def __enter__(self) -> SpreadFabric:
        self.connect()
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        self.close()

    def connect(self) -> None:
        """Every server answers, runs this code and holds no fabric of this lab:
        ServerError (one line) before anything is built otherwise (so a failed build
        takes down only what it built)."""
        for s in self.servers:
            reach(self.conns[s])
        mine = source_digest()
        for s, got in self._each(lambda s: call(self.conns[s], "digest",
                                                {"lab": self.lab})).items():
            if got["digest"] != mine:
                raise ServerError(f"server {s}: runs other testbed code at {remote_dir()} "
                                  f"(source digest {got['digest']}, here {mine}): bring its "
                                  "clone to this commit, or set AFT_REMOTE_DIR")
            if got["deployed"]:
                raise ServerError(f"server {s}: a fabric is deployed there already "
                                  f"({got['deployed']} namespaces); remove it with "
                                  f"'testbed destroy --servers {s}' first")
        self.addresses = {s: address_of(self.conns[s]) for s in self.servers}

    def start(self) -> SpreadFabric:
        """Each server builds its part, all at once; on a failure every part comes down."""
        if not self.addresses:
            self.connect()
        data = self.topo.to_data()
        cut = self.cut_links()

        def build(s: str) -> dict:
            here = self.placement.nodes_on(s)
            mine = [[a, b, vni, self.addresses[self.server_of(b if self.server_of(a) == s
                                                              else a)]]
                    for a, b, vni in cut if s in (self.server_of(a), self.server_of(b))]
            self._progress(f"{s}: building {len(here)} nodes, {len(mine)} VXLAN links")
            return call(self.conns[s], "build", {"topology": data, "lab": self.lab,
                                                 "seed": self.seed, "here": here,
                                                 "cut": mine}, BUILD_TIMEOUT_S)

        t0 = time.monotonic()
        try:
            self.built = self._each(build)
        except BaseException:
            self.stop()
            raise
        self.timings["build_s"] = time.monotonic() - t0
        for s, b in self.built.items():
            self._progress(f"{s}: {b['nodes']} nodes, {b['cut']} VXLAN links up "
                           f"in {sum(b['timings_s'].values()):.1f} s")
        return self

    def stop(self) -> dict:
        """Every server's part removed (whatever each holds of this lab); {server: what}."""
        t0 = time.monotonic()
        gone = {}
        for s in self.servers:
            with contextlib.suppress(ServerError, subprocess.SubprocessError, OSError):
                gone[s] = call(self.conns[s], "destroy", {"lab": self.lab})
        self.timings["stop_s"] = time.monotonic() - t0
        self.built = {}
        return gone

    def close(self) -> None:
        for c in self.conns.values():
            c.close()

    # -- what runs on it -------------------------------------------------------------------
    def ping_all(self, sources: list[str] | None = None) -> list[tuple[str, str, bool]]:
        """Every ordered pair of endpoints (from `sources` only, if given): (src, dst,
        answered), each pinged from its server."""
        eps = self.topo.endpoints()
        pairs = [(a, b) for a in sources or eps for b in eps if a != b]

        def on(s: str) -> list[tuple[str, str, bool]]:
            mine = [(a, b) for a, b in pairs if self.server_of(a) == s]
            got = call(self.conns[s], "ping", {"lab": self.lab, "pairs": [
                [a, self.plan.loopback[b]] for a, b in mine]}, 60 + 2 * len(mine))
            return [(a, b, ok) for (a, b), ok in zip(mine, got["ok"], strict=True)]

        return [r for rs in self._each(on).values() for r in rs]

    def counters(self) -> dict[str, dict[str, dict[str, int]]]:
        """node -> port -> {tx_packets, rx_packets, tx_bytes, ...}, from every server."""
        got = self._each(lambda s: call(self.conns[s], "counters", {
            "lab": self.lab, "nodes": self.placement.nodes_on(s)}))
        return {n: ports for per in got.values() for n, ports in per.items()}

    def clock_offsets(self) -> dict[str, dict[str, int]]:
        """server -> {"offset_ns", "uncertainty_ns"} against this machine's clock."""
        return {s: dict(zip(("offset_ns", "uncertainty_ns"), clock_offset(self.conns[s]),
                            strict=True)) for s in self.servers}

    def run_agents(self, schedule, *, processes: int | None = None,
                   start_delay_s: float = 0.5, features: dict | None = None,
                   ranks: list[str] | None = None, **options) -> dict[str, dict]:
        """`schedule` run by agents on their servers, started at one instant (each server's
        in its own clock); {node: results}, as traffic.launch.run_agents gives, their
        stamps on this machine's clock (correct_clocks); each server's clock offset, CPU
        verdict, what its features measured and the files they wrote (bytes) in
        `last_run`. `features`: the run's (testbed.features.run_options; default: the
        samplers), entered on every server over its part. `ranks`: the run's."""
        from traffic.agent_config import AgentOptions
        from traffic.launch import agent_configs
        configs = agent_configs(self, schedule, AgentOptions(**options))
        offsets = self.clock_offsets()
        # every server, ranks or not: one that only forwards is sampled and graded too
        by_server = {s: {n: c for n, c in configs.items() if self.server_of(n) == s}
                     for s in self.servers}
        procs: dict[str, subprocess.Popen] = {}
        errs = {}
        answers: dict[str, dict] = {}
        try:
            for s, cfgs in by_server.items():
                errs[s] = tempfile.TemporaryFile()  # noqa: SIM115 (closed below; a pipe could fill)
                procs[s] = self.conns[s].popen(
                    REMOTE.format(verb="agents"), stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=errs[s], text=True, bufsize=1)
                procs[s].stdin.write(remote_dir() + "\n" + json.dumps(
                    {"lab": self.lab, "configs": cfgs, "processes": processes,
                     "features": SAMPLERS if features is None else features,
                     "ranks": ranks or sorted(configs)}) + "\n")
                procs[s].stdin.flush()
            for s, proc in procs.items():
                _await_line(s, proc, errs[s], "ready", READY_TIMEOUT_S)
            held = sum(1 for c in by_server.values() if c)
            self._progress(f"agents: {len(configs)} ready on {held} of {len(procs)} servers, "
                           "starting them together")
            start = time.monotonic_ns() + int(start_delay_s * 1e9)
            for s, proc in procs.items():
                proc.stdin.write(f"go {start + offsets[s]['offset_ns']}\n")
                proc.stdin.flush()
            longest = max(c.get("timeout_s", 60) for c in configs.values()) + 60
            for s, proc in procs.items():
                _await_line(s, proc, errs[s], "done", longest)
            end = time.monotonic_ns()
            for s, proc in procs.items():
                off = offsets[s]["offset_ns"]
                proc.stdin.write(f"end {start + off} {end + off}\n")
                proc.stdin.flush()
            answers = {s: json.loads(_await_line(s, proc, errs[s], None, 60))
                       for s, proc in procs.items()}
        finally:
            for proc in procs.values():
                with contextlib.suppress(OSError):
                    proc.stdin.close()
                if proc.poll() is None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=30)
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            for f in errs.values():
                f.close()
        results = {n: r for a in answers.values() for n, r in a["agents"].items()}
        on_clock = {n: offsets[self.server_of(n)]["offset_ns"] for n in results}
        correct_clocks(results, configs, on_clock)
        for node, r in results.items():
            r["server"] = self.server_of(node)
        for s, a in answers.items():     # the samplers' start on this machine's clock
            a["features"]["links"]["t0_ns"] -= offsets[s]["offset_ns"]
        self.last_run = {s: {"clock": offsets[s], "fidelity": a["fidelity"],
                             "features": a["features"],
                             "files": {k: base64.b64decode(v) for k, v in a["files"].items()}}
                         for s, a in answers.items()}
        return results


def correct_clocks(results: dict[str, dict], configs: dict[str, dict],
                   offset_ns: dict[str, int]) -> None:
    """Put every agent's stamps on the orchestrator's clock: its absolute times less its
    server's offset, and each one-way latency less the receiver's offset over the
    sender's (zero between two agents of one server)."""
    src_of = {n: {t["tag"]: t["src"] for st in c["steps"] for t in st["recvs"]}
              for n, c in configs.items()}
    for node, r in results.items():
        off = offset_ns[node]
        for item in (*r.get("iterations", []), *r.get("flows", [])):
            for key in ("start_ns", "end_ns"):
                if item.get(key):
                    item[key] -= off
        for key in ("started_ns", "done_ns"):
            if r.get(key):
                r[key] -= off
        for sample in r.get("latency_ns", []):
            src = src_of[node].get(sample[0])
            if src in offset_ns:
                sample[2] -= off - offset_ns[src]


def _await_line(server: str, proc: subprocess.Popen, err, want: str | None,
                timeout_s: float) -> str:
    """The next stdout line of `proc` (that equals `want`, if given); ServerError with its
    last stderr line if it ends first or takes over `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, left))
        if not ready:
            raise ServerError(f"server {server}: no answer in {timeout_s:g} s")
        line = proc.stdout.readline()
        if not line:
            proc.wait()
            err.seek(0)
            said = err.read().decode(errors="replace").strip().splitlines()
            raise ServerError(f"server {server}: " + (said[-1] if said else
                                                      f"ended (exit {proc.returncode})"))
        line = line.strip()
        if want is None or line == want:
            return line


def spread_summary(fab: SpreadFabric) -> dict:
    """What a results folder records of the placement and the servers."""
    return {"servers": fab.servers, "addresses": fab.addresses,
            "nodes": {s: fab.placement.nodes_on(s) for s in fab.servers},
            "cut": [{"a": a, "b": b, "vni": v} for a, b, v in fab.cut_links()],
            "built": fab.built, "timings_s": fab.timings,
            "placement": fab.placement.to_json()}

