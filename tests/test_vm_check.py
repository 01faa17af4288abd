"""make vm-check's reading of the VM's console (scripts/vm_check.py) and its refusals.
Booting the VM takes many minutes under software emulation, so the suite checks what
decides its verdict, on consoles built the way scripts/vm_inside.sh prints them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import vm_check  # noqa: E402


def console(available: dict, tests_rc: int = 0, tally: str = "7 passed in 300.1s",
            extra_tests: tuple = (), left: str = "", done: bool = True,
            softroce: tuple = (0, "PFC on kept the class lossless")) -> str:
    checks = [{"name": n, "available": ok, "detail": "created in a scratch namespace"
               if ok else f"kernel has no {n} qdisc", "disables": "x"}
              for n, ok in available.items()]
    lines = ["[    1.2] Linux version 6.1.0-41-amd64", "@@AFT kernel 6.1.0-41-amd64 cpus 2",
             "@@AFT begin doctor 100", *json.dumps({"checks": checks}, indent=1).splitlines(),
             "@@AFT end doctor rc=0 104", "@@AFT begin tests 104", "....", *extra_tests,
             "netem: one way 1.28 ms configured, ping RTT min 2.9 ms",
             tally, f"@@AFT end tests rc={tests_rc} 404",
             *(["@@AFT begin softroce 404", softroce[1], f"@@AFT end softroce rc={softroce[0]} 470"]
               if softroce else []),
             "@@AFT begin clean_state 470",
             "lo               UNKNOWN        00:00:00:00:00:00 <LOOPBACK,UP,LOWER_UP>",
             *([left] if left else []), "@@AFT end clean_state rc=0 470"]
    if done:
        lines.append("@@AFT done")
    return "\r\n".join(lines) + "\r\n"


ALL = {n: True for n in vm_check.VM_ONLY} | {"htb": True}


def test_a_vm_with_every_feature_and_green_tests_passes():
    v = vm_check.verdict(console(ALL))
    assert v["ok"] and v["failures"] == []
    assert v["kernel"] == "6.1.0-41-amd64" and v["cpus"] == 2
    assert v["doctor"] == {n: True for n in vm_check.VM_ONLY}
    assert v["tests"] == {"passed": 7} and v["tests_s"] == 300
    assert v["measured"] == ["netem: one way 1.28 ms configured, ping RTT min 2.9 ms"]
    coloured = vm_check.verdict(console(ALL, tally="\x1b[32m7 passed\x1b[0m in 300.1s"))
    assert coloured["ok"] and coloured["tests"] == {"passed": 7}
    text = vm_check.summary(v, {"VM run": 310.0}, "tcg")
    assert "netem yes" in text and "7 passed" in text and "All VM checks passed" in text
    assert "- measured: netem: one way 1.28 ms" in text
    assert v["softroce_s"] == 66 and "Soft-RoCE comparison in 66 s" in text
    table = "# Soft-RoCE beside the agents\n\n| field | rxe | agents |\n"
    text = vm_check.summary(v, {}, "tcg", table)
    assert "\n## Soft-RoCE beside the agents\n" in text and "| field | rxe |" in text


def test_a_missing_vm_feature_a_failed_test_or_a_skip_fails_it():
    v = vm_check.verdict(console(ALL | {"netem": False}))
    assert not v["ok"] and v["failures"] == [
        "doctor: netem not available in the VM (kernel has no netem qdisc)"]
    v = vm_check.verdict(console(ALL, tests_rc=1, tally="1 failed, 6 passed in 200s",
                                 extra_tests=("FAILED tests/test_run.py::test_x - boom",)))
    assert v["tests"] == {"failed": 1, "passed": 6}
    assert v["failures"] == ["tests: exit 1: FAILED tests/test_run.py::test_x - boom"]
    v = vm_check.verdict(console(ALL, tally="6 passed, 1 skipped in 200s",
                                 extra_tests=("SKIPPED [1] tests/test_x.py:3: no netem",)))
    assert not v["ok"] and "SKIPPED [1] tests/test_x.py:3: no netem" in v["failures"][0]
    assert "## FAILED" in vm_check.summary(v, {}, "kvm")


def test_an_unfinished_vm_or_leftovers_fail_it():
    v = vm_check.verdict(console(ALL, done=False))
    assert v["failures"] == ["the VM did not reach the end of its checks"]
    v = vm_check.verdict(console(ALL, left="aft-s0g0"))
    assert v["failures"] == ["left behind in the VM: aft-s0g0"]
    v = vm_check.verdict("[ 0.1] Kernel panic - not syncing\r\n")
    assert "the doctor did not run (no output between its markers)" in v["failures"]
    assert "the tests did not finish" in v["failures"] and not v["ok"]
    v = vm_check.verdict(console(ALL, left="link rxe_l0h0/1 state ACTIVE"))
    assert v["failures"] == ["left behind in the VM: link rxe_l0h0/1 state ACTIVE"]


def test_soft_roce_that_did_not_run_or_failed_fails_it():
    v = vm_check.verdict(console(ALL, softroce=()))
    assert v["failures"] == ["Soft-RoCE: scripts/softroce_compare.py did not finish"]
    v = vm_check.verdict(console(ALL, softroce=(3, "softroce_compare: unavailable: no rxe")))
    assert v["failures"] == ["Soft-RoCE: scripts/softroce_compare.py exit 3: "
                             "softroce_compare: unavailable: no rxe"]


def test_the_vm_is_provisioned_and_booted_as_vagrant_would():
    """The check runs the Vagrantfile's own provisioning command, and boots the kernel the
    VM's boot loader would: the newest installed (with its own initrd)."""
    assert vm_check.provision_command() == "cd /vagrant && bash scripts/setup.sh --guest"
    names = ["vmlinuz-6.1.0-50-amd64", "vmlinuz-7.3.4+deb13-amd64", "vmlinuz-6.12.95+deb12-amd64"]
    newest = max((Path(n) for n in names), key=vm_check.kernel_version)
    assert newest.name == "vmlinuz-7.3.4+deb13-amd64"


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    if os.geteuid() != 0:
        assert vm_check.main(["--results", str(tmp_path)]) == 2
        assert "needs root" in capsys.readouterr().err
        return
    if not all(vm_check.shutil.which(t) for t in ("qemu-system-x86_64", "debootstrap")):
        assert vm_check.main(["--results", str(tmp_path)]) == 2
        assert "sudo bash scripts/setup.sh --vm" in capsys.readouterr().err
        return
    for bad, says in ((["--tests", "tests/x.py; rm -rf /"], "is not a test file"),
                      (["--tests", "tests/test_nosuch.py"], "does not exist"),
                      (["--cpus", "0"], "--cpus must be 1-64"),
                      (["--results", "/proc/nope"], "--results")):
        assert vm_check.main(bad + ["--results", str(tmp_path)] if "--results" not in bad
                             else bad) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("line,part", [("@@AFT begin doctor 12", ("begin", "doctor", None)),
                                       ("@@AFT end tests rc=3 99", ("end", "tests", "3"))])
