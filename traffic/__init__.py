"""The traffic agents' package; with AFT_ENGINE=interpreted it loads the modules that
scripts/build_compiled.py compiles from their .py files (traffic.engine)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys


class _SourceFirst:
    """A meta-path finder that loads the listed modules with a SourceFileLoader, so a
    compiled extension beside the .py is ignored (AFT_ENGINE=interpreted)."""

    def __init__(self, names: tuple[str, ...]):
        self.names = frozenset(names)

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.names or not path:
            return None
        leaf = fullname.rpartition(".")[2]
        for folder in path:
            source = os.path.join(folder, f"{leaf}.py")
            if os.path.isfile(source):
                loader = importlib.machinery.SourceFileLoader(fullname, source)
                return importlib.util.spec_from_file_location(fullname, source, loader=loader)
        return None


def _install() -> None:
    """The hook, if AFT_ENGINE asks for the interpreted engine; an unknown engine installs
    nothing here (importing never fails): traffic.engine.requested refuses it, and the
    command line at start-up (testbed.environment)."""
    from traffic.engine import COMPILED_MODULES, INTERPRETED, requested
    try:
        interpreted = requested() == INTERPRETED
    except ValueError:
        return
    if interpreted and not any(isinstance(f, _SourceFirst) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceFirst(COMPILED_MODULES))


_install()
