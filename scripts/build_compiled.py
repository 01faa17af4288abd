#!/usr/bin/env python3
"""Compile the per-packet modules (traffic.engine.COMPILED_MODULES) in place with Cython.

    traffic/transport.py (+ transport.pxd, if any) ─ cythonize ─▶ traffic/transport.c
        ─ cc -O2 -shared ─▶ traffic/transport.cpython-311-x86_64-linux-gnu.so

The .so lands beside its .py, so `import traffic.transport` loads the extension
(AFT_ENGINE=interpreted loads the .py regardless: traffic/__init__.py). The modules are
plain Python in Cython's pure-Python mode, the same source either way. Idempotent: a
module is rebuilt only when its .py or .pxd, Cython's version or the flags changed (a
stamp per module in build/compiled/). The generated .c and .so are not committed
(.gitignore). scripts/setup.sh runs it after installing the pinned packages.

    python scripts/build_compiled.py [--force] [--clean] [--check] [--jobs N]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import importlib.machinery
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from traffic.engine import COMPILED_MODULES

ROOT = Path(__file__).resolve().parent.parent

STAMPS = ROOT / "build" / "compiled"
CFLAGS = ("-O2", "-fPIC", "-fwrapv", "-fno-strict-aliasing", "-DNDEBUG", "-w")
LDLIBS = ("-lz",)       # zlib's crc32 (traffic/patch.pxd); linked only where used
# annotation_typing off: a hint such as `frame: bytearray` or `rate: float` stays a hint
# (Cython would otherwise enforce or convert it); C types come only from the explicit
# pure-mode declarations (cython.locals, cython.declare, .pxd), so both engines run the
# same program.
DIRECTIVES = {"language_level": 3, "annotation_typing": False, "binding": True}
EXT_SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def sources(module: str) -> tuple[Path, Path | None]:
    """The module's .py and its .pxd (None if it has none)."""
    py = ROOT.joinpath(*module.split(".")).with_suffix(".py")
    pxd = py.with_suffix(".pxd")
    return py, pxd if pxd.exists() else None


def extension(module: str) -> Path:
    return ROOT.joinpath(*module.split(".")).with_suffix("").with_name(
        module.rpartition(".")[2] + EXT_SUFFIX)


def fingerprint(module: str) -> str:
    """What the extension is built from: sources, Cython's version, flags, directives."""
    import Cython
    py, _ = sources(module)
    h = hashlib.sha256()
    # every .pxd of the package: a module cimports its neighbours' types (their layout
    # is compiled into it), so a change to any of them rebuilds it
    pxds = b"".join(p.name.encode() + b"\0" + p.read_bytes()
                    for p in sorted(py.parent.glob("*.pxd")))
    for part in (py.read_bytes(), pxds, Cython.__version__,
                 " ".join(CFLAGS + LDLIBS), repr(sorted(DIRECTIVES.items())), EXT_SUFFIX,
                 sys.version):
        h.update(part if isinstance(part, bytes) else part.encode())
        h.update(b"\0")
    return h.hexdigest()


def stamp_path(module: str) -> Path:
    return STAMPS / f"{module}.sha256"


def up_to_date(module: str) -> bool:
    stamp = stamp_path(module)
    return (extension(module).exists() and stamp.exists()
            and stamp.read_text().strip() == fingerprint(module))


def cythonize(module: str) -> None:
    """Generate the module's .c (one at a time: Cython's compiler is not thread-safe)."""
    from Cython.Build import cythonize as run
    py, _ = sources(module)
    run([str(py)], compiler_directives=DIRECTIVES, quiet=True, force=True)


def build(module: str) -> str:
    """Compile one module's .c; the extension replaces the old one atomically (a process
    importing it meanwhile sees the old or the new file, never half of one)."""
    py, _ = sources(module)
    want = fingerprint(module)
    c_file = py.with_suffix(".c")
    so = extension(module)
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    fd, tmp = tempfile.mkstemp(suffix=EXT_SUFFIX, dir=so.parent)
    os.close(fd)
    try:
        subprocess.run([*cc.split(), "-shared", *CFLAGS,
                        f"-I{sysconfig.get_paths()['include']}", str(c_file), "-o", tmp,
                        "-Wl,--as-needed", *LDLIBS],
                       check=True)
        os.chmod(tmp, 0o755)
        os.replace(tmp, so)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    STAMPS.mkdir(parents=True, exist_ok=True)
    stamp_path(module).write_text(want + "\n")
    return module


def clean() -> None:
    for module in COMPILED_MODULES:
        py, _ = sources(module)
        for path in (extension(module), py.with_suffix(".c"), stamp_path(module)):
            path.unlink(missing_ok=True)
    shutil.rmtree(STAMPS, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="rebuild every module")
    ap.add_argument("--clean", action="store_true", help="remove the extensions and exit")
    ap.add_argument("--check", action="store_true",
                    help="build nothing; exit 1 if a module is missing or stale")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    if args.clean:
        clean()
        print("[build_compiled] removed the compiled modules")
        return 0
    stale = [m for m in COMPILED_MODULES if args.force or not up_to_date(m)]
    if args.check:
        for m in stale:
            print(f"[build_compiled] stale or missing: {m}")
        return 1 if stale else 0
    if not stale:
        print(f"[build_compiled] all {len(COMPILED_MODULES)} modules up to date")
        return 0
    try:
        import Cython
    except ImportError:
        print("[build_compiled] Cython is not installed (requirements.txt pins it)",
              file=sys.stderr)
        return 2
    print(f"[build_compiled] Cython {Cython.__version__}: building {', '.join(stale)}")
    for module in stale:
        cythonize(module)
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for module in pool.map(build, stale):
            print(f"[build_compiled] built {module} -> {extension(module).name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
