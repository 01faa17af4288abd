"""The few libbpf calls the testbed makes (Debian's libbpf1, through ctypes).

The switch-side programs are C (fabric/bpf/*.bpf.c), compiled by clang when
scripts/setup.sh builds the project (scripts/build_bpf.py), never at run time.
Each is loaded as libbpf loads any object:

    BpfObject("queue", ["aft_count"], config, maps={"counters": fd})
        open fabric/bpf/queue.bpf.o ─▶ only the named programs load ─▶ the object's
        `cfg` (its .rodata) := config, a ctypes Structure that mirrors it ─▶ the named
        maps reuse the caller's fds (one map the controller mmaps, shared by every
        port's program) ─▶ load (the verifier's last lines in the error if it refuses)

A loaded program's fd outlives the object (`keep`), so hundreds of ports hold an fd
each, not an object each. Maps the caller shares are made here too (`create_map`), and
`test_run` runs a program once on a frame (BPF_PROG_TEST_RUN) for the doctor, the
tests and the controller's arming. Where libbpf or an object is missing, BpfError says
which and what to run.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from pathlib import Path

OBJ_DIR = Path(__file__).resolve().parent / "bpf"
LOG_BYTES = 1 << 16

BPF_MAP_TYPE_ARRAY, BPF_MAP_TYPE_LPM_TRIE = 2, 11
BPF_MAP_TYPE_RINGBUF = 27
BPF_F_NO_PREALLOC, BPF_F_MMAPABLE = 1, 1 << 10


class BpfError(OSError):
    """libbpf or the kernel refused (the message says what and why)."""


class _MapCreateOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("btf_fd", ctypes.c_uint32),
                ("btf_key_type_id", ctypes.c_uint32), ("btf_value_type_id", ctypes.c_uint32),
                ("btf_vmlinux_value_type_id", ctypes.c_uint32),
                ("inner_map_fd", ctypes.c_uint32), ("map_flags", ctypes.c_uint32),
                ("map_extra", ctypes.c_uint64), ("numa_node", ctypes.c_uint32),
                ("map_ifindex", ctypes.c_uint32)]


class _TestRunOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("data_in", ctypes.c_void_p),
                ("data_out", ctypes.c_void_p), ("data_size_in", ctypes.c_uint32),
                ("data_size_out", ctypes.c_uint32), ("ctx_in", ctypes.c_void_p),
                ("ctx_out", ctypes.c_void_p), ("ctx_size_in", ctypes.c_uint32),
                ("ctx_size_out", ctypes.c_uint32), ("retval", ctypes.c_uint32),
                ("repeat", ctypes.c_int), ("duration", ctypes.c_uint32),
                ("flags", ctypes.c_uint32), ("cpu", ctypes.c_uint32),
                ("batch_size", ctypes.c_uint32)]


_LIB: ctypes.CDLL | None = None
_P = ctypes.c_void_p
_SIGNATURES = {   # name: (restype, argtypes)
    "bpf_object__open_file": (_P, [ctypes.c_char_p, _P]),
    "bpf_object__load": (ctypes.c_int, [_P]),
    "bpf_object__close": (None, [_P]),
    "bpf_object__next_program": (_P, [_P, _P]),
    "bpf_object__find_program_by_name": (_P, [_P, ctypes.c_char_p]),
    "bpf_object__find_map_by_name": (_P, [_P, ctypes.c_char_p]),
    "bpf_program__name": (ctypes.c_char_p, [_P]),
    "bpf_program__fd": (ctypes.c_int, [_P]),
    "bpf_program__set_autoload": (ctypes.c_int, [_P, ctypes.c_bool]),
    "bpf_program__set_log_buf": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_size_t]),
    "bpf_map__reuse_fd": (ctypes.c_int, [_P, ctypes.c_int]),
    "bpf_map__set_autocreate": (ctypes.c_int, [_P, ctypes.c_bool]),
    "bpf_map__set_initial_value": (ctypes.c_int, [_P, _P, ctypes.c_size_t]),
    "bpf_map__initial_value": (_P, [_P, ctypes.POINTER(ctypes.c_size_t)]),
    "bpf_map__fd": (ctypes.c_int, [_P]),
    "bpf_map_create": (ctypes.c_int, [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32,
                                      ctypes.c_uint32, ctypes.c_uint32, _P]),
    "bpf_map_update_elem": (ctypes.c_int, [ctypes.c_int, _P, _P, ctypes.c_uint64]),
    "bpf_prog_test_run_opts": (ctypes.c_int, [ctypes.c_int, _P]),
    "libbpf_set_print": (_P, [_P]),
}


def lib() -> ctypes.CDLL:
    """libbpf.so.1, its signatures declared; its own printing off (errors come back as
    exceptions carrying the verifier's log)."""
    global _LIB
    if _LIB is None:
        path = ctypes.util.find_library("bpf")
        try:
            handle = ctypes.CDLL(path or "libbpf.so.1", use_errno=True)
        except OSError as exc:
            raise BpfError(errno.ENOENT, f"libbpf not found ({exc}): run scripts/setup.sh, which "
                           "installs Debian's libbpf1") from None
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(handle, name)
            fn.restype, fn.argtypes = restype, argtypes
        handle.libbpf_set_print(None)
        _LIB = handle
    return _LIB


def _check(rc: int, what: str) -> int:
    if rc < 0:
        err = ctypes.get_errno() or -rc
        raise BpfError(err, f"{what}: {os.strerror(err)}")
    return rc


def object_path(name: str) -> Path:
    return OBJ_DIR / f"{name}.bpf.o"


class BpfObject:
    """One compiled object opened, configured and loaded (module docstring). `programs`
    are the ones to load (the others are skipped); `config` the bytes of its `cfg`;
    `maps` name -> an fd to reuse; `skip_maps` maps it must not create (unused by the
    programs it loads). close() frees it and every fd it made."""

    def __init__(self, name: str, programs: list[str], config: ctypes.Structure | None = None,
                 maps: dict[str, int] | None = None, skip_maps: tuple[str, ...] = ()):
        self.name = name
        path = object_path(name)
        if not path.exists():
            raise BpfError(errno.ENOENT, f"{path.name} is not built: run scripts/setup.sh (clang "
                           "compiles fabric/bpf/*.bpf.c; an installed package has the objects "
                           "built before its install)")
        self.lib = lib()
        self.obj = self.lib.bpf_object__open_file(str(path).encode(), None)
        if not self.obj:
            _check(-1, f"libbpf could not open {path.name}")
        self.logs: dict[str, ctypes.Array] = {}
        try:
            self._configure(programs, config, maps or {}, skip_maps)
            if self.lib.bpf_object__load(self.obj) < 0:
                err = ctypes.get_errno()
                raise BpfError(err, f"the kernel refused {name}: {os.strerror(err)}"
                               + self._log_tail())
        except BaseException:
            self.close()
            raise

    def _configure(self, programs, config, maps, skip_maps) -> None:
        prog, wanted = None, set(programs)
        while prog := self.lib.bpf_object__next_program(self.obj, prog):
            pname = self.lib.bpf_program__name(prog).decode()
            self.lib.bpf_program__set_autoload(prog, pname in wanted)
            if pname in wanted:
                wanted.discard(pname)
                self.logs[pname] = buf = ctypes.create_string_buffer(LOG_BYTES)
                self.lib.bpf_program__set_log_buf(prog, buf, LOG_BYTES)
        if wanted:
            raise BpfError(errno.EINVAL, f"{self.name}.bpf.o has no program {sorted(wanted)}")
        if config is not None:
            rodata = self._map(".rodata")
            size = ctypes.c_size_t()
            self.lib.bpf_map__initial_value(rodata, ctypes.byref(size))
            if size.value != ctypes.sizeof(config):
                raise BpfError(errno.EINVAL, f"{self.name}.bpf.o's cfg is {size.value} bytes, the "
                               f"loader's {ctypes.sizeof(config)}: rebuild (scripts/setup.sh)")
            _check(self.lib.bpf_map__set_initial_value(rodata, ctypes.byref(config),
                                                       ctypes.sizeof(config)), "cfg")
        for mname, fd in maps.items():
            _check(self.lib.bpf_map__reuse_fd(self._map(mname), fd), f"map {mname}")
        for mname in skip_maps:
            _check(self.lib.bpf_map__set_autocreate(self._map(mname), False), f"map {mname}")

    def _map(self, name: str) -> int:
        found = self.lib.bpf_object__find_map_by_name(self.obj, name.encode())
        if not found:
            raise BpfError(errno.EINVAL, f"{self.name}.bpf.o has no map {name}")
        return found

    def _log_tail(self) -> str:
        lines = [ln for buf in self.logs.values()
                 for ln in buf.value.decode(errors="replace").strip().splitlines()]
        return (": " + " | ".join(lines[-3:])) if lines else ""

    def program(self, name: str) -> int:
        """A loaded program: a pointer libbpf's attach calls take."""
        prog = self.lib.bpf_object__find_program_by_name(self.obj, name.encode())
        if not prog:
            raise BpfError(errno.EINVAL, f"{self.name}.bpf.o has no program {name}")
        return prog

    def keep(self, program: str) -> int:
        """A new fd of a loaded program, the caller's to close (it outlives the object)."""
        return os.dup(_check(self.lib.bpf_program__fd(self.program(program)), program))

    def map_fd(self, name: str) -> int:
        return _check(self.lib.bpf_map__fd(self._map(name)), f"map {name}")

    def close(self) -> None:
        if self.obj:
            self.lib.bpf_object__close(self.obj)
            self.obj = None

    def __enter__(self) -> BpfObject:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load_program(name: str, program: str, config: ctypes.Structure | None = None,
                 maps: dict[str, int] | None = None, skip_maps: tuple[str, ...] = ()) -> int:
    """One program of object `name`, loaded: its fd (the caller's to close)."""
    with BpfObject(name, [program], config, maps, skip_maps) as obj:
        return obj.keep(program)


def create_map(kind: int, key_bytes: int, value_bytes: int, entries: int, flags: int = 0,
               name: str = "") -> int:
    """A map the caller shares among programs (its fd)."""
    opts = _MapCreateOpts(sz=ctypes.sizeof(_MapCreateOpts), map_flags=flags)
    return _check(lib().bpf_map_create(kind, name.encode()[:15] or None, key_bytes,
                                       value_bytes, entries, ctypes.byref(opts)),
                  f"map of type {kind}")


def update(map_fd: int, key: bytes, value: bytes) -> None:
    k = ctypes.create_string_buffer(key, len(key))
    v = ctypes.create_string_buffer(value, len(value))
    _check(lib().bpf_map_update_elem(map_fd, k, v, 0), "map update")


SKB_INGRESS_IFINDEX = 36     # struct __sk_buff's ingress_ifindex, which a test run may set


def test_run(prog_fd: int, frame: bytes, ingress_ifindex: int = 0) -> tuple[int, bytes]:
    """Run a loaded program once on `frame` (BPF_PROG_TEST_RUN, no interface involved),
    as if it came in by `ingress_ifindex`: its return value and the frame as it left
    the program."""
    data_in = ctypes.create_string_buffer(frame, len(frame))
    data_out = ctypes.create_string_buffer(len(frame) + 256)
    opts = _TestRunOpts(sz=ctypes.sizeof(_TestRunOpts),
                        data_in=ctypes.cast(data_in, ctypes.c_void_p),
                        data_out=ctypes.cast(data_out, ctypes.c_void_p),
                        data_size_in=len(frame), data_size_out=len(data_out), repeat=1)
    if ingress_ifindex:
        ctx = ctypes.create_string_buffer(SKB_INGRESS_IFINDEX + 4)
        ctypes.c_uint32.from_buffer(ctx, SKB_INGRESS_IFINDEX).value = ingress_ifindex
        opts.ctx_in, opts.ctx_size_in = ctypes.cast(ctx, ctypes.c_void_p), len(ctx)
    _check(lib().bpf_prog_test_run_opts(prog_fd, ctypes.byref(opts)), "test run")
    retval = ctypes.c_int32(opts.retval).value
    return retval, data_out.raw[:opts.data_size_out]
