"""The files a new user and CI start from: README commands, installer, CI, Vagrantfile."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_readme_gives_the_quick_start_and_ci_runs_its_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "sudo make demo" in readme and "sudo make test" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/setup.sh" in ci and "sudo make test" in ci


def test_one_installer_for_readme_ci_and_vagrant():
    assert "scripts/setup.sh" in (ROOT / "Vagrantfile").read_text()
    assert "scripts/setup.sh" in (ROOT / "Makefile").read_text()
    out = subprocess.run(["bash", "-n", str(ROOT / "scripts" / "setup.sh")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


@pytest.mark.skipif(shutil.which("vagrant") is None, reason="vagrant is not installed")
def test_vagrantfile_validates(tmp_path):
    """`vagrant validate` without a provider (none runs here): the Vagrantfile's own
    configuration; the same check refuses a Vagrantfile with an unknown setting."""
    def validate(folder):
        return subprocess.run(["vagrant", "validate", "--ignore-provider"], cwd=folder,
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "VAGRANT_HOME": str(tmp_path / "home")})
    out = validate(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    text = (ROOT / "Vagrantfile").read_text()
    assert 'config.vm.box = "debian/bookworm64"' in text and "scripts/setup.sh" in text
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "Vagrantfile").write_text(
        text.replace("config.vm.hostname", "config.vm.no_such_setting"))
    assert validate(tmp_path / "bad").returncode != 0
