"""The run's features (testbed.features): the hooks every feature must give, the options
that cross to a server, the refusals on several machines, one ExitStack's order, and the
merging of what the servers measured. No root: the root runs are tests/test_run.py,
tests/test_spread.py and the features' own tests."""

from __future__ import annotations

import contextlib
import json
from dataclasses import fields
from pathlib import Path

import pytest

from fabric.lossless import SwitchSettings
from testbed import features
from testbed.experiment import Experiment
from testbed.features import (
    FEATURES,
    HOOKS,
    SAMPLERS,
    Feature,
    Part,
    Run,
    entered,
    features_metrics,
    merged_results,
    run_options,
    summary_lines,
)
from testbed.run_spread import inside
from testbed.switch_summary import spread_pfc_metrics
from topologies.spec import SpecError


@pytest.mark.parametrize("hook", HOOKS)
def test_a_feature_missing_a_hook_is_refused_when_its_class_is_defined(hook):
    body = {h: (lambda self, *a: None) for h in HOOKS if h != hook}
    with pytest.raises(TypeError, match=f"lacks {hook}"):
        type("Half", (Feature,), {"name": "half", **body})


def test_a_feature_without_a_name_is_refused():
    with pytest.raises(TypeError, match="lacks name"):
        type("Nameless", (Feature,), {h: (lambda self, *a: None) for h in HOOKS})


def test_the_registry_names_each_feature_once_and_every_settings_type_is_the_experiments():
    names = [f.name for f in FEATURES]
    assert len(names) == len(set(names))
    bases = set(Experiment.__mro__)
    for f in FEATURES:
        assert all(cls in bases for cls in f.settings), f.name
        assert f.across_servers is True or isinstance(f.across_servers, str)


def test_a_default_run_enters_only_the_samplers():
    assert run_options(Experiment().validate()) == SAMPLERS


def test_options_are_json_and_rebuild_the_same_settings_on_a_server():
    exp = Experiment(pfc="on", ecn="on", cc="dcqcn", pcap=["leaf0-eth0"], loss_rate=0.01,
                     delay="on").validate()
    opts = json.loads(json.dumps(run_options(exp)))   # what a server is sent
    assert set(opts) == {"pcap", "switch", "link_physics", "cc"} | set(SAMPLERS)
    assert SwitchSettings(**opts["switch"]) == SwitchSettings.of(exp)
    assert opts["pcap"] == {"pcap": ["leaf0-eth0"]}
    assert opts["link_physics"]["loss_rate"] == 0.01 and opts["link_physics"]["delay"] == "on"


@pytest.mark.parametrize(("setting", "value", "why"), [
    ("ecn", "on", "far end"),
    ("switch_lb", "dlb", "far end"),
])
def test_what_a_run_on_several_machines_cannot_do_is_refused_with_the_features_reason(
        setting, value, why):
    exp = Experiment(servers=["a", "b"])
    setattr(exp, setting, value)
    if setting == "ecn":
        exp.cc = "none"
    with pytest.raises(SpecError, match=why) as err:
        exp.validate()
    assert err.value.field == f"experiment.{setting}"


@pytest.mark.parametrize(("setting", "value"), [("pfc", "on"), ("loss_rate", 0.01),
                                                ("delay", "on"), ("failure_horizon_h", 1.0)])
def test_pfc_and_link_physics_are_allowed_on_several_machines(setting, value):
    exp = Experiment(servers=["a", "b"])
    setattr(exp, setting, value)
    exp.validate()


def test_link_physics_of_several_servers_lands_each_event_when_its_last_end_had_it(tmp_path):
    def record(t_s: float, began_s: float, note: str) -> dict:
        return {"events": [{"action": "fail_link", "t_s": t_s, "began_s": began_s}],
                "not_emulated": [note], "schedule_errors": [], "links": []}
    merged = merged_results({"a": {"link_physics": record(0.12, 0.10, "x")},
                             "b": {"link_physics": record(0.15, 0.11, "x")}},
                            Run(tmp_path, None, {}, {}))["link_physics"]
    assert merged["events"] == [{"action": "fail_link", "t_s": 0.15, "began_s": 0.10}]
    assert merged["not_emulated"] == ["x"]



def test_an_event_one_servers_player_never_reached_says_how_many_ends_played_it(tmp_path):
    first = {"action": "fail_link", "t_s": 0.12, "began_s": 0.10}
    second = {"action": "repair_link", "t_s": 0.31, "began_s": 0.30}
    records = {"a": {"events": [first, second], "not_emulated": [], "schedule_errors": []},
               "b": {"events": [first], "not_emulated": [], "schedule_errors": []}}
    merged = merged_results({s: {"link_physics": r} for s, r in records.items()},
                            Run(tmp_path, None, {}, {}))["link_physics"]
    assert merged["events"] == [first, {**second, "ends_played": 1}]


class _Recorder(Feature):
    """A feature that logs its set-up and tear-down (entered's order)."""

    name = "recorder"

    def __init__(self, name: str, log: list[str], fail: bool = False):
        self.name, self.log, self.fail = name, log, fail

    def options(self, exp):
        return {}

    @contextlib.contextmanager
    def running(self, part, options):
        if self.fail:
            raise RuntimeError(f"{self.name} cannot start")
        self.log.append(f"up {self.name}")
        try:
            yield self.name
        finally:
            self.log.append(f"down {self.name}")

    def measure(self, state, part, window, measured):
        return {"state": state, "before": sorted(measured)}

    def merge(self, by_server, run):
        return by_server

    def metrics(self, merged, run):
        return {}

    def summary(self, m):
        return []

    def plots(self, folder, m):
        return []


