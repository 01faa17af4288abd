"""Rail-optimized vs rail-only at a real cluster's size: the specs and their cost cut.

The emulated comparison runs 16 GPUs: there each switch is a whole 51.2 Tb/s box
serving a handful of its 128 ports, so box prices, not the fabric's shape, set the
cost cut; the published cuts of rail-only (Wang et al. 2023) depend on cluster size
and are not for 16 GPUs. This module sizes both fabrics for `gpus` GPUs as a real
cluster is wired: 8 GPUs per server (DGX/HGX H100), one 400 Gb/s NIC per GPU (the
spec default, 100 Mbit/s x 4000), 51.2 Tb/s switches (128 ports of 400 Gb/s: the box
the switch cost and power in link_profiles.toml stand for), rail-optimized
non-blocking in two tiers. It builds the real specs (topologies/builders.py) and
prices them with the same cost_table as the emulated fabric: pure data, nothing is
deployed.

    rail-only       one leaf per rail: servers <= radix
    rail-optimized  leaves_per_rail = ceil(servers / (radix / 2)): half of a leaf's
                    ports down, half up; spines = ceil(gpus / radix); every leaf on
                    every spine with its uplinks split evenly (a bundle per spine)
"""

from __future__ import annotations

import math

from topologies import units
from topologies.builders import rail_only, rail_optimized
from topologies.physics import Profiles, cost_table
from topologies.spec import (
    DEFAULT_RATE_MBPS,
    DEFAULT_SCALE_FACTOR,
    SpecError,
    Topology,
    check_count,
)

SWITCH_GBPS = 51_200.0      # one switch's ports together (Tomahawk 5 / Spectrum-4 class)
GPUS_PER_SERVER = 8         # DGX/HGX H100: 8 GPUs, one 400G ConnectX-7 NIC each
# The largest cluster both builders wire with these switches: 128 servers, each rail
# filling one 128-port switch under rail-only; a bigger rail needs a Clos of its own.
AT_SCALE_GPUS = 1024
GPU_LINK_GBPS = units.real_mbps(DEFAULT_RATE_MBPS, DEFAULT_SCALE_FACTOR) / 1000


def radix(switch_gbps: float = SWITCH_GBPS) -> int:
    """Ports of a `switch_gbps` switch at the GPU link rate (51.2 Tb/s: 128 x 400G)."""
    return int(switch_gbps // GPU_LINK_GBPS)


def rail_fabrics(gpus: int, gpus_per_server: int = GPUS_PER_SERVER,
                 switch_gbps: float = SWITCH_GBPS) -> dict[str, Topology]:
    """Rail-optimized (non-blocking, two tiers) and rail-only specs for `gpus` GPUs
    with switches of `switch_gbps`. SpecError where the builders cannot wire it."""
    check_count("gpus", gpus, 2)
    if gpus % gpus_per_server:
        raise SpecError("gpus", f"{gpus} is not a whole number of {gpus_per_server}-GPU "
                        "servers")
    servers = gpus // gpus_per_server
    ports = radix(switch_gbps)
    if servers > ports:
        raise SpecError("gpus", f"a rail of {servers} GPUs does not fit one {ports}-port "
                        "switch: rail-only would need a Clos per rail, which "
                        "builders.rail_only does not build")
    return {
        "rail_optimized": rail_optimized(
            servers, gpus_per_server, spines=math.ceil(gpus / ports),
            leaves_per_rail=math.ceil(servers / (ports // 2)),
            name=f"rail_optimized_{gpus}"),
        "rail_only": rail_only(servers, gpus_per_server, name=f"rail_only_{gpus}")}


def cut_percent(tables: dict[str, dict], key: str) -> float:
    """How much less `key` (cost_usd, power_w) rail-only has than rail-optimized, %."""
    return 100 * (1 - tables["rail_only"][key] / tables["rail_optimized"][key])


def rail_only_cut(gpus: int, profiles: Profiles, gpus_per_server: int = GPUS_PER_SERVER,
                  switch_gbps: float = SWITCH_GBPS) -> dict:
    """Cost tables of both fabrics at `gpus` GPUs and rail-only's cost and power cut."""
    fabrics = rail_fabrics(gpus, gpus_per_server, switch_gbps)
    tables = {name: cost_table(topo, profiles) for name, topo in fabrics.items()}
    return {"gpus": gpus, "gpus_per_server": gpus_per_server, "switch_gbps": switch_gbps,
            "radix": radix(switch_gbps), "tables": tables,
            "cost_cut_percent": cut_percent(tables, "cost_usd"),
            "power_cut_percent": cut_percent(tables, "power_w")}