def test_markers(line, part):
    assert vm_check.MARK.match(line).group(1, 2, 3) == part


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.skipif(not all(shutil.which(t) for t in ("qemu-system-x86_64", "debootstrap")),
                    reason="needs qemu and debootstrap: sudo bash scripts/setup.sh --vm "
                           "(CI installs them)")
def test_vm_check_boots_the_vm_and_its_checks_pass(tmp_path, host_untouched):
    """The whole of make vm-check: the image (cached in vm_check.VM_DIR after the first run),
    provisioned by setup.sh, booted under qemu; every VM-only feature present and every
    VM test passed inside; nothing of the chroot left mounted on the host."""
    out = subprocess.run([sys.executable, "scripts/vm_check.py", "--results", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=3600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    (folder,) = tmp_path.glob("vm-check-*")
    summary = (folder / "summary.md").read_text()
    assert "All VM checks passed" in summary
    assert all(f"{name} yes" in summary for name in vm_check.VM_ONLY)
    got = json.loads((folder / "doctor.json").read_text())
    assert got["ok"] and got["tests"]["passed"] >= len(vm_check.VM_TESTS)
    assert any(m.startswith("netem: one way") for m in got["measured"])
    rootfs = str(vm_check.VM_DIR / "rootfs")
    assert rootfs not in Path("/proc/mounts").read_text()


def test_a_guest_kernel_that_died_before_its_checks_ended_is_told_apart():
    died = ("[    1.70] Oops: int3: 0000 [#2] SMP NOPTI\n[    1.70] RIP: sched_clock_cpu+0x9\n"
            "[    1.70] Kernel panic - not syncing: Fatal exception in interrupt\n")
    assert vm_check.tcg_panic(died) == "[    1.70] Kernel panic - not syncing: Fatal " \
                                       "exception in interrupt"
    assert vm_check.tcg_panic("@@AFT begin doctor 1\n@@AFT end doctor rc=0 2\n") is None
    # a panic after the checks ended (the VM's own power-off) is not a death mid-check
    assert vm_check.tcg_panic("@@AFT done 9\nKernel panic - not syncing: Attempted to "
                              "kill init!\n") is None
