"""Detect which kernel features and tools this machine has, and what a missing one disables.

Kernel features are tested for real, never guessed from version numbers: each qdisc is
added to a veth inside a scratch namespace named ``aft-doctor-*`` (removed in a finally
block), and nftables loads a table there. The root namespace is never touched. Qdisc
results are cached per process because shaping code asks ``has("netem")`` repeatedly.
"""

from __future__ import annotations

import errno
import functools
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import struct
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from pyroute2 import GenericNetlinkSocket, IPRoute, NetlinkError, netns
from pyroute2.netlink import genlmsg

from fabric import netns as fabric_netns

NS_PREFIX = "aft-doctor-"
TIMEOUT_S = 10.0
FIB_SEED_PATH = Path("/proc/sys/net/ipv4/fib_multipath_hash_seed")
REPO_ROOT = Path(__file__).resolve().parent.parent
ENGINE_PROBE = "from traffic.engine import engine; print(engine())"
NEEDS_ROOT = "needs root"          # how a probe that was not run for want of root begins
TABLE_WIDTH_CHARS, STATUS_WIDTH, MIN_DETAIL_CHARS = 100, len("not checked"), 30

# Minimal valid pyroute2 arguments per kind (pyroute2 units: netem delay in us, tbf
# latency in us, burst in bytes). red and fq have no pyroute2 encoder: they are sent
# without options, which fq and bfifo accept; red answers EINVAL if the kernel has it.
QDISC_ARGS: dict[str, dict[str, object]] = {
    "netem": {"delay": 1000},
    "red": {},
    "prio": {"bands": 3, "priomap": [1, 2, 2, 2, 1, 2, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1]},
    "fq": {},
    "htb": {"handle": "1:", "default": 0x10},
    "tbf": {"rate": "1mbit", "burst": 10000, "latency": 50000},
    "clsact": {},
    "ingress": {},
    "bfifo": {},
}
QDISC_KINDS = tuple(QDISC_ARGS)

DISABLES: dict[str, str] = {
    "netem": "propagation delay and BER loss in the kernel: loss falls back to nftables "
    "numgen drop at each link's receiving port (netdev ingress); delay (`delay = on`) to "
    "the agents' delay line, each path's delay added at its receiver (switch queues and "
    "PFC pauses see none of it)",
    "red": "the RED qdisc; ECN marking runs in eBPF instead (ecn_marking)",
    "prio": "strict-priority bands per egress port (prio qdisc)",
    "fq": "per-flow fair queueing and pacing on host NICs (fq qdisc)",
    "htb": "rate-limited links and traffic classes: no link shaping at all",
    "tbf": "single-rate token-bucket links (tbf qdisc)",
    "clsact": "tc filters and actions at ingress/egress (taps, mirred, bpf)",
    "ingress": "ingress policing and redirect (ingress qdisc)",
    "bfifo": "byte-limited queues: buffer depth in bytes",
    "openvswitch": "OVS kernel switches; the testbed uses Linux routers and bridges",
    "ebpf_counters": "PFC occupancy from eBPF byte counters in the kernel: the PFC "
    "controller polls a netlink dump per switch instead (>= 1 ms, slower reactions)",
    "pfc_wake": "the PFC controller cannot sleep while nothing is queued (the counters "
    "wake it through a BPF ring buffer): it polls every pfc_poll_ms all along",
    "ecn_marking": "ECN: switches cannot mark CE (bpf_skb_ecn_set_ce on the eBPF "
    "counters' occupancy); `ecn = on` runs say it did not run",
    "packet_trimming": "UET packet trimming: switches cannot cut a frame to its headers "
    "(bpf_skb_change_tail on the eBPF counters' occupancy); `trimming = on` runs say it "
    "did not run and full queues drop",
    "shaping_timers": "the fidelity verdict cannot see shaped ports' timers firing late "
    "(qdisc watchdogs, eBPF on the timer tracepoints): wire time the kernel's shaping "
    "lost is not measured, and the run says so",
    "nftables": "random loss through nftables numgen drop at each link's receiving port "
    "(netdev ingress hook) and packet marks; without netem as well, no loss emulation",
    "fib_multipath_hash_seed": "reproducible ECMP hashing across runs",
    "tcpdump": "packet capture into pcaps/*.pcap",
    "tshark": "decoding captures (infiniband.bth.*, macc.cbfc.*) in reports",
    "iperf3": "TCP/UDP baseline throughput measurements",
    "ping": "reachability and RTT checks",
    "mnexec": "Mininet hosts: Mininet cannot start nodes",
    "brctl": "the plain-Mininet baseline benchmark (fabric_build_vs_mininet)",
    "vagrant": "the Vagrant VM with a full kernel (optional)",
    "mininet": "the Mininet-based fabric and the plain-Mininet baseline",
    "scapy": "packet building (RoCEv2 BTH/ICRC, PFC frames) and traffic agents",
    "compiled_data_path": "the agents' compiled per-packet code (traffic.engine): they run "
    "interpreted, at more CPU per packet (docs/compiled.md); `bash scripts/setup.sh` builds it",
}
TOOLS: dict[str, list[str]] = {
    "tcpdump": ["--version"],
    "tshark": ["--version"],
    "iperf3": ["--version"],
    "ping": ["-V"],
    "mnexec": ["-v"],
    "brctl": ["-V"],
    "vagrant": ["--version"],
}
MODULES = ("mininet", "scapy")
NFT_PROBE = """add table inet aft_doctor
add chain inet aft_doctor out { type filter hook output priority 0; }
add rule inet aft_doctor out numgen random mod 1000 < 1 drop
add rule inet aft_doctor out meta mark set 0x2a
delete table inet aft_doctor
add table netdev aft_doctor_in
add chain netdev aft_doctor_in in { type filter hook ingress device "lo" priority 0; }
add rule netdev aft_doctor_in in numgen random mod 1000 < 1 drop
delete table netdev aft_doctor_in
"""


