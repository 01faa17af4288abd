"""`testbed exec NODE -- CMD ...`: run a command inside a deployed node's network namespace.

The node is one of the deployed fabric's (its record in /run/testbed names the
namespaces, `aft-<node>`); the command is an argv list, never a shell string, run by
`ip netns exec` (iproute2, which also mounts the namespace's own /sys), which this
process becomes: the command's exit code is `testbed exec`'s, and a signal reaches it
directly.
"""

from __future__ import annotations

import os
import shutil
import sys

from fabric import netns
from fabric.state import read_state
from testbed import log
from topologies.spec import SpecError, did_you_mean

IP_NETNS_EXEC = ("ip", "netns", "exec")


def deployed_nodes(lab: str = "") -> dict[str, str] | None:
    """{node: its namespace} of the fabric deployed under `lab` on this machine; None when
    nothing is deployed."""
    state = read_state(lab)
    if state is None or "namespaces" not in state:
        return None
    prefix = netns.name_of("", lab)
    return {ns.removeprefix(prefix): ns for ns in state["namespaces"]
            if ns.startswith(prefix)}


def exec_argv(node: str, command: list[str], lab: str = "") -> list[str]:
    """The argv that runs `command` in `node`'s namespace; SpecError (one line, exit 2)
    for no fabric, an unknown node (with a guess), a namespace gone, or no command."""
    nodes = deployed_nodes(lab)
    if nodes is None:
        raise SpecError("node", "nothing deployed (no fabric state in /run/testbed); deploy "
                        "one with 'testbed deploy TOPO'")
    if node not in nodes:
        shown = ", ".join(sorted(nodes)[:8]) + (", ..." if len(nodes) > 8 else "")
        raise SpecError("node", f"{node!r} is not a node of the deployed fabric"
                        f"{did_you_mean(node, nodes)} ({len(nodes)} nodes: {shown})")
    if not (netns.RUN_DIR / nodes[node]).exists():
        raise SpecError("node", f"{node}'s namespace {nodes[node]} is gone; "
                        "'testbed clean' removes what is left of the fabric")
    if not command:
        raise SpecError("command", "missing: give it after '--', e.g. "
                        f"'testbed exec {node} -- ip -br addr'")
    if shutil.which(command[0]) is None:
        raise SpecError("command", f"{command[0]!r} is not found (not in PATH, or not an "
                        "executable file)")
    return [*IP_NETNS_EXEC, nodes[node], *command]


def exec_in_node(node: str, command: list[str], lab: str = "") -> int:
    """Become `command` inside `node`'s namespace (returns only by raising)."""
    argv = exec_argv(node, command, lab)
    log.LOGGER.debug("exec: %s", argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(argv[0], argv)
    raise AssertionError("unreachable: execvp returned")
