"""Features on a fabric spread over two test servers (tests/servers.py), entered on each
server as on one machine (testbed.features): link physics on the links between servers
(loss at the receiving end, propagation delay, a failure played at the agreed start),
and a capture of a port on each server. Wiring, not capacity: both servers share this
machine's two cores."""

from __future__ import annotations

import json

import pytest

from topologies.files import resolve
from topologies.partition import partition

from .test_spread import cli, servers  # noqa: F401 (the servers fixture)

pytestmark = pytest.mark.root


def _run(servers, tmp_path, extra: str, *flags: str) -> tuple[dict, object]:  # noqa: F811
    exp = tmp_path / "exp.toml"
    exp.write_text('[experiment]\nname = "spread"\nworkload = "allreduce"\n'
                   'topology = "leaf_spine"\ntransport = "uet"\nmessage_bytes = 262144\n'
                   f'iterations = 2\nresults_dir = "{tmp_path / "results"}"\n{extra}'
                   f'[cluster]\nservers = {json.dumps(servers.addresses)}\n')
    out = cli(servers, "run", str(exp), *flags)
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    (folder,) = (tmp_path / "results").iterdir()
    return json.loads((folder / "metrics.json").read_text()), folder


def _cut(servers) -> list[tuple[str, str]]:  # noqa: F811
    return [(c.a, c.b) for c in partition(resolve("leaf_spine"), servers.addresses).cut]


def test_loss_on_the_links_between_servers_is_applied_there_and_recovered(servers,  # noqa: F811
                                                                          tmp_path):
    links = [f"{a}:{b}" for a, b in _cut(servers)]
    metrics, folder = _run(servers, tmp_path, f"loss_rate = 0.05\nloss_links = "
                           f"{json.dumps(links)}\n")
    flows = metrics["flows"]
    assert metrics["ok"] and flows["exactly_once"]
    assert flows["bytes_delivered"] == flows["bytes_expected"] > 0
    # only links between the servers lose: each server dropped at its receiving ends
    assert flows["retransmits"] + flows["naks"] > 0, flows
    physics = metrics["link_physics"]
    assert physics["mechanisms"]["loss"] in ("netem", "nftables")
    lossy = {e["link"] for e in physics["links"] if any(e["loss_rate"].values())}
    assert lossy == set(links)
    assert "link physics: loss by" in (folder / "summary.md").read_text()


def test_a_failure_of_a_link_between_servers_is_played_by_both_ends(servers,  # noqa: F811
                                                                    tmp_path):
    a, b = _cut(servers)[0]
    metrics, _ = _run(servers, tmp_path, "delay = \"on\"\n"
                      f'failures = [{{link = "{a}:{b}", at_s = 0.02, repair_s = 0.1}}]\n')
    assert metrics["ok"] and metrics["flows"]["exactly_once"]
    physics = metrics["link_physics"]
    events = physics["events"]
    assert [e["action"] for e in events] == ["fail_link", "repair_link"], events
    assert all(e["link"] == f"{a}:{b}" for e in events)
    assert not physics["schedule_errors"]
    # each change landed after it was due, the repair after the failure
    assert 0.02 <= events[0]["t_s"] < events[1]["t_s"]
    assert events[1]["t_s"] >= 0.1
    # propagation delay: netem on each server's ports, or the receivers' delay lines
    assert physics["mechanisms"]["delay"] in ("netem", "agent delay line")
    if physics["mechanisms"]["delay"] == "agent delay line":
        assert physics["path_delay_ms"]["min"] > 0
        assert metrics["latency_us"]["p50"] >= physics["path_delay_ms"]["min"] * 1e3
