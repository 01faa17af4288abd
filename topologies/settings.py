"""Settings declared once: a field's name is its experiment key, and its declaration
carries its default, its help and the values it allows.

    @dataclass
    class EcnSettings:
        ecn: str = setting("off", "switches mark CE ...", choices=("off", "on"))
        ecn_pmax: float = setting(0.2, "marking probability at kmax", low=0, low_open=True,
                                  high=1)

From the declarations come the [experiment] keys (the field names), the checks of the
values (`check_declared`: choices, whole numbers, ranges), the `testbed run` flags
(`add_flags`: `--ecn-pmax`, grouped by settings type, with the help and default) and
the settings reference (`reference_md`; `reference_json` for `--format json`). Rules that
tie several settings together stay in their type's own `check_<feature>` method. Pure
data, no root.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterator
from dataclasses import MISSING, Field, dataclass, field, fields

from topologies.spec import SpecError

DECLARED = "setting"          # the metadata key of a declaration


@dataclass(frozen=True)
class Declared:
    """What a setting's declaration says beyond its name and default."""

    help: str
    flag: bool = True                      # `testbed run --<key with dashes>`
    aliases: tuple[str, ...] = ()          # further option strings of that flag
    choices: tuple | None = None
    whole: bool = False                    # an integer (bool is not one)
    number: bool = False                   # a finite number
    low: float | None = None               # the range a number or integer takes
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    metavar: str | None = None
    convert: Callable | None = None        # the flag's argparse type, where not inferred
    allowed: str | None = None             # the reference's "allowed", where the settings
                                           # type checks the value itself


def setting(default=MISSING, help: str = "", *, factory=MISSING, **declared) -> Field:
    """A dataclass field declared as a user's setting (module docstring)."""
    if not help:
        raise ValueError("a setting needs its help text")
    meta = {DECLARED: Declared(help=help, **declared)}
    if factory is not MISSING:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def declared(cls) -> Iterator[tuple[Field, Declared]]:
    """The declared settings of a dataclass (or instance), in field order."""
    for f in fields(cls):
        if DECLARED in f.metadata:
            yield f, f.metadata[DECLARED]


def default_of(f: Field):
    return f.default_factory() if f.default is MISSING else f.default


def check_declared(obj, where: str = "experiment", only: type | None = None) -> None:
    """Raise SpecError naming `where.<key>` for the first value its declaration refuses
    (of the settings type `only` declares, or of all)."""
    for f, decl in declared(only or obj):
        check_value(f"{where}.{f.name}", getattr(obj, f.name), decl)


def check_value(key: str, value, decl: Declared) -> None:
    if decl.choices is not None:
        if value not in decl.choices:
            allowed = ", ".join(repr(c) if c == "" else str(c) for c in decl.choices)
            raise SpecError(key, f"{value!r} is not one of {allowed}")
        return
    if decl.whole:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(key, f"{value!r} is not an integer")
    elif decl.number:
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise SpecError(key, f"{value!r} is not a finite number")
    else:
        return
    low = -math.inf if decl.low is None else decl.low
    high = math.inf if decl.high is None else decl.high
    if value < low or value > high or (decl.low_open and value == low) \
            or (decl.high_open and value == high):
        if decl.high is None:
            raise SpecError(key, f"{value:g} must be greater than {low:g}" if decl.low_open
                            else f"{value:g} is less than {low:g}")
        raise SpecError(key, f"{value:g} is not in {range_text(decl)}")


def range_text(decl: Declared) -> str:
    """'[0, 1)', '> 0', '>= 1' ... as the reference and the refusals write it."""
    low, high = decl.low, decl.high
    if high is None:
        return f"{'>' if decl.low_open else '>='} {low:g}" if low is not None else "any"
    if low is None:
        return f"{'<' if decl.high_open else '<='} {high:g}"
    return (f"{'(' if decl.low_open else '['}{low:g}, {high:g}"
            f"{')' if decl.high_open else ']'}")


