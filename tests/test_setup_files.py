"""The files a new user and CI start from: README commands, installer, CI, Vagrantfile."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent


def test_readme_gives_the_quick_start_and_ci_runs_its_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "sudo make demo" in readme and "sudo make test" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/setup.sh" in ci and "sudo make test" in ci
    # a guide to read on one sitting, depth in docs/; its first screen says what a bare
    # machine needs before make
    assert len(readme.splitlines()) < 300
    assert "apt-get install -y git make" in "\n".join(readme.splitlines()[:30])
    for page in set(re.findall(r"\]\((docs/[a-z0-9_.-]+\.md)", readme)):
        assert (ROOT / page).is_file(), page


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
    def validate(folder, **env):
        return subprocess.run(["vagrant", "validate", "--ignore-provider"], cwd=folder,
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "VAGRANT_HOME": str(tmp_path / "home"), **env})
    out = validate(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert validate(ROOT, AFT_VM_CPUS="2", AFT_VM_MEMORY_MB="4096").returncode == 0
    out = validate(ROOT, AFT_VM_CPUS="many")
    assert out.returncode != 0 and 'AFT_VM_CPUS="many" must be a whole number' in out.stderr
    text = (ROOT / "Vagrantfile").read_text()
    assert 'config.vm.box = "debian/bookworm64"' in text and "scripts/setup.sh" in text
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "Vagrantfile").write_text(
        text.replace("config.vm.hostname", "config.vm.no_such_setting"))
    assert validate(tmp_path / "bad").returncode != 0


# The Vagrantfile run by Ruby with Vagrant's configure stubbed: every setting it makes, by
# path ("vm.provider.virtualbox.cpus" -> 4), as JSON
VAGRANT_STUB = r"""
require "json"
class Rec
  def initialize(seen, path) = (@seen, @path = seen, path)
  def respond_to_missing?(*) = true
  def method_missing(name, *args, **kw, &blk)
    key = (@path + [name.to_s.chomp("=")]).join(".")
    return @seen[key] = args[0] if name.to_s.end_with?("=")
    return blk.call(Rec.new(@seen, @path + [name.to_s, args[0].to_s])) if blk
    return Rec.new(@seen, @path + [name.to_s]) if args.empty? && kw.empty?
    @seen[key] = args
  end
end
module Vagrant
  def self.configure(_version)
    seen = {}
    yield Rec.new(seen, [])
    puts JSON.generate(seen)
  end
end
load ARGV[0]
"""


def vagrant_settings(folder: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ruby", "-e", VAGRANT_STUB, str(folder / "Vagrantfile")],
                          capture_output=True, text=True, timeout=60,
                          env={**{k: v for k, v in os.environ.items()
                                  if not k.startswith("AFT_VM_")}, **env})


@pytest.mark.skipif(shutil.which("ruby") is None, reason="ruby is not installed")
def test_vagrantfile_sizes_from_the_environment_and_names_the_vm_per_clone(tmp_path):
    clones = [tmp_path / "a" / "ai-fabric-testbed", tmp_path / "b" / "ai-fabric-testbed"]
    for clone in clones:
        clone.mkdir(parents=True)
        shutil.copy2(ROOT / "Vagrantfile", clone / "Vagrantfile")
    runs = [vagrant_settings(clone) for clone in clones]
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    first, second = (json.loads(r.stdout) for r in runs)
    assert first["vm.provider.virtualbox.cpus"] == 4
    assert first["vm.provider.virtualbox.memory"] == 8192
    name = first["vm.provider.virtualbox.name"]
    assert re.fullmatch(r"ai-fabric-testbed-[0-9a-f]{8}", name)
    assert first["vm.provider.libvirt.default_prefix"] == name + "_"
    assert second["vm.provider.virtualbox.name"] != name                # another clone
    assert json.loads(vagrant_settings(clones[0]).stdout) == first      # the same clone
    sized = json.loads(vagrant_settings(clones[0], AFT_VM_CPUS="2",
                                        AFT_VM_MEMORY_MB="4096").stdout)
    for provider in ("virtualbox", "libvirt"):
        assert sized[f"vm.provider.{provider}.cpus"] == 2
        assert sized[f"vm.provider.{provider}.memory"] == 4096
    for var, value, limits in (("AFT_VM_CPUS", "two", "1 (default 4)"),
                               ("AFT_VM_CPUS", "0", "1 (default 4)"),
                               ("AFT_VM_MEMORY_MB", "8g", "1024 (default 8192)"),
                               ("AFT_VM_MEMORY_MB", "512", "1024 (default 8192)")):
        bad = vagrant_settings(clones[0], **{var: value})
        assert bad.returncode != 0 and bad.stdout == ""
        assert bad.stderr.strip().splitlines() == [
            f'Vagrantfile: {var}="{value}" must be a whole number of at least {limits}']


def test_what_runs_in_the_vm_keeps_lf_line_endings():
    """.gitattributes: every tracked file that starts with a shebang, the Makefile and the
    Vagrantfile check out with LF everywhere (the VM gets the clone as it is on disk)."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout.decode().split("\0")
    runnable = [f for f in tracked if f and (ROOT / f).is_file()
                and (ROOT / f).read_bytes()[:2] == b"#!"]
    assert {"scripts/setup.sh", "scripts/vm_inside.sh", ".ci/run"} <= set(runnable)
    out = subprocess.run(["git", "check-attr", "eol", "--", *runnable, "Makefile",
                          "Vagrantfile"], cwd=ROOT, capture_output=True, text=True, check=True)
    not_lf = [line for line in out.stdout.splitlines() if not line.endswith(": eol: lf")]
    assert not_lf == []
    for f in runnable:
        assert b"\r\n" not in (ROOT / f).read_bytes(), f


