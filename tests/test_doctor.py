"""Tests for fabric.doctor: both branches through seams without root; the real probe as root."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
from pyroute2 import IPRoute, NetlinkError, netns

from fabric import doctor

EXPECTED_NAMES = {
    *doctor.QDISC_KINDS,
    "openvswitch",
    "nftables",
    "ebpf_counters",
    "pfc_wake",
    "ecn_marking",
    "packet_trimming",
    "shaping_timers",
    "compiled_data_path",
    "fib_multipath_hash_seed",
    *doctor.TOOLS,
    *doctor.MODULES,
}


@pytest.fixture(autouse=True)
def fresh_cache():
    doctor.clear_cache()
    yield
    doctor.clear_cache()


def fake_machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, present: bool) -> list[str]:
    """Patch every seam so the machine has everything (present) or nothing; log qdisc probes."""
    probes: list[str] = []

    def probe_qdiscs(kinds):
        probes.extend(kinds)
        return {k: None if present else f"kernel has no {k} qdisc" for k in kinds}

    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args):
        if name in doctor.MODULES:
            return real_find_spec("json") if present else None
        return real_find_spec(name, *args)

    seed = tmp_path / "fib_multipath_hash_seed"
    if present:
        seed.write_text("0\n")
    monkeypatch.setattr(doctor, "_is_root", lambda: True)
    monkeypatch.setattr(doctor, "_probe_qdiscs", probe_qdiscs)
    monkeypatch.setattr(doctor, "_probe_ovs", lambda: (present, "ovs probe"))
    monkeypatch.setattr(doctor, "_probe_nftables", lambda: (present, "nft probe"))
    monkeypatch.setattr(doctor, "_probe_ebpf", lambda: (present, "bpf probe"))
    monkeypatch.setattr(doctor, "_probe_wake", lambda: (present, "wake probe"))
    monkeypatch.setattr(doctor, "_probe_ecn", lambda: (present, "ecn probe"))
    monkeypatch.setattr(doctor, "_probe_trim", lambda: (present, "trim probe"))
    monkeypatch.setattr(doctor, "_probe_timers", lambda: (present, "timers probe"))
    monkeypatch.setattr(doctor, "_probe_compiled", lambda: (present, "engine probe"))
    monkeypatch.setattr(doctor, "FIB_SEED_PATH", seed)
    monkeypatch.setattr(doctor.shutil, "which", lambda n: f"/usr/bin/{n}" if present else None)
    monkeypatch.setattr(doctor, "_run_version", lambda argv: f"{Path(argv[0]).name} 1.0")
    monkeypatch.setattr(doctor.importlib.util, "find_spec", find_spec)
    return probes


def by_name(checks: list[doctor.Check]) -> dict[str, doctor.Check]:
    return {c.name: c for c in checks}


def test_everything_present(monkeypatch, tmp_path):
    fake_machine(monkeypatch, tmp_path, present=True)
    checks = doctor.run_checks()
    assert {c.name for c in checks} == EXPECTED_NAMES
    assert len(checks) == len(EXPECTED_NAMES)
    assert all(c.available for c in checks)
    found = by_name(checks)
    assert found["netem"].detail == "created in a scratch namespace"
    assert found["tcpdump"].detail == "tcpdump 1.0"
    assert found["fib_multipath_hash_seed"].detail.startswith("sysctl present")
    assert all(doctor.has(name, checks) for name in EXPECTED_NAMES)


def test_everything_missing(monkeypatch, tmp_path):
    fake_machine(monkeypatch, tmp_path, present=False)
    checks = doctor.run_checks()
    assert {c.name for c in checks} == EXPECTED_NAMES
    assert not any(c.available for c in checks)
    found = by_name(checks)
    assert found["netem"].detail == "kernel has no netem qdisc"
    assert "numgen" in found["netem"].disables
    assert found["iperf3"].detail == "not found in PATH"
    assert found["scapy"].detail == "python module not importable"
    assert "6.11" in found["fib_multipath_hash_seed"].detail
    assert all(c.disables for c in checks)


def test_not_root_reports_needs_root_without_probing(monkeypatch):
    def must_not_probe(kinds):
        raise AssertionError("probed qdiscs without root")

    monkeypatch.setattr(doctor, "_is_root", lambda: False)
    monkeypatch.setattr(doctor, "_probe_qdiscs", must_not_probe)
    monkeypatch.setattr(doctor.shutil, "which", lambda n: f"/usr/bin/{n}")
    monkeypatch.setattr(doctor, "_run_version", lambda argv: "nftables v1.0")
    assert not doctor.has("htb")
    ok, detail = doctor._probe_nftables()
    assert not ok
    assert detail == "needs root for the kernel check (nftables v1.0)"
    assert doctor._probe_ebpf() == (False, "needs root (bpf(2) loads programs as root)")
    assert doctor._probe_ecn() == (False, "needs root (bpf(2) loads programs as root)")
    assert doctor._probe_wake() == (False, "needs root (bpf(2) loads programs as root)")
    checks = doctor.run_checks()
    assert {c.detail for c in checks if c.name in doctor.QDISC_KINDS} == {"needs root"}
    unchecked = {c.name for c in checks if not c.checked}
    assert unchecked >= {*doctor.QDISC_KINDS, "nftables", "ebpf_counters", "ecn_marking"}
    assert all(not c.available for c in checks if not c.checked)
    assert "not checked  needs root" in doctor.format_table(checks)


def test_qdisc_probe_is_cached(monkeypatch, tmp_path):
    probes = fake_machine(monkeypatch, tmp_path, present=True)
    assert doctor.has("netem") and doctor.has("htb")
    doctor.run_checks()
    assert probes == list(doctor.QDISC_KINDS)
    doctor.clear_cache()
    doctor.has("netem")
    assert len(probes) == 2 * len(doctor.QDISC_KINDS)


def test_has_without_checks_covers_tools_and_rejects_unknown(monkeypatch, tmp_path):
    fake_machine(monkeypatch, tmp_path, present=False)
    assert not doctor.has("tshark")
    assert not doctor.has("nftables")
    with pytest.raises(KeyError):
        doctor.has("no-such-feature")
    with pytest.raises(KeyError):
        doctor.has("netem", [])


def test_table_every_status_within_100_columns():
    checks = [
        doctor.Check("htb", True, "created in a scratch namespace", "links"),
        doctor.Check("netem", False, "x" * 150, "delay not emulated " * 10),
        doctor.Check("red", False, "needs root", "RED", checked=False),
    ]
    table = doctor.format_table(checks)
    lines = table.splitlines()
    assert max(len(line) for line in lines) <= 100
    header, present = lines[:2]
    assert header.startswith("# feature") and "status" in header and "without it" in header
    column = header.index("status")
    detail = header.index("detail")
    assert present[column:].startswith("yes ")
    assert present.rstrip().endswith("created in a scratch namespace")  # no "disables" text
    missing = lines[2:-1]
    assert missing[0][column:].startswith("NO ")
    assert all(line[:detail].strip() == "" for line in missing[1:])   # wrapped in its column
    wrapped = "".join(line[detail:] for line in missing)
    assert "x" * 150 in wrapped and "without it: delay not emulated" in wrapped
    assert wrapped.rstrip().endswith("delay not emulated")
    assert lines[-1][column:] == "not checked  needs root"            # and nothing it disables


def test_json_both_branches(monkeypatch, tmp_path):
    fake_machine(monkeypatch, tmp_path, present=False)
    checks = doctor.run_checks()
    data = json.loads(json.dumps(doctor.to_json(checks)))
    assert list(data) == ["checks"]
    assert [row["name"] for row in data["checks"]] == [c.name for c in checks]
    for row in data["checks"]:
        assert set(row) == {"name", "available", "detail", "disables", "checked"}
        assert row["available"] is False
    ok = doctor.to_json([doctor.Check("htb", True, "d", "w")])
    assert ok == {"checks": [{"name": "htb", "available": True, "detail": "d", "disables": "w",
                              "checked": True}]}


class FakeIPR:
    """Stands in for IPRoute inside _try_qdisc; `error` is what tc("add") raises."""

    def __init__(self, error: Exception | None, listed: str | None = None):
        self.error, self.listed = error, listed

    def link(self, *args, **kwargs):
        pass

    def link_lookup(self, ifname):
        return [7]

    def tc(self, command, kind, **kwargs):
        if self.error is not None:
            raise self.error
        self.listed = self.listed or kind

    def get_qdiscs(self, index):
        listed = self.listed

        class Qdisc:
            def get_attr(self, name):
                return listed

        return [Qdisc()]


@pytest.mark.parametrize(
    ("kind", "ipr", "expected"),
    [
        ("netem", FakeIPR(NetlinkError(2, "No such file")), "kernel has no netem qdisc"),
        ("red", FakeIPR(NetlinkError(95, "Not supported")), "pyroute2 cannot encode red"),
        ("htb", FakeIPR(NetlinkError(22, "Invalid argument")), "kernel refused htb"),
        ("tbf", FakeIPR(KeyError("rate")), "pyroute2 cannot encode tbf: KeyError"),
        ("bfifo", FakeIPR(None, listed="pfifo_fast"), "bfifo accepted but not listed"),
    ],
)
def test_try_qdisc_reasons(kind, ipr, expected):
    reason = doctor._try_qdisc(ipr, kind, 0, encoders={"htb": None, "tbf": None, "netem": None})
    assert reason is not None and reason.startswith(expected)


def test_try_qdisc_kind_the_kernel_has_but_pyroute2_cannot_encode():
    """EINVAL for a kind without an encoder: the kernel found the kind and refused the
    empty options (ENOENT would say it has none): present, though not created."""
    reason = doctor._try_qdisc(FakeIPR(NetlinkError(22, "Invalid argument")), "red", 0,
                               encoders={})
    assert doctor.qdisc_available(reason) and "the kernel has red" in reason
    assert not doctor.qdisc_available("kernel has no red qdisc (NetlinkError ENOENT)")


def test_try_qdisc_success():
    assert doctor._try_qdisc(FakeIPR(None), "htb", 0, encoders={}) is None


def test_run_version_real_and_failing(tmp_path):
    import sys

    assert doctor._run_version([sys.executable, "--version"]).startswith("Python 3")
    missing = str(tmp_path / "no-such-tool")
    assert doctor._run_version([missing, "--version"]).startswith(f"{missing} (version unknown")


def link_names() -> list[str]:
    with IPRoute() as ipr:
        return sorted(link.get_attr("IFLA_IFNAME") for link in ipr.get_links())


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_real_checks_leave_no_trace():
    before = link_names()
    checks = doctor.run_checks()
    found = by_name(checks)
    assert set(found) == EXPECTED_NAMES
    for kind in ("htb", "clsact", "bfifo", "ebpf_counters", "ecn_marking",
                 "packet_trimming", "pfc_wake", "shaping_timers"):           # BPF here
        assert found[kind].available, found[kind].detail
    assert not [ns for ns in netns.listnetns() if ns.startswith(doctor.NS_PREFIX)]
    assert link_names() == before
    print()
    print(doctor.format_table(checks))