def _registry(monkeypatch, *feats):
    monkeypatch.setattr(features, "FEATURES", feats)
    monkeypatch.setattr(features, "BY_NAME", {f.name: f for f in feats})


def test_features_come_up_in_order_go_down_in_reverse_and_measure_in_order(monkeypatch,
                                                                             tmp_path):
    log: list[str] = []
    _registry(monkeypatch, _Recorder("a", log), _Recorder("b", log), _Recorder("c", log))
    part = Part(fab=None, out=tmp_path)
    with entered(part, {"a": {}, "c": {}}) as live:
        log.append("agents")
    assert log == ["up a", "up c", "agents", "down c", "down a"]
    assert live.measure(None) == {"a": {"state": "a", "before": []},
                                  "c": {"state": "c", "before": ["a"]}}


def test_a_feature_that_fails_to_start_takes_down_those_already_up(monkeypatch, tmp_path):
    log: list[str] = []
    _registry(monkeypatch, _Recorder("a", log), _Recorder("b", log, fail=True),
              _Recorder("c", log))
    with pytest.raises(RuntimeError, match="b cannot start"), \
            entered(Part(fab=None, out=tmp_path), {"a": {}, "b": {}, "c": {}}):
        log.append("agents")
    assert log == ["up a", "down a"]


def _controller(frames: int, marks: int, port: str) -> dict:
    return {"totals": {"frames_sent": frames, "xoff_frames": frames, "send_errors": 0,
                       "drops": 0, "host_refused": 0, "paused_s": 0.5},
            "calibration": {"occupancy_from": "netlink", "poll_ms": 1.0, "sleep": "off"},
            "enabled": True, "headroom": {"verdict": "ok"}, "reaction_ms": {}, "storms": [],
            "controller": {}, "ecn": {"enabled": True, "marks": marks,
                                      "by_port": {port: marks}},
            "switch_lb": {"mode": "ecmp"}, "trimming": {"enabled": False}}


def test_a_spread_runs_switch_figures_sum_every_servers():
    receiver = {"totals": {"frames_received": 2, "xoff_frames": 1, "xon_frames": 1,
                           "expired": 0, "paused_s": 0.25}}
    merged = {"per_server": {
        "a": {"controller": _controller(10, 7, "leaf0:eth1"), "receiver": receiver},
        "b": {"controller": _controller(4, 5, "leaf1:eth1"), "receiver": receiver}}}
    got = spread_pfc_metrics(merged)
    assert got["totals"]["frames_sent"] == 14
    assert got["totals"]["paused_s"] == 1.5      # 2 x 0.5 held by controllers + 2 x 0.25
    assert got["ecn"]["marks"] == 12
    assert got["ecn"]["by_port"] == {"leaf0:eth1": 7, "leaf1:eth1": 5}
    assert got["from_other_servers"]["frames_received"] == 4


def test_every_feature_gives_its_metrics_keys_whether_used_or_not(tmp_path):
    run = Run(tmp_path, None, {}, {})
    keys = features_metrics({"links": {"period_s_mean": 0.05}, "shaping_timers": {}}, run)
    assert {"pfc", "link_physics", "cc", "shaping_timers", "link_sample_period_s"} <= set(keys)
    assert keys["pfc"] is None and keys["link_physics"] is None and keys["cc"] is None


def test_link_samples_of_several_servers_share_one_time_axis(tmp_path):
    rows = {"a": {"t0_ns": 1_000_000_000, "period_s_mean": 0.05,
                  "rows": [[0.0, "n0", "n0-eth0", 0, 0, 0, 0, 0],
                           [0.1, "n0", "n0-eth0", 100, 0, 1, 0, 0]]},
            "b": {"t0_ns": 1_500_000_000, "period_s_mean": 0.06,
                  "rows": [[0.0, "n1", "n1-eth0", 0, 0, 0, 0, 0]]}}
    merged = merged_results({s: {"links": r} for s, r in rows.items()},
                            Run(tmp_path, None, {}, {}))["links"]
    assert [round(s.t_s, 3) for s in merged["samples"]] == [0.0, 0.1, 0.5]
    assert merged["totals"][("n0", "n0-eth0")]["tx_bytes"] == 100
    assert merged["base_s"] == 1.0


def test_summary_lines_come_from_metrics_alone():
    m = {"pfc": {"enabled": True, "totals": {"frames_sent": 3, "xoff_frames": 2},
                 "headroom": {"verdict": "ok"}, "ecn": {"enabled": False}},
         "flows": {"trimmed": 0}, "cc": None, "link_physics": None}
    lines = summary_lines(m)
    assert lines[0].startswith("- PFC on (lossless class): 3 pause frames sent (2 XOFF)")


@pytest.mark.parametrize("name", ["../escape.pcap", "/etc/passwd", "pcaps/../../x", "."])
def test_a_servers_file_outside_the_results_folder_is_refused(tmp_path, name):
    from fabric.cluster import ServerError
    with pytest.raises(ServerError, match="outside"):
        inside(tmp_path, name, "srv0")


def test_a_servers_capture_lands_in_pcaps(tmp_path):
    assert inside(tmp_path, "pcaps/leaf0-eth0.pcap", "srv0") == \
        (tmp_path / "pcaps" / "leaf0-eth0.pcap").resolve()


def test_settings_of_each_feature_are_declared_once():
    seen: dict[str, str] = {}
    for f in FEATURES:
        for cls in f.settings:
            for fl in fields(cls):
                assert seen.setdefault(fl.name, f.name) == f.name, fl.name
    assert Path(features.__file__).name == "features.py"
