"""A run's link physics settings (pure data): loss, propagation delay, failures, and what
they become on a topology (topologies.physics; fabric.impair applies them)."""

from __future__ import annotations

from dataclasses import dataclass

from topologies.physics import FailureEvent, Profiles, load_profiles, parse_events, random_failures
from topologies.settings import setting
from topologies.spec import Topology

DELAY_MODES = ("off", "on")      # propagation delay: none, or each link's (netem or
                                 # the agents' delay line, fabric.impair)


@dataclass
class LinkSettings:
    """Link physics: loss, propagation delay, failures (topologies.physics, fabric.impair)"""

    loss_rate: float = setting(0.0, "random loss on fabric links, both directions (a "
                               "fraction)", number=True, low=0, high=1, high_open=True,
                               aliases=("--loss",))
    loss_links: list[str] = setting(factory=list, help='the "a:b" links that lose (default: '
                                    'all)', metavar="A:B")
    delay: str = setting("off", "each link's propagation delay, ~5 ns/m x the scale factor: "
                         "netem where the kernel has it, else the agents' delay line",
                         choices=DELAY_MODES)
    link_profiles: str = setting("", "a TOML file overriding topologies/link_profiles.toml",
                                 metavar="FILE")
    failures: list[dict] = setting(factory=list, help="link failures, a list of tables "
                                   "{link, lane?, at_s, repair_s?}", flag=False)
    failure_horizon_h: float = setting(0.0, "random failures over this many real hours "
                                       "(0: none) ...", number=True, low=0, metavar="H")
    failure_compression: float = setting(1e6, "... played back this many times faster",
                                         number=True, low=0, low_open=True)


def physics_of(settings: LinkSettings, topo: Topology, seed: int
               ) -> tuple[Profiles, list[FailureEvent], list[tuple[str, str]]]:
    """The profiles, the failure events a run plays (timed from the workload's start) and
    the lossy links; testbed.experiment.Experiment.check_against has refused what does
    not fit the topology."""
    profiles = load_profiles(settings.link_profiles or None)
    events = parse_events(settings.failures, topo, profiles)
    if settings.failure_horizon_h:
        events += random_failures(topo, profiles, seed, settings.failure_horizon_h,
                                  settings.failure_compression)
    loss_links = [tuple(text.split(":")) for text in settings.loss_links]
    return profiles, sorted(events), loss_links
