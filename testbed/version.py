"""The testbed's version: the installed distribution's metadata, or pyproject.toml's
[project].version in a checkout run without install metadata."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "ai-fabric-testbed"
PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def version() -> str:
    """"0.1.0"-style version string; "unknown" where neither source has one."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pass
    try:
        with PYPROJECT.open("rb") as f:
            return str(tomllib.load(f)["project"]["version"])
    except (OSError, tomllib.TOMLDecodeError, KeyError):
        return "unknown"
