#!/usr/bin/env python3
"""make vm-check: boot the users' VM (Debian 12, provisioned as the Vagrantfile does) under
qemu and run the testbed's VM-only checks in it.

    debootstrap bookworm + linux-image-amd64 ─▶ <vm dir>/rootfs ─ chroot: the clone's
    tracked files in /vagrant, the Vagrantfile's provisioning (setup.sh --guest: Soft-RoCE
    and the backported kernel) ─▶ mkfs.ext4 -d ─▶ <vm dir>/disk.raw ─ qemu-system-x86_64
    (KVM if it works, else TCG), the newest kernel, -snapshot, init = scripts/vm_inside.sh
        ─▶ serial console, and a second disk (a tar stream) ─▶ results/vm-check-<UTC>/

Inside the VM: `testbed doctor` (every VM-only feature must read yes: netem, red, prio,
fq, openvswitch), the root tests that take the VM kernel's branches (netem delay and
loss; see VM_TESTS), and scripts/softroce_compare.py (the kernel's RDMA stack beside the
agents; its tables and pcaps come back in softroce/). The base image (debootstrap and the
first provisioning, a few minutes, ~2.5 GB) is cached in /var/cache/aft-testbed/vm
(AFT_VM_DIR), outside every clone and shared by them one check at a time (a lock), until
scripts/setup.sh, requirements.txt or pyproject.toml change; every run copies the clone's
tracked files in again and provisions again, which then only rebuilds what changed.
Packages come from Debian's registry and PyPI, fetched on the host (the chroot uses the
host's network); the VM itself needs none. Needs root and `sudo bash scripts/setup.sh
--vm` (qemu-system-x86, debootstrap). Writes console.log, doctor.json and summary.md;
exits 1 if any check failed (or on SIGTERM, after unmounting and stopping qemu), 2 on bad
input.

    sudo .venv/bin/python scripts/vm_check.py [--tests ...] [--timeout-s 5400] [--rebuild]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from testbed.interrupts import failure_reason, stop_on_signals
from testbed.outputs import make_folder
from topologies.spec import SpecError

ROOT = Path(__file__).resolve().parent.parent
# outside the clone: 2 GB of a Debian system in the tree would be read by every tool that
# walks it (and copied by every clone's first check)
VM_DIR = Path(os.environ.get("AFT_VM_DIR", "/var/cache/aft-testbed/vm"))
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
# debootstrap's extras: the stock kernel with its modules, the module loader (qdisc
# modules load on demand), an initrd builder (ext4 and virtio_blk are modules), sudo
# and ca-certificates for setup.sh's apt and pip
BASE_PACKAGES = ("linux-image-amd64", "kmod", "initramfs-tools", "ca-certificates", "sudo",
                 "iproute2", "procps")
VM_ONLY = ("netem", "red", "prio", "fq", "openvswitch")
# root tests whose branches only the VM's kernel takes (netem for delay and loss), and
# the doctor's own tests
VM_TESTS = (
    "tests/test_doctor.py",
    "tests/test_impair.py::test_one_percent_loss_measured_over_20k_packets",
    "tests/test_impair.py::test_loss_applies_on_every_hop_including_the_host_uplink",
    "tests/test_impair.py::test_netem_delays_every_link_by_its_length",
    "tests/test_run.py::test_propagation_delay_holds_every_packet_its_paths_delay",
    "tests/test_run.py::test_run_with_loss_and_a_link_failure",
)
# Under software emulation on a busy host the guest's vCPUs are starved unevenly, its
# clocksource watchdog then finds the TSC skewed against the HPET and switches clocks at
# run time, and the 7.3 kernel's switch of sched_clock died there (an int3 Oops in
# sched_clock_cpu, with two busy loops on the host's two cores). Both clocks come from the
# host's under TCG: the TSC is trusted from boot and the watchdog never switches.
TCG_CLOCK = "tsc=reliable"
# the VM's second disk, for the files it hands back (softroce_compare's pcaps and tables)
OUT_DISK_BYTES = 256 << 20
ANSI = re.compile(r"\x1b\[[0-9;]*m")
MARK = re.compile(r"^@@AFT (begin|end) (\w+)(?: rc=(\d+))? (\d+)\s*$")
# what the VM-only tests print of their measurements (pytest -rP shows it)
MEASURED = re.compile(r"^(netem: |\d+% loss: |\d+% per hop)")
PYTEST_TALLY = re.compile(r"(\d+) (passed|failed|error|errors|skipped)")


class UsageError(Exception):
    """Bad input or a missing prerequisite: one line, exit 2."""


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, **kw)


def base_stamp() -> str:
    """What the provisioned base depends on: the installer and the pinned packages."""
    h = hashlib.sha256(" ".join(BASE_PACKAGES).encode())
    for name in ("scripts/setup.sh", "requirements.txt", "pyproject.toml"):
        h.update((ROOT / name).read_bytes())
    return h.hexdigest()


@contextlib.contextmanager
def chroot_mounts(rootfs: Path):
    """/proc, /sys, /dev and the host's resolver inside the chroot, and services kept
    from starting there (policy-rc.d); undone on the way out, whatever happened."""
    mounted = []
    try:
        for src, kind in (("/proc", "proc"), ("/sys", "sysfs"), ("/dev", None),
                          ("/dev/pts", None)):
            target = rootfs / src.lstrip("/")
            target.mkdir(parents=True, exist_ok=True)
            run(["mount", "--bind", src, str(target)] if kind is None
                else ["mount", "-t", kind, kind, str(target)])
            mounted.append(target)
        shutil.copyfile("/etc/resolv.conf", rootfs / "etc" / "resolv.conf")
        policy = rootfs / "usr" / "sbin" / "policy-rc.d"
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            (rootfs / "usr" / "sbin" / "policy-rc.d").unlink()
        for target in reversed(mounted):
            subprocess.run(["umount", "-l", str(target)], check=False)


def provision_command() -> str:
    """The Vagrantfile's provisioning command, which the check runs as it is."""
    text = (ROOT / "Vagrantfile").read_text()
    m = re.search(r'config\.vm\.provision "shell".*?inline: "([^"]+)"', text, re.S)
    if not m:
        raise RuntimeError("the Vagrantfile has no shell provisioner with an inline command")
    return m.group(1)


