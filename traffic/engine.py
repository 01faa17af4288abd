"""Which engine runs the per-packet code: the Cython-compiled modules or their .py files.

The modules in COMPILED_MODULES are plain Python, compiled in place by
scripts/build_compiled.py (Cython, pure-Python mode: a `.so` beside each `.py`, which
Python's import prefers). `AFT_ENGINE` picks the engine of a process and of the agents
it starts (they inherit the environment): `compiled` (the default: the extensions, where
built) or `interpreted` (the `.py` files even where extensions exist; traffic/__init__.py
installs the import hook that does it). `engine()` says which one actually loaded.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os

from fabric.environ import environ

ENGINE_ENV = "AFT_ENGINE"
COMPILED, INTERPRETED = "compiled", "interpreted"
ENGINES = (COMPILED, INTERPRETED)
# an installed package ships no extension (pyproject.toml's package data)
BUILT_BY = "bash scripts/setup.sh builds them in a checkout; an installed package has none"

# The modules whose functions run per packet or per wake-up, compiled where built.
# Interpreted always: traffic.packets (scapy layer classes; its per-packet patchers are
# traffic.patch's). traffic.host is compiled too, so agent processes start it by import
# (traffic.launch.host_argv), not with `python -m`, which needs a code object.
COMPILED_MODULES = (
    "traffic.transport",
    "traffic.nscc",
    "traffic.cc",
    "traffic.flows",
    "traffic.entropy",
    "traffic.port",
    "traffic.rx",
    "traffic.patch",
    "traffic.agent",
    "traffic.host",
)


def requested() -> str:
    """The engine `AFT_ENGINE` asks for (default: compiled); ValueError if unknown."""
    want = os.environ.get(ENGINE_ENV, COMPILED).strip().lower() or COMPILED
    if want not in ENGINES:
        raise ValueError(f"{ENGINE_ENV}={want!r}: must be one of {', '.join(ENGINES)}")
    return want


def is_compiled(module) -> bool:
    """Whether `module` was loaded from an extension (a compiled `.so`)."""
    return isinstance(getattr(module, "__loader__", None),
                      importlib.machinery.ExtensionFileLoader) or str(
        getattr(module, "__file__", "") or "").endswith(
        tuple(importlib.machinery.EXTENSION_SUFFIXES))


def not_compiled() -> list[str]:
    """The listed modules that loaded from their .py files (importing them if needed)."""
    return [name for name in COMPILED_MODULES
            if not is_compiled(importlib.import_module(name))]


def engine() -> str:
    """"compiled" (every listed module is an extension), "interpreted" (AFT_ENGINE asked
    for it, and every one is a .py), or "interpreted (compiled path not built: <why>)"."""
    missing = not_compiled()
    if not missing:
        return COMPILED
    if requested() == INTERPRETED and len(missing) == len(COMPILED_MODULES):
        return INTERPRETED
    if len(missing) == len(COMPILED_MODULES):
        why = f"no extension built ({BUILT_BY})"
    else:
        why = f"{', '.join(missing)} not built ({BUILT_BY})"
    return f"{INTERPRETED} (compiled path not built: {why})"


def engine_name(described: str | None) -> str:
    """"compiled" or "interpreted" from what engine() says (its reason dropped)."""
    return (described or "").split(" ")[0]


def engine_env(name: str):
    """AFT_ENGINE set to `name` for the processes started inside the block (a context;
    the agents a run launches inherit it), restored after."""
    if name not in ENGINES:
        raise ValueError(f"{ENGINE_ENV}={name!r}: must be one of {', '.join(ENGINES)}")
    return environ(ENGINE_ENV, name)
