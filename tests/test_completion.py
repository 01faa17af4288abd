"""`testbed completion bash`: a script bash accepts, naming every verb, that completes
verbs, flags, fixed values and topology names the way a user presses Tab."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from testbed.cli import build_parser
from testbed.completion import _verbs

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def script(tmp_path_factory) -> Path:
    out = subprocess.run([sys.executable, "-m", "testbed", "completion", "bash"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    path = tmp_path_factory.mktemp("completion") / "testbed.bash"
    path.write_text(out.stdout)
    return path


def complete(script: Path, *words: str) -> list[str]:
    """What Tab offers after `testbed WORDS...` (the last word is the one being typed)."""
    line = " ".join(f"'{w}'" for w in ("testbed", *words))
    probe = (f"source {script}; COMP_WORDS=({line}); COMP_CWORD={len(words)}; _testbed; "
             'printf "%s\\n" "${COMPREPLY[@]}"')
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return [w for w in out.stdout.splitlines() if w]


def test_bash_accepts_the_script_and_it_names_every_verb(script):
    assert subprocess.run(["bash", "-n", str(script)], timeout=30).returncode == 0
    verbs = set(_verbs(build_parser()))
    assert {"deploy", "run", "exec", "completion", "settings"} <= verbs
    assert set(complete(script, "")) >= verbs | {"-v", "-q"}
    assert "complete -o filenames -F _testbed testbed" in script.read_text()


def test_it_completes_verbs_flags_values_and_topologies(script):
    assert complete(script, "de") == ["deploy", "destroy"]
    assert complete(script, "-q", "ins") == ["inspect"]
    assert "--workload" in complete(script, "run", "--wor")
    assert complete(script, "run", "--cc", "") == ["none", "dcqcn", "nscc"]
    assert complete(script, "inspect", "--format", "j") == ["json"]
    assert set(complete(script, "deploy", "rail")) >= {"rail_only", "rail_optimized"}
    assert "link_profiles" not in complete(script, "validate", "")   # not a topology
    assert complete(script, "completion", "") == ["bash"]
    assert "--seed" in complete(script, "deploy", "--")
