"""`testbed clean` removes what the testbed recorded or marked as its own, and only that.

The look-alikes are a user's: a namespace `aft-usersown` (with a process inside) and a
root bridge `aftbmine0`, made by the test through pyroute2 and removed by it afterwards.
Beside them, what crashes leave: a `testbed run` killed with -9 (its record deleted
too, so only the marks on the kernel objects say what is ours), and the benchmark's
plain-Mininet baseline killed with -9 (with and without its record).
The records' bookkeeping (fabric.state) is tested without root on a temporary folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pyroute2 import IPRoute
from pyroute2 import netns as pr_netns

from fabric import netns, state
from fabric.clean import KILLED_REASON, leftovers, mark_killed_runs, our_processes, root_links

from .conftest import root_snapshot, wait_for
from .test_signals import assert_nothing_left, start_run

ROOT = Path(__file__).resolve().parent.parent
USER_NS = "aft-usersown"
USER_BRIDGE = "aftbmine0"


# -- without root: the records ---------------------------------------------------------
@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    folder = tmp_path / "state"
    monkeypatch.setattr(state, "STATE_DIR", folder)
    monkeypatch.setattr(state, "STATE_FILE", folder / "fabric.json")
    return folder


def test_a_run_outlives_its_fabric_in_the_record(state_dir, tmp_path):
    state.record_run("run7", tmp_path)
    state.update_record("run7", {"lab": "run7", "namespaces": ["aft-run7.cpu0"], "pid": 7})
    state.forget_fabric("run7")            # Fabric.stop: the run is still writing results
    assert state.read_state("run7") == {"run": {
        "pid": os.getpid(), "pid_start_ticks": state.process_start_ticks(os.getpid()),
        "results": str(tmp_path.resolve())}}
    state.forget_run("run7")
    assert list(state_dir.iterdir()) == []
    state.record_root_links("bench-baseline", ["aftbleaf0", "aftbleaf0-eth1"])
    assert state.all_records() == {"bench-baseline": {
        "root_links": ["aftbleaf0", "aftbleaf0-eth1"]}}


def test_clean_marks_only_runs_whose_process_is_gone(state_dir, tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()
    folders = {k: tmp_path / k for k in ("killed", "alive", "reused", "deleted")}
    for folder in list(folders.values())[:3]:
        folder.mkdir()
    me, ticks = os.getpid(), state.process_start_ticks(os.getpid())
    records = {
        "run1": {"run": {"pid": gone.pid, "pid_start_ticks": 1, "results": str(folders["killed"])}},
        "run2": {"run": {"pid": me, "pid_start_ticks": ticks, "results": str(folders["alive"])}},
        "run3": {"run": {"pid": me, "pid_start_ticks": ticks - 1,     # the pid was reused
                         "results": str(folders["reused"])}},
        "run4": {"run": {"pid": gone.pid, "pid_start_ticks": 1,
                         "results": str(folders["deleted"])}},       # the user removed it
        "": {"namespaces": []},                                      # a deployed fabric
    }
    assert sorted(mark_killed_runs(records)) == [str(folders["killed"]), str(folders["reused"])]
    assert (folders["killed"] / "FAILED").read_text() == f"{KILLED_REASON}\n"
    # a run on several machines: the folder says how to clean its servers
    spread = tmp_path / "spread"
    spread.mkdir()
    hint = "; its servers may still hold its parts: testbed clean --servers gpu-a,gpu-b"
    assert mark_killed_runs({"run5": {"run": {
        "pid": gone.pid, "pid_start_ticks": 1, "results": str(spread),
        "servers": ["gpu-a", "gpu-b"]}}}) == [str(spread) + hint]
    assert (spread / "FAILED").read_text() == f"{KILLED_REASON}{hint}\n"
    assert not (folders["alive"] / "FAILED").exists()
    assert not folders["deleted"].exists()


def test_failed_keeps_an_earlier_reason(tmp_path):
    state.mark_failed(tmp_path, "terminated (SIGTERM)")
    state.mark_failed(tmp_path, KILLED_REASON)
    assert (tmp_path / "FAILED").read_text() == f"terminated (SIGTERM)\n{KILLED_REASON}\n"


# -- with root: a user's look-alikes beside what crashes leave -------------------------
@pytest.fixture
def lookalikes(host_untouched):
    """A user's namespace aft-usersown (a process inside) and root bridge aftbmine0."""
    pr_netns.create(USER_NS)
    sleeper = None
    try:
        with IPRoute() as ipr:
            ipr.link("add", ifname=USER_BRIDGE, kind="bridge")
        sleeper = subprocess.Popen(["sleep", "600"],
                                   preexec_fn=lambda: pr_netns.setns(USER_NS, flags=0))
        assert wait_for(lambda: _netns_inode(sleeper.pid) == netns.inode(USER_NS))
        yield sleeper
    finally:
        if sleeper is not None:
            sleeper.kill()
            sleeper.wait()
        with IPRoute() as ipr:
            for index in ipr.link_lookup(ifname=USER_BRIDGE):
                ipr.link("del", index=index)
        pr_netns.remove(USER_NS)