@dataclass
class Check:
    name: str
    available: bool
    detail: str
    disables: str
    checked: bool = True      # False: not probed (it needs root), so neither yes nor NO


def _is_root() -> bool:
    return os.geteuid() == 0


@contextmanager
def _scratch_namespace() -> Iterator[str]:
    """A throwaway network namespace; removed on exit whatever happens."""
    name = f"{NS_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:6]}"
    fabric_netns.create(name)   # marked as ours: clean removes it after a crash
    try:
        yield name
    finally:
        netns.remove(name)


PRESENT = "present"


def qdisc_available(reason: str | None) -> bool:
    """A _try_qdisc answer: created (None), or known to the kernel though not created."""
    return reason is None or reason.startswith(PRESENT)


def _try_qdisc(ipr: IPRoute, kind: str, slot: int, encoders: dict) -> str | None:
    """Add `kind` as the qdisc of a fresh veth; None if the kernel took it, else why not
    (or, starting with PRESENT, that the kernel has it though it was not created)."""
    ipr.link("add", ifname=f"aftd{slot}", kind="veth", peer=f"aftp{slot}")
    index = ipr.link_lookup(ifname=f"aftd{slot}")[0]
    try:
        ipr.tc("add", kind, index=index, **QDISC_ARGS[kind])
    except NetlinkError as err:
        if err.code == errno.ENOENT:  # qdisc_create found no such kind
            return f"kernel has no {kind} qdisc (NetlinkError ENOENT)"
        if kind not in encoders and err.code == errno.EINVAL:
            # qdisc_create found the kind and its init refused the options pyroute2
            # cannot give it: the kernel has it, unconfigured here
            return (f"{PRESENT}: the kernel has {kind} (it refused empty options: "
                    f"pyroute2 has no {kind} encoder, and the testbed does not configure it)")
        if kind not in encoders:
            return f"pyroute2 cannot encode {kind} options (kernel: {err.args[-1]})"
        return f"kernel refused {kind}: NetlinkError {err.code} {err.args[-1]}"
    except (KeyError, TypeError, ValueError, struct.error) as err:  # pyroute2 encoding
        return f"pyroute2 cannot encode {kind}: {type(err).__name__}: {err}"
    kinds = {q.get_attr("TCA_KIND") for q in ipr.get_qdiscs(index=index)}
    return None if kind in kinds else f"{kind} accepted but not listed by the kernel"


def _probe_qdiscs(kinds: Iterable[str]) -> dict[str, str | None]:
    """Seam: for each kind, None if it works, else the reason (needs root)."""
    with _scratch_namespace() as name, IPRoute(netns=name) as ipr:
        encoders = ipr.tc("modules")
        return {k: _try_qdisc(ipr, k, i, encoders) for i, k in enumerate(kinds)}


@functools.cache
def _qdisc_reasons() -> dict[str, str | None]:
    if not _is_root():
        return {kind: NEEDS_ROOT for kind in QDISC_KINDS}
    return _probe_qdiscs(QDISC_KINDS)


