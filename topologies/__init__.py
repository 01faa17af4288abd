"""Topology specs (pure data): builders, TOML files, validation. No root needed."""

from topologies.builders import BUILDERS, full_mesh, leaf_spine, one_tier, rail_only, rail_optimized
from topologies.files import build, load_file, resolve
from topologies.spec import SpecError, Topology

__all__ = ["BUILDERS", "SpecError", "Topology", "build", "full_mesh", "leaf_spine",
           "load_file", "one_tier", "rail_only", "rail_optimized", "resolve"]
