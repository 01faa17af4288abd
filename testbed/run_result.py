"""A run's result in memory, typed: `RunResult`; metrics.json is its serialization.

    testbed.results.compute_metrics + the run's own sections ─▶ RunResult ─▶ metrics.json
    metrics.json ─▶ RunResult.load ─▶ testbed report, summary.md, the scripts

metrics.json carries `schema_version` (SCHEMA_VERSION, first in the file). A file of a
newer version, a required key missing or a value of the wrong type is refused with a
MetricsError (a ValueError) naming the file and the key. A file without `schema_version`
was written before versions existed: it is read as version 0, whose keys are version 1's,
and written back as version 1.

The sections a run adds after compute_metrics (shaping timers, PFC, fidelity, ...) may be
left out of the file: such a key reads as None and stays out when written again, so
`to_dict(from_dict(d)) == d` for every metrics.json a run writes. A key this code does not
know is kept in `extra` and written back after the known ones: a feature's own section
rides through report and the scripts untouched, and a folder is never refused for
carrying more than this code reads. Sections read by few and shaped by their own modules
(cpu, link energy, attribution, cc, train, ...) stay plain dicts.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
FILE = "metrics.json"


class MetricsError(ValueError):
    """A metrics.json (or a metrics table) this code cannot read, naming where and why."""


@dataclass(kw_only=True)
class Record:
    """A dataclass read from and written to a JSON table: fields without a default are
    required keys, fields with one (None) may be left out. `extra` holds the keys this
    code does not know, `absent` the optional keys the table left out (written out again
    only if set since)."""

    extra: dict[str, Any] = field(default_factory=dict, repr=False)
    absent: frozenset[str] = field(default=frozenset(), repr=False, compare=False)

    @classmethod
    def from_dict(cls, table: Any, where: str = "metrics"):
        """The record of `table`; MetricsError naming `where` and the key that is wrong."""
        if not isinstance(table, dict):
            raise MetricsError(f"{where} is {type(table).__name__}, not a table")
        hints, known = _hints(cls), _data_fields(cls)
        values: dict[str, Any] = {}
        for f in known:
            if f.name not in table:
                if f.default is dataclasses.MISSING:
                    raise MetricsError(f"{where}: no {f.name!r} (a required key)")
                continue
            values[f.name] = _read(table[f.name], hints[f.name], f"{where}.{f.name}")
        names = {f.name for f in known}
        absent = frozenset(n for n in names if n not in table)
        extra = {k: v for k, v in table.items() if k not in names}
        return cls(**values, extra=extra, absent=absent)

    @classmethod
    def required_keys(cls) -> tuple[str, ...]:
        """The keys every table of this record has."""
        return tuple(f.name for f in _data_fields(cls) if f.default is dataclasses.MISSING)

    def to_dict(self) -> dict[str, Any]:
        """The table: known keys in field order (left out where the table read had none
        and nothing set them since), then `extra`."""
        out = {}
        for f in _data_fields(type(self)):
            value = getattr(self, f.name)
            if f.name in self.absent and value is None:
                continue
            out[f.name] = _write(value)
        return {**out, **self.extra}


@functools.cache
def _data_fields(cls) -> tuple[dataclasses.Field, ...]:
    return tuple(f for f in dataclasses.fields(cls) if f.name not in ("extra", "absent"))


@functools.cache
def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _read(value: Any, hint: Any, where: str) -> Any:
    """`value` as `hint` (a Record from a table, a list of Records from a list of tables),
    MetricsError where its JSON type is not the hint's."""
    options = typing.get_args(hint) if _is_union(hint) else (hint,)
    for option in options:
        if _matches(value, option):
            if isinstance(option, type) and issubclass(option, Record):
                return option.from_dict(value, where)
            inner = typing.get_args(option)
            if typing.get_origin(option) is list and inner and _is_record(inner[0]):
                return [inner[0].from_dict(v, f"{where}[{i}]") for i, v in enumerate(value)]
            return value
    wanted = " or ".join(_name(o) for o in options)
    raise MetricsError(f"{where} is {_name(type(value))} {_short(value)}, not {wanted}")


def _matches(value: Any, hint: Any) -> bool:
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    origin = typing.get_origin(hint) or hint
    if _is_record(origin):
        return isinstance(value, dict)
    if origin is float:       # JSON writes 4000.0 as 4000.0 and 4000 as 4000
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, origin)


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _is_record(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, Record)


def _name(hint: Any) -> str:
    if hint is type(None) or hint is None:
        return "null"
    origin = typing.get_origin(hint) or hint
    return {dict: "a table", list: "a list", str: "text", bool: "true/false", int: "an integer",
            float: "a number"}.get(origin, "a table" if _is_record(origin)
                                   else getattr(origin, "__name__", str(origin)))


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return f"({text[:40]}{'...' if len(text) > 40 else ''})"


def _write(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, list):
        return [_write(v) for v in value]
    return value


# -- the sections read most --------------------------------------------------------------
@dataclass(kw_only=True)
class Iteration(Record):
    """One completed iteration: its JCT (first start to last end over the ranks)."""

    iteration: int
    jct_s: float
    jct_s_real: float
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float


@dataclass(kw_only=True)
class FlowTotals(Record):
    """The flows summed: sends' recovery, receivers' delivery, FCT percentiles."""

    count: int
    exactly_once: bool
    bytes_delivered: int
    bytes_expected: int
    retransmits: int
    naks: int
    timeouts: int
    trimmed: int
    ooo_packets: int
    dup_packets: int
    max_reorder: int
    fct_p50_s: float | None
    fct_p99_s: float | None
    fct_max_s: float | None


