"""One process, one event loop, the agents of one or several endpoints.

    main(CONFIG.json, ...) in an agent process (traffic.launch.host_argv starts one):
    exit 0: every agent ok; 1: not

    configs ─▶ an Agent per config (traffic.agent): its sockets opened inside its node's
        namespace (a socket stays in the namespace it was opened in), its templates built
    ─▶ with `start_from_stdin`: "ready" on stdout, then "go <start_at_ns>" on stdin
    ─▶ the loop: select() over every agent's receive socket and its blocked ports, a
       heap of their wake-up times; the agents with traffic, room or a timer due take their
       turn, until each is done
    ─▶ each agent's results JSON (its `results_path`)

Why several endpoints per process: with one process per endpoint, 16 ranks
on 2 cores are 16 interpreters taking turns on the cores, each waking for its own few
packets; one process per core wakes once for the packets of all its endpoints, and its
code and data stay in one core's caches. traffic.launch picks how many processes
(`processes`); a process's CPU is shared out evenly over its agents in their results,
beside the process's own figures (`host`, with the engine that ran them: traffic.engine).

A round over the agents must not be longer than one agent's turn in a process of its
own, or data waits for every other agent's sends: each agent's budgets per turn
(datagrams read, frames sent) are shared out over the process's agents.

Interrupt moderation is the process's: once awake it serves every endpoint that has
something, then sleeps until `coalesce_ns` (the smallest of its agents') has passed
since it woke, or the earliest agent's timer, so a wake-up serves a batch. How late
those naps and timed wake-ups end is the timer lag of every agent it served meanwhile
(its fidelity pools them with its own).
"""

from __future__ import annotations

import array
import gc
import heapq
import itertools
import json
import select
import signal
import sys
import time
from pathlib import Path

from traffic.agent import PUMP_BATCH, RX_BATCH, Agent
from traffic.agent_config import (
    TERMINATED,
    AgentConfig,
    ConfigError,
    TerminatedError,
    cpu_seconds,
    empty_results,
    wait_for_go,
    write_json,
)
from traffic.engine import engine
from traffic.packets import now_ns

RX_BATCH_MIN, PUMP_BATCH_MIN = 32, 8


