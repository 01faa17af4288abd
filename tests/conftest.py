"""Shared fixtures: root-only marking, fabrics that always come down, host-safety checks."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import tempfile
import time

# The suite reads nothing an earlier run left on this machine: `rate = "auto"` finds no
# calibration cached and measures one, as on a new machine (testbed.rate.CACHE reads
# AFT_CALIBRATION when first imported, which is after this). A test may set its own.
CALIBRATION_DIR = tempfile.mkdtemp(prefix="aft-test-calibration-")
os.chmod(CALIBRATION_DIR, 0o755)   # tests that drop to another user read it too
os.environ["AFT_CALIBRATION"] = os.path.join(CALIBRATION_DIR, "calibration.json")

import pytest  # noqa: E402
from pyroute2 import IPRoute  # noqa: E402

from fabric import netns  # noqa: E402
from fabric.clean import leftovers  # noqa: E402
from fabric.core import Fabric  # noqa: E402

IS_ROOT = os.geteuid() == 0
LAB = f"t{os.getpid()}"   # fabrics of this test run: aft-<LAB>.<node>, beside any other


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(CALIBRATION_DIR, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="builds real namespaces: needs root")
    for item in items:
        if "root" in item.keywords and not IS_ROOT:
            item.add_marker(skip)


def root_snapshot() -> dict:
    """What the tests must never change: the root namespace's links, addresses, routes."""
    with IPRoute() as ipr:
        links = sorted(lk.get_attr("IFLA_IFNAME") for lk in ipr.get_links())
        addrs = sorted((a["index"], a.get_attr("IFA_ADDRESS")) for a in ipr.get_addr())
        routes = sorted((r["family"], r.get_attr("RTA_DST") or "", r["dst_len"],
                         r.get_attr("RTA_TABLE")) for r in ipr.get_routes(family=socket.AF_INET))
    return {"links": links, "addresses": addrs, "routes": routes}


@pytest.fixture
def host_untouched():
    """Assert the root namespace's links, addresses and routes are the same afterwards."""
    before = root_snapshot()
    yield
    assert root_snapshot() == before


@pytest.fixture
def default_lab_free(host_untouched):
    """For tests of the CLI, which deploys the default fabric (aft-<node>)."""
    if netns.ours(""):
        pytest.fail("a fabric is deployed (aft-* namespaces exist): run 'testbed destroy' "
                    "(or 'testbed clean' after a crash) before the tests")
    yield
    assert netns.ours("") == [] and leftovers("") == 0


@pytest.fixture
def fabric(host_untouched):
    """Factory: fabric(topo, seed=1) builds a Fabric that is torn down after the test."""
    built: list[Fabric] = []

    def make(topo, seed: int = 1) -> Fabric:
        fab = Fabric(topo, seed=seed, lab=LAB)
        built.append(fab)
        return fab.start()

    yield make
    for fab in built:
        fab.stop()
    assert netns.ours(LAB) == [] and leftovers(LAB) == 0


def sigint_as_in_a_terminal() -> None:
    """preexec_fn: in the child, SIGINT as a foreground command gets it. Tests started as
    a background job (a CI script's `cmd &`) run with SIGINT ignored, which every child
    inherits, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def udp_socket_in(fab: Fabric, node: str) -> socket.socket:
    with netns.entered(fab.ns(node)):
        return socket.socket(socket.AF_INET, socket.SOCK_DGRAM)


def link_counters(fab: Fabric, node: str) -> dict[str, dict]:
    """ifname -> IFLA_STATS64 of every port of `node`."""
    with fab.ipr(node) as ipr:
        return {lk.get_attr("IFLA_IFNAME"): dict(lk.get_attr("IFLA_STATS64"))
                for lk in ipr.get_links() if lk.get_attr("IFLA_IFNAME") != "lo"}


def wait_for(predicate, timeout_s: float = 5.0, interval_s: float = 0.05):
    """Poll until predicate() is truthy; return its value (or the last one on timeout)."""
    deadline = time.monotonic() + timeout_s
    value = predicate()
    while not value and time.monotonic() < deadline:
        time.sleep(interval_s)
        value = predicate()
    return value


@contextlib.contextmanager
def process(fab: Fabric, node: str, args: list[str]):
    """A process inside a node that is killed and reaped at the end of the block."""
    proc = fab.popen(node, args)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def assert_lossless_unless_late(rep: dict) -> None:
    """A PFC report (pfc.json) lost no lossless frame, or says why: a busy host can stall
    even the SCHED_FIFO controller for several ms, past the reaction the headroom was
    sized for. Then the verdict must be "exceeded" with the slowest reaction or the
    longest poll gap beside the sized one and the drops counted, never "ok"."""
    room, drops = rep["headroom"], rep["totals"]["drops"]
    assert room["thresholds_fit"], room
    if room["verdict"] == "ok":
        assert drops == 0, {k: v for k, v in rep["ports"].items() if v["drops"]}
        return
    assert room["verdict"] == "exceeded", room
    # a reaction it measured, or a stall between its polls (a crossing then went
    # unanswered without a reaction to measure: 2 drops at 4.8 ms against 1.8 sized)
    assert max(room["slowest_reaction_ms"] or 0.0, rep["controller"]["max_poll_gap_ms"]) \
        > room["sized_for_reaction_ms"]
    assert any(f"{drops} lossless drops" in note for note in room["notes"]), room["notes"]
