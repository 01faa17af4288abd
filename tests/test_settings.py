"""Every setting declared once: the [experiment] keys, the `testbed run` flags, the checks,
the agents' options and docs/settings.md all come from the declarations (no root)."""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

import pytest

from testbed.cli import build_parser
from testbed.experiment import FIELD_NAMES, SETTINGS_TYPES, Experiment, from_toml, settings_page
from testbed.run import agent_options
from topologies.settings import DECLARED, declared, default_of, flag_of, own_fields
from topologies.spec import SpecError
from traffic.agent_config import AgentOptions
from traffic.transport_settings import TransportSettings

ROOT = Path(__file__).resolve().parent.parent
# builder parameters, a permission, the output form
NOT_SETTINGS = {"-h", "--help", "--set", "--force", "--format", "--dry-run"}


def run_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["run"]


def test_every_experiment_key_is_declared_once_with_its_help():
    owners: dict[str, list[str]] = {}
    for cls in SETTINGS_TYPES:
        for name in own_fields(cls):
            owners.setdefault(name, []).append(cls.__name__)
    assert set(owners) == FIELD_NAMES
    assert all(len(o) == 1 for o in owners.values()), owners
    for f in fields(Experiment):
        assert DECLARED in f.metadata and f.metadata[DECLARED].help, f.name


def test_run_flags_are_derived_from_the_declarations_and_no_other():
    options = {s for a in run_parser()._actions for s in a.option_strings}
    derived = {s for f, d in declared(Experiment) if d.flag for s in (flag_of(f), *d.aliases)}
    assert options - NOT_SETTINGS == derived
    file_only = {f.name for f, d in declared(Experiment) if not d.flag}
    assert file_only == {"failures"}        # a list of tables has no flag form


def test_each_flag_sets_its_key():
    parser = run_parser()
    for f, decl in declared(Experiment):
        if not decl.flag:
            continue
        default = default_of(f)
        if decl.choices is not None:
            value = [c for c in decl.choices if c not in ("", default)][0]
            text = [str(value)]
        elif isinstance(default, list):
            text, value = ["a>b"], ["a>b"]
        elif decl.whole:
            value = int(default or 0) + 1 if decl.high is None or default + 1 <= decl.high \
                else default - 1
            text = [str(value)]
        elif decl.number:
            value = 0.5 if decl.high is not None and decl.high <= 1 else float(default or 0) + 1
            text = [str(value)]
        elif decl.convert is not None and f.name in ("rate", "byte_scale"):
            text, value = ["auto"], "auto"
        else:
            text, value = ["x"], "x"
        args = parser.parse_args([flag_of(f), *text])
        assert getattr(args, f.name) == value, f.name


@pytest.mark.parametrize("name", sorted(FIELD_NAMES))
def test_a_file_key_takes_its_default_and_refuses_what_its_declaration_refuses(name):
    f = Experiment.__dataclass_fields__[name]
    decl = f.metadata[DECLARED]
    assert getattr(Experiment(**{name: default_of(f)}).validate(), name) == default_of(f)
    bad = []
    if decl.choices is not None:
        bad.append("no-such-choice")
    if decl.whole or decl.number:
        bad.append("7")
        if decl.low is not None:
            bad.append(decl.low - 1)
        if decl.high is not None:
            bad.append(decl.high * 2 + 1)
    for value in bad:
        with pytest.raises(SpecError) as err:
            Experiment(**{name: value}).validate()
        assert err.value.field == f"experiment.{name}", (name, value)


def test_an_unknown_key_is_refused_with_the_allowed_ones():
    with pytest.raises(SpecError, match=r"unknown setting \(did you mean 'ecn_pmax'\?\); "
                       "allowed: .*ecn_pmax"):
        from_toml(None, {"ecn_pmx": 0.5})
    with pytest.raises(SpecError, match="'zzzz' is an unknown setting; allowed: "):
        from_toml(None, {"zzzz": 0.5})          # nothing close: no guess


def test_agents_get_every_transport_setting_the_experiment_has():
    assert set(TransportSettings.__dataclass_fields__) <= set(AgentOptions.__dataclass_fields__)
    changed = {"transport": "uet", "entropy": "spray", "payload_bytes": 1024,
               "window_packets": 9, "ack_every": 3, "rto_ms": 7.0, "flowlet_gap_us": 11.0,
               "coalesce_frames": 1.5, "cc": "nscc", "nic_queues": "destination"}
    assert set(changed) == set(own_fields(TransportSettings))
    options = agent_options(from_toml(None, changed), 4000)
    assert {k: options[k] for k in changed} == changed
    assert AgentOptions(**options).timeout_s == Experiment.timeout_s


def test_features_are_independent_switches():
    """ECN, switch balancing and trimming each bring the counted lossless class, unpaused,
    without PFC; PFC comes only when asked for."""
    for key, value, extra in (("ecn", "on", {}), ("switch_lb", "dlb", {}),
                              ("trimming", "on", {"transport": "uet"})):
        st = from_toml(None, {key: value, **extra}).switch_settings()
        assert st.pfc == "off" and not st.enabled and st.counted_by == [key]
    assert from_toml(None, {}).switch_settings().counted_by == []


def test_settings_page_is_written_from_the_declarations():
    page = (ROOT / "docs" / "settings.md").read_text()
    assert page == settings_page(), "run: .venv/bin/python -m testbed settings > docs/settings.md"
    for name in FIELD_NAMES:
        assert f"| `{name}` |" in page
