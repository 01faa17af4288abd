"""Request/response (workload rpc): clients ask servers, servers answer; the retrieval
traffic of a cluster without GPUs (storage and compute nodes east-west).

    [rpc] table ─▶ RpcSettings ─▶ plan_rpcs ─▶ rpc_schedule ─▶ the agents' steps:
      closed loop (rate 0): each client keeps `concurrency` requests in flight, each
        chain's next request waiting for the previous response (a step that sends the
        request and receives the response);
      open loop (rate > 0): each client sends at Poisson instants (a chain of computed
        gaps, as traffic.open_loop's flows), each response its own step;
      a server receives each request (a step waiting for nothing) and then sends its
        response (a step waiting for that one)

The last `servers` ranks serve (half the ranks when 0), the others are clients; each
request goes to a server drawn uniformly (seeded). A response is `response_bytes`, or
drawn from a flow-size distribution (traffic.flow_sizes) when `response_sizes` names
one. An RPC's latency is its client's view: from the request's first packet to the
response's last (testbed.flow_run). Pure data.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from topologies.settings import setting
from topologies.spec import SpecError
from traffic.flow_sizes import FlowSizes
from traffic.flow_sizes import load as load_sizes
from traffic.workloads import Schedule, Step, Transfer

TAG = "rpc"                  # rpc.<client>.<k>.req / .resp
MAX_RPCS = 10_000            # per iteration: two flows and three steps each


@dataclass
class RpcSettings:
    """Request/response: clients ask servers (workload rpc; the [rpc] table,
    docs/flows.md)"""

    rpc_request_bytes: int = setting(512, "a request's size", whole=True, low=1,
                                     high=1 << 30, metavar="BYTES")
    rpc_response_bytes: int = setting(16384, "a response's size (unless rpc_response_sizes "
                                      "draws them)", whole=True, low=1, high=1 << 30,
                                      metavar="BYTES")
    rpc_response_sizes: str = setting(
        "", "draw each response's size from a distribution (a shipped name or a CDF "
        "file, as flow_sizes; empty: rpc_response_bytes)", metavar="NAME|FILE")
    rpc_servers: int = setting(0, "ranks that serve, the last ones (0: half the ranks)",
                               whole=True, low=0, metavar="N")
    rpc_concurrency: int = setting(1, "closed loop: requests each client keeps in flight",
                                   whole=True, low=1, high=64, metavar="N")
    rpc_rate: float = setting(0.0, "open loop: requests per second (emulated time) each "
                              "client starts at Poisson instants (0: closed loop)",
                              number=True, low=0, metavar="PER_S")
    rpc_count: int = setting(50, "requests per client in each iteration", whole=True,
                             low=1, high=MAX_RPCS, metavar="N")

    def check_rpc(self, ranks: int) -> FlowSizes | None:
        """The response distribution (None: a fixed size), or SpecError naming the
        setting."""
        servers = self.rpc_servers or ranks // 2
        if not 1 <= servers < ranks:
            raise SpecError("rpc.rpc_servers", f"{servers} servers of {ranks} ranks: at least "
                            "one server and one client")
        if (ranks - servers) * self.rpc_count > MAX_RPCS:
            raise SpecError("rpc.rpc_count", f"{ranks - servers} clients x {self.rpc_count} "
                            f"requests is more than {MAX_RPCS} RPCs in an iteration")
        if not self.rpc_response_sizes:
            return None
        return load_sizes(self.rpc_response_sizes, "rpc.rpc_response_sizes")


@dataclass(frozen=True)
class PlannedRpc:
    client: str
    server: str
    k: int                    # the client's k-th request
    request_bytes: int
    response_bytes: int
    chain: int                # closed loop: its chain (k mod concurrency)
    arrival_ns: int | None    # open loop: its instant after the iteration's start

    @property
    def tag(self) -> str:
        return f"{TAG}.{self.client}.{self.k}"


def plan_rpcs(ranks: list[str], s: RpcSettings, responses: FlowSizes | None,
              seed: int) -> list[PlannedRpc]:
    """Every client's requests, in order."""
    rng = random.Random(seed)
    n_servers = s.rpc_servers or len(ranks) // 2
    servers, clients = ranks[-n_servers:], ranks[:-n_servers]
    out = []
    for c in clients:
        t = 0.0
        for k in range(s.rpc_count):
            if s.rpc_rate > 0:
                t += rng.expovariate(s.rpc_rate)
            size = responses.sample(rng) if responses else s.rpc_response_bytes
            out.append(PlannedRpc(c, rng.choice(servers), k, s.rpc_request_bytes, size,
                                  k % s.rpc_concurrency,
                                  round(t * 1e9) if s.rpc_rate > 0 else None))
    return out


def rpc_schedule(rpcs: list[PlannedRpc], ranks: list[str]) -> Schedule:
    """The clients' and servers' steps (module docstring)."""
    sched: Schedule = {r: [] for r in ranks}
    chain_last: dict[tuple[str, int], int] = {}   # closed: (client, chain) -> its last step
    gap_last: dict[str, tuple[int, int]] = {}     # open: client -> (its last step, instant)
    for r in rpcs:
        req = Transfer(r.client, r.server, r.request_bytes, f"{r.tag}.req")
        resp = Transfer(r.server, r.client, r.response_bytes, f"{r.tag}.resp")
        mine = sched[r.client]
        if r.arrival_ns is None:                  # closed loop: send, wait for the answer
            prev = chain_last.get((r.client, r.chain))
            mine.append(Step(sends=[req], recvs=[resp],
                             after=(prev,) if prev is not None else (), label=TAG))
            chain_last[r.client, r.chain] = len(mine) - 1
        else:                                      # open loop: send at its instant
            prev, since = gap_last.get(r.client, (None, 0))
            mine.append(Step(sends=[req], after=(prev,) if prev is not None else (),
                             compute_ns=max(1, r.arrival_ns - since), label=TAG))
            gap_last[r.client] = (len(mine) - 1, r.arrival_ns)
            mine.append(Step(recvs=[resp], after=(), label=TAG))
        serve = sched[r.server]
        serve.append(Step(recvs=[req], after=(), label=TAG))
        serve.append(Step(sends=[resp], after=(len(serve) - 1,), label=TAG))
    return {r: s for r, s in sched.items() if s}