def _run_version(argv: list[str]) -> str:
    """First line a tool prints for its version flag; its path if it prints nothing."""
    try:
        done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"{argv[0]} (version unknown: {err})"
    lines = [line.strip() for line in (done.stdout + done.stderr).splitlines()]
    return next((line for line in lines if line), argv[0]) if done.returncode == 0 else argv[0]


def _check_tool(name: str) -> Check:
    path = shutil.which(name)
    if path is None:
        return Check(name, False, "not found in PATH", DISABLES[name])
    return Check(name, True, _run_version([path, *TOOLS[name]]), DISABLES[name])


def _check_module(name: str) -> Check:
    if importlib.util.find_spec(name) is None:
        return Check(name, False, "python module not importable", DISABLES[name])
    try:
        detail = f"{name} {importlib.metadata.version(name)}"
    except importlib.metadata.PackageNotFoundError:
        detail = f"{name} (version unknown)"
    return Check(name, True, detail, DISABLES[name])


def _probe_ovs() -> tuple[bool, str]:
    """Seam: resolving the generic netlink family makes the kernel load openvswitch."""
    sock = GenericNetlinkSocket()
    sock.asyncore.module_err_level = "debug"  # pyroute2 logs a missing family as an error
    try:
        sock.bind("ovs_datapath", genlmsg)
    except NetlinkError as err:
        return False, f"no ovs_datapath genl family ({errno.errorcode.get(err.code, err.code)})"
    finally:
        sock.close()
    return True, "ovs_datapath generic netlink family present"


def _probe_nftables() -> tuple[bool, str]:
    """Seam: load a numgen/mark table into a scratch namespace with the nft binary."""
    path = shutil.which("nft")
    if path is None:
        return False, "nft not found in PATH"
    version = _run_version([path, "--version"])
    if not _is_root():
        return False, f"{NEEDS_ROOT} for the kernel check ({version})"
    with _scratch_namespace() as name:
        fd = os.open(os.path.join(netns.NETNS_RUN_DIR, name), os.O_RDONLY)
        try:
            done = subprocess.run(
                [path, "-f", "-"],
                input=NFT_PROBE,
                capture_output=True,
                text=True,
                check=False,
                timeout=TIMEOUT_S,
                preexec_fn=functools.partial(netns.setns, fd),
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            return False, f"nft failed to run: {err}"
        finally:
            os.close(fd)
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[0]
        return False, f"kernel refused the table: {reason}"
    return True, version


def _probe_ebpf() -> tuple[bool, str]:
    """Seam: create the counters' map and load one counter program (fabric.queue_counters,
    through libbpf); attaching it needs clsact, which has its own check."""
    from fabric.queue_counters import hook_config, scratch_hook
    if not _is_root():
        return False, f"{NEEDS_ROOT} (bpf(2) loads programs as root)"
    try:
        with scratch_hook(4, hook_config(0, 26, (2, [1]))):
            pass
    except OSError as err:
        return False, f"refused: {err.strerror or err}"
    return True, "mmapable array map and a clsact counter program (libbpf) loaded"


def _lossless_frame(ecn: int) -> bytes:
    """A 62-byte frame the counter programs take for lossless (DSCP 26) with the given
    ECN bits: Ethernet, the first 4 bytes of an IPv4 header, zeros."""
    return bytes(12) + b"\x08\x00" + bytes([0x45, (26 << 2) | ecn, 0, 48]) + bytes(44)


def _probe_wake() -> tuple[bool, str]:
    """Seam: arm the wake-up (fabric.queue_wake) and run a counter program once on a
    lossless frame (BPF_PROG_TEST_RUN): the kernel itself puts the record in the ring."""
    import mmap

    from fabric.libbpf import test_run
    from fabric.queue_counters import create_map, hook_config, load_hook, make_waker
    if not _is_root():
        return False, f"{NEEDS_ROOT} (bpf(2) loads programs as root)"
    frame = _lossless_frame(ecn=0)
    fds: list[int] = []
    waker = None
    try:
        fds.append(create_map(4))
        with mmap.mmap(fds[0], mmap.PAGESIZE) as mm, memoryview(mm) as raw, \
                raw.cast("Q") as values:
            waker = make_waker(fds[0], values, 3)
            fds.append(load_hook(fds[0], hook_config(0, 26, (1, [1]), wake_entry=3),
                                 waker.ring_fd))
            waker.arm()
            test_run(fds[1], frame)
            woke, wakes = waker.drain(), waker.wakes()
            waker.close()
            waker = None
    except OSError as err:
        return False, f"refused: {err.strerror or err}"
    finally:
        if waker is not None:
            waker.close()
        for fd in fds:
            os.close(fd)
    if woke is None or wakes != 1:
        return False, "an armed test run left the ring buffer empty"
    return True, "an armed counter program put its time into a BPF ring buffer"


def _run_in_kernel(entries: int, cfg, frame: bytes, queued: int = 0) -> bytes:
    """Load the counter program with `cfg` on a fresh counters map of `entries` (entry
    0's bytes = `queued`) and run it once on `frame` (BPF_PROG_TEST_RUN): the frame as
    the program passed it on. OSError where the kernel refuses."""
    from fabric.libbpf import test_run
    from fabric.queue_counters import scratch_hook
    with scratch_hook(entries, cfg) as (prog_fd, values):
        values[0] = queued
        return test_run(prog_fd, frame)[1]


def _probe_ecn() -> tuple[bool, str]:
    """Seam: a marking program run once on an ECT(0) frame over kmax (BPF_PROG_TEST_RUN):
    the kernel itself says whether it sets CE."""
    from fabric.queue_counters import Ecn, hook_config
    if not _is_root():
        return False, f"{NEEDS_ROOT} (bpf(2) loads programs as root)"
    frame = _lossless_frame(ecn=2)                   # ECT(0)
    try:
        out = _run_in_kernel(3, hook_config(0, 26, ecn=(2, Ecn(0, 1, 1.0))), frame)
    except OSError as err:
        return False, f"refused: {err.strerror or err}"
    if out[15] & 3 != 3:
        return False, "a test run over kmax left the frame unmarked"
    return True, "a test run set CE (bpf_skb_ecn_set_ce) on an ECT(0) frame over kmax"


def _probe_trim() -> tuple[bool, str]:
    """Seam: a trimming program run once on a UET data frame over its threshold
    (BPF_PROG_TEST_RUN): the kernel itself cuts it, or says why not."""
    import struct

    from fabric.queue_counters import hook_config
    from fabric.trimming import Trim, ip_checksum, trimmed_frame_ok
    if not _is_root():
        return False, f"{NEEDS_ROOT} (bpf(2) loads programs as root)"
    bth = struct.pack(">BBHBBHI", 0x04, 0, 0xFFFF, 0, 0x80, 5, 7)      # UET (dQPN bit 23)
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, (26 << 2) | 2, 20 + 8 + 12 + 1040, 0, 0, 64,
                     17, 0, bytes(4), bytes(4))
    ip = ip[:10] + struct.pack(">H", ip_checksum(ip)) + ip[12:]
    udp = struct.pack(">HHHH", 49152, 4791, 8 + 12 + 1040, 0)
    frame = bytes(12) + b"\x08\x00" + ip + udp + bth + bytes(1040)
    try:
        out = _run_in_kernel(4, hook_config(0, 26, trim=(2, 3, Trim(65536))), frame,
                             queued=1 << 20)
    except OSError as err:
        return False, f"refused: {err.strerror or err}"
    wrong = trimmed_frame_ok(out)
    if wrong:
        return False, f"a test run over the threshold did not trim: {wrong}"
    return True, "a test run cut a UET frame to its 70 B of headers (bpf_skb_change_tail)"


