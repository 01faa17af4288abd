"""The open-loop workloads' steps for a run (workloads flows and rpc), at the run's link
rates: what testbed.rate prices and testbed.run hands the agents, with what they were
planned from (testbed.flow_run and testbed.rpc_run read the results against it)."""

from __future__ import annotations

from traffic.open_loop import background, open_loop_schedule, plan_flows
from traffic.rpc import plan_rpcs, rpc_schedule
from traffic.workloads import Schedule


def flow_schedule(exp, topo, ranks: list[str],
                  pairs: list[tuple[str, str]] | None) -> tuple[Schedule, dict]:
    """The run's steps at `topo`'s rates and what they were planned from (flows, or
    request/response: rpc_schedule_of)."""
    if exp.workload == "rpc":
        return rpc_schedule_of(exp, topo, ranks)
    sizes = exp.check_flows(exp.pairs)
    host_mbps = {r: topo.nic_rate_mbps(r) for r in ranks}
    planned = plan_flows(ranks, sizes, exp.flow_load, exp.flow_count, exp.flow_destinations,
                         pairs, exp.seed, host_mbps, exp.flow_duration_s)
    extra = background(exp.flow_background, ranks, exp.message_bytes, exp.seed)
    info = {"kind": "flows", "planned": planned, "sizes": sizes, "host_mbps": host_mbps,
            "load": exp.flow_load, "destinations": exp.flow_destinations,
            "background": exp.flow_background, "coalesce_frames": exp.coalesce_frames,
            "payload_bytes": exp.payload_bytes}
    return open_loop_schedule(planned, ranks, extra), info


def rpc_schedule_of(exp, topo, ranks: list[str]) -> tuple[Schedule, dict]:
    """The run's RPC steps and what they were planned from."""
    responses = exp.check_rpc(len(ranks))
    rpcs = plan_rpcs(ranks, exp, responses, exp.seed)
    servers = sorted({r.server for r in rpcs} | set(ranks[-(exp.rpc_servers
                                                            or len(ranks) // 2):]))
    info = {"kind": "rpc", "rpcs": rpcs, "servers": servers,
            "clients": sorted({r.client for r in rpcs}),
            "host_mbps": {r: topo.nic_rate_mbps(r) for r in ranks},
            # a server answers on every link it has (a full mesh's: one per client)
            "server_mbps": {s: sum(d["rate_mbps"] for _, _, d in topo.graph.edges(s, data=True)
                                   if d["tech"] != "nvlink") for s in servers},
            "closed": exp.rpc_rate == 0, "concurrency": exp.rpc_concurrency,
            "rate_per_s": exp.rpc_rate,
            "response": exp.rpc_response_sizes or f"{exp.rpc_response_bytes} B",
            "mean_response_bytes": responses.mean_bytes() if responses
            else float(exp.rpc_response_bytes)}
    return rpc_schedule(rpcs, ranks), info
