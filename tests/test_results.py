"""testbed.results: the per-port rate plot brackets the workload whatever the sampler did;
metrics.json carries its schema version and older folders still read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.collect import LinkSample
from testbed.results import (
    METRICS_SCHEMA_VERSION,
    port_series,
    read_metrics,
    write_metrics,
    write_plots,
)


def samples(times_and_bytes: list[tuple[float, int]]) -> list[LinkSample]:
    return [LinkSample(t, "leaf0", "leaf0-eth0", b, b, b // 4000, 0, 0)
            for t, b in times_and_bytes]


# A CI run: the sampler came 585 ms late just before a 66 ms workload (2.179-2.245 s).
LATE = [(1.326, 0), (1.656, 0), (2.241, 799_056), (2.522, 799_056), (2.805, 799_056)]


def test_the_last_sample_before_and_first_after_bracket_the_workload():
    got = port_series(samples(LATE), 2.179, 2.245)[("leaf0", "leaf0-eth0")]
    assert [round(t, 3) for t, _ in got] == [-0.523, 0.062, 0.343]  # 1.656, 2.241, 2.522
    assert [b for _, b in got] == [0, 799_056, 799_056]


def test_rate_plot_is_written_after_a_late_sample(tmp_path: Path):
    metrics = {"workload": "allreduce", "workload_window_s": [2.179, 2.245]}
    out = write_plots(tmp_path, metrics, [10.0, 20.0], samples(LATE))
    assert tmp_path / "plots" / "port_rates.png" in out
    assert (tmp_path / "plots" / "port_rates.png").stat().st_size > 0


def test_drops_are_the_fabrics_and_refusals_at_an_endpoint_nic_are_apart():
    """A qdisc "drop" at an endpoint's own NIC is a frame its agent kept and sent again:
    counted as host_refused, never as fabric loss."""
    from testbed.results import link_metrics
    from topologies.builders import leaf_spine
    topo = leaf_spine(leaves=2, spines=1, hosts_per_leaf=1)
    totals = {(n, topo.ifname(n, p)): {"tx_bytes": 0, "drops": 0, "max_backlog_bytes": 0}
              for n in topo.graph for p in topo.ports(n)}
    host = next(n for n in topo.graph if not topo.graph.nodes[n].get("forwards"))
    totals[(host, topo.ifname(host, topo.ports(host)[0]))]["drops"] = 7
    totals[("leaf0", topo.ifname("leaf0", "spine0"))]["drops"] = 3
    links = link_metrics(topo, totals)
    assert (links["drops"], links["host_refused"]) == (3, 7)


def test_metrics_carry_a_schema_version_and_older_folders_still_read(tmp_path):
    write_metrics(tmp_path, {"ok": True})
    data = json.loads((tmp_path / "metrics.json").read_text())
    assert data == {"schema_version": METRICS_SCHEMA_VERSION, "ok": True} and \
        list(data)[0] == "schema_version" and METRICS_SCHEMA_VERSION == 1
    assert read_metrics(tmp_path)["ok"]
    (tmp_path / "metrics.json").write_text('{"ok": true}')          # before versions
    assert read_metrics(tmp_path) == {"ok": True}
    for bad in ('{"schema_version": 2}', '{"schema_version": "1"}', "[1, 2]"):
        (tmp_path / "metrics.json").write_text(bad)
        with pytest.raises(ValueError):
            read_metrics(tmp_path)
    write_metrics(tmp_path, [{"row": 1}])          # a script's rows stay as they are
    assert json.loads((tmp_path / "metrics.json").read_text()) == [{"row": 1}]