def _probe_timers() -> tuple[bool, str]:
    """Seam: watch the qdisc watchdogs (fabric.shaping_timers) while 40 frames leave a
    veth shaped at 10 Mbit/s in a scratch namespace: its timer must be seen firing."""
    from fabric.shaping_timers import (
        ShapingTimers,
        TimersUnavailableError,
        shaped_burst,
        summarize,
    )
    if not _is_root():
        return False, f"{NEEDS_ROOT} (bpf(2) and perf_event_open on tracepoints)"
    try:
        with ShapingTimers(1e-3) as timers, _scratch_namespace() as name, \
                IPRoute(netns=name) as ipr:
            got = summarize(*shaped_burst(timers, name, ipr), 1e-3)
    except TimersUnavailableError as err:
        return False, str(err)
    except (OSError, NetlinkError) as err:
        return False, f"kernel refused: {err}"
    if not got["firings"]:
        return False, "no qdisc watchdog seen firing while a shaped port sent"
    return True, (f"{got['firings']} watchdog firings of a 10 Mbit/s port seen, late p50 "
                  f"{got['late_p50_us']} us")


def _engine_of_agents() -> str:
    """Seam: traffic.engine.engine() in a fresh interpreter, as an agent process starts
    (asked from outside: fabric sits below traffic)."""
    done = subprocess.run([sys.executable, "-c", ENGINE_PROBE], cwd=REPO_ROOT, check=False,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise RuntimeError(lines[-1] if lines else f"exit status {done.returncode}")
    return done.stdout.strip()


def _probe_compiled() -> tuple[bool, str]:
    """Whether the agents' per-packet modules load compiled (traffic.engine)."""
    try:
        running = _engine_of_agents()
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as err:
        return False, f"cannot tell: {err}; fix: bash scripts/setup.sh"
    if running == "compiled":
        return True, "compiled (Cython extensions beside traffic's modules)"
    return False, f"{running}; fix: bash scripts/setup.sh"


def _check_fib_seed() -> Check:
    name = "fib_multipath_hash_seed"
    found = FIB_SEED_PATH.exists()
    state = "sysctl present" if found else "sysctl missing (needs >= 6.11)"
    return Check(name, found, f"{state}; kernel {platform.release()}", DISABLES[name])


def run_checks() -> list[Check]:
    """Every check, in a stable order: qdiscs, kernel features, tools, python modules."""
    checks = [
        Check(kind, qdisc_available(reason), reason or "created in a scratch namespace",
              DISABLES[kind])
        for kind, reason in _qdisc_reasons().items()
    ]
    for name, probe in (("openvswitch", _probe_ovs), ("nftables", _probe_nftables),
                        ("ebpf_counters", _probe_ebpf), ("pfc_wake", _probe_wake),
                        ("ecn_marking", _probe_ecn),
                        ("packet_trimming", _probe_trim),
                        ("shaping_timers", _probe_timers),
                        ("compiled_data_path", _probe_compiled)):
        ok, detail = probe()
        checks.append(Check(name, ok, detail, DISABLES[name]))
    checks.append(_check_fib_seed())
    checks += [_check_tool(name) for name in TOOLS]
    checks += [_check_module(name) for name in MODULES]
    if not _is_root():       # a probe that needs root said so instead of probing
        checks = [replace(c, checked=False)
                  if not c.available and c.detail.startswith(NEEDS_ROOT) else c
                  for c in checks]
    return checks


# Kernel features a check probes in a scratch namespace (root), beside run_checks' others
KERNEL_FEATURES = (*QDISC_KINDS, "openvswitch", "nftables", "ebpf_counters", "pfc_wake",
                   "ecn_marking", "packet_trimming", "shaping_timers")


def checks_without_namespace() -> list[Check]:
    """The checks that need no root and build nothing: the ECMP seed sysctl, the tools
    and the python modules (the kernel features need a scratch namespace: run_checks)."""
    return [_check_fib_seed(), *(_check_tool(name) for name in TOOLS),
            *(_check_module(name) for name in MODULES)]


@functools.cache
def _cached_checks() -> tuple[Check, ...]:
    return tuple(run_checks())


def clear_cache() -> None:
    """Forget cached results so the next call probes again."""
    _qdisc_reasons.cache_clear()
    _cached_checks.cache_clear()


def has(name: str, checks: list[Check] | None = None) -> bool:
    """Whether feature `name` is available; probes (once per process) if checks is None."""
    if checks is None and name in QDISC_KINDS:
        return qdisc_available(_qdisc_reasons()[name])
    for check in checks if checks is not None else _cached_checks():
        if check.name == name:
            return check.available
    raise KeyError(f"unknown check {name!r}")


def format_table(checks: Iterable[Check], width_chars: int = TABLE_WIDTH_CHARS) -> str:
    """Fixed-width table within `width_chars` columns: feature, status (yes, NO, or not
    checked: it needs root), the detail wrapped in its column, and under a missing
    feature what it disables ("without it: ...")."""
    checks = list(checks)
    name_w = max([len("feature"), *(len(c.name) for c in checks)])
    indent = 2 + name_w + 2 + STATUS_WIDTH + 2
    detail_w = max(MIN_DETAIL_CHARS, width_chars - indent)
    rows = [f"# {'feature':<{name_w}}  {'status':<{STATUS_WIDTH}}  detail / without it"]
    for c in checks:
        status = "yes" if c.available else "NO" if c.checked else "not checked"
        detail = textwrap.wrap(c.detail, detail_w) or [""]
        if c.checked and not c.available:
            detail += textwrap.wrap(f"without it: {c.disables}", detail_w)
        rows.append(f"  {c.name:<{name_w}}  {status:<{STATUS_WIDTH}}  {detail[0]}".rstrip())
        rows += [" " * indent + line for line in detail[1:]]
    return "\n".join(rows) + "\n"


def to_json(checks: Iterable[Check]) -> dict:
    """{"checks": [{"name", "available", "detail", "disables", "checked"}, ...]}."""
    return {"checks": [asdict(c) for c in checks]}
