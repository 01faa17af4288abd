"""Command line: `testbed VERB ...` (same as `python -m testbed VERB ...`).

Exit codes: 0 success; 2 bad input or a missing prerequisite (one-line reason on
stderr, nothing built); 1 a run or check that failed. A run stopped by a signal is
torn down and its folder marked FAILED, then exits 128 + the signal: 130 after Ctrl-C,
143 after SIGTERM (what a shell reports for a process the signal ended).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from testbed import log
from testbed.environment import check_environment
from testbed.experiment import SETTINGS_TYPES, Experiment
from testbed.outputs import check_output_folder
from testbed.sizes import is_sweep
from testbed.version import version
from topologies.files import parse_assignments, resolve
from topologies.settings import add_flags, flag_values
from topologies.spec import SpecError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_BROKEN_PIPE = 128 + 13      # what a shell reports for a command SIGPIPE ended
DEFAULT_TOPOLOGY = "rail_optimized"


class UsageError(Exception):
    """Bad input or missing prerequisite: exit 2 with this message."""


def _need_root(verb: str) -> None:
    if os.geteuid() != 0:
        raise UsageError(f"'testbed {verb}' needs root: run it with sudo")


def _topology(args):
    return resolve(args.topology, parse_assignments(args.set or []))


def _add_topology_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("topology", nargs="?", default=DEFAULT_TOPOLOGY,
                   help="a topology file (.toml), a file shipped in topologies/ by name "
                        "(rail_optimized, rail_only, one_tier, full_mesh, leaf_spine, rail128) "
                        f"or a builder kind; default {DEFAULT_TOPOLOGY}")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a builder parameter, e.g. --set servers=2 (repeatable)")


# -- verbs -------------------------------------------------------------------------------
def _on_servers(fn, *a) -> int:
    """A verb on several machines (testbed.cli_spread): a server that cannot be reached or
    used is one line and exit 2."""
    from fabric.cluster import ServerError
    try:
        return fn(*a)
    except ServerError as exc:
        raise UsageError(str(exc)) from None


def cmd_deploy(args) -> int:
    topo = _topology(args)
    if args.servers:
        from testbed import cli_spread
        if args.cli:
            raise UsageError("--cli: the Mininet CLI is for a fabric on this machine, not "
                             "with --servers")
        return _on_servers(cli_spread.deploy, topo, cli_spread.servers_arg(args.servers),
                           args.seed, args.check, log.progress)
    _need_root("deploy")
    from fabric.core import Fabric, FabricError, detach_shells
    from testbed.report import fabric_summary
    fabric = Fabric(topo, seed=args.seed, progress=log.progress)
    try:
        fabric.check_free()
    except FabricError as exc:
        raise UsageError(str(exc)) from None
    log.progress(f"building {topo.name}: {topo.graph.number_of_nodes()} nodes, "
              f"{topo.graph.number_of_edges()} links")
    try:
        fabric.start()
    except FabricError as exc:
        raise UsageError(str(exc)) from None
    status = EXIT_OK
    try:
        print(fabric_summary(fabric))
        if args.check:
            from fabric.checks import check_fabric
            ok, text = check_fabric(fabric, progress=log.progress)
            print(text)
            status = EXIT_OK if ok else EXIT_FAILED
        if args.cli:
            fabric.cli()
    except BaseException:
        fabric.stop()
        raise
    detach_shells(fabric)  # the namespaces (and the fabric) stay until `testbed destroy`
    print("deployed; see it with 'testbed inspect', remove it with 'testbed destroy'")
    return status


def cmd_destroy(args) -> int:
    if args.servers:
        from testbed import cli_spread
        return _on_servers(cli_spread.destroy, cli_spread.servers_arg(args.servers), False)
    _need_root("destroy")
    from fabric.clean import destroy
    report = destroy()
    if report.total() == 0:
        print("nothing deployed")
    else:
        print(f"destroyed: {len(report.namespaces)} namespaces, "
              f"{len(report.processes)} processes")
    return EXIT_OK


def cmd_clean(args) -> int:
    if args.servers:
        from testbed import cli_spread
        return _on_servers(cli_spread.destroy, cli_spread.servers_arg(args.servers), True)
    _need_root("clean")
    from fabric.clean import clean
    report = clean()
    print(f"removed {len(report.processes)} processes, {len(report.namespaces)} namespaces, "
          f"{len(report.links)} root-namespace links of the testbed")
    for folder in report.failed_runs:
        print(f"marked FAILED (the run was killed): {folder}")
    return EXIT_OK


def cmd_inspect(args) -> int:
    _need_root("inspect")
    from fabric.inspect import inspect_deployed
    data = inspect_deployed(routes=args.routes, node=args.node)
    if data is None:
        raise UsageError("nothing deployed (no fabric state in /run/testbed); "
                         "deploy one with 'testbed deploy TOPO'")
    if args.format == "json":
        print(json.dumps(data, indent=1))
    else:
        from fabric.inspect import format_inspect
        print(format_inspect(data))
    return EXIT_OK


def cmd_exec(args) -> int:
    _need_root("exec")
    from testbed.cli_exec import exec_in_node
    return exec_in_node(args.node, args.command)


def cmd_graph(args) -> int:
    from testbed.diagram_text import write_diagram
    from testbed.dry_run import experiment_topology, is_experiment_file, load_experiment
    topo = (experiment_topology(load_experiment(args.topology, {}, args.set))
            if is_experiment_file(args.topology) else _topology(args))
    out = write_diagram(topo, args.output, args.format)
    if out is not None:
        print(f"wrote {out}")
    return EXIT_OK


def _dry_run(verb: str, exp: Experiment, fmt: str, force: bool) -> int:
    """Print what a run of `exp` would do (testbed.dry_run); exit 2 if it would be
    refused, each refusal one line on stderr."""
    from testbed.dry_run import format_plan, plan
    check_output_folder("experiment.results_dir", exp.results_dir)
    p = plan(exp, force)
    if fmt == "json":
        print(json.dumps({k: v for k, v in p.items() if k != "config_toml"}, indent=1))
    else:
        print(format_plan(p))
    for x in p["refused"]:
        print(f"testbed {verb}: would be refused: {x['field']}: {x['reason']}",
              file=sys.stderr)
    return EXIT_USAGE if p["refused"] else EXIT_OK


def cmd_partition(args) -> int:
    from testbed.cli_spread import servers_arg
    from topologies.partition import partition
    servers = servers_arg(args.servers)
    topo = _topology(args)
    plan = partition(topo, servers, seed=args.seed)
    if args.format == "json":
        print(json.dumps(plan.to_json(), indent=1))
    else:
        print("\n".join(plan.lines(topo)))
        for c in plan.cut:
            print(f"    {c.a} ({c.server_a}) -- {c.b} ({c.server_b}): {c.rate_mbps:g} Mbit/s")
    return EXIT_OK


def cmd_doctor(args) -> int:
    from fabric import doctor
    if args.servers:
        return _doctor_servers(args)
    checks = doctor.run_checks()
    if args.format == "json":
        print(json.dumps(doctor.to_json(checks), indent=1))
    else:
        print(doctor.format_table(checks))
    return EXIT_OK


def _doctor_servers(args) -> int:
    """Each server's checks over ssh (fabric.cluster); exit 1 if one lacks something, 2
    (one line) if one cannot be reached."""
    from fabric import cluster, doctor
    from testbed.cli_spread import servers_arg
    servers = servers_arg(args.servers)
    try:
        checks = cluster.check_servers(servers, cluster.ssh_config_from_env(),
                                       os.environ.get("AFT_SSH_NETNS") or None)
    except cluster.ServerError as exc:
        raise UsageError(str(exc)) from None
    if args.format == "json":
        print(json.dumps(doctor.to_json(checks), indent=1))
    else:
        print(doctor.format_table(checks))
    return EXIT_OK if all(c.available for c in checks) else 1


def cmd_validate(args) -> int:
    from testbed.dry_run import is_experiment_file, load_experiment
    overrides = flag_values(args, Experiment)
    if is_experiment_file(args.spec):
        exp = load_experiment(args.spec, overrides, args.set)
        return _dry_run("validate", exp, args.format, args.force)
    if overrides or args.force:
        given = ", ".join(sorted(overrides)) or "force"
        raise UsageError(f"{given}: settings are checked with an experiment file (a .toml "
                         f"with an [experiment] table); {args.spec} is a topology")
    topo = resolve(args.spec, parse_assignments(args.set or []))
    summary = topo.summary()
    if args.format == "json":
        print(json.dumps(summary, indent=1))
    else:
        roles = ", ".join(f"{n} {r}" for r, n in summary["roles"].items())
        print(f"{topo.name} ({topo.kind}): {summary['nodes']} nodes ({roles}), "
              f"{summary['links']} links; valid")
    return EXIT_OK


def cmd_run(args) -> int:
    from testbed.dry_run import load_experiment
    exp = load_experiment(args.experiment, flag_values(args, Experiment), args.set)
    if args.dry_run:
        return _dry_run("run", exp, args.format, args.force)
    exp.check_against(exp.resolve_topology())  # bad input: exit 2 before anything is built
    check_output_folder("experiment.results_dir", exp.results_dir)
    if exp.servers:         # no root needed here: the servers build (testbed.run_spread)
        from fabric.cluster import ServerError
        from testbed.run_spread import run_spread
        return _report_run(lambda: run_spread(exp, log.progress, args.force), ServerError,
                           "every server's part removed", args.format)
    _need_root("run")
    from fabric.core import FabricError
    if is_sweep(exp.message_bytes):   # one run per size, then one table (testbed.sweep)
        from testbed import sweep
        try:
            return sweep.main(exp, log.progress, force=args.force)
        except FabricError as exc:
            raise UsageError(str(exc)) from None
    from testbed.run import run
    return _report_run(lambda: run(exp, progress=log.progress, force=args.force), FabricError,
                       "cleaned up", args.format)


def _report_run(run_it, unusable: type[Exception], cleaned: str, fmt: str) -> int:
    """Run (`run_it`: the results folder and metrics) and say how it ended: `unusable` is
    one line and exit 2 (nothing could be built), a failed run exit 1, a stop signal
    128 + it (torn down, `cleaned`), else the summary (`fmt` json: metrics.json) and
    exit 0."""
    from testbed.calibrate import CalibrationError
    from testbed.interrupts import Terminated
    from testbed.results import RunFailedError
    try:
        folder, _ = run_it()      # SIGTERM: Terminated, torn down
    except unusable as exc:
        raise UsageError(str(exc)) from None
    except CalibrationError as exc:   # rate auto, and this machine's calibration failed
        print(f"testbed run: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except RunFailedError as exc:
        print(f"testbed run: FAILED: {exc} (see {exc.folder})", file=sys.stderr)
        return EXIT_FAILED
    except Terminated as exc:
        print(f"testbed run: {exc.reason}; {cleaned}, results marked FAILED",
              file=sys.stderr)
        return exc.exit_code
    if fmt == "json":          # stdout is the JSON alone; where the folder is goes to stderr
        print((folder / "metrics.json").read_text(), end="")
        print(f"results: {folder}", file=sys.stderr)
        return EXIT_OK
    print((folder / "summary.md").read_text())
    print(f"results: {folder}")
    return EXIT_OK


def cmd_settings(args) -> int:
    from testbed.experiment import settings_json, settings_page
    if args.format == "json":
        print(json.dumps(settings_json(), indent=1))
    else:
        print(settings_page(), end="")
    return EXIT_OK


def cmd_calibrate(args) -> int:
    _need_root("calibrate")
    from testbed.calibrate import CalibrationError, describe
    from testbed.run import ensure_calibration
    try:
        cal = ensure_calibration(progress=log.progress, force=args.force)
    except CalibrationError as exc:
        print(f"testbed calibrate: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(json.dumps(cal, indent=1) if args.format == "json" else describe(cal))
    return EXIT_OK


def cmd_report(args) -> int:
    from pathlib import Path

    from testbed.report_folder import is_script_folder, report, report_script
    folder = Path(args.folder)
    if is_script_folder(folder):
        summary, pages = report_script(folder)
        print(summary)
        page = pages[-1]
    else:
        summary, plots = report(folder)
        print(summary)
        print("plots: " + ", ".join(str(p) for p in plots))
        page = folder.resolve() / "summary.html"
    print(f"page: {page.as_uri() if args.open else page}")
    return EXIT_OK


def cmd_completion(args) -> int:
    from testbed.completion import bash_script
    from topologies.files import topology_names
    print(bash_script(build_parser(), topology_names()), end="")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="testbed", description="Emulated AI-datacenter fabrics on real Linux networking.")
    ap.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    ap.add_argument("-v", "--verbose", action="count", default=0,
                    help="more detail on stderr (debug records)")
    ap.add_argument("-q", "--quiet", action="count", default=0,
                    help="no progress lines on stderr, only warnings and errors")
    sub = ap.add_subparsers(dest="verb", required=True, metavar="VERB")

    p = sub.add_parser("deploy", help="build a fabric (root); it stays until 'destroy'")
    _add_topology_args(p)
    p.add_argument("--seed", type=int, default=1, help="experiment seed; also the ECMP "
                   "hash seed (fib_multipath_hash_seed) where the kernel has it")
    p.add_argument("--check", action="store_true",
                   help="after building, check reachability and paths on real packets")
    p.add_argument("--cli", action="store_true", help="drop into the Mininet CLI")
    p.add_argument("--servers", metavar="HOST,HOST",
                   help="spread the fabric over these machines, over ssh "
                   "(docs/cluster.md); with --check every endpoint pair is pinged")
    p.set_defaults(fn=cmd_deploy)

    p = sub.add_parser("run", help="run an experiment (a TOML file and/or flags): build, "
                       "run the workload, collect, tear down, write a results folder (root)",
                       description="Every setting is an [experiment] key of the file and "
                       "a flag here (the flag wins); docs/settings.md lists them.")
    p.add_argument("experiment", nargs="?", help="experiment TOML file (see experiments/)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a topology builder parameter (repeatable)")
    p.add_argument("--force", action="store_true",
                   help="run even at a rate far above what this machine's calibration says "
                   "it carries faithfully (refused otherwise, before anything is built)")
    p.add_argument("--dry-run", action="store_true",
                   help="build nothing, need no root: print the resolved experiment, the "
                   "fabric, the rate and why, the ideal job time and what would be refused "
                   "(exit 2 if something would be)")
    p.add_argument("--format", choices=["summary", "json"], default="summary",
                   help="what goes to stdout: summary.md after the run (--dry-run: the plan "
                   "as text), or metrics.json (--dry-run: the plan as JSON)")
    add_flags(p, *SETTINGS_TYPES)
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("report", help="redraw a results folder's plots and rewrite its "
                       "summary and page (summary.html; a script's folder: each run's and "
                       "its index.html), from its own files (writes only inside the folder)")
    p.add_argument("folder")
    p.add_argument("--open", action="store_true",
                   help="print the page as a file:// URL, to paste into a browser")
    p.set_defaults(fn=cmd_report)

    p = sub.add_parser("destroy", help="remove the deployed fabric (root)")
    p.add_argument("--servers", metavar="HOST,HOST",
                   help="remove the fabric deployed on these machines, each its part")
    p.set_defaults(fn=cmd_destroy)

    p = sub.add_parser("inspect", help="nodes, links, addresses (and routes) of the "
                       "deployed fabric, read back from the kernel (root)")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.add_argument("--routes", action="store_true", help="also list each node's routes")
    p.add_argument("--node", help="only this node")
    p.set_defaults(fn=cmd_inspect)

    p = sub.add_parser("exec", help="run a command inside a deployed node's network "
                       "namespace (root): testbed exec NODE -- CMD ...; exits as CMD does")
    p.add_argument("node", help="a node of the deployed fabric (see 'testbed inspect')")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...",
                   help="the command and its arguments, after '--' (no shell: "
                   "use -- sh -c '...' for one)")
    p.set_defaults(fn=cmd_exec)

    p = sub.add_parser("graph", help="draw a topology or an experiment's (no root needed): "
                       "PNG, SVG or PDF by the output's suffix, or DOT / Mermaid text")
    _add_topology_args(p)
    p.add_argument("-o", "--output", help="the file to write: .png, .svg or .pdf (default "
                   "topology.png); with --format dot|mermaid any name, '-' (the default) "
                   "for stdout; its folder must exist")
    p.add_argument("--format", choices=["dot", "mermaid"],
                   help="a text diagram instead of a picture: Graphviz DOT or a Mermaid "
                   "flowchart")
    p.set_defaults(fn=cmd_graph)

    p = sub.add_parser("validate", help="check a topology spec, or dry-run an experiment "
                       "file (as 'run --dry-run'; no root needed)")
    p.add_argument("spec", nargs="?", default=DEFAULT_TOPOLOGY, metavar="SPEC",
                   help="a topology (file, shipped name or kind, as 'deploy' takes) or an "
                   f"experiment file (a .toml with an [experiment] table); default "
                   f"{DEFAULT_TOPOLOGY}")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a topology builder parameter (repeatable)")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.add_argument("--force", action="store_true", help="as 'run --force' (experiment only)")
    add_flags(p, *SETTINGS_TYPES)
    p.set_defaults(fn=cmd_validate)

    p = sub.add_parser("partition", help="how a topology would be placed on several "
                       "machines: nodes per server and the links cut (no root needed)")
    _add_topology_args(p)
    p.add_argument("--servers", required=True, metavar="HOST,HOST",
                   help="the machines, comma-separated")
    p.add_argument("--seed", type=int, default=1, help="the partitioner's seed")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.set_defaults(fn=cmd_partition)

    p = sub.add_parser("doctor", help="which kernel features and tools this machine has "
                       "(or, with --servers, each of those machines, over ssh)")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.add_argument("--servers", metavar="HOST,HOST",
                   help="check these machines instead, over ssh (as ~/.ssh/config, or the "
                        "file AFT_SSH_CONFIG names, reaches them): root or sudo, mininet, "
                        "vxlan, the underlay's MTU between them; exit 1 if one lacks "
                        "something, 2 if one does not answer")
    p.set_defaults(fn=cmd_doctor)

    p = sub.add_parser("calibrate", help="measure this machine's packet budget (root; "
                       "cached per machine for a week), which '--rate auto' uses")
    p.add_argument("--force", action="store_true", help="measure again even if cached")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.set_defaults(fn=cmd_calibrate)

    p = sub.add_parser("settings", help="every setting of 'testbed run' (key, flag, "
                       "default, allowed values), as docs/settings.md has them")
    p.add_argument("--format", choices=["markdown", "json"], default="markdown")
    p.set_defaults(fn=cmd_settings)

    p = sub.add_parser("clean", help="remove everything the testbed left behind (root)")
    p.add_argument("--servers", metavar="HOST,HOST",
                   help="clean these machines instead, over ssh (each only what the "
                   "testbed made there)")
    p.set_defaults(fn=cmd_clean)

    p = sub.add_parser("completion", help="print a shell completion script: "
                       "source <(testbed completion bash)")
    p.add_argument("shell", choices=["bash"])
    p.set_defaults(fn=cmd_completion)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    log.setup(log.level_of(args.verbose, args.quiet))
    try:
        check_environment()
        return args.fn(args)
    except (SpecError, UsageError) as exc:
        print(f"testbed {args.verb}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"testbed {args.verb}: interrupted; cleaned up", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`testbed inspect | head`): no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
