"""Property-based fuzzing of the input layer: topology files, experiment files, --set,
[train] sizes (judged within a time bound), Chakra trace streams (gzipped too, under a
memory cap) and the AFT_ environment variables.

Whatever the input, the CLI accepts it or refuses it with exit 2 and one line naming a
field; the library raises nothing but SpecError; no file or folder appears beside the
inputs. Nothing is ever built: testbed.cli._need_root is replaced by a refusal the tests
recognise as acceptance (a valid `run` stops there, before anything is built).

Fast and deterministic by default; `make fuzz` (HYPOTHESIS_PROFILE=fuzz) runs many more
examples, randomised.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
import os
import re
import resource
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

from testbed import cli
from testbed.environment import VARIABLES
from testbed.experiment import FIELD_NAMES, from_toml
from topologies import files
from topologies.builders import BUILDERS
from topologies.spec import TECHS, SpecError
from traffic import chakra

DEFAULT_EXAMPLES = 300          # per test: the whole file in a few seconds
FUZZ_EXAMPLES = 10_000
_COMMON = {"deadline": None, "database": None,   # no .hypothesis folder left behind
           "suppress_health_check": [HealthCheck.too_slow, HealthCheck.filter_too_much]}
# hypothesis's caches (unicode tables, constants) outside the checkout
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "aft-testbed-hypothesis")
settings.register_profile("default", max_examples=DEFAULT_EXAMPLES, derandomize=True,
                          **_COMMON)
settings.register_profile("fuzz", max_examples=FUZZ_EXAMPLES, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
# [train] sizes, Chakra streams and AFT_ variables: fewer in the suite (their examples
# cost more), as many with `make fuzz`
NEW_EXAMPLES = settings().max_examples if settings().max_examples > DEFAULT_EXAMPLES else 150

NEEDS_ROOT = "fuzz: stopped where root is needed"   # a valid input got this far
# "testbed VERB: <field>: <what is wrong>", the field without spaces
ONE_LINE_RE = re.compile(r"^testbed (validate|run): [^\s:][^\s]*: \S.*$")
KINDS = sorted(BUILDERS)
PARAMS = sorted({p for kind in KINDS for p in files.builder_params(kind)})
SMALL_TOPOLOGY = {"kind": "one_tier", "params": {"nodes": 2, "planes": 1}}


@pytest.fixture(autouse=True, scope="module")
def no_root_ever():
    """A valid input stops at _need_root: nothing is built, whoever runs the tests."""
    def refuse(verb: str) -> None:
        raise cli.UsageError(NEEDS_ROOT)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cli, "_need_root", refuse)
        yield


# -- values ------------------------------------------------------------------------------
edge_ints = st.sampled_from([-1, 0, 1, 2, 3, 8, 9000, 2**31, 2**63 - 1, -(2**63), 10**6])
numbers = st.one_of(st.integers(0, 6), edge_ints,
                    st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([1e-9, 0.05, 0.1, 100.0, 32000.0, 1e9, -0.0]))
words = st.one_of(st.sampled_from(sorted(TECHS) + KINDS + ["on", "off", "", "auto"]),
                  st.text(st.characters(blacklist_categories=("Cs",)), max_size=12))
scalars = st.one_of(numbers, words, st.booleans(), st.dates(), st.times())
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(words, inner, max_size=3)), max_leaves=6)
keys = st.one_of(words, st.sampled_from(PARAMS))


def toml_value(value: object) -> str:
    """TOML for a value hypothesis drew (datetime types as TOML's local ones)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if -(2**63) <= value < 2**63 else json.dumps(str(value))
    if isinstance(value, float):
        return ("nan" if math.isnan(value) else "inf" if value > 0 else "-inf") \
            if not math.isfinite(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{toml_key(k)} = {toml_value(v)}"
                               for k, v in value.items()) + "}"
    return value.isoformat()      # date, time


def toml_key(key: str) -> str:
    return json.dumps(key, ensure_ascii=False)


def toml_table(name: str | None, table: dict) -> str:
    head = f"[{toml_key(name)}]\n" if name is not None else ""
    return head + "".join(f"{toml_key(k)} = {toml_value(v)}\n" for k, v in table.items())


@st.composite
def topology_tables(draw) -> dict:
    """A topology table around the schema: real kinds and parameters, odd values."""
    kind = draw(st.one_of(st.sampled_from(KINDS), words))
    allowed = files.builder_params(kind) if kind in BUILDERS else PARAMS
    params = draw(st.dictionaries(st.one_of(st.sampled_from(allowed), keys),
                                  st.one_of(numbers, words, values), max_size=4))
    table: dict = {"kind": kind} if draw(st.booleans()) or not params else {}
    table["params"] = params if draw(st.integers(0, 9)) else draw(values)
    extra = draw(st.dictionaries(st.one_of(st.sampled_from(["name", "scale_factor"]), keys),
                                 st.one_of(numbers, words), max_size=2))
    return {**extra, **table}


def experiment_values(key: str):
    """Values for an [experiment] key: of every type, with the key's likely ones."""
    likely = {"workload": st.sampled_from(["p2p", "permutation", "incast", "allreduce",
                                           "alltoall", "x"]),
              "pfc": st.sampled_from(["", "on", "off", "x"]),
              "rate": st.one_of(st.sampled_from(["", "auto"]), numbers),
              "pairs": st.lists(st.sampled_from(["cpu0>cpu1", "cpu0>cpu0", "x>y", "a"]),
                                max_size=2),
              "loss_links": st.lists(st.sampled_from(["cpu0:plane0", "a:b", "x"]),
                                     max_size=2),
              "pcap": st.lists(st.sampled_from(["cpu0-eth0", "plane0-eth9", "x"]),
                               max_size=2),
              "failures": st.lists(st.dictionaries(
                  st.sampled_from(["link", "lane", "at_s", "repair_s", "x"]),
                  st.one_of(numbers, st.sampled_from(["cpu0:plane0", "a:b"]))), max_size=2)}
    return st.one_of(likely.get(key, numbers), values)


@st.composite
def experiment_files(draw) -> str:
    names = draw(st.lists(st.one_of(st.sampled_from(sorted(FIELD_NAMES - {"topology"})),
                                    keys), max_size=5, unique=True))
    table = {k: draw(experiment_values(k)) for k in names}
    text = toml_table("experiment", table) if draw(st.integers(0, 5)) else ""
    topo = draw(st.one_of(st.just(SMALL_TOPOLOGY), topology_tables(), words))
    if isinstance(topo, dict):
        text += toml_table("topology", {k: v for k, v in topo.items() if k != "params"})
        if "params" in topo:
            text += "[topology.params]\n" if isinstance(topo["params"], dict) else ""
            text += toml_table(None, topo["params"]) if isinstance(topo["params"], dict) \
                else f"# params {toml_value(topo['params'])}\n"
    elif "topology" not in table:
        text = f"topology = {toml_value(topo)}\n" + text if not text else \
            text.replace("[experiment]\n", f"[experiment]\ntopology = {toml_value(topo)}\n", 1)
    if not draw(st.integers(0, 9)):
        text += toml_table(draw(words), draw(st.dictionaries(keys, scalars, max_size=2)))
    return text


plausible_sets = st.builds(lambda k, v: f"{k}={v}", st.sampled_from(PARAMS), st.one_of(
    st.integers(1, 4).map(str), st.sampled_from(sorted(TECHS) + ["0.1", "100", "65536"])))
set_items = st.one_of(
    plausible_sets, plausible_sets,
    st.builds(lambda k, v: f"{k}={v}", st.one_of(st.sampled_from(PARAMS), words),
              st.one_of(numbers.map(lambda n: toml_value(n)), words,
                        st.sampled_from(["nan", "inf", "-inf", "1e-9", "[1, 2]", "{a = 1}",
                                         '"laser"', "true", "1979-05-27", "0x10"]))),
    words)


# -- the property --------------------------------------------------------------------------
def run_main(argv: list[str]) -> tuple[int, str]:
    """testbed.cli.main in this process: (exit code, stderr)."""
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = cli.main(argv)
        except SystemExit as exc:    # argparse's own refusal
            code = exc.code
    return code, err.getvalue()


def assert_accepted_or_refused(argv: list[str], folder: Path) -> None:
    before = sorted(folder.rglob("*"))
    code, stderr = run_main(argv)
    assert code in (0, 2), (argv, code, stderr)
    assert "Traceback" not in stderr, (argv, stderr)
    if code == 2 and "error: argument" not in stderr and "error: unrecognized" not in stderr:
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and ONE_LINE_RE.match(lines[0]), (argv, stderr)
    assert sorted(folder.rglob("*")) == before, (argv, "left something behind")
    event(f"{argv[0]}: " + ("accepted" if code == 0 or NEEDS_ROOT in stderr else
                            "refused by argparse" if "error: " in stderr else "refused"))


def library_accepts_or_refuses(fn, *args) -> object | None:
    try:
        return fn(*args)
    except SpecError as exc:
        assert exc.field and "\n" not in str(exc), repr(exc)
        return None


def _workdir(tmp_path_factory, name: str) -> Path:
    return tmp_path_factory.mktemp(name)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(table=topology_tables(), raw=st.one_of(st.none(), st.binary(max_size=40)))
def test_topology_files(tmp_path_factory, table, raw):
    folder = _workdir(tmp_path_factory, "topo")
    path = folder / "t.toml"
    path.write_bytes(raw if raw is not None else toml_table(None, {
        k: v for k, v in table.items() if k != "params"}).encode()
        + (f"[params]\n{toml_table(None, table['params'])}" if isinstance(
            table.get("params"), dict) else "").encode())
    assert_accepted_or_refused(["validate", str(path)], folder)
    assert_accepted_or_refused(["run", "--topology", str(path), "--results",
                                str(folder / "res")], folder)
    library_accepts_or_refuses(files.resolve, str(path))
    library_accepts_or_refuses(files.from_data, table)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(text=experiment_files())
# found by the fuzz profile: a key ending in a newline passed a `^...$` pattern (`$` also
# matches before a final newline) and split the refusal over two lines
@example(text='["experiment"]\n"0\\n" = 0\n["topology"]\n"kind" = "one_tier"\n'
              '[topology.params]\n"nodes" = 2\n"planes" = 1\n')
@example(text='["experiment"]\n"name" = "a\\n"\n')
def test_experiment_files(tmp_path_factory, text):
    folder = _workdir(tmp_path_factory, "exp")
    path = folder / "e.toml"
    path.write_text(text)
    assert_accepted_or_refused(["run", str(path), "--results", str(folder / "res")], folder)
    exp = library_accepts_or_refuses(from_toml, str(path))
    if exp is not None:
        topo = library_accepts_or_refuses(exp.resolve_topology)
        if topo is not None:
            library_accepts_or_refuses(exp.check_against, topo)
    assert sorted(p.name for p in folder.iterdir()) == ["e.toml"]


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(kind=st.sampled_from(KINDS), items=st.lists(set_items, min_size=1, max_size=3),
       flags=st.lists(st.sampled_from([
           ["--ranks", "0"], ["--ranks", "1"], ["--ranks", "3"], ["--rate", "1e-9"],
           ["--rate", "nan"], ["--pfc", "on"], ["--pfc-xoff", "999999999"],
           ["--workload", "p2p"], ["--loss", "nan"], ["--timeout", "inf"]]), max_size=2))
def test_set_assignments(tmp_path_factory, kind, items, flags):
    folder = _workdir(tmp_path_factory, "set")
    sets = [arg for item in items for arg in ("--set", item)]
    assert_accepted_or_refused(["validate", kind, *sets], folder)
    assert_accepted_or_refused(["run", "--topology", kind, *sets, *sum(flags, []),
                                "--results", str(folder / "res")], folder)
    overrides = library_accepts_or_refuses(files.parse_assignments, items)
    if overrides is not None:
        library_accepts_or_refuses(files.resolve, kind, overrides)


# -- [train] sizes, Chakra streams, AFT_ variables -------------------------------------------
TRAIN_WITHIN_S = 5.0            # a [train] table is judged from its settings, in well under
TRAIN_INTS = st.one_of(st.integers(0, 8), edge_ints, st.sampled_from(
    [16, 64, 1000, 4096, 65536, 10**5, 10**5 + 1, 1 << 20, 1 << 24, 10**9]))
TRAIN_VALUES = {"layers": TRAIN_INTS, "hidden_size": TRAIN_INTS, "seq_len": TRAIN_INTS,
                "micro_batch": TRAIN_INTS, "global_batch": TRAIN_INTS, "tp": TRAIN_INTS,
                "pp": TRAIN_INTS, "ep": TRAIN_INTS, "experts": TRAIN_INTS,
                "top_k": TRAIN_INTS, "dtype_bytes": TRAIN_INTS, "bucket_mb": numbers,
                "gpu_tflops": numbers, "layer_ms": numbers,
                "schedule": st.sampled_from(["1f1b", "gpipe", "x"]),
                "placement": st.sampled_from(["tp-first", "dp-first"]),
                "byte_scale": st.one_of(st.just("auto"), numbers)}


@st.composite
def train_files(draw) -> str:
    """A train_step experiment whose [train] sizes are anything, small to absurd."""
    keys = draw(st.lists(st.sampled_from(sorted(TRAIN_VALUES)), max_size=6, unique=True))
    table = {k: draw(TRAIN_VALUES[k]) for k in keys}
    topo = draw(st.sampled_from([SMALL_TOPOLOGY, {"kind": "rail_optimized"},
                                 {"kind": "rail_optimized", "params": {"servers": 8}}]))
    ranks = draw(st.sampled_from([None, 2, 4, 8, 16]))
    return (toml_table("experiment", {"workload": "train_step", **(
        {"ranks": ranks} if ranks else {})}) + toml_table("train", table)
        + toml_table("topology", {"kind": topo["kind"]})
        + (f"[topology.params]\n{toml_table(None, topo['params'])}" if "params" in topo
           else ""))


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
          max_examples=NEW_EXAMPLES)