# -- packaging: what `pip install .` declares and ships -----------------------------------
PACKAGES = ("topologies", "fabric", "traffic", "testbed")
# a top-level module -> the distribution that provides it, where the names differ
DISTRIBUTION_OF = {"cython": "Cython", "google": "protobuf", "tomli_w": "tomli-w",
                   "yaml": "PyYAML", "PIL": "pillow",
                   "markdown_it": "markdown-it-py"}
# Debian's python3-mininet: no PyPI package (pyproject.toml says so)
NOT_FROM_PYPI = {"mininet"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pyproject() -> dict:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def _names(requirements: list[str]) -> set[str]:
    return {_norm(re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0]) for r in requirements}


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, ver = line.partition("==")
            assert sep, f"requirements.txt: {line!r} is not pinned with =="
            pins[_norm(name)] = ver
    return pins


def third_party_imports(packages=PACKAGES) -> dict[str, str]:
    """Every top-level module the packages import (at any depth, function-local too) that
    is neither the standard library nor one of the packages -> a file importing it."""
    found: dict[str, str] = {}
    for pkg in packages:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    tops = [a.name.split(".")[0] for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    tops = [node.module.split(".")[0]]
                else:
                    continue
                for top in tops:
                    if top not in sys.stdlib_module_names and top not in PACKAGES:
                        found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_every_third_party_import_is_a_declared_dependency():
    imports = third_party_imports()
    assert {"pyroute2", "scapy", "networkx", "mininet"} <= set(imports)   # the walk works
    declared = _names(_pyproject()["project"]["dependencies"])
    missing = {f"{top} ({where}) -> {DISTRIBUTION_OF.get(top, top)}"
               for top, where in imports.items()
               if top not in NOT_FROM_PYPI and _norm(DISTRIBUTION_OF.get(top, top)) not in declared}
    assert not missing, f"imported but not in [project].dependencies: {sorted(missing)}"
    # and nothing declared that the packages never import
    used = {_norm(DISTRIBUTION_OF.get(top, top)) for top in imports}
    assert declared <= used, f"declared but never imported: {sorted(declared - used)}"


def test_the_mapping_sees_a_missing_dependency(tmp_path, monkeypatch):
    """The walk above on a package that imports yaml and Mininet: yaml is reported as
    PyYAML, Mininet is the documented exception."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(
        "import json\nimport yaml\n\ndef f():\n    from mininet.net import Mininet\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert third_party_imports(("pkg",)) == {"yaml": "pkg/m.py", "mininet": "pkg/m.py"}


def test_requirements_txt_pins_what_pyproject_declares():
    """requirements.txt pins exactly the declared dependencies (runtime and dev) and what
    they need in turn (their installed metadata), at the versions installed here."""
    project = _pyproject()["project"]
    runtime = _names(project["dependencies"])
    dev = _names(project["optional-dependencies"]["dev"])
    pins = _pins()
    assert not (runtime | dev) - set(pins), "declared but not pinned in requirements.txt"
    assert {"pytest", "hypothesis", "ruff"} <= dev and not dev & runtime
    needed, todo = set(), list(runtime | dev)
    while todo:
        name = todo.pop()
        if name in needed:
            continue
        needed.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            pytest.skip(f"{name} is not installed here: its own dependencies are unknown")
        todo += [r.name for r in map(Requirement, requires)
                 if r.marker is None or r.marker.evaluate({"extra": ""})]
        todo = list(_names(todo))
    orphans = set(pins) - needed
    assert not orphans, f"pinned in requirements.txt but needed by nothing declared: {orphans}"
    assert not needed - set(pins), "needed but not pinned in requirements.txt"
    for name, pinned in pins.items():
        assert metadata.version(name) == pinned, f"{name}: installed is not the pinned one"


def _copy_source(dest: Path) -> None:
    """What `pip install .` reads: pyproject, README and the packages, without build
    outputs (caches, the compiled engine's .c and .so)."""
    def skip(folder, names):
        return [n for n in names if n == "__pycache__" or n.endswith(".so")
                or (n.endswith(".c") and not n.endswith(".bpf.c"))]
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, dest / pkg, ignore=skip)


# run by the installed copy, outside any checkout: every module imports, from where
IMPORT_ALL = """
import importlib, json, pkgutil, sys
files = {}
for top in sys.argv[1:]:
    pkg = importlib.import_module(top)
    files[top] = pkg.__file__
    for info in pkgutil.walk_packages(pkg.__path__, top + "."):
        if info.name.rsplit(".", 1)[1] != "__main__":
            files[info.name] = importlib.import_module(info.name).__file__
print(json.dumps(files))
"""


@pytest.mark.slow
def test_pip_install_gives_a_package_that_imports_and_runs():
    """`pip install --no-deps --no-build-isolation` of a copy of the source (not editable)
    into a fresh virtualenv that sees this one's packages but not this checkout: every
    module of the four packages imports from the installed copy, the package data is
    there, and `testbed --version` says pyproject's version. Nothing is downloaded."""
    version = _pyproject()["project"]["version"]
    ours = re.compile(r"^(ai_fabric_testbed|__editable__)|\.pth$")
    with tempfile.TemporaryDirectory(prefix="aft-install-") as tmp:
        tmp = Path(tmp)
        _copy_source(tmp / "src")
        # this virtualenv's packages minus this project's own install (editable or not)
        deps = tmp / "deps"
        deps.mkdir()
        for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
            if not ours.search(entry.name):
                (deps / entry.name).symlink_to(entry)
        venv = tmp / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                        str(venv)], check=True, timeout=120)
        py = venv / "bin" / "python"
        site = subprocess.run([str(py), "-c", "import sysconfig; "
                               "print(sysconfig.get_paths()['purelib'])"], check=True,
                              capture_output=True, text=True).stdout.strip()
        (Path(site) / "aft-deps.pth").write_text(f"{deps}\n")
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        env["PIP_NO_INDEX"] = "1"          # pip must find nothing to download
        out = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps",
                              "--no-build-isolation", "--disable-pip-version-check",
                              str(tmp / "src")], cwd=tmp, env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        (tmp / "elsewhere").mkdir()
        out = subprocess.run([str(py), "-c", IMPORT_ALL, *PACKAGES], cwd=tmp / "elsewhere", env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        files = json.loads(out.stdout)
        assert len(files) > 50 and "fabric.core" in files and "testbed.cli" in files
        outside = {m: f for m, f in files.items() if not f.startswith(site + os.sep)}
        assert not outside, f"not imported from the installed copy: {outside}"
        installed = Path(site)
        for pattern in ("topologies/*.toml", "fabric/bpf/*.bpf.c", "fabric/bpf/*.h",
                        "fabric/bpf/*.bpf.o", "fabric/wireshark/*.lua",
                        "traffic/*.pxd"):
            want = sorted(p.relative_to(ROOT) for p in ROOT.glob(pattern))
            assert sorted(p.relative_to(installed) for p in installed.glob(pattern)) == want
        for argv in ([str(venv / "bin" / "testbed"), "--version"],
                     [str(py), "-m", "testbed", "--version"]):
            out = subprocess.run(argv, cwd=tmp / "elsewhere", env=env, capture_output=True,
                                 text=True, timeout=60)
            assert (out.returncode, out.stdout.strip()) == (0, f"testbed {version}"), out


def test_version_from_the_checkout(monkeypatch):
    from testbed import version as version_mod
    want = _pyproject()["project"]["version"]
    out = subprocess.run([sys.executable, "-m", "testbed", "--version"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout.strip()) == (0, f"testbed {want}")

    def absent(name):
        raise metadata.PackageNotFoundError(name)
    monkeypatch.setattr(version_mod.metadata, "version", absent)
    assert version_mod.version() == want          # no install metadata: pyproject's
    monkeypatch.setattr(version_mod, "PYPROJECT", ROOT / "no-such.toml")
    assert version_mod.version() == "unknown"


MININET_ABSENT = """
import importlib.abc, sys
class NoMininet(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "mininet":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NoMininet())
import fabric.core
"""


def test_a_missing_mininet_says_where_it_comes_from():
    out = subprocess.run([sys.executable, "-c", MININET_ABSENT], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError: fabric needs Mininet") and \
        "python3-mininet" in last and "--system-site-packages" in last, out.stderr
