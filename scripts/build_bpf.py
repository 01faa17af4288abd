#!/usr/bin/env python3
"""Compile the switch-side eBPF programs (fabric/bpf/*.bpf.c) with clang.

    fabric/bpf/queue.bpf.c ─ clang -O2 -g -target bpf -mcpu=v3 ─▶ fabric/bpf/queue.bpf.o

fabric/bpf/wire.h, the wire offsets and `struct count` the programs share, is written
first from fabric/wire.py (`c_header`) when it differs. fabric.libbpf loads the objects
at run time; nothing is compiled then. -mcpu=v3 gives
the atomic exchange the wake-up needs (Linux 5.12 and later run it); -g keeps the BTF
libbpf reads the maps and `cfg` from. An object is rebuilt when its source or a header
of fabric/bpf is newer or --force says so. The .o files are not committed (.gitignore).
scripts/setup.sh runs this after installing Debian's clang and libbpf-dev.

    python3 scripts/build_bpf.py [--force] [--check]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))        # this checkout's fabric.wire, not an installed one

from fabric.wire import c_header  # noqa: E402

SOURCES = ROOT / "fabric" / "bpf"
HEADER = SOURCES / "wire.h"
FLAGS = ("-O2", "-g", "-target", "bpf", "-mcpu=v3", "-Wall", "-Werror")


def objects() -> list[tuple[Path, Path]]:
    return [(src, src.with_suffix(".o")) for src in sorted(SOURCES.glob("*.bpf.c"))]


def stale() -> list[Path]:
    """The objects that are missing or older than their source or a header."""
    headers = max((h.stat().st_mtime for h in SOURCES.glob("*.h")), default=0.0)
    return [obj for src, obj in objects()
            if not obj.exists() or obj.stat().st_mtime < max(src.stat().st_mtime, headers)]


def header_current() -> bool:
    return HEADER.exists() and HEADER.read_text() == c_header()


def write_header() -> None:
    """fabric/bpf/wire.h from fabric/wire.py, if it differs (its mtime then rebuilds all)."""
    if not header_current():
        HEADER.write_text(c_header())
        print(f"[build_bpf] wrote {HEADER.relative_to(ROOT)} from fabric/wire.py")


def build(src: Path, obj: Path) -> None:
    # the multiarch include directory holds asm/types.h, which linux/bpf.h includes
    arch = sysconfig.get_config_var("MULTIARCH") or "x86_64-linux-gnu"
    cmd = ["clang", *FLAGS, f"-I/usr/include/{arch}", "-c", str(src), "-o", str(obj)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"[build_bpf] clang failed on {src.name}:\n{done.stderr}")
    print(f"[build_bpf] built {obj.relative_to(ROOT)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="rebuild every object")
    ap.add_argument("--check", action="store_true",
                    help="only say whether an object is missing or stale (exit 1 if so)")
    args = ap.parse_args(argv)
    if args.check and not header_current():
        print(f"[build_bpf] stale: {HEADER.relative_to(ROOT)}")
        return 1
    if not args.check:
        write_header()
    todo = [obj for _, obj in objects()] if args.force else stale()
    if args.check:
        for obj in todo:
            print(f"[build_bpf] stale: {obj.relative_to(ROOT)}")
        return 1 if todo else 0
    if todo and shutil.which("clang") is None:
        print("[build_bpf] needs clang (Debian's clang, installed by scripts/setup.sh)",
              file=sys.stderr)
        return 2
    for src, obj in objects():
        if obj in todo:
            build(src, obj)
    if not todo:
        print("[build_bpf] eBPF objects up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
