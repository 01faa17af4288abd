"""Where results and drawings go: refused in one line (exit 2) when no folder can be made
there, before anything is built or written (testbed.outputs)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from testbed.outputs import check_output_folder, filesystem_of, make_folder
from topologies.spec import SpecError

from .test_cli import ROOT, run_cli

RUN = ["run", "--topology", "leaf_spine", "--workload", "allreduce"]


def one_line(out, words: str) -> bool:
    lines = out.stderr.strip().splitlines()
    return out.returncode == 2 and len(lines) == 1 and words in lines[0]


def test_a_file_on_the_way_a_pseudo_filesystem_and_a_read_only_folder(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(SpecError, match=r"^--results: .* is a file$"):
        check_output_folder("--results", afile / "deeper" / "still")
    with pytest.raises(SpecError, match="a proc filesystem"):
        check_output_folder("--results", "/proc/xyz")
    with pytest.raises(SpecError, match="a sysfs filesystem"):
        check_output_folder("output", "/sys/kernel/nope")
    assert make_folder("--results", tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert (tmp_path / "a" / "b").is_dir()
    assert filesystem_of(tmp_path) not in (None, "proc", "sysfs")


def test_the_mount_that_holds_a_path_is_the_longest_prefix(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text("rootfs / ext4 rw 0 0\nproc /proc proc rw 0 0\n"
                      "tmpfs /proc/tmp\\040dir tmpfs rw 0 0\n")
    assert filesystem_of(tmp_path, mounts) == "ext4"
    assert filesystem_of("/proc/1", mounts) == "proc"
    assert filesystem_of("/procs", mounts) == "ext4"        # a prefix of the name only
    assert filesystem_of(tmp_path / "none", tmp_path / "missing") is None


@pytest.mark.parametrize("where", ["file", "file/below", "/proc/xyz"])
def test_run_refuses_a_results_folder_it_cannot_make(tmp_path, where):
    (tmp_path / "file").write_text("x")
    results = where if where.startswith("/") else str(tmp_path / where)
    out = run_cli(*RUN, "--results", results)
    assert one_line(out, "testbed run: experiment.results_dir: "), out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


@pytest.mark.parametrize(("output", "words"), [
    ("/proc/x.png", "output: /proc is on /proc, a proc filesystem"),
    ("file/x.png", "is a file"),
    (".", "is a folder; name the file to write"),
    ("missing/x.png", "missing does not exist: the folder must exist"),
    ("x.txt", "ends in .txt; allowed: .png, .svg, .pdf"),
])
def test_graph_refuses_an_output_it_cannot_write(tmp_path, output, words):
    (tmp_path / "file").write_text("x")
    path = output if output.startswith("/") else str(tmp_path / output)
    out = run_cli("graph", "leaf_spine", "-o", path)
    assert one_line(out, words), out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_a_script_refuses_a_results_file(tmp_path):
    (tmp_path / "file").write_text("x")
    out = subprocess.run([sys.executable, "scripts/pfc_hol.py", "--results",
                          str(tmp_path / "file")], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert one_line(out, "--results: "), out.stderr