def _netns_inode(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def assert_lookalikes_untouched(sleeper: subprocess.Popen) -> None:
    assert USER_NS in pr_netns.listnetns()
    assert sleeper.poll() is None and _netns_inode(sleeper.pid) == netns.inode(USER_NS)
    with IPRoute() as ipr:
        assert ipr.link_lookup(ifname=USER_BRIDGE)


def run_clean() -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "testbed", "clean"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out


@pytest.mark.root
def test_lookalikes_are_not_ours():
    pr_netns.create(USER_NS)
    try:
        assert USER_NS in netns.named("")
        assert USER_NS not in netns.ours()            # named like ours, but not marked
    finally:
        pr_netns.remove(USER_NS)


@pytest.mark.root
def test_clean_after_a_killed_run_without_its_record_leaves_the_users_things(
        tmp_path, lookalikes):
    before = root_snapshot()
    proc, folder = start_run(tmp_path, new_session=True)
    lab = f"run{proc.pid}"
    proc.kill()
    proc.wait()
    state.state_file(lab).unlink()           # the crash lost the record: marks must do
    out = run_clean()
    assert "6 namespaces" in out.stdout, out.stdout
    assert "marked FAILED" not in out.stdout   # the record said where the folder was
    assert_nothing_left(lab)
    assert_lookalikes_untouched(lookalikes)
    assert root_snapshot() == before
    again = run_clean()
    assert "removed 0 processes, 0 namespaces, 0 root-namespace links" in again.stdout
    assert_lookalikes_untouched(lookalikes)


CRASHING_BASELINE = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, "scripts")
    import bench_fabric
    from topologies import resolve
    net, names = bench_fabric.start_plain(resolve("leaf_spine", {{"leaves": 2, "spines": 2,
                                                                 "hosts_per_leaf": 2}}))
    {mark}
    print(" ".join(names), flush=True)
    time.sleep(600)
""")


@pytest.mark.root
@pytest.mark.parametrize(("keep_record", "marked"), [(True, False), (False, True)],
                         ids=["record-only", "marks-only"])
def test_clean_after_a_killed_plain_mininet_baseline(lookalikes, keep_record, marked):
    before = root_snapshot()
    mark = "bench_fabric.mark_root_links(names)" if marked else ""
    proc = subprocess.Popen([sys.executable, "-c", CRASHING_BASELINE.format(mark=mark)],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        names = proc.stdout.readline().split()
        assert len(names) == 4 + 4 + 8, names  # 4 bridges; 4 host-facing ports, 8 uplink ends
        assert set(names) <= set(root_snapshot()["links"])    # what the record predicted
        assert set(root_links()) == set(names)
        shells = [p for p in our_processes(None) if b"mininet:aftb" in _cmdline(p)]
        assert len(shells) == 8                # 4 hosts, 4 bridges: each carries the marker
    finally:
        proc.kill()                            # the crash
        proc.wait()
    assert state.state_file("bench-baseline").exists()
    if not keep_record:
        state.state_file("bench-baseline").unlink()
    run_clean()
    assert root_links() == []
    assert leftovers() == 0
    assert not any(b"mininet:aftb" in _cmdline(p) for p in _pids())
    assert_lookalikes_untouched(lookalikes)
    assert root_snapshot() == before


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _pids() -> list[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit()]


@pytest.mark.root
def test_a_marker_alone_proves_nothing(lookalikes):
    """Someone's processes with the fabric marker in their environment, empty, foreign or
    in our format, but no record, no namespace of ours and no Mininet shell behind them:
    clean leaves them running (it once killed every one)."""
    sleepers = [subprocess.Popen(["sleep", "600"], env={**os.environ, state.MARKER_ENV: value})
                for value in ("", "mine", "aft-mine.cpu0")]
    try:
        assert wait_for(lambda: all(Path(f"/proc/{p.pid}/environ").read_bytes().count(
            state.MARKER_ENV.encode() + b"=") for p in sleepers))     # exec'd with the marker
        assert not set(our_processes(None)) & {p.pid for p in sleepers}
        run_clean()
        assert all(p.poll() is None for p in sleepers)
        assert_lookalikes_untouched(lookalikes)
    finally:
        for p in sleepers:
            p.kill()
            p.wait()
