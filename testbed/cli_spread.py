"""The command line's verbs on several machines (`--servers a,b`): deploy, destroy, clean
(testbed.spread). The orchestrator needs no root: it only runs ssh, as ~/.ssh/config or
the file AFT_SSH_CONFIG names reaches the servers (AFT_SSH_NETNS: from that network
namespace); each server needs root or passwordless sudo. A server that cannot be reached,
or runs other code, is one line and exit 2 before anything is built."""

from __future__ import annotations

import os
import sys

from topologies.partition import check_servers, servers_list

EXIT_OK, EXIT_FAILED = 0, 1


def servers_arg(text: str) -> list[str]:
    return check_servers(servers_list(text), "--servers")


def spread_fabric(topo, servers: list[str], seed: int = 1, lab: str = "", progress=None):
    from fabric.cluster import ssh_config_from_env
    from testbed.spread import SpreadFabric
    return SpreadFabric(topo, servers, ssh_config=ssh_config_from_env(),
                        via_netns=os.environ.get("AFT_SSH_NETNS") or None, lab=lab,
                        seed=seed, progress=progress)


def deploy(topo, servers: list[str], seed: int, check: bool, progress) -> int:
    """Place, reach every server, build each part; with `check`, every endpoint pair
    answers. A server that cannot be used raises fabric.cluster.ServerError before
    anything is built (the caller's exit 2); a build that fails is exit 1."""
    from fabric.cluster import ServerError
    fab = spread_fabric(topo, servers, seed, progress=progress)
    print("\n".join(fab.placement.lines(topo)))
    try:
        fab.connect()      # nothing built yet: a refusal here takes nothing down
    except BaseException:
        fab.close()
        raise
    try:
        progress(f"building {topo.name}: {topo.graph.number_of_nodes()} nodes on "
                  f"{len(servers)} servers, {len(fab.placement.cut)} links over VXLAN")
        fab.start()
        status = EXIT_OK
        for s, b in fab.built.items():
            print(f"  {s} ({b['host']}): {b['nodes']} nodes, {b['cut']} VXLAN ports, "
                  f"built in {sum(b['timings_s'].values()):.1f} s")
        if check:
            got = fab.ping_all()
            bad = [(a, b) for a, b, ok in got if not ok]
            print(f"reachability: {len(got) - len(bad)}/{len(got)} endpoint pairs answer"
                  + (f"; not: {', '.join(f'{a}>{b}' for a, b in bad[:8])}" if bad else ""))
            status = EXIT_FAILED if bad else EXIT_OK
    except ServerError as exc:        # a build that failed: every part taken down
        fab.stop()
        print(f"testbed deploy: FAILED: {exc}; every server's part removed",
              file=sys.stderr)
        return EXIT_FAILED
    except BaseException:
        fab.stop()
        raise
    finally:
        fab.close()
    print(f"deployed on {len(servers)} servers; remove it with "
          f"'testbed destroy --servers {','.join(servers)}'")
    return status


def destroy(servers: list[str], everything: bool) -> int:
    """The deployed fabric's part on each server removed (with `everything`: all the
    testbed left there, `testbed clean` on each); servers that do not answer are said."""
    from fabric.cluster import ServerError, Ssh, reach, ssh_config_from_env
    from testbed.spread import call
    conns = [Ssh(s, ssh_config_from_env(), os.environ.get("AFT_SSH_NETNS") or None)
             for s in servers]
    try:
        for c in conns:
            reach(c)
        for c in conns:
            try:
                got = call(c, "clean" if everything else "destroy", {"lab": ""})
            except ServerError as exc:
                print(f"{c.server}: FAILED: {exc}")
                return EXIT_FAILED
            print(f"{c.server}: removed {got['namespaces']} namespaces, {got['processes']} "
                  f"processes, {got['staging_ports']} staging ports")
    finally:
        for c in conns:
            c.close()
    return EXIT_OK
