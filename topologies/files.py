"""Load topology specs from TOML files or from a kind name plus key=value parameters.

A topology file:

    name = "rail4x4"            # plain identifier, used in names of results
    kind = "rail_optimized"     # one of BUILDERS
    scale_factor = 4000         # optional: real rate / emulated rate

    [params]                    # the builder's keyword arguments
    servers = 4
    gpus_per_server = 4
    spines = 2
"""

from __future__ import annotations

import errno
import inspect
import os
import stat
import tomllib
from pathlib import Path

from topologies.builders import BUILDERS
from topologies.spec import SpecError, Topology, did_you_mean, key_field

TOPOLOGY_DIR = Path(__file__).resolve().parent
TOP_KEYS = {"name", "kind", "scale_factor", "params"}
# The largest topology, experiment or link-profile file read: a shipped one is under
# 10 KiB, so 1 MiB is no limit for a real input and bounds what a wrong path costs.
INPUT_MAX_BYTES = 1 << 20


def builder_params(kind: str) -> list[str]:
    """The parameter names a builder accepts."""
    return [p for p in inspect.signature(BUILDERS[kind]).parameters if p != "name"]


def build(kind: str, params: dict | None = None, name: str | None = None,
          scale_factor: float | None = None) -> Topology:
    """Build a topology of `kind` from keyword parameters, checking names first."""
    if kind not in BUILDERS:
        raise SpecError("kind", f"{kind!r} is not one of {sorted(BUILDERS)}"
                        f"{did_you_mean(kind, BUILDERS)}")
    params = dict(params or {})
    allowed = builder_params(kind)
    for key in params:
        if key not in allowed:
            raise SpecError(key_field("params", key), f"{key!r} is no parameter of "
                            f"{kind}{did_you_mean(key, allowed)}; allowed: {', '.join(allowed)}")
    if scale_factor is not None:       # a file's own; --set scale_factor=... wins
        params.setdefault("scale_factor", scale_factor)
    try:
        return BUILDERS[kind](name=kind if name is None else name, **params)
    except TypeError as exc:  # e.g. a string where a number belongs, caught late
        raise SpecError("params", str(exc)) from None


def parse_value(text: str) -> object:
    """A command-line value as TOML would read it: 4 -> int, 1.5 -> float, else str."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_assignments(items: list[str]) -> dict:
    """['servers=4', 'tech=laser'] -> {'servers': 4, 'tech': 'laser'}."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SpecError("--set", f"{item!r} is not of the form key=value")
        out[key.strip()] = parse_value(value.strip())
    return out


def load_file(path: str | Path, overrides: dict | None = None) -> Topology:
    """Load and validate a topology file; `overrides` replace entries of [params]."""
    data = read_toml("topology", path)
    return from_data(data, overrides, source=str(path))


def read_toml(field_name: str, path: str | Path) -> dict:
    """A TOML file's tables; a SpecError naming `field_name` for anything but a readable,
    parsable regular file of at most INPUT_MAX_BYTES (missing, a directory, a FIFO or a
    device, too large, unreadable, not TOML)."""
    path = Path(path)
    shown = str(path) if str(path).isprintable() else repr(str(path))   # one line
    try:
        return tomllib.loads(read_input(path).decode())
    except FileNotFoundError:
        raise SpecError(field_name, f"no such file: {shown}") from None
    except IsADirectoryError:
        raise SpecError(field_name, f"{shown} is a directory, not a TOML file") from None
    except InputError as exc:
        raise SpecError(field_name, f"{shown} {exc}") from None
    except OSError as exc:
        raise SpecError(field_name, f"{shown} cannot be read: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SpecError(field_name, f"{shown} does not parse: {exc}") from None
    except ValueError:          # a NUL byte in the path
        raise SpecError(field_name, f"{shown} is not a file name") from None


class InputError(OSError):
    """A user's input path that is no regular file of bounded size (str(): why)."""


def read_input(path: Path, max_bytes: int = INPUT_MAX_BYTES) -> bytes:
    """The bytes of a regular file of at most `max_bytes`. A FIFO, a device or a socket
    is refused from its stat, without opening it (a FIFO's open would wait for a writer,
    /dev/zero never ends); the file is opened non-blocking and read up to one byte past
    the limit, so a file that grew after the stat is refused too."""
    mode = path.stat().st_mode
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if not stat.S_ISREG(mode):
        raise InputError(f"is a {_file_type(mode)}, not a regular file")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # replaced since the stat
            raise InputError("is not a regular file")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise InputError(f"is larger than {max_bytes} bytes (the most an input file may "
                         "have)")
    return data


def _file_type(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def from_data(data: dict, overrides: dict | None = None, source: str = "topology") -> Topology:
    """Build from a parsed TOML table (e.g. the [topology] table of an experiment)."""
    for key in data:
        if key not in TOP_KEYS:
            raise SpecError(key_field("", key), f"{key!r} is an unknown key in {source}"
                            f"{did_you_mean(key, TOP_KEYS)}; allowed: {sorted(TOP_KEYS)}")
    if "kind" not in data:
        raise SpecError("kind", f"missing in {source}")
    params = data.get("params", {})
    if not isinstance(params, dict):
        raise SpecError("params", "must be a table")
    params = {**params, **(overrides or {})}
    return build(data["kind"], params, data.get("name"), data.get("scale_factor"))


def topology_names() -> list[str]:
    """What a topology argument takes by name: the files shipped in topologies/ (those
    with a kind: not link_profiles.toml) and the builder kinds."""
    files = [p.stem for p in sorted(TOPOLOGY_DIR.glob("*.toml"))
             if "kind" in tomllib.loads(p.read_text())]
    return sorted({*files, *BUILDERS})


def resolve(topo: str, overrides: dict | None = None) -> Topology:
    """A file path, a file shipped in topologies/ (by stem), or a kind name."""
    path = Path(topo)
    if path.suffix == ".toml" or path.exists():
        return load_file(path, overrides)
    shipped = TOPOLOGY_DIR / f"{topo}.toml"
    if shipped.exists():
        return load_file(shipped, overrides)
    if topo in BUILDERS:
        return build(topo, overrides)
    files = sorted(p.stem for p in TOPOLOGY_DIR.glob("*.toml"))
    raise SpecError("topology", f"{topo!r} is neither a file nor a kind"
                    f"{did_you_mean(topo, [*BUILDERS, *files])}; kinds: "
                    f"{', '.join(sorted(BUILDERS))}; files: {', '.join(files)}")