@dataclass(kw_only=True)
class Latency(Record):
    """One-way packet latency, microseconds, measured."""

    samples: int
    p50: float | None
    p99: float | None
    p999: float | None


@dataclass(kw_only=True)
class LinkTotals(Record):
    """testbed.results.link_metrics: the fabric's drops, the endpoints' refusals, ECMP
    spread over the leaves' uplinks."""

    drops: int
    host_refused: int
    max_backlog_bytes: int
    uplink_bytes: dict[str, dict[str, int]]
    uplink_max_over_mean_per_leaf: dict[str, float]
    uplink_max_over_mean: float | None


@dataclass(kw_only=True)
class Fidelity(Record):
    """testbed.fidelity's verdict; a run spread over servers adds the server it is from
    and every server's own."""

    verdict: str
    reasons: list[str]
    grades: dict[str, str]
    figures: dict[str, Any]
    thresholds: dict[str, Any]
    server: str | None = None
    per_server: dict[str, str] | None = None


@dataclass(kw_only=True)
class PfcTotals(Record):
    """PFC's counters over the run (testbed.pfc_results)."""

    frames_sent: int
    xoff_frames: int
    send_errors: int
    drops: int
    host_refused: int
    paused_s: float


@dataclass(kw_only=True)
class PfcReport(Record):
    """metrics.json "pfc": pfc.json's figures the summary reads; a spread run adds what
    came from the other servers and its per-server files."""

    enabled: bool | None
    headroom: dict[str, Any] | None
    reaction_ms: dict[str, Any] | None
    totals: PfcTotals | None
    storms: list | None
    controller: dict[str, Any] | None
    ecn: dict[str, Any] | None
    switch_lb: dict[str, Any] | None
    trimming: dict[str, Any] | None
    occupancy_from: str | None
    poll_ms: float | None
    sleep: str | None
    from_other_servers: dict[str, Any] | None = None
    files: str | None = None
    per_server: dict[str, Any] | None = None


# -- the run -----------------------------------------------------------------------------
@dataclass(kw_only=True)
class RunResult(Record):
    """One run's results (metrics.json). Times end in _s (emulated, as measured) or
    _s_real (scaled to the real fabric by scale_factor); rates in Mbit/s."""

    # testbed.results.compute_metrics: every run has these
    ok: bool
    errors: dict[str, str]
    workload: str
    ranks: int
    message_bytes: int
    transport: str
    entropy: str
    seed: int
    scale_factor: float
    link_mbps: float
    link_mbps_real: float
    iterations: list[Iteration]
    jct_mean_s: float | None
    jct_mean_s_real: float | None
    ideal_s: float | None
    jct_over_ideal: float | None
    busbw_over_link: float | None
    flows: FlowTotals
    latency_us: Latency
    links: LinkTotals
    cpu: dict[str, Any]
    agent_cpu_s: dict[str, float | None]
    timings_s: dict[str, float]
    # what the run adds (testbed.run; a spread run, testbed.run_spread, adds fewer)
    shaping_timers: dict[str, Any] | None = None
    engine: str | None = None
    link_sample_period_s: float | None = None
    workload_window_s: list[float] | None = None
    workload_start_monotonic_s: float | None = None
    link_energy: dict[str, Any] | None = None
    fabric_cost: dict[str, Any] | None = None
    link_physics: dict[str, Any] | None = None
    rate_choice: dict[str, Any] | None = None
    rate_check: dict[str, Any] | None = None
    rto_ms: float | None = None
    pfc: PfcReport | None = None
    expected: list[dict[str, Any]] | None = None
    fidelity: Fidelity | None = None
    cc: dict[str, Any] | None = None
    train: dict[str, Any] | None = None
    open_loop: dict[str, Any] | None = None
    attribution: dict[str, Any] | None = None
    servers: dict[str, Any] | None = None

    @classmethod
    def from_dict(cls, table: Any, where: str = "metrics") -> RunResult:
        """A metrics table of this schema version or an older one; MetricsError naming
        `where` (the file) and the key for one this code cannot read."""
        if not isinstance(table, dict):
            raise MetricsError(f"{where} is {_name(type(table))}, not a table")
        version = table.get("schema_version", 0)
        if not isinstance(version, int) or isinstance(version, bool) \
                or not 0 <= version <= SCHEMA_VERSION:
            raise MetricsError(f"{where} has schema_version {version!r}; this testbed "
                               f"reads versions up to {SCHEMA_VERSION}")
        rest = {k: v for k, v in table.items() if k != "schema_version"}
        return super().from_dict(rest, where)

    def to_dict(self) -> dict[str, Any]:
        """metrics.json's table: schema_version first."""
        return {"schema_version": SCHEMA_VERSION, **super().to_dict()}

    @classmethod
    def load(cls, folder: Path) -> RunResult:
        """`folder`'s metrics.json (OSError where it cannot be read, MetricsError where it
        is not JSON or not a run's results)."""
        path = Path(folder) / FILE
        try:
            table = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise MetricsError(f"{path} is not JSON ({exc})") from None
        return cls.from_dict(table, str(path))

    def save(self, folder: Path) -> Path:
        """Write `folder`/metrics.json; its path."""
        path = Path(folder) / FILE
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    @property
    def is_train(self) -> bool:
        """A training step (testbed.train_run), not a collective."""
        return bool(self.train)