def tracked_files() -> list[str]:
    out = run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True)
    return [f for f in out.stdout.decode().split("\0") if f and (ROOT / f).is_file()]


def sync_clone(rootfs: Path, tests: list[str]) -> None:
    """The clone's tracked files into /vagrant (what the Vagrantfile's rsync copies), its
    .venv and compiled build kept so setup.sh only redoes what changed."""
    dest = rootfs / "vagrant"
    dest.mkdir(exist_ok=True)
    keep = {".venv", "build"}
    for entry in dest.iterdir():
        if entry.name not in keep:
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    for rel in tracked_files():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)
    (dest / "build").mkdir(exist_ok=True)
    (dest / "build" / "vm-tests.txt").write_text("\n".join(tests) + "\n")
    init = rootfs / "vm-inside.sh"
    shutil.copyfile(ROOT / "scripts" / "vm_inside.sh", init)
    init.chmod(0o755)


def provision(rootfs: Path, say) -> float:
    """The Vagrantfile's provisioning (scripts/setup.sh) in the chroot; seconds taken."""
    t0 = time.monotonic()
    with chroot_mounts(rootfs):
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
               "DEBIAN_FRONTEND": "noninteractive"}
        # pip in the chroot trusts what the host trusts (a proxy's own CA included), as
        # it uses the host's network; the guest keeps Debian's bundle
        host_ca = Path(os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE")
                       or "/etc/ssl/certs/ca-certificates.crt")
        if host_ca.is_file():
            shutil.copyfile(host_ca, rootfs / "root" / "host-ca.crt")
            env["PIP_CERT"] = "/root/host-ca.crt"
        proc = subprocess.run(["chroot", str(rootfs), "bash", "-c", provision_command()],
                              env=env,
                              capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("[setup]"):
            say(f"  guest {line}")
    if proc.returncode != 0:
        raise RuntimeError("scripts/setup.sh failed in the VM's root file system "
                           f"(exit {proc.returncode}): {proc.stderr.strip()[-1500:]}")
    return time.monotonic() - t0


def build_base(say) -> None:
    rootfs = VM_DIR / "rootfs"
    stamp = VM_DIR / "base.stamp"
    if stamp.exists() and stamp.read_text() == base_stamp() and rootfs.is_dir():
        say(f"base image: cached ({rootfs})")
        return
    shutil.rmtree(rootfs, ignore_errors=True)
    VM_DIR.mkdir(parents=True, exist_ok=True)
    say(f"debootstrap {SUITE} from {MIRROR} (a few minutes)")
    t0 = time.monotonic()
    run(["debootstrap", "--include=" + ",".join(BASE_PACKAGES), SUITE, str(rootfs), MIRROR],
        stdout=subprocess.DEVNULL)
    say(f"debootstrap: {time.monotonic() - t0:.0f} s")
    stamp.unlink(missing_ok=True)
    stamp.write_text(base_stamp())


def kernel_version(path: Path) -> tuple[int, ...]:
    """vmlinuz-7.3.4+deb13-amd64 -> (7, 3, 4): the boot loader's order, newest last."""
    return tuple(int(n) for n in re.findall(r"\d+", path.name.split("-", 1)[1])[:3])


def make_disk(rootfs: Path, say) -> tuple[Path, Path, Path]:
    """The root file system as an ext4 image, and the newest kernel and its initrd beside
    it (the one the VM's boot loader picks)."""
    boot = rootfs / "boot"
    kernels = sorted(boot.glob("vmlinuz-*"), key=kernel_version)
    if not kernels:
        raise RuntimeError(f"no kernel in {boot}")
    abi = kernels[-1].name.removeprefix("vmlinuz-")
    if not (boot / f"initrd.img-{abi}").exists():
        raise RuntimeError(f"no initrd for kernel {abi} in {boot}")
    kernel, initrd = VM_DIR / "vmlinuz", VM_DIR / "initrd.img"
    shutil.copyfile(kernels[-1], kernel)
    shutil.copyfile(boot / f"initrd.img-{abi}", initrd)
    disk = VM_DIR / "disk.raw"
    used = int(run(["du", "-sb", str(rootfs)], capture_output=True, text=True)
               .stdout.split()[0])
    size = int(used * 1.5) + (1 << 30)            # room for the tests' results and pcaps
    disk.unlink(missing_ok=True)
    with open(disk, "wb") as fh:
        fh.truncate(size)
    run(["mkfs.ext4", "-q", "-F", "-L", "aftvm", "-d", str(rootfs), str(disk)])
    say(f"disk: {size / 2**30:.1f} GiB from {used / 2**30:.1f} GiB of files, "
        f"kernel {kernels[-1].name}")
    return disk, kernel, initrd


def kvm_usable() -> bool:
    """/dev/kvm opens and the CPU offers virtualisation (nested guests here have neither
    vmx nor svm, and qemu's KVM then fails on its first MSR)."""
    flags = Path("/proc/cpuinfo").read_text()
    return os.access("/dev/kvm", os.R_OK | os.W_OK) and bool(re.search(r"\b(vmx|svm)\b", flags))


def boot(disk: Path, kernel: Path, initrd: Path, folder: Path, timeout_s: float,
         cpus: int, memory_mb: int, say) -> tuple[str, str, float]:
    """Boot the image once; the console's text, the accelerator, seconds taken. What the
    VM writes to its second disk (a tar stream: /dev/vdb) is unpacked into `folder`."""
    accel = "kvm" if kvm_usable() else "tcg"
    outdisk = VM_DIR / "out.raw"
    outdisk.unlink(missing_ok=True)
    with open(outdisk, "wb") as fh:
        fh.truncate(OUT_DISK_BYTES)
    cmd = ["qemu-system-x86_64", "-accel", accel, "-cpu", "host" if accel == "kvm" else "max",
           "-smp", str(cpus), "-m", str(memory_mb), "-nographic", "-no-reboot",
           "-snapshot", "-nic", "none", "-kernel", str(kernel), "-initrd", str(initrd),
           "-append", "console=ttyS0 root=/dev/vda rw init=/vm-inside.sh panic=-1 "
                      "net.ifnames=0" + (" " + TCG_CLOCK if accel == "tcg" else ""),
           "-drive", f"file={disk},format=raw,if=virtio",
           "-drive", f"file={outdisk},format=raw,if=virtio,snapshot=off"]
    say(f"booting: {accel.upper()}, {cpus} CPUs, {memory_mb} MiB "
        + ("" if accel == "kvm" else "(no KVM here: software emulation, slow)"))
    log = folder / "console.log"
    t0 = time.monotonic()
    lines: list[str] = []
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace")
        try:
            for line in proc.stdout:
                out.write(line)
                lines.append(line)
                m = MARK.match(line.strip())
                if m or line.startswith("@@AFT"):
                    say(f"  [{time.monotonic() - t0:5.0f} s] {line.strip()}")
                if time.monotonic() - t0 > timeout_s:
                    raise TimeoutError(f"the VM ran past --timeout-s {timeout_s:g}")
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    # an all-zero disk (the VM wrote nothing) is an empty archive to tar
    subprocess.run(["tar", "-xf", str(outdisk), "-C", str(folder)], check=False,
                   capture_output=True)
    outdisk.unlink(missing_ok=True)
    return "".join(lines), accel, time.monotonic() - t0


def tcg_panic(console: str) -> str | None:
    """The panic line of a guest kernel that died before the checks ended, else None.
    Under software emulation the 7.3 kernel has died so, seldom, in its own code patching
    (an int3 Oops in sched_clock_cpu while a static key flipped on another vCPU): the
    emulator's fault, not the testbed's, so main() boots once more."""
    if "@@AFT done" in console:
        return None
    return next((line.strip() for line in console.splitlines()
                 if "Kernel panic" in line), None)


def parts(console: str) -> dict[str, dict]:
    """Each step's output and exit code, from the markers scripts/vm_inside.sh prints."""
    found: dict[str, dict] = {}
    current = None
    for line in console.splitlines():
        m = MARK.match(line.strip().replace("\r", ""))
        if m and m.group(1) == "begin":
            current = found[m.group(2)] = {"lines": [], "rc": None, "t0": int(m.group(4))}
        elif m and m.group(1) == "end" and m.group(2) in found:
            found[m.group(2)].update(rc=int(m.group(3)), s=int(m.group(4)) - found[
                m.group(2)]["t0"])
            current = None
        elif current is not None:
            current["lines"].append(line.replace("\r", ""))
    return found


def verdict(console: str) -> dict:
    """What the VM's console says: the kernel, the doctor's VM-only features, the tests'
    tally, and every failure found, named."""
    console = ANSI.sub("", console)
    got = parts(console)
    failures = []
    kernel = re.search(r"^@@AFT kernel (\S+) cpus (\d+)", console, re.M)
    doctor = {}
    if "doctor" not in got:
        failures.append("the doctor did not run (no output between its markers)")
    else:
        text = "\n".join(got["doctor"]["lines"])
        try:
            checks = json.loads(text[text.index("{"):text.rindex("}") + 1])["checks"]
            doctor = {c["name"]: c for c in checks}
        except (ValueError, KeyError) as exc:
            failures.append(f"the doctor's JSON could not be read: {exc}")
        for name in VM_ONLY:
            if doctor and not doctor.get(name, {}).get("available"):
                failures.append(f"doctor: {name} not available in the VM "
                                f"({doctor.get(name, {}).get('detail', 'not checked')})")
    tally = {}
    if "tests" not in got or got["tests"]["rc"] is None:
        failures.append("the tests did not finish")
    else:
        last = [ln for ln in got["tests"]["lines"] if PYTEST_TALLY.search(ln)]
        if last:
            for n, kind in PYTEST_TALLY.findall(last[-1]):
                tally[kind.rstrip("s") if kind.startswith("error") else kind] = int(n)
        if got["tests"]["rc"] != 0:
            failed = [ln for ln in got["tests"]["lines"] if ln.startswith(("FAILED", "ERROR"))]
            failures.append(f"tests: exit {got['tests']['rc']}"
                            + (": " + "; ".join(failed) if failed else ""))
        elif tally.get("skipped"):
            skips = [ln for ln in got["tests"]["lines"] if ln.startswith("SKIPPED")]
            failures.append("tests skipped in the VM (each should run there): "
                            + "; ".join(skips))
    soft = got.get("softroce")
    if soft is None or soft["rc"] is None:
        failures.append("Soft-RoCE: scripts/softroce_compare.py did not finish")
    elif soft["rc"] != 0:
        last = [ln for ln in soft["lines"] if ln.strip()][-3:]
        failures.append(f"Soft-RoCE: scripts/softroce_compare.py exit {soft['rc']}: "
                        + " / ".join(ln.strip() for ln in last))
    left = got.get("clean_state", {}).get("lines", [])
    leftovers = [ln for ln in left if "aft-" in ln or "rxe_" in ln
                 or ln.startswith(("aftb", "s0g", "leaf"))]
    if leftovers:
        failures.append(f"left behind in the VM: {', '.join(leftovers)}")
    if "@@AFT done" not in console:
        failures.append("the VM did not reach the end of its checks")
    measured = [ln.strip() for ln in got.get("tests", {}).get("lines", [])
                if MEASURED.match(ln.strip())]
    return {"kernel": kernel.group(1) if kernel else None,
            "measured": measured,
            "cpus": int(kernel.group(2)) if kernel else None,
            "doctor": {n: bool(doctor.get(n, {}).get("available")) for n in VM_ONLY},
            "doctor_all": {n: c.get("available") for n, c in doctor.items()},
            "tests": tally, "tests_s": got.get("tests", {}).get("s"),
            "softroce_s": (soft or {}).get("s"),
            "failures": failures, "ok": not failures}


def summary(v: dict, timings: dict, accel: str, softroce: str = "") -> str:
    lines = ["# vm-check", "",
             f"- kernel {v['kernel']}, {v['cpus']} CPUs, {accel.upper()}"
             + (" (software emulation: no nested virtualisation here)" if accel == "tcg" else ""),
             "- timings: " + ", ".join(f"{k} {s:.0f} s" for k, s in timings.items()),
             "- VM-only features (testbed doctor): "
             + ", ".join(f"{n} {'yes' if ok else 'NO'}" for n, ok in v["doctor"].items()),
             "- tests: " + (", ".join(f"{n} {k}" for k, n in v["tests"].items()) or "none")
             + (f" in {v['tests_s']} s" if v["tests_s"] is not None else "")]
    lines += [f"- measured: {m}" for m in v["measured"]]
    if v.get("softroce_s") is not None:
        lines.append(f"- Soft-RoCE comparison in {v['softroce_s']} s: softroce/softroce.md")
    lines.append("")
    if softroce:      # its own title one level down
        lines += ["#" + ln if ln.startswith("#") else ln for ln in softroce.splitlines()]
        lines.append("")
    if v["failures"]:
        lines += ["## FAILED", ""] + [f"- {f}" for f in v["failures"]]
    else:
        lines.append("All VM checks passed.")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tests", nargs="+", default=list(VM_TESTS),
                    help="pytest node ids to run in the VM (default: the VM-only branches)")
    ap.add_argument("--timeout-s", type=float, default=5400.0)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--memory-mb", type=int, default=4096)
    ap.add_argument("--rebuild", action="store_true", help="debootstrap the base again")
    ap.add_argument("--results", default=str(ROOT / "results"))
    args = ap.parse_args(argv)
    try:
        if os.geteuid() != 0:
            raise UsageError("needs root (debootstrap, chroot, mkfs): run it with sudo")
        missing = [t for t in ("qemu-system-x86_64", "debootstrap", "mkfs.ext4", "chroot")
                   if shutil.which(t) is None]
        if missing:
            raise UsageError(f"missing {', '.join(missing)}: sudo bash scripts/setup.sh --vm")
        for t in args.tests:
            if not re.fullmatch(r"tests/[\w/]+\.py(::[\w\[\]-]+)?", t):
                raise UsageError(f"--tests: {t!r} is not a test file or node id "
                                 "(tests/test_x.py or tests/test_x.py::test_y)")
            if not (ROOT / t.split("::")[0]).is_file():
                raise UsageError(f"--tests: {t.split('::')[0]} does not exist")
        if not 1 <= args.cpus <= 64 or not 1024 <= args.memory_mb <= 65536:
            raise UsageError("--cpus must be 1-64 and --memory-mb 1024-65536")
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
        folder = make_folder("--results", Path(args.results) / f"vm-check-{stamp}")
    except (UsageError, SpecError) as exc:
        print(f"vm_check: {exc}", file=sys.stderr)
        return 2

    def say(text: str) -> None:
        print(text, flush=True)

    timings = {}
    panic = None      # the first boot's, when the guest kernel died and it booted again
    t0 = time.monotonic()
    try:
        with stop_on_signals():   # SIGTERM too unmounts the chroot and stops qemu
            VM_DIR.mkdir(parents=True, exist_ok=True)
            lock = open(VM_DIR / "lock", "w")     # noqa: SIM115 (held to the end of main)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                say(f"waiting for another vm-check, which holds {VM_DIR}")
                fcntl.flock(lock, fcntl.LOCK_EX)
            if args.rebuild:
                shutil.rmtree(VM_DIR / "rootfs", ignore_errors=True)
            build_base(say)
            timings["base image"] = time.monotonic() - t0
            rootfs = VM_DIR / "rootfs"
            sync_clone(rootfs, args.tests)
            say("provisioning: bash scripts/setup.sh in the VM's root file system")
            timings["provisioning"] = provision(rootfs, say)
            t1 = time.monotonic()
            disk, kernel, initrd = make_disk(rootfs, say)
            timings["disk"] = time.monotonic() - t1
            console, accel, boot_s = boot(disk, kernel, initrd, folder, args.timeout_s,
                                          args.cpus, args.memory_mb, say)
            panic = tcg_panic(console) if accel == "tcg" else None
            if panic:
                say(f"the guest kernel died under software emulation ({panic}); booting "
                    "again, its console kept as console-panic.log")
                (folder / "console.log").rename(folder / "console-panic.log")
                console, accel, again_s = boot(disk, kernel, initrd, folder, args.timeout_s,
                                               args.cpus, args.memory_mb, say)
                boot_s += again_s
            timings["VM run"] = boot_s
    except (subprocess.CalledProcessError, RuntimeError, TimeoutError, OSError,
            KeyboardInterrupt) as exc:
        reason = failure_reason(exc) if isinstance(exc, KeyboardInterrupt) else str(exc)
        (folder / "FAILED").write_text(f"{reason}\n")
        print(f"vm_check: FAILED: {reason} (folder {folder})", file=sys.stderr)
        return 1
    timings["total"] = time.monotonic() - t0
    v = verdict(console)
    (folder / "doctor.json").write_text(json.dumps(v, indent=1) + "\n")
    soft_md = folder / "softroce" / "softroce.md"
    text = summary(v, timings, accel, soft_md.read_text() if soft_md.exists() else "")
    if panic:       # said, never hidden: the second boot's checks are these
        text += (f"\nThe first boot's kernel died under software emulation ({panic}; "
                 "console-panic.log); these are the second boot's checks.\n")
    (folder / "summary.md").write_text(text)
    print(text + f"results: {folder}")
    if not v["ok"]:
        (folder / "FAILED").write_text("\n".join(v["failures"]) + "\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
