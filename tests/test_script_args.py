"""The scripts' flags in `testbed`'s vocabulary (testbed.script_args): --server-count and
--rate, the old --servers N and --rate-mbps as hidden aliases that say so once."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from testbed.experiment import rate_arg
from testbed.script_args import add_rate, add_server_count

ROOT = Path(__file__).resolve().parent.parent


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="claim.py")
    add_server_count(ap)
    add_rate(ap, type=rate_arg, default="auto", metavar="MBPS|auto", help="link rate")
    return ap


def test_new_names_parse_without_a_word(capsys):
    args = parser().parse_args(["--server-count", "2", "--rate", "100"])
    assert (args.servers, args.rate_mbps) == (2, 100.0)
    assert parser().parse_args(["--rate", "auto"]).rate_mbps == "auto"
    assert vars(parser().parse_args([])) == {"servers": 4, "rate_mbps": "auto"}
    assert capsys.readouterr().err == ""


def test_old_names_still_work_and_say_so_once(capsys):
    args = parser().parse_args(["--servers", "2", "--rate-mbps", "25", "--rate-mbps", "30"])
    assert (args.servers, args.rate_mbps) == (2, 30.0)
    assert capsys.readouterr().err.splitlines() == [
        "claim.py: --servers is deprecated, use --server-count",
        "claim.py: --rate-mbps is deprecated, use --rate"]


def test_old_names_are_hidden_and_bad_values_refused(capsys):
    text = parser().format_help()
    assert "--server-count" in text and "--rate MBPS|auto" in text
    assert "--servers" not in text and "--rate-mbps" not in text
    with pytest.raises(SystemExit) as exc:
        parser().parse_args(["--servers", "two"])
    assert exc.value.code == 2 and "invalid int value: 'two'" in capsys.readouterr().err


def test_no_script_defines_the_old_names_itself():
    """Every script takes a server count and a rate through testbed.script_args, so
    `--servers` is a host list and the rate is `--rate` everywhere."""
    offenders = []
    for path in sorted((ROOT / "scripts").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in ("--servers", "--rate-mbps"):
                offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []
