"""Inputs that once exhausted the machine or gave a traceback are bounded and refused in
one line with exit 2, before anything is planned, read past a bound or built (no root):
a training plan too big for the machine, a Chakra trace that is a gzip bomb, a bad AFT_
environment variable, a server name a shell would read, a trace without train_step."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import zlib

import pytest

from testbed.environment import VARIABLES, check_environment
from topologies.partition import check_servers
from topologies.spec import SpecError
from traffic import chakra
from traffic.job import expand
from traffic.train import TrainSettings, plan_job
from traffic.train_size import MAX_STEPS, check_plan_size, plan_size

from .test_chakra import _job
from .test_cli import ROOT

REFUSE_WITHIN_S = 10        # each refusal here takes well under a second
# A results folder that cannot be made: checked after the experiment, so a check that went
# missing gives another refusal here, never a run (the tests may run as root)
NOWHERE = "/proc/aft-test-nowhere"


def run_cli(*args: str, env: dict | None = None, memory_bytes: int | None = None,
            timeout: float = 30) -> subprocess.CompletedProcess:
    """`testbed ARGS` in a child process, its address space capped at `memory_bytes`."""
    cap = "" if memory_bytes is None else (
        f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({memory_bytes}, "
        f"{memory_bytes})); ")
    code = cap + "import sys; from testbed.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def refused(out: subprocess.CompletedProcess, field: str, words: str = "") -> bool:
    lines = out.stderr.strip().splitlines()
    return (out.returncode == 2 and len(lines) == 1 and f": {field}: " in lines[0]
            and words in lines[0] and "Traceback" not in out.stderr)


def train_file(tmp_path, train: str, workload: str = "train_step") -> str:
    path = tmp_path / "e.toml"
    path.write_text(f'[experiment]\nworkload = "{workload}"\n[train]\n{train}\n'
                    '[topology]\nkind = "rail_optimized"\n')
    return str(path)


# -- a plan that cannot fit ----------------------------------------------------------------
@pytest.mark.parametrize(("train", "field", "words"), [
    ("layers = 1000000000", "experiment.layers", "not in [1, 100000]"),
    ("layers = 1000\nhidden_size = 65536\nseq_len = 1000000", "train.layers",
     "agent steps"),
    ("hidden_size = 1000000000", "experiment.hidden_size", "not in [1,"),
    (f"seq_len = {2**63 - 1}", "experiment.seq_len", "not in [1,"),
    ("layers = 4000\nglobal_batch = 64", "train.layers", f"more than the {MAX_STEPS}"),
    ("hidden_size = 1048576\nseq_len = 16777216", "train.seq_len", "longest computation"),
    ("gpu_tflops = 1e-300", "train.gpu_tflops", "longest computation"),
    ("bucket_mb = 1e-300\nlayers = 2000\ntp = 4", "train.layers", "more than"),
])
def test_a_plan_too_big_is_refused_in_one_line_at_once(tmp_path, train, field, words):
    out = run_cli("run", train_file(tmp_path, train), "--results", NOWHERE,
                  timeout=REFUSE_WITHIN_S)
    assert refused(out, field, words), out.stderr


@pytest.mark.parametrize("kw", [
    {}, {"tp": 4}, {"tp": 2, "pp": 2}, {"tp": 2, "pp": 2, "layers": 6, "schedule": "gpipe"},
    {"experts": 4, "ep": 2, "tp": 2}, {"experts": 4, "ep": 4, "pp": 2, "bucket_mb": 0.001},
    {"pp": 4, "layers": 8, "global_batch": 32, "bucket_mb": 1e6},
    {"experts": 2, "top_k": 1, "tp": 2, "overlap": "off"},
    {"hidden_size": 64, "seq_len": 16, "bucket_mb": 0.05, "layers": 12, "pp": 3, "tp": 2}])
def test_the_counted_size_is_the_planned_one(kw):
    t = TrainSettings(**kw)
    ranks = 16 if kw.get("pp") != 3 else 12
    job = plan_job(t, [f"r{i}" for i in range(ranks)])
    schedule = expand(job)
    ops = [op for o in job.ranks.values() for op in o]
    size = plan_size(t, ranks)
    assert size.ops == len(ops)
    assert size.steps == sum(len(s) for s in schedule.values())
    assert size.transfers == len({x.tag for s in schedule.values() for st in s
                                  for x in st.sends + st.recvs})
    assert size.message_bytes == max(op.size_bytes for op in ops)
    assert size.compute_s == pytest.approx(max(op.duration_ns for op in ops) / 1e9, abs=1e-9)


def test_a_plan_at_the_bound_is_accepted():
    assert check_plan_size(TrainSettings(layers=40, tp=4, pp=2, global_batch=64), 32).steps \
        <= MAX_STEPS


# -- Chakra traces: bounded reads ----------------------------------------------------------
def _zeros_gz(path, total_bytes: int) -> None:
    """`total_bytes` of zeros, gzipped chunk by chunk (never held whole)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    with open(path, "wb") as out:
        for _ in range(total_bytes >> 20):
            out.write(z.compress(zeros))
        out.write(z.compress(bytes(total_bytes & ((1 << 20) - 1))) + z.flush())


def test_a_gzip_just_past_the_bound_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(chakra, "MAX_TRACE_BYTES", 1 << 16)
    _zeros_gz(tmp_path / "t.0.et", (1 << 16) + 1)
    with pytest.raises(chakra.ChakraError, match=f"more than {1 << 16} bytes gunzipped"):
        chakra.check_traces(tmp_path)
    with pytest.raises(chakra.ChakraError, match=f"more than {1 << 16} bytes gunzipped"):
        chakra.read_traces(tmp_path)


def test_all_traces_together_are_bounded(tmp_path, monkeypatch):
    chakra.write_traces(_job(), tmp_path)
    sizes = [p.stat().st_size for p in chakra.trace_files(tmp_path)]
    monkeypatch.setattr(chakra, "MAX_TRACES_BYTES", sum(sizes) - 1)
    with pytest.raises(chakra.ChakraError, match="a trace may have"):
        chakra.read_traces(tmp_path)
    monkeypatch.setattr(chakra, "MAX_TRACES_BYTES", sum(sizes))
    assert chakra.read_traces(tmp_path).ranks


def test_nodes_per_rank_are_bounded(tmp_path, monkeypatch):
    chakra.write_traces(_job(), tmp_path)
    most = max(len(ops) for ops in _job().ranks.values())
    monkeypatch.setattr(chakra, "MAX_NODES_PER_RANK", most - 1)
    for fn in (chakra.check_traces, chakra.read_traces):
        with pytest.raises(chakra.ChakraError, match=f"more than {most - 1} nodes"):
            fn(tmp_path)


def test_a_real_trace_under_the_bounds_loads_gzipped_or_not(tmp_path):
    paths = chakra.write_traces(_job(), tmp_path / "plain")
    (tmp_path / "gz").mkdir()
    for p in paths:
        (tmp_path / "gz" / p.name).write_bytes(gzip.compress(p.read_bytes())
                                               if p.suffix == ".et" else p.read_bytes())
    assert chakra.check_traces(tmp_path / "gz") == chakra.trace_files(tmp_path / "gz")
    assert chakra.read_traces(tmp_path / "gz") == chakra.read_traces(tmp_path / "plain")


def test_a_broken_gzip_or_a_fifo_is_one_error(tmp_path):
    (tmp_path / "t.0.et").write_bytes(gzip.compress(b"x" * 1000)[:-9] + b"garbage!!")
    with pytest.raises(chakra.ChakraError, match="broken gzip"):
        chakra.check_traces(tmp_path)
    os.unlink(tmp_path / "t.0.et")
    os.mkfifo(tmp_path / "t.0.et")
    with pytest.raises(chakra.ChakraError, match="not a regular file"):
        chakra.check_traces(tmp_path)


def test_a_gzip_bomb_is_refused_in_bounded_memory(tmp_path):
    """200 MB of zeros in some 200 KB: refused in one line within a 1 GiB address space
    (reading it whole would need 200 MB more than the bound lets be held)."""
    bomb = tmp_path / "bomb"
    bomb.mkdir()
    _zeros_gz(bomb / "t.0.et", 200 << 20)
    _zeros_gz(bomb / "t.1.et", 200 << 20)
    assert (bomb / "t.0.et").stat().st_size < 1 << 20
    out = run_cli("run", "--workload", "train_step", "--trace", str(bomb), "--topology",
                  "one_tier", "--results", NOWHERE, memory_bytes=1 << 30)
    assert refused(out, "train.trace", "bytes gunzipped"), out.stderr


