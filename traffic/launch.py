"""Launching agents on a fabric: one config per endpoint, one process per core.

    schedule (workloads) ─▶ agent_configs(fab, schedule, options): ports, MACs, routes
        ─▶ start: traffic.host's main on CONFIG... (host_argv), the endpoints
           dealt round-robin over `processes` processes (default: one per core; a
           number >= the endpoints gives each its own)
        ─▶ every process prints "ready" ─▶ all get "go <start_at_ns>"
        ─▶ wait (timeout), end leftovers ─▶ {node: results}

The ready/go handshake starts every agent at one `time.monotonic_ns()` instant (all
namespaces share the clock) once all of them have their sockets bound (each inside its
endpoint's namespace, whichever process serves it), templates built and their garbage
collected, so no packet reaches an endpoint that is not listening yet. A process's
start-up (Python, scapy, templates) costs ~0.5-1 s of CPU; it is not in the run. A
process runs in the namespace of its first endpoint.

Message ids: every tag of the schedule gets one (1, 2, ... in sorted tag order), the
same at its sender and its receiver; the agents add `iteration * 2**20` on the wire.
Routes: `fab.routes[node][peer]` (the ECMP next hops) become egress interfaces; the
destination MAC of a port is the next hop's port facing it (`addresses_between` gives
the same for one frame's way, for raw senders: traffic.port).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from fabric.routing import path_bottleneck_mbps
from traffic.agent_config import (
    DEFAULT_TIMEOUT_S,
    ITERATION_MSG_STRIDE,
    TERMINATED,
    AgentOptions,
    empty_results,
    linger_ms,
)
from traffic.cc import DcqcnSettings
from traffic.nscc import NsccSettings
from traffic.packets import Addresses, now_ns
from traffic.workloads import Schedule, step_extras

REPO_ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_BASE_S = 30.0
READY_TIMEOUT_PER_AGENT_S = 2.0      # 16 agents importing scapy on 2 cores: ~8 s
READY_TIMEOUT_PER_FLOW_S = 100e-6    # building a flow before "ready": ~20 us measured, x5
# The most flows (a transfer's send at its source, its receive at its destination, every
# iteration) the agents of one run hold: each is built before "ready" (~20 us) and kept
# (~1.5 KB), so a million is ~20 s of start-up and ~1.5 GB
MAX_RUN_FLOWS = 1_000_000
EXIT_GRACE_S = 10.0                  # beyond timeout_s + linger before SIGTERM
TERM_GRACE_S = 3.0                   # SIGTERM, then SIGKILL
# node -> file: that node's agent runs under cProfile (traffic.agent_cprofile) and
# writes its profile there; set by scripts/profile_packet.py, empty otherwise
CPROFILE_AGENTS: dict[str, Path] = {}


# How an agent process starts: traffic.host's main, imported rather than run with `-m`
# (runpy cannot run a compiled module, which has no code object); "traffic.host" stays
# in its command line, where the collectors and tests look for it
HOST_MAIN = "import sys; from traffic.host import main; sys.exit(main())"


def host_argv(configs: list[str], cprofile_out: Path | None = None) -> list[str]:
    """The command of an agent process serving `configs` (under cProfile, writing to
    `cprofile_out`, when given: traffic.agent_cprofile)."""
    if cprofile_out is not None:
        return [sys.executable, "-m", "traffic.agent_cprofile", str(cprofile_out), *configs]
    return [sys.executable, "-c", HOST_MAIN, *configs]


def flow_count(schedule: Schedule, iterations: int) -> int:
    """How many flows the agents build for `schedule` run `iterations` times."""
    return iterations * sum(len(s.sends) + len(s.recvs) for steps in schedule.values()
                            for s in steps)


def assign_msg_ids(schedule: Schedule) -> dict[str, int]:
    """tag -> message id (1-based, in sorted tag order)."""
    tags = sorted({t.tag for steps in schedule.values() for s in steps
                   for t in s.sends + s.recvs})
    if len(tags) >= ITERATION_MSG_STRIDE:
        raise ValueError(f"schedule: {len(tags)} transfers, at most {ITERATION_MSG_STRIDE - 1}")
    return {tag: i + 1 for i, tag in enumerate(tags)}


def _macs(fab, node: str) -> dict[str, str]:
    if hasattr(fab, "port_macs"):     # a fabric on other machines: its address plan's
        return fab.port_macs(node)
    with fab.ipr(node) as ipr:
        return {lk.get_attr("IFLA_IFNAME"): lk.get_attr("IFLA_ADDRESS")
                for lk in ipr.get_links()}


def addresses_between(fab, src: str, dst: str) -> tuple[str, Addresses]:
    """(src's egress port, Addresses) for frames from node src to node dst's loopback.

    The destination MAC is the next hop's port facing src (the first of the ECMP next
    hops if there are several: a raw socket bypasses the sender's routing).
    """
    if dst in fab.topo.graph.adj[src]:
        hop = dst
    else:
        hops = fab.routes[src].get(dst)
        if not hops:
            raise ValueError(f"no route from {src} to {dst}")
        hop = hops[0]
    port = fab.plan.port(src, hop)
    return port.ifname, Addresses(src_mac=_macs(fab, src)[port.ifname],
                                  dst_mac=_macs(fab, hop)[port.peer_ifname],
                                  src_ip=fab.plan.loopback[src],
                                  dst_ip=fab.plan.loopback[dst])


def agent_configs(fab, schedule: Schedule, options: AgentOptions | None = None,
                  results_dir: str | Path = ".",
                  path_delay_ns: dict[tuple[str, str], int] | None = None) -> dict[str, dict]:
    """The config of every endpoint in `schedule` (as traffic.agent reads it).
    `path_delay_ns` {(src, dst): one-way ns} turns on the receivers' delay lines."""
    options = options or AgentOptions()
    msg_ids = assign_msg_ids(schedule)
    macs: dict[str, dict[str, str]] = {}

    def mac(node: str, ifname: str) -> str:
        if node not in macs:
            macs[node] = _macs(fab, node)
        return macs[node][ifname]

    knobs = asdict(options)
    if options.cc == "dcqcn" and not options.dcqcn:   # the paper's, at this fabric's scale
        knobs["dcqcn"] = DcqcnSettings().dcqcn_emulated(fab.topo.scale_factor)
    if options.cc == "nscc" and not options.nscc:     # defaults; no ECN known: delay alone
        knobs["nscc"] = NsccSettings().nscc_emulated(fab.topo.scale_factor)
    graph = fab.topo.graph

    def rate(a: str, b: str) -> float:
        return graph.edges[a, b]["rate_mbps"]

    configs = {}
    for node, steps in schedule.items():
        peers = sorted({t.dst for s in steps for t in s.sends}
                       | {t.src for s in steps for t in s.recvs})
        ports: dict[str, dict[str, str]] = {}
        routes: dict[str, list[str]] = {}
        for peer in peers:
            hops = fab.routes[node].get(peer)
            if not hops:
                raise ValueError(f"no route from {node} to {peer}")
            routes[peer] = []
            for hop in hops:
                port = fab.plan.port(node, hop)
                routes[peer].append(port.ifname)
                ports[port.ifname] = {"src_mac": mac(node, port.ifname),
                                      "dst_mac": mac(hop, port.peer_ifname),
                                      "rate_mbps": fab.topo.graph.edges[node, hop]["rate_mbps"]}
        configs[node] = {
            "node": node, "loopback": fab.plan.loopback[node], **knobs,
            "start_at_ns": 0,
            "ports": ports, "routes": routes,
            "peers": {p: fab.plan.loopback[p] for p in peers},
            "rx_delay_ns": ({p: int(path_delay_ns[p, node]) for p in peers}
                            if path_delay_ns else {}),
            "path_mbps": {p: path_bottleneck_mbps(fab.routes, rate, node, p) for p in peers},
            "steps": [{"sends": [{**asdict(t), "msg_id": msg_ids[t.tag]} for t in s.sends],
                       "recvs": [{**asdict(t), "msg_id": msg_ids[t.tag]} for t in s.recvs],
                       **step_extras(s)} for s in steps],
            "results_path": str(Path(results_dir) / f"agent-{node}.json"),
        }
    return configs


@dataclass
class _Running:
    nodes: list[str]
    proc: subprocess.Popen
    log: Path
    results: dict[str, Path]     # node -> where its agent writes its results
    ready: bool = False

    def results_written(self, node: str) -> bool:
        return self.results[node].exists()

    @property
    def name(self) -> str:
        more = len(self.nodes) - 1
        return f"{self.nodes[0]} (+{more})" if more else self.nodes[0]


# How a run's agents are laid out over processes, as scripts/scale_sweep.py compares
# them: the `processes` for a run of n ranks
AGENT_LAYOUTS = {"per-rank": lambda ranks: ranks,   # one agent process per rank
                 "per-core": lambda ranks: 0}       # one per core (process_count)


def process_count(processes: int | None, agents: int) -> int:
    """How many agent processes: `processes` (None or 0: one per core), at most one per
    agent."""
    return max(1, min(processes or os.cpu_count() or 1, agents))


def deal(nodes: list[str], processes: int) -> list[list[str]]:
    """The nodes dealt round-robin over `processes` processes (neighbours of a ring
    land in different ones, so both cores carry a share of every step)."""
    return [g for g in (nodes[k::processes] for k in range(processes)) if g]


def launch(fab, configs: dict[str, dict], workdir: str | Path, *,
           start_delay_s: float = 0.2, ready_timeout_s: float | None = None,
           progress=None, on_start=None, processes: int | None = None,
           status=None, start_gate=None, helpers: dict[int, str] | None = None
           ) -> dict[str, dict]:
    """Start the agents of `configs` inside their nodes, together; wait; collect.

    `processes`: how many processes serve them (traffic.host; None: one per core).
    `status`: a function whose text the progress lines carry while the agents run.
    `start_gate`: called once every agent is ready, returns the start instant (default:
    now + `start_delay_s`); a server of a fabric on several machines asks its orchestrator.
    Every agent gets `start_from_stdin`; configs and logs are written to `workdir`.
    Returns {node: results}; an agent that left no results gets `empty_results` (ok
    False, the exit code and its process's log tail in "error"). Raises if a process
    exits or hangs before it is ready (a broken config, a port that does not exist), and
    AgentDiedError the moment a process dies while the others run (the rest are ended).
    `helpers`: the run's own processes the agents' work depends on ({pid: what}, e.g.
    the PFC controller; children of this process), watched as the agents are: one that a
    signal kills or that exits with an error while the agents run raises HelperDiedError.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    running: list[_Running] = []
    try:
        paths = {}
        for node, cfg in configs.items():
            cfg = {**cfg, "start_from_stdin": True,
                   "namespace": fab.netns_path(node)}
            path = paths[node] = workdir / f"agent-{node}.config.json"
            path.write_text(json.dumps(cfg, indent=1))
            Path(cfg["results_path"]).parent.mkdir(parents=True, exist_ok=True)
            Path(cfg["results_path"]).unlink(missing_ok=True)
        for nodes in deal(list(configs), process_count(processes, len(configs))):
            log = workdir / f"agent-{nodes[0]}.log"
            profiled = [CPROFILE_AGENTS[n] for n in nodes if n in CPROFILE_AGENTS]
            args = host_argv([str(paths[n]) for n in nodes], *profiled[:1])
            with open(log, "wb") as err:
                proc = fab.popen(nodes[0], args,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                 cwd=str(REPO_ROOT))
            running.append(_Running(nodes, proc, log,
                                    {n: Path(configs[n]["results_path"]) for n in nodes}))
        if ready_timeout_s is None:
            flows = sum(c.get("iterations", 1) * sum(len(s.get("sends", ()))
                                                     + len(s.get("recvs", ()))
                                                     for s in c.get("steps", ()))
                        for c in configs.values())
            ready_timeout_s = (READY_TIMEOUT_BASE_S + READY_TIMEOUT_PER_AGENT_S * len(configs)
                               + READY_TIMEOUT_PER_FLOW_S * flows)
        _wait_ready(running, ready_timeout_s, progress)
        if progress:
            progress(f"agents: {len(configs)} ready, starting them together "
                     f"({len(running)} processes)")
        start_at = start_gate() if start_gate else now_ns() + int(start_delay_s * 1e9)
        start_delay_s = max(0.0, (start_at - now_ns()) / 1e9)
        for r in running:
            with contextlib.suppress(OSError):
                r.proc.stdin.write(f"go {start_at}\n".encode())
                r.proc.stdin.close()
        if on_start:  # e.g. a failure schedule timed from the workload's start
            on_start(start_at)
        longest = max((c.get("timeout_s", DEFAULT_TIMEOUT_S) + _linger_s(c)
                       for c in configs.values()),
                      default=0.0)
        _wait_exit(running, start_delay_s + longest + EXIT_GRACE_S, progress,
                   status=status, helpers=helpers)
    finally:
        _end(running)
    return {n: _results(r, configs[n]) for r in running for n in r.nodes}


def _linger_s(cfg: dict) -> float:
    return linger_ms(cfg.get("linger_ms"), cfg.get("rto_ms", AgentOptions.rto_ms)) / 1000


def _wait_ready(running: list[_Running], timeout_s: float, progress=None,
                every_s: float = 5.0) -> None:
    """Wait for every process's "ready" (its agents' sockets bound, templates built),
    saying every `every_s` how many are."""
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    next_report = t0 + every_s
    agents = sum(len(r.nodes) for r in running)
    waiting = {r.proc.stdout.fileno(): r for r in running}
    buffers = {fd: b"" for fd in waiting}
    poller = select.poll()      # not select(): a big fabric's run holds fds past 1024
    for fd in waiting:
        poller.register(fd, select.POLLIN)
    while waiting:
        left = deadline - time.monotonic()
        if left <= 0:
            names = ", ".join(r.name for r in waiting.values())
            raise TimeoutError(f"agents not ready after {timeout_s:g} s: {names}")
        if progress and time.monotonic() >= next_report:
            next_report += every_s
            progress(f"agent processes: {len(running) - len(waiting)}/{len(running)} ready "
                     f"({agents} agents opening sockets and building templates), "
                     f"{time.monotonic() - t0:.0f} s")
        for fd, _ in poller.poll(min(left, 1.0) * 1000):
            if fd not in waiting:
                continue
            chunk = os.read(fd, 4096)
            buffers[fd] += chunk
            if b"ready\n" in buffers[fd]:
                waiting.pop(fd).ready = True
                poller.unregister(fd)
            elif not chunk:       # exited before it was ready: its log says why
                r = waiting.pop(fd)
                raise RuntimeError(f"agent {r.name} exited before it was ready: "
                                   f"{_tail(r.log)}")


class AgentDiedError(RuntimeError):
    """An agent process ended before the others, killed by a signal or without its
    results: the rest cannot finish without it, so the run stops at once."""


class HelperDiedError(RuntimeError):
    """A helper process of the run (launch's `helpers`) died while the agents ran: what
    it does for them (pauses, failures, captures) stopped, so the run stops at once."""


def _wait_exit(running: list[_Running], timeout_s: float, progress=None,
               every_s: float = 2.0, status=None, helpers: dict[int, str] | None = None
               ) -> None:
    """Wait for every agent process to exit (or the deadline), saying every `every_s` how
    many are done (and `status()`, when given, e.g. the bytes delivered so far). Each
    process is watched through a pidfd, so a death is seen the moment it happens: one
    killed by a signal, or gone without its results, raises AgentDiedError; a helper
    (launch's `helpers`) that dies so, HelperDiedError."""
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    pidfds = {os.pidfd_open(r.proc.pid): r for r in running if r.proc.poll() is None}
    watched = {}
    for pid, what in (helpers or {}).items():
        try:
            watched[os.pidfd_open(pid)] = (pid, what)
        except ProcessLookupError:
            raise HelperDiedError(f"{what} (pid {pid}) died before the agents "
                                  "started") from None
    poller = select.poll()
    for fd in [*pidfds, *watched]:
        poller.register(fd, select.POLLIN)
    try:
        next_report = t0 + every_s
        while pidfds and time.monotonic() < deadline:
            wait_s = max(0.0, min(deadline, next_report) - time.monotonic())
            for fd, _ in poller.poll(wait_s * 1000):
                if fd in watched:
                    poller.unregister(fd)
                    _check_helper(fd, *watched[fd])     # an exit 0: its work is done
                    continue
                r = pidfds.pop(fd)
                poller.unregister(fd)
                os.close(fd)
                r.proc.wait()
                _check_exit(r, alive=len(pidfds))
            if progress and pidfds and time.monotonic() >= next_report:
                next_report += every_s
                done = len(running) - len(pidfds)
                extra = status() if status else ""
                progress(f"agent processes: {done}/{len(running)} finished, "
                         f"{time.monotonic() - t0:.0f} s since start"
                         + (f"; {extra}" if extra else ""))
    finally:
        for fd in [*pidfds, *watched]:
            os.close(fd)


def _check_helper(pidfd: int, pid: int, what: str) -> None:
    """Raise HelperDiedError for a helper that ended other than with exit code 0; it is
    left unreaped (WNOWAIT) for its owner to collect."""
    try:
        got = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOWAIT | os.WNOHANG)
    except ChildProcessError:       # not ours to ask, or already collected
        got = None
    if got is None:
        raise HelperDiedError(f"{what} (pid {pid}) died")
    if got.si_code == os.CLD_EXITED:
        if got.si_status:
            raise HelperDiedError(f"{what} (pid {pid}) died: exited with code "
                                  f"{got.si_status}")
        return
    raise HelperDiedError(f"{what} (pid {pid}) died: killed by {_signal_name(got.si_status)}")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _check_exit(r: _Running, alive: int) -> None:
    """Raise AgentDiedError, while others still run, for a process that a signal
    killed, that ended with an error code and no results, or whose agents a signal from
    outside stopped (the run's own SIGTERMs come after this wait)."""
    code = r.proc.returncode
    if code < 0:
        sig = _signal_name(-code)
        raise AgentDiedError(f"agent process {r.proc.pid} ({r.name}) was killed by {sig}"
                             + (f"; {_tail(r.log)}" if _tail(r.log) else ""))
    if code == 0 or not alive:
        return
    missing = [n for n in r.nodes if not r.results_written(n)]
    if missing:
        raise AgentDiedError(f"agent process {r.proc.pid} ({r.name}) exited with code "
                             f"{code} and no results for {', '.join(missing)}: "
                             f"{_tail(r.log)}")
    if any(_read_results(r.results[n]).get("error") == TERMINATED for n in r.nodes):
        raise AgentDiedError(f"agent process {r.proc.pid} ({r.name}) was stopped by a "
                             "signal from outside the run (its agents say terminated)")


def _read_results(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _end(running: list[_Running]) -> None:
    """SIGTERM what still runs (agents then write their results), SIGKILL after a grace."""
    for r in running:
        if r.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                r.proc.terminate()
    deadline = time.monotonic() + TERM_GRACE_S
    for r in running:
        try:
            r.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            r.proc.kill()
            r.proc.wait(timeout=10)
        for stream in (r.proc.stdin, r.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


def _tail(log: Path, lines: int = 5) -> str:
    try:
        return " | ".join(log.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def _results(r: _Running, cfg: dict) -> dict:
    try:
        return json.loads(Path(cfg["results_path"]).read_text())
    except (OSError, json.JSONDecodeError):
        return {**empty_results(cfg["node"], f"agent exited with code {r.proc.returncode} and "
                                        f"no results: {_tail(r.log)}",
                                cfg.get("transport"), cfg.get("entropy")), "cpu_s": None}


def run_agents(fab, schedule: Schedule, *, workdir: str | Path | None = None,
               start_delay_s: float = 0.2, ready_timeout_s: float | None = None,
               progress=None, on_start=None,
               path_delay_ns: dict[tuple[str, str], int] | None = None,
               processes: int | None = None, status=None,
               helpers: dict[int, str] | None = None, **options) -> dict[str, dict]:
    """Run `schedule` on `fab`: one agent per endpoint; {node: results}.

    `options` are AgentOptions fields (transport, entropy, iterations, rto_ms, ...);
    `path_delay_ns` is agent_configs', `processes` and `helpers` launch's.
    Configs, logs and results go to `workdir` (default: a temporary directory, removed).
    """
    opts = AgentOptions(**options)
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="aft-agents-") as tmp:
            return run_agents(fab, schedule, workdir=tmp, start_delay_s=start_delay_s,
                              ready_timeout_s=ready_timeout_s, progress=progress,
                              on_start=on_start, path_delay_ns=path_delay_ns,
                              processes=processes, status=status, helpers=helpers,
                              **options)
    configs = agent_configs(fab, schedule, opts, workdir, path_delay_ns)
    return launch(fab, configs, workdir, start_delay_s=start_delay_s,
                  ready_timeout_s=ready_timeout_s, progress=progress, on_start=on_start,
                  processes=processes, status=status, helpers=helpers)
