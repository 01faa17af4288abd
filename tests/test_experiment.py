"""Experiment settings: files, flags, validation naming the field (no root)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from testbed.experiment import Experiment, from_toml, to_toml
from topologies.spec import SpecError

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("path", sorted((ROOT / "experiments").glob("*.toml")))
def test_shipped_experiments_validate(path):
    exp = from_toml(path)
    topo = exp.resolve_topology()
    assert exp.name == path.stem and len(topo.endpoints()) >= 2


def test_flags_override_the_file_and_config_round_trips(tmp_path):
    exp = from_toml(ROOT / "experiments" / "allreduce_rail.toml",
                    {"transport": "uet", "iterations": 5, "seed": None})
    assert exp.transport == "uet" and exp.iterations == 5 and exp.seed == 1
    topo = exp.resolve_topology()
    written = tmp_path / "config.toml"
    written.write_text(to_toml(exp, topo))
    again = from_toml(written)
    assert again.to_data()["transport"] == "uet"
    assert again.resolve_topology().summary() == topo.summary()
    assert tomllib.loads(written.read_text())["experiment"]["pcap"] == ["leaf0-eth0"]


def test_topology_by_name_flag():
    exp = from_toml(None, {"topology": "full_mesh", "workload": "alltoall"})
    assert exp.resolve_topology().kind == "full_mesh"


@pytest.mark.parametrize(("overrides", "field"), [
    ({"workload": "allscatter"}, "experiment.workload"),
    ({"transport": "tcp"}, "experiment.transport"),
    ({"entropy": "random"}, "experiment.entropy"),
    ({"iterations": 0}, "experiment.iterations"),
    ({"message_bytes": -1}, "experiment.message_bytes"),
    ({"name": "a b"}, "experiment.name"),
    ({"dscp": 64}, "experiment.dscp"),
    ({"payload_bytes": 9000}, "experiment.payload_bytes"),
    ({"colour": "red"}, "experiment.colour"),
    ({"pairs": ["a-b"]}, "experiment.pairs"),
    ({"pairs": ["a>b"], "workload": "allreduce"}, "experiment.pairs"),
    ({"coalesce_frames": -1}, "experiment.coalesce_frames"),
    ({"coalesce_frames": "auto"}, "experiment.coalesce_frames"),
    ({"delay": "netem"}, "experiment.delay"),
    ({"ring_order": "snake"}, "experiment.ring_order"),
])
def test_bad_settings_name_the_field(overrides, field):
    with pytest.raises(SpecError) as err:
        from_toml(None, overrides)
    assert err.value.field == field


def test_bad_files(tmp_path):
    bad = tmp_path / "e.toml"
    bad.write_text("[experiment\n")
    with pytest.raises(SpecError, match="does not parse"):
        from_toml(bad)
    bad.write_text("[experimant]\nname = 'x'\n")
    with pytest.raises(SpecError) as err:
        from_toml(bad)
    assert err.value.field == "experimant"
    bad.write_text("[experiment]\nname = 'x'\n[topology]\nkind = 'ring'\n")
    with pytest.raises(SpecError) as err:
        from_toml(bad).resolve_topology()
    assert err.value.field == "kind"


def test_defaults_are_valid():
    assert Experiment().validate().workload == "allreduce"


def test_a_files_ranks_0_means_every_endpoint_a_flags_is_refused(tmp_path):
    path = tmp_path / "e.toml"
    path.write_text('[experiment]\nranks = 0\n[topology]\nkind = "one_tier"\n')
    assert from_toml(path).ranks == 0
    with pytest.raises(SpecError, match="omit --ranks") as err:
        from_toml(None, {"ranks": 0})
    assert err.value.field == "experiment.ranks"
    with pytest.raises(SpecError, match="fewer than the 2"):
        from_toml(path, {"ranks": 1})


def test_pfc_thresholds_must_fit_the_smallest_queue():
    exp = from_toml(None, {"pfc": "on", "pfc_xoff_bytes": 200_000,
                           "topology": {"kind": "one_tier", "params": {"nodes": 2}}})
    with pytest.raises(SpecError, match="131072 bytes per port") as err:
        exp.check_against(exp.resolve_topology())
    assert err.value.field == "experiment.pfc_xoff_bytes"
    fits = from_toml(None, {"pfc": "on", "pfc_xoff_bytes": 65536,
                            "topology": {"kind": "one_tier", "params": {"nodes": 2}}})
    fits.check_against(fits.resolve_topology())


def test_the_agents_get_every_transport_knob_and_the_run_timeout():
    """Both sides inherit TransportSettings: each of its fields reaches the agents with
    the experiment's value, and the agents' own deadline is the experiment's timeout."""
    from dataclasses import fields

    from testbed.run import agent_options
    from traffic.agent_config import DEFAULT_TIMEOUT_S, AgentOptions
    from traffic.transport_settings import TransportSettings
    exp = from_toml(None, {"transport": "uet", "entropy": "spray", "payload_bytes": 2048,
                           "window_packets": 16, "ack_every": 4, "rto_ms": 70.0,
                           "flowlet_gap_us": 300.0, "coalesce_frames": 0, "cc": "nscc"})
    got = agent_options(exp, 4000.0)
    for f in fields(TransportSettings):
        assert got[f.name] == getattr(exp, f.name), f.name
    assert AgentOptions(**got).transport == "uet"
    assert exp.timeout_s == AgentOptions().timeout_s == DEFAULT_TIMEOUT_S


def test_servers_come_from_the_cluster_table_or_the_flag_and_round_trip(tmp_path):
    path = tmp_path / "spread.toml"
    path.write_text('[experiment]\nworkload = "allreduce"\n'
                    '[cluster]\nservers = ["gpu-a", "gpu-b"]\n')
    exp = from_toml(path)
    assert exp.servers == ["gpu-a", "gpu-b"]
    written = tmp_path / "config.toml"
    written.write_text(to_toml(exp, exp.resolve_topology()))
    data = tomllib.loads(written.read_text())
    assert data["cluster"] == {"servers": ["gpu-a", "gpu-b"]}
    assert "servers" not in data["experiment"]
    assert from_toml(written).servers == ["gpu-a", "gpu-b"]
    # the flag takes host names comma-separated, as doctor and deploy do
    from testbed.cli import build_parser
    args = build_parser().parse_args(["run", "--servers", "a,b"])
    assert args.servers == ["a", "b"]
    # on one machine, nothing goes to [cluster]
    alone = from_toml(None, {"workload": "allreduce"})
    assert "cluster" not in tomllib.loads(to_toml(alone, alone.resolve_topology()))


@pytest.mark.parametrize("text, field", [
    ('[cluster]\nservers = ["a", "a"]\n', "cluster.servers"),
    ('[cluster]\nservers = ["-oProxyCommand=x"]\n', "cluster.servers"),
    ('[cluster]\nservers = "a,b"\n', "cluster.servers"),
    ('[cluster]\nhosts = ["a"]\n', "cluster.hosts"),
    ('[experiment]\nservers = ["a"]\n', "experiment.servers"),
    ('[experiment]\necn = "on"\n[cluster]\nservers = ["a"]\n', "experiment.ecn"),
    ('[experiment]\nswitch_lb = "dlb"\n[cluster]\nservers = ["a"]\n', "experiment.switch_lb"),
])
def test_bad_cluster_settings_name_the_field(tmp_path, text, field):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        from_toml(path)
    assert str(err.value).startswith(field), str(err.value)
