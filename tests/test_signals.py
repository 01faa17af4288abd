"""Signals stop a run cleanly: teardown, FAILED with the reason, the documented exit code.

Unit tests of testbed.interrupts run without root (each in a child Python, so a broken
handler cannot kill the test session). The root tests start `testbed run` as a
subprocess on a 4-node one-tier fabric with a message large enough to still be running,
wait until its agents have been started together, and then:
  - SIGTERM to the process, or to its process group (as `timeout` and process managers
    send it), or SIGINT to the group (Ctrl-C in a terminal): exit 143 / 130, FAILED with
    the reason, nothing of the run left (namespaces, processes, record, root links);
  - kill -9, then `testbed clean`: the folder is marked FAILED by clean, nothing left.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fabric import netns
from fabric.clean import KILLED_REASON, leftovers, our_processes
from fabric.state import state_file
from testbed.interrupts import Terminated, exit_code, failure_reason
from traffic.launch import process_count

from .conftest import sigint_as_in_a_terminal, wait_for

ROOT = Path(__file__).resolve().parent.parent
READY_LINE = "ready, starting them together"   # traffic.launch, once every agent is up


# -- without root: the handler ----------------------------------------------------------
def _child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-u", "-c", textwrap.dedent(code)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_first_sigterm_raises_terminated_a_second_is_ignored_then_default_again():
    out = _child("""
        import os, signal
        from testbed.interrupts import Terminated, stop_on_signals
        with stop_on_signals():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(10**6): pass          # the handler runs between bytecodes
                print("not raised")
            except Terminated as exc:
                print("raised", exc.reason, exc.exit_code)
            os.kill(os.getpid(), signal.SIGTERM)     # during the teardown: ignored
            for _ in range(10**6): pass
            print("second ignored")
        print("restored", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)          # default again: the process ends
        print("still alive")
    """)
    assert out.stdout.splitlines() == ["raised terminated (SIGTERM) 143", "second ignored",
                                       "restored True"], out.stderr
    assert out.returncode == -signal.SIGTERM


def test_a_child_forked_inside_the_block_dies_by_the_signal_not_by_our_finally():
    # pyroute2 forks to enter namespaces and stops those children with SIGTERM: a child
    # that raised Terminated would run the parent's `finally` blocks (teardown) itself.
    out = _child("""
        import os, signal, time
        from testbed.interrupts import stop_on_signals
        with stop_on_signals():
            pid = os.fork()
            if pid == 0:
                try:
                    time.sleep(30)
                finally:
                    print("child ran the parent's finally", flush=True)
                os._exit(0)
            time.sleep(0.2)
            os.kill(pid, signal.SIGTERM)
            _, status = os.waitpid(pid, 0)
            print("child", os.waitstatus_to_exitcode(status))
    """)
    assert out.stdout.splitlines() == [f"child {-signal.SIGTERM}"], out.stdout + out.stderr


def test_an_ignored_or_foreign_handler_is_left_alone():
    out = _child("""
        import signal
        from testbed.interrupts import stop_on_signals
        signal.signal(signal.SIGHUP, signal.SIG_IGN)           # as under nohup
        mine = lambda *a: None
        signal.signal(signal.SIGTERM, mine)                    # the caller's own
        with stop_on_signals():
            print(signal.getsignal(signal.SIGHUP) is signal.SIG_IGN,
                  signal.getsignal(signal.SIGTERM) is mine)
    """)
    assert out.stdout.split() == ["True", "True"], out.stderr


def test_nested_blocks_keep_the_outer_handler_and_fire_once():
    out = _child("""
        import os, signal
        from testbed.interrupts import Terminated, stop_on_signals
        with stop_on_signals():
            outer = signal.getsignal(signal.SIGTERM)
            try:
                with stop_on_signals():
                    print(signal.getsignal(signal.SIGTERM) is outer)
                    os.kill(os.getpid(), signal.SIGTERM)
                    for _ in range(10**6): pass
            except Terminated:
                print("raised")
            print(signal.getsignal(signal.SIGTERM) is outer)
    """)
    assert out.stdout.split() == ["True", "raised", "True"], out.stderr


def test_reasons_and_exit_codes():
    term, hup = Terminated(signal.SIGTERM), Terminated(signal.SIGHUP)
    assert isinstance(term, KeyboardInterrupt)   # every Ctrl-C teardown path applies
    assert failure_reason(term) == "terminated (SIGTERM)" and exit_code(term) == 143
    assert failure_reason(hup) == "terminated (SIGHUP)" and exit_code(hup) == 129
    assert failure_reason(KeyboardInterrupt()) == "interrupted (Ctrl-C)"
    assert exit_code(KeyboardInterrupt()) == 130
    assert failure_reason(ValueError("x")) == "ValueError('x')"


def test_a_helper_that_dies_ends_the_wait_naming_it_one_that_finishes_does_not(tmp_path):
    """traffic.launch watches the run's helpers as it watches the agents: a helper killed
    by a signal or exiting with an error raises HelperDiedError at once; one that exits
    0 (a failure player whose schedule is played) is done, and the wait goes on."""
    from traffic.launch import HelperDiedError, _Running, _wait_exit
    agent = subprocess.Popen(["sleep", "30"])
    done, killed, failed = (subprocess.Popen(["sh", "-c", code])
                            for code in ("exit 0", "sleep 30", "sleep 0.2; exit 3"))
    try:
        running = [_Running(["cpu0"], agent, tmp_path / "log", {"cpu0": tmp_path / "r"})]
        killed.kill()
        t0 = time.monotonic()
        with pytest.raises(HelperDiedError) as err:
            _wait_exit(running, 20, helpers={done.pid: "the failure player",
                                             killed.pid: "the PFC controller"})
        assert str(err.value) == f"the PFC controller (pid {killed.pid}) died: killed by SIGKILL"
        assert time.monotonic() - t0 < 5
        # left to their owner to reap (one reaped elsewhere would read as exit 0)
        assert killed.poll() == -signal.SIGKILL and done.wait(timeout=10) == 0
        with pytest.raises(HelperDiedError, match=f"pid {failed.pid}.*exited with code 3"):
            _wait_exit(running, 20, helpers={failed.pid: "the capture"})
        assert agent.poll() is None
    finally:
        for p in (agent, done, killed, failed):
            p.kill()
            p.wait()


# -- with root: a real run, stopped -------------------------------------------------------
def start_run(tmp_path: Path, new_session: bool,
              argv: list[str] | None = None) -> tuple[subprocess.Popen, Path]:
    """`testbed run` on 4 one-tier nodes (all-reduce of 64 MiB, one capture) or `argv`
    (writing into tmp_path/results), started; returns once its agents have all been
    told to go, with its results folder."""
    log = tmp_path / "stderr.log"
    argv = argv or ["-m", "testbed", "run", "--topology", "one_tier", "--set", "nodes=4",
                    "--workload", "allreduce", "--message-bytes", str(64 << 20),
                    "--pcap", "cpu0-eth0", "--timeout", "120"]
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, *argv, "--results", str(tmp_path / "results")],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=new_session,
                                preexec_fn=sigint_as_in_a_terminal)
    try:
        started = wait_for(lambda: READY_LINE in log.read_text() or proc.poll() is not None,
                           timeout_s=120, interval_s=0.1)
        assert started and proc.poll() is None, log.read_text()[-3000:]
        lab = f"run{proc.pid}"
        agents = [p for p in our_processes(netns.ours(lab)) if _is_agent(p)]
        # running, in the run's fabric: the 4 agents' processes (traffic.launch)
        assert len(agents) == process_count(None, 4), log.read_text()[-3000:]
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    (folder,) = (tmp_path / "results").iterdir()
    return proc, folder


def send_and_wait(proc: subprocess.Popen, send) -> float:
    """send() (a signal to the run or one of its processes), then wait for the run to
    end (killed if it has not in 60 s); the seconds it took."""
    t0 = time.monotonic()
    try:
        send()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return time.monotonic() - t0


def _is_agent(pid: int) -> bool:
    try:
        return b"traffic.host" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def assert_nothing_left(lab: str) -> None:
    assert wait_for(lambda: leftovers(lab) == 0, timeout_s=10), leftovers(lab)
    assert netns.named(lab) == []                # not even an unmarked one
    assert not state_file(lab).exists()
    tcpdumps = [p for p in our_processes(None) if b"tcpdump" in _cmdline(p)]
    assert tcpdumps == []


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.mark.root
@pytest.mark.parametrize(("sig", "to_group", "code", "reason"), [
    (signal.SIGTERM, False, 143, "terminated (SIGTERM)"),   # kill PID, a process manager
    (signal.SIGTERM, True, 143, "terminated (SIGTERM)"),    # timeout, kill -- -PGID
    (signal.SIGINT, True, 130, "interrupted (Ctrl-C)"),     # Ctrl-C in a terminal
], ids=["sigterm-process", "sigterm-group", "sigint-group"])
def test_signal_tears_the_run_down_and_marks_it_failed(tmp_path, host_untouched, sig,
                                                       to_group, code, reason):
    proc, folder = start_run(tmp_path, new_session=to_group)
    lab = f"run{proc.pid}"
    assert state_file(lab).exists()
    stopped_s = send_and_wait(proc, lambda: os.killpg(proc.pid, sig) if to_group
                              else proc.send_signal(sig))
    err = (tmp_path / "stderr.log").read_text()
    assert proc.returncode == code, err[-3000:]
    assert (folder / "FAILED").read_text() == f"{reason}\n"
    assert not (folder / "summary.md").exists()
    assert stopped_s < 30, stopped_s   # torn down, not left to run out its 120 s timeout
    assert_nothing_left(lab)


@pytest.mark.root
def test_kill_9_then_clean_marks_the_run_failed(tmp_path, host_untouched):
    proc, folder = start_run(tmp_path, new_session=True)
    lab = f"run{proc.pid}"
    proc.kill()
    proc.wait()
    try:
        assert len(netns.ours(lab)) == 6 and leftovers(lab) > 6   # what the crash left
        assert not (folder / "FAILED").exists()
    finally:
        out = subprocess.run([sys.executable, "-m", "testbed", "clean"], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "6 namespaces" in out.stdout
    assert f"marked FAILED (the run was killed): {folder}" in out.stdout
    assert (folder / "FAILED").read_text() == f"{KILLED_REASON}\n"
    assert_nothing_left(lab)
    again = subprocess.run([sys.executable, "-m", "testbed", "clean"], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert "marked FAILED" not in again.stdout          # once, by the clean that cleaned up
    assert (folder / "FAILED").read_text() == f"{KILLED_REASON}\n"


@pytest.mark.root
def test_sigterm_stops_an_experiment_script_and_marks_both_folders(tmp_path, host_untouched):
    proc, folder = start_run(tmp_path, new_session=True, argv=[
        "scripts/scale_sweep.py", "--ranks", "4", "--layouts", "per-core",
        "--message-bytes", str(64 << 20), "--iterations", "1"])
    lab = f"run{proc.pid}"
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = (tmp_path / "stderr.log").read_text()
    assert proc.returncode == 143, err[-3000:]
    assert "terminated (SIGTERM); the fabric was taken down" in err
    (run_folder,) = folder.glob("allreduce4_per_core-*")
    for marked in (folder, run_folder):          # the script's folder and its run's
        assert (marked / "FAILED").read_text() == "terminated (SIGTERM)\n"
    assert not (folder / "summary.md").exists()
    assert_nothing_left(lab)


@pytest.mark.root
@pytest.mark.parametrize(("sig", "said"), [
    (signal.SIGKILL, "was killed by SIGKILL"),
    (signal.SIGTERM, "was stopped by a signal from outside the run"),
], ids=["sigkill", "sigterm"])
def test_an_agent_process_that_dies_fails_the_run_at_once(tmp_path, host_untouched, sig,
                                                          said):
    proc, folder = start_run(tmp_path, new_session=True)
    lab = f"run{proc.pid}"
    log = tmp_path / "stderr.log"
    try:   # the progress lines say what the ranks have received so far
        assert wait_for(lambda: "MB into the ranks' ports" in log.read_text(),
                        timeout_s=30, interval_s=0.1), log.read_text()[-3000:]
        victim = min(p for p in our_processes(netns.ours(lab)) if _is_agent(p))
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    stopped_s = send_and_wait(proc, lambda: os.kill(victim, sig))
    err = log.read_text()
    assert proc.returncode == 1, err[-3000:]
    reason = (folder / "FAILED").read_text()
    assert f"agent process {victim} (" in reason and said in reason, reason
    assert err.strip().splitlines()[-1].startswith("testbed run: FAILED: agent process")
    assert "Traceback" not in err
    assert stopped_s < 30, stopped_s   # its death seen at once, not after the 120 s timeout
    assert_nothing_left(lab)


@pytest.mark.root
def test_a_pfc_controller_that_dies_fails_the_run_at_once(tmp_path, host_untouched):
    """kill -9 of the PFC controller mid-run: exit 1, FAILED naming it, nothing left."""
    proc, folder = start_run(tmp_path, new_session=True, argv=[
        "-m", "testbed", "run", "--topology", "one_tier", "--set", "nodes=4", "--workload",
        "allreduce", "--message-bytes", str(64 << 20), "--iterations", "10", "--pfc", "on",
        "--timeout", "120"])
    lab = f"run{proc.pid}"
    log = tmp_path / "stderr.log"
    try:
        assert wait_for(lambda: "MB into the ranks' ports" in log.read_text(),
                        timeout_s=30, interval_s=0.1), log.read_text()[-3000:]
        (pid,) = re.findall(r"the PFC controller \(pid (\d+)\)", log.read_text())
        victim = int(pid)
        assert Path(f"/proc/{victim}/status").read_text().count(f"PPid:\t{proc.pid}\n")
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    stopped_s = send_and_wait(proc, lambda: os.kill(victim, signal.SIGKILL))
    err = log.read_text()
    assert proc.returncode == 1, err[-3000:]
    said = f"the PFC controller (pid {victim}) died: killed by SIGKILL"
    assert said in (folder / "FAILED").read_text()
    assert err.strip().splitlines()[-1].startswith(f"testbed run: FAILED: {said}")
    assert "Traceback" not in err and not (folder / "summary.md").exists()
    assert stopped_s < 30, stopped_s
    assert_nothing_left(lab)