def finite_float(text: str) -> float:
    """argparse type of a number flag: a finite float (no nan, no inf)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def number_or_auto(number: str) -> Callable[[str], str | float]:
    """argparse type of a flag that takes "auto" or a number; `number` names the number in
    the refusal ("a number of Mbit/s")."""
    def convert(text: str) -> str | float:
        if text == "auto":
            return text
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {number} or 'auto'") from None
    return convert


def flag_of(f: Field) -> str:
    return "--" + f.name.replace("_", "-")


def add_flags(parser: argparse.ArgumentParser, *groups: type) -> None:
    """One flag per declared setting of each settings type, in an argument group per type
    (titled by its docstring's first line); a flag left out is None (not set)."""
    for cls in groups:
        group = parser.add_argument_group(title(cls))
        for f, decl in own_declared(cls):
            if not decl.flag:
                continue
            kw: dict = {"dest": f.name, "default": None, "help": flag_help(f, decl)}
            default = default_of(f)
            if decl.choices is not None:
                kw["choices"] = [str(c) for c in decl.choices if c != ""]
            if isinstance(default, list) and decl.convert is None:
                kw["nargs"] = "+"      # else the one argument convert makes a list of
            if decl.convert is not None:
                kw["type"] = decl.convert
            elif decl.whole:
                kw["type"] = int
            elif decl.number:
                kw["type"] = finite_float
            if decl.metavar or decl.whole or decl.number:
                kw["metavar"] = decl.metavar or ("N" if decl.whole else "X")
            group.add_argument(flag_of(f), *decl.aliases, **kw)


def title(cls) -> str:
    """A settings type's title: its docstring's first line."""
    return (cls.__doc__ or cls.__name__).split("\n")[0]


def own_declared(cls) -> Iterator[tuple[Field, Declared]]:
    """The declared settings a settings type declares itself (not those it inherits)."""
    own = set(own_fields(cls))
    return ((f, decl) for f, decl in declared(cls) if f.name in own)


def own_fields(cls) -> list[str]:
    """The fields a settings type declares itself, not those it inherits, in order."""
    inherited = set()
    for base in cls.__mro__[1:]:
        inherited |= set(getattr(base, "__dataclass_fields__", {}))
    return [f.name for f in fields(cls) if f.name not in inherited]


def flag_help(f: Field, decl: Declared) -> str:
    default = default_of(f)
    shown = "" if default in ("", [], {}) or isinstance(default, dict) else \
        f" (default {default})"
    return (decl.help + shown).replace("%", "%%")


def flag_values(args: argparse.Namespace, cls) -> dict:
    """The settings the flags gave ({key: value}; unset flags are left out)."""
    return {f.name: getattr(args, f.name) for f, decl in declared(cls)
            if decl.flag and getattr(args, f.name, None) is not None}


def allowed_text(decl: Declared) -> str:
    """What a setting allows, as the reference writes it ('"off", "on"', 'number > 0')."""
    if decl.allowed is not None:
        return decl.allowed
    if decl.choices is not None:
        return ", ".join(f'"{c}"' for c in decl.choices)
    kind = "integer " if decl.whole else "number " if decl.number else ""
    bounds = range_text(decl) if decl.low is not None or decl.high is not None else ""
    return (kind + bounds).strip()


def reference_json(*groups: type) -> list[dict]:
    """Every declared setting of each settings type as a JSON-ready row: key, group, flag
    (None: file only), aliases, default, allowed (text as in the reference), choices
    (None unless a fixed list), low/high (None unless a range), help."""
    rows = []
    for cls in groups:
        for f, decl in own_declared(cls):
            default = default_of(f)
            rows.append({
                "key": f.name, "group": title(cls),
                "flag": flag_of(f) if decl.flag else None, "aliases": list(decl.aliases),
                "default": list(default) if isinstance(default, tuple) else default,
                "allowed": allowed_text(decl),
                "choices": None if decl.choices is None else list(decl.choices),
                "low": decl.low, "high": decl.high, "help": decl.help})
    return rows


def reference_md(*groups: type) -> str:
    """A Markdown table per settings type: key, flag, default, allowed values, meaning."""
    out = []
    for cls in groups:
        out += [f"## {title(cls)}", "", "| key | flag | default | allowed | meaning |",
                "|---|---|---|---|---|"]
        for f, decl in own_declared(cls):
            flags = ", ".join(f"`{s}`" for s in (flag_of(f), *decl.aliases)) \
                if decl.flag else "file only"
            allowed = allowed_text(decl)
            default = default_of(f)
            shown = f'"{default}"' if isinstance(default, str) else f"{default!r}"
            out.append(f"| `{f.name}` | {flags} | {shown} | {allowed} | "
                       f"{decl.help.replace('|', '/')} |")
        out.append("")
    return "\n".join(out)