class Host:
    """The agents of one process and the loop that serves them."""

    def __init__(self, agents: list[Agent]):
        self.agents = agents
        if len(agents) > 1:             # a round over every agent as short as one
            for a in agents:            # agent's turn was (the module docstring)
                a.rx_batch = max(RX_BATCH_MIN, RX_BATCH // len(agents))
                a.pump_batch = max(PUMP_BATCH_MIN, PUMP_BATCH // len(agents))
        self.errors: dict[str, str | None] = {a.cfg.node: None for a in agents}
        self.wakeups = 0
        self.lags = array.array("q")     # how late its naps and timed wake-ups ended (ns)
        self.cpu_start_s: float | None = None
        self.start_ns = 0
        self.coalesce_ns = min((a.cfg.coalesce_ns for a in agents), default=0)

    def open(self) -> None:
        for a in self.agents:
            a.open()

    def close(self) -> None:
        for a in self.agents:
            a.close()

    def run(self) -> None:
        """Serve every agent until each is done, timed out or failed (its error kept)."""
        start = max(a.cfg.start_at_ns for a in self.agents)
        now = now_ns()
        if start > now:
            time.sleep((start - now) / 1e9)
        now = self.start_ns = now_ns()
        self.cpu_start_s = cpu_seconds()
        for a in self.agents:
            a.begin(now)
        self.loop(list(self.agents))

    def loop(self, live: list[Agent]) -> None:
        self._rfds = [a.rx.fd for a in live]             # select()'s lists, kept as
        self._watched: dict[Agent, dict] = {}            # agents come and go, not built
        self._writers: dict[int, tuple[Agent, object]] = {}   # at every wake-up
        try:
            self._loop(live)
        finally:
            for a in self.agents:        # what the process's wake-ups were while it ran
                if a.host_lags is None:
                    self._retire(a)

    def _retire(self, a: Agent) -> None:
        """`a` is done: its sockets are no longer watched; the process's wake-ups and
        timer lags so far were its own too (traffic.agent.fidelity pools them)."""
        a.wakeups = self.wakeups
        a.host_lags, a.host_lags_end = self.lags, len(self.lags)
        if a.rx.fd in self._rfds:
            self._rfds.remove(a.rx.fd)
        for fd in self._watched.pop(a, ()):
            del self._writers[fd]

    def _watch(self, a: Agent) -> None:
        """Watch for room exactly the sockets of `a` that its port could not send on."""
        want = {s.fileno(): s for s in a.wait_socks}
        have = self._watched.get(a, {})
        for fd in have.keys() - want.keys():
            del self._writers[fd]
        for fd in want.keys() - have.keys():
            self._writers[fd] = (a, want[fd])
        if want:
            self._watched[a] = want
        else:
            self._watched.pop(a, None)

    def _loop(self, live: list[Agent]) -> None:
        """Serve the agents that have something to do: a timer due (a heap of wake-up
        times), a datagram or room on a blocked port (select(2): to the microsecond,
        where poll and epoll round a wait up to whole milliseconds). The Python work
        per wake-up grows with the agents served, not with all of them: a pass over the
        64 agents of a 128-GPU run's process at every wake-up took a fifth of its CPU."""
        clock, errors, sel = now_ns, self.errors, select.select
        coalesce = self.coalesce_ns
        lags = self.lags
        readers = {a.rx.fd: a for a in live}
        rfds, writers = self._rfds, self._writers
        order = itertools.count()
        heap = [(a.wake_ns, next(order), a) for a in live]
        heapq.heapify(heap)
        alive = set(live)
        woke = clock()
        ready: dict[Agent, set] = {}           # agent -> its sockets with room
        while alive:
            now = clock()
            while heap and heap[0][0] <= now:
                due, _, a = heapq.heappop(heap)
                if due == a.wake_ns and a in alive:
                    ready.setdefault(a, set())
            served = list(ready)
            for a in served:
                if ready[a]:
                    a.writable(ready[a], now)
                a.turns += 1
                a.wakeups = self.wakeups
                try:
                    wake = a.turn()
                except TimeoutError as exc:
                    errors[a.cfg.node], wake = str(exc), None
                except Exception as exc:      # reported in its results, not lost
                    errors[a.cfg.node], wake = f"{type(exc).__name__}: {exc}", None
                if wake is None:
                    alive.discard(a)
                    self._retire(a)
                else:
                    a.wake_ns = wake
                    heapq.heappush(heap, (wake, next(order), a))
            if not alive:
                return
            if len(heap) > 4 * len(alive) + 64:       # superseded entries pile up: renew
                heap = [(a.wake_ns, next(order), a) for a in alive]
                heapq.heapify(heap)
            while heap[0][2] not in alive or heap[0][0] != heap[0][2].wake_ns:
                heapq.heappop(heap)                    # superseded wake-up times
            wake = heap[0][0]
            now = clock()
            for a in served:
                if a in alive:
                    a.leave(now)        # what its ports hold waits from now on
                    if a.wait_socks or a in self._watched:
                        self._watch(a)
            timeout = 0.0
            if wake > now:
                if coalesce and woke + coalesce > now:
                    # Interrupt moderation: at most one wake-up per coalesce_ns, so
                    # packets are handled in batches (a wake-up costs ~10-20 us of CPU).
                    nap = min(woke + coalesce, wake) - now
                    if nap > 0:
                        time.sleep(nap / 1e9)
                        after = clock()
                        lags.append(int(after - now - nap))   # how late it ended
                        now = after
                timeout = max(0.0, (wake - now) / 1e9)
            readable, writable, _ = sel(rfds, list(writers), [], timeout)
            woke = clock()
            self.wakeups += 1
            ready = {readers[fd]: set() for fd in readable}
            for fd in writable:
                a, sock = writers[fd]
                ready.setdefault(a, set()).add(sock)
            if timeout > 0 and not readable and not writable:   # a timer's, how late
                lags.append(int(woke - now - timeout * 1e9))

    def busy_fraction(self) -> float | None:
        """The process's CPU over its workload (start to its last agent's workload done,
        lingering left out), a share of one core: near 1, its one thread was the pace."""
        done = [a for a in self.agents if a.done_wall_ns is not None]
        if self.cpu_start_s is None or not done or len(done) < len(self.agents):
            return None
        last = max(done, key=lambda a: a.done_wall_ns)
        wall_s = (last.done_wall_ns - self.start_ns) / 1e9
        return round((last.done_cpu_s - self.cpu_start_s) / wall_s, 4) if wall_s > 0 else None

    def results(self, error: str | None = None) -> dict[str, dict]:
        """Every agent's results; `error` for those that have none of their own. A share
        of the process's CPU each, and the process's figures (`host`)."""
        n = len(self.agents)
        cpu = cpu_seconds()
        run_s = None if self.cpu_start_s is None else cpu - self.cpu_start_s
        host = {"agents": n, "nodes": [a.cfg.node for a in self.agents],
                "cpu_s": round(cpu, 4), "cpu_run_s": None if run_s is None else round(run_s, 4),
                "wakeups": self.wakeups, "busy_fraction": self.busy_fraction(),
                # which code ran the agents: "compiled", "interpreted" or why not compiled
                "engine": engine()}
        out = {}
        for a in self.agents:
            node = a.cfg.node
            res = a.results(self.errors.get(node) or error)
            res.update(cpu_s=cpu / n, cpu_run_s=None if run_s is None else run_s / n,
                       host=host)
            out[node] = res
        return out


def _terminate(signum, frame) -> None:
    raise TerminatedError()


def serve(configs: list[dict]) -> dict[str, dict]:
    """Run the agents of `configs` in this process; {node: results}."""
    cfgs = [AgentConfig.from_dict(c) for c in configs]
    host = Host([Agent(c) for c in cfgs])
    error = None
    try:
        host.open()
        gc.collect()     # before "ready": a full collection takes tens of ms with scapy
        gc.freeze()      # loaded, many agents at once on 2 cores much more
        if any(c.start_from_stdin for c in cfgs):
            start = wait_for_go()
            for c in cfgs:
                c.start_at_ns = start
        host.run()
    except TerminatedError:
        error = TERMINATED
    except Exception as exc:  # opening failed: every agent says so
        error = f"{type(exc).__name__}: {exc}"
    finally:
        results = host.results(error)    # while the sockets exist: their drop counts
        host.close()
    return results


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: traffic.host's main CONFIG.json [CONFIG.json ...] (traffic.launch."
              "host_argv)", file=sys.stderr)
        return 2
    try:
        configs = [json.loads(Path(p).read_text()) for p in argv]
    except (OSError, json.JSONDecodeError) as exc:
        print(f"host: cannot read a config: {exc}", file=sys.stderr)
        return 1
    saved = {sig: signal.signal(sig, _terminate) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        try:
            results = serve(configs)
        except (TerminatedError, ConfigError, ValueError, KeyError, TypeError) as exc:
            why = TERMINATED if isinstance(exc, TerminatedError) else f"config: {exc}"
            results = {c.get("node"): empty_results(c.get("node"), why, c.get("transport"),
                                                    c.get("entropy")) for c in configs}
        for sig in saved:                 # a late signal must not cut the results short
            signal.signal(sig, signal.SIG_IGN)
        for c in configs:
            if c.get("results_path") and c.get("node") in results:
                write_json(c["results_path"], results[c["node"]])
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    failed = [r for r in results.values() if not r["ok"]]
    for r in failed:
        print(f"agent {r['node']}: {r['error']}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