@given(text=train_files())
@example(text='[experiment]\nworkload = "train_step"\n[train]\nlayers = 100000\n'
              'global_batch = 16777216\n')
@example(text='[experiment]\nworkload = "train_step"\n[train]\nhidden_size = 1048576\n'
              'seq_len = 16777216\nmicro_batch = 16777216\n')
def test_train_sizes(tmp_path_factory, text):
    folder = _workdir(tmp_path_factory, "train")
    path = folder / "e.toml"
    path.write_text(text)
    t0 = time.monotonic()
    assert_accepted_or_refused(["run", str(path), "--results", str(folder / "res")], folder)
    assert time.monotonic() - t0 < TRAIN_WITHIN_S, text


@contextlib.contextmanager
def memory_cap(extra_bytes: int):
    """This process's address space capped at what it maps now plus `extra_bytes`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    now = int(Path("/proc/self/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (min(now + extra_bytes, hard)
                                            if hard != resource.RLIM_INFINITY
                                            else now + extra_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


FUZZ_TRACE_BYTES = 1 << 16      # chakra's bound while fuzzing: bombs near it stay cheap
varints = st.integers(0, 2**64).map(lambda n: chakra._varint(n))
stream_parts = st.one_of(st.binary(max_size=24), varints,
                         st.builds(lambda n: chakra._varint(n) + bytes(min(n, 64)),
                                   st.integers(0, 80)),
                         st.sampled_from([b"\x1f\x8b", b"\x00" * 8, b"\xff" * 10]))


@st.composite
def trace_streams(draw) -> bytes:
    """A rank's trace: framed messages and bytes around them, gzipped or not; or zeros
    gzipped, under, at and past the (fuzzing) bound."""
    if draw(st.integers(0, 4)) == 0:
        n = draw(st.sampled_from([0, 1, FUZZ_TRACE_BYTES - 1, FUZZ_TRACE_BYTES,
                                  FUZZ_TRACE_BYTES + 1, 8 * FUZZ_TRACE_BYTES]))
        return gzip.compress(bytes(n))
    data = b"".join(draw(st.lists(stream_parts, max_size=8)))
    how = draw(st.integers(0, 3))
    return gzip.compress(data) if how == 0 else gzip.compress(data)[:-3] if how == 1 \
        else data


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
          max_examples=NEW_EXAMPLES)
@given(streams=st.lists(trace_streams(), min_size=1, max_size=3),
       group=st.one_of(st.none(), st.binary(max_size=20), st.just(b'{"1": [0, 1]}')))
def test_chakra_streams(tmp_path_factory, streams, group):
    folder = _workdir(tmp_path_factory, "trace")
    traces = folder / "traces"
    traces.mkdir()
    for i, data in enumerate(streams):
        (traces / f"t.{i}.et").write_bytes(data)
    if group is not None:
        (traces / chakra.COMM_GROUP_FILE).write_bytes(group)
    with pytest.MonkeyPatch.context() as mp, memory_cap(1 << 30):
        mp.setattr(chakra, "MAX_TRACE_BYTES", FUZZ_TRACE_BYTES)
        assert_accepted_or_refused(["run", "--workload", "train_step", "--trace",
                                    str(traces), "--topology", "one_tier", "--results",
                                    str(folder / "res")], folder)
        try:
            chakra.read_traces(traces)
        except chakra.ChakraError as exc:
            assert "\n" not in str(exc)


env_values = st.one_of(
    st.sampled_from(["", "compiled", "interpreted", " Interpreted", "nosuch", "/proc/self",
                     "python;id", "/", "/proc", "/dev/null", "/tmp", "../x", "a\nb",
                     "/nonexistent/x", "$(id)", "-oProxyCommand=x"]),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
            max_size=16))


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
          max_examples=NEW_EXAMPLES)
@given(assigned=st.dictionaries(st.sampled_from(sorted(VARIABLES)), env_values, min_size=1,
                                max_size=3))
def test_aft_variables(tmp_path_factory, assigned):
    folder = _workdir(tmp_path_factory, "env")
    with pytest.MonkeyPatch.context() as mp:
        for name, value in assigned.items():
            mp.setenv(name, value)
        assert_accepted_or_refused(["validate", "one_tier"], folder)