# -- --trace only with train_step ------------------------------------------------------------
@pytest.mark.parametrize("workload", ["allreduce", "alltoall", "p2p"])
def test_a_trace_needs_the_train_step_workload(tmp_path, workload):
    out = run_cli("run", "--workload", workload, "--trace", str(tmp_path), "--results",
                  NOWHERE)
    assert refused(out, "train.trace", "train_step"), out.stderr
    out = run_cli("run", train_file(tmp_path, f'trace = "{tmp_path}"', workload),
                  "--results", NOWHERE)
    assert refused(out, "train.trace", "train_step"), out.stderr


# -- AFT_ variables ------------------------------------------------------------------------
BAD_ENVIRONMENT = [
    ("AFT_ENGINE", "nosuch", "compiled, interpreted"),
    ("AFT_ENGINE", "/proc/self", "compiled, interpreted"),
    ("AFT_ENGINE", "python;id", "compiled, interpreted"),
    ("AFT_SSH_NETNS", "nosuchns", "network namespace in /run/netns"),
    ("AFT_SSH_NETNS", "../../proc/1/ns/net", "network namespace in /run/netns"),
    ("AFT_SSH_CONFIG", "/nonexistent/ssh_config", "ssh_config file"),
    ("AFT_SSH_CONFIG", "/tmp", "ssh_config file"),
    ("AFT_REMOTE_DIR", "relative/clone", "absolute path"),
    ("AFT_REMOTE_DIR", "/clone\nrm -rf /", "one line"),
    ("AFT_CALIBRATION", "/dev/null", "regular file"),
    ("AFT_CALIBRATION", "/proc", "regular file"),
    ("AFT_CALIBRATION", "", "file's path"),
    ("AFT_VM_DIR", "vm", "absolute path"),
    ("AFT_VM_DIR", "/dev/null", "a folder"),
]


def test_every_variable_read_has_a_bad_value_here():
    assert {name for name, _, _ in BAD_ENVIRONMENT} == set(VARIABLES)


@pytest.mark.parametrize(("name", "value", "words"), BAD_ENVIRONMENT)
def test_a_bad_variable_is_one_line_at_start_up(name, value, words):
    out = run_cli("doctor", "--servers", "a", env={name: value})
    assert refused(out, name, words), out.stderr
    with pytest.raises(SpecError, match=name):
        check_environment({name: value})


def test_good_or_unset_variables_pass(tmp_path):
    (tmp_path / "ssh_config").write_text("")
    check_environment({})
    check_environment({"AFT_ENGINE": "Interpreted ", "AFT_SSH_CONFIG": str(tmp_path /
                       "ssh_config"), "AFT_SSH_NETNS": "", "AFT_REMOTE_DIR": "/nonexistent",
                       "AFT_CALIBRATION": str(tmp_path / "new" / "c.json"),
                       "AFT_VM_DIR": str(tmp_path), "AFT_FABRIC": "anything"})


# -- server names ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["$(id)", "`id`", "a b", "-oProxyCommand=x", "a;b", "(a)",
                                  "a'b", 'a"b', "a\nb", "a..b", "a%b", "user@-x", "@a",
                                  "fe80::1%eth0", "a|b", "a&b", "a>b", "x" * 254])
def test_a_server_a_shell_would_read_is_refused(name):
    with pytest.raises(SpecError, match="is not a host name or address"):
        check_servers([name])


def test_servers_ssh_takes_pass():
    hosts = ["a", "gpu-node-01.example.com", "root@198.18.0.10", "::1", "user@fe80::1",
             "ssh_alias", "10.0.0.1"]
    assert check_servers(hosts) == hosts


def test_the_cli_refuses_a_server_name_with_a_command_in_it():
    out = run_cli("doctor", "--servers", "$(id)")
    assert refused(out, "--servers", "not a host name"), out.stderr


def test_a_comm_group_file_of_any_bytes_is_one_error(tmp_path):
    chakra.write_traces(_job(), tmp_path)
    (tmp_path / chakra.COMM_GROUP_FILE).write_bytes(b"\x80\xff{")
    with pytest.raises(chakra.ChakraError, match="not JSON"):
        chakra.read_traces(tmp_path)
