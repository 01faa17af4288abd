"""Fabric: turns a topology spec into real kernel forwarding, and takes it down again.

Every node (endpoint or switch) is a Mininet node: a shell in its own network
namespace, named `aft-<node>` so `ip netns` and pyroute2 reach it. Switches are Linux
routers (IP forwarding on, L4 multipath hash); links are veth pairs created directly
inside the two namespaces, so nothing of the fabric ever exists in the root namespace.

    topology spec ──plan()──▶ addresses ──compute_routes()──▶ next hops
          │                                                       │
          └─ start(): nodes ─▶ veth pairs ─▶ addresses, tc, routes ┘ ─▶ stop()

Use as a context manager, or start()/stop(); stop() also runs after a failed start().
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import time
import traceback
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pyroute2 import IPRoute

try:
    from mininet import log as mnlog
    from mininet.link import Intf
    from mininet.net import Mininet
    from mininet.node import Node
except ModuleNotFoundError as exc:
    if exc.name is None or exc.name.split(".")[0] != "mininet":
        raise
    # Mininet is Debian's python3-mininet, not a PyPI package (pyproject.toml)
    raise ModuleNotFoundError(
        "fabric needs Mininet, which comes from Debian's python3-mininet, not from pip: "
        "apt-get install mininet, and run the testbed from a virtualenv made with "
        "--system-site-packages (bash scripts/setup.sh does both)", name="mininet") from exc

from fabric import netns
from fabric.addressing import AddressPlan, plan
from fabric.clean import kill_inside
from fabric.failplay import add_neighbour
from fabric.routing import Routes, compute_routes
from fabric.shaping import PLAIN, port_layout, shape
from fabric.state import MARKER_ENV, forget_fabric, read_state, write_state
from fabric.vxlan import CutEnd, add_cut_port
from topologies.spec import MTU_BYTES, Topology

LOOPBACK_AGGREGATE = "198.19.0.0/16"
MAX_WORKERS = 4
NODE_THREADS = 8
IFF_UP = 0x1


class FabricError(RuntimeError):
    """The fabric cannot be built here (already deployed, not root, ...)."""


class FabricNode(Node):
    """A Mininet node whose processes carry the fabric marker and whose IP is its loopback."""

    def __init__(self, name: str, loopback: str | None = None, role: str = "",
                 marker: str = "", **params):
        self.loopback = loopback
        self.role = role
        self.marker = marker or name
        super().__init__(name, inNamespace=True, **params)

    def _popen(self, cmd, **params):
        params.setdefault("env", {**os.environ, MARKER_ENV: self.marker})
        return super()._popen(cmd, **params)

    def IP(self, intf=None):  # noqa: N802 (Mininet's name)
        return self.loopback if intf is None else super().IP(intf)

    def defaultIntf(self):  # noqa: N802 (Mininet's name)
        """The loopback: the CLI's `cpu0 ping cpu2` then targets cpu2's /32."""
        return LoopbackIntf(self.loopback)


class LoopbackIntf:
    """What Mininet's CLI asks of a node's default interface: its address."""

    name = "lo"

    def __init__(self, ip: str | None):
        self.ip = ip

    def IP(self):  # noqa: N802 (Mininet's name)
        return self.ip

    def updateIP(self):  # noqa: N802 (Mininet's name)
        return self.ip


class PortIntf(Intf):
    """A Mininet view of a port that already exists in the node's namespace."""

    def __init__(self, name: str, node: Node, port: int, ip: str):
        super().__init__(name, node=node, port=port, moveIntfFn=lambda *a, **k: None)
        self.ip, self.prefixLen = ip, 31

    def config(self, **params):
        return {}


def sysctls_for(topo: Topology, node: str, seed: int, seed_supported: bool) -> dict:
    values: dict[str, int | str] = {
        "net.ipv6.conf.all.disable_ipv6": 1,      # no IPv6 chatter in the pcaps
        "net.ipv6.conf.default.disable_ipv6": 1,
        "net.ipv4.conf.all.rp_filter": 0,         # multipath: replies may come back
        "net.ipv4.conf.default.rp_filter": 0,     # on another port
        "net.ipv4.fib_multipath_hash_policy": 1,  # L4 5-tuple: UDP sport is entropy
        "net.ipv4.icmp_ratelimit": 0,             # probes are not rate-limited
        "net.ipv4.ip_forward": int(topo.graph.nodes[node]["forwards"]),
    }
    if seed_supported:
        values["net.ipv4.fib_multipath_hash_seed"] = seed & 0xFFFFFFFF
    return values


def multipath_seed_supported() -> bool:
    return Path("/proc/sys/net/ipv4/fib_multipath_hash_seed").exists()


class Fabric:
    """A topology built out of namespaces, veth pairs, kernel routes and tc."""

    def __init__(self, topo: Topology, seed: int = 1, progress=None, lab: str = "",
                 here: list[str] | None = None, cut: list[CutEnd] | None = None):
        """`here`: build only these nodes (this machine's part of a fabric spread over
        several: testbed.remote); `cut`: this part's ends of the links to other machines,
        each a VXLAN port (fabric.vxlan.CutEnd). Routes and addresses are the whole
        fabric's either way."""
        self.topo = topo
        self.seed = seed
        self.lab = lab
        self.here = list(here) if here is not None else list(topo.graph.nodes)
        self.cut = {frozenset((c.node, c.peer)): c for c in cut or []}
        self.plan: AddressPlan = plan(topo)
        self.routes: Routes = compute_routes(topo)
        self.net: Mininet | None = None
        self.nodes: dict[str, FabricNode] = {}
        self.timings: dict[str, float] = {}
        self.seed_supported = multipath_seed_supported()
        self._progress = progress or (lambda msg: None)
        self._started = False

    # -- lifecycle ---------------------------------------------------------------------
    def __enter__(self) -> Fabric:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> Fabric:
        if os.geteuid() != 0:
            raise FabricError("building a fabric needs root (run with sudo)")
        self.check_free()
        self._started = True
        try:
            self._timed("nodes", self._make_nodes)
            self._timed("links", self._make_links)
            self._timed("config", self._configure)
            self._timed("links up", self._wait_links_up)
            write_state(self)
        except BaseException:
            self.stop()
            raise
        return self

    def check_free(self) -> None:
        """Refuse to build over a live fabric of the same lab, or over namespace names
        that something else holds (the testbed never removes what it did not make)."""
        record = read_state(self.lab) or {}
        live = [n for n in record.get("namespaces", []) if netns.is_marked(n)]
        if "topology" in record and live:
            what = record["topology"].get("name", "a fabric")
            raise FabricError(f"{what} is already deployed ({len(live)} namespaces, since "
                              f"{record.get('created_utc', '?')}); remove it with "
                              "'testbed destroy' first")
        taken = [n for n in self.namespaces() if netns.inode(n) is not None]
        foreign = [n for n in taken if not netns.is_marked(n)]
        if foreign:
            raise FabricError(f"the name {foreign[0]} is taken by a namespace the testbed "
                              f"did not create ({len(foreign)} such); the testbed will not "
                              "remove it: rename or delete it yourself "
                              f"(ip netns delete {foreign[0]})")
        if taken:
            raise FabricError(f"{taken[0]} is left from an earlier fabric ({len(taken)} "
                              "namespaces); remove it with 'testbed clean' first")

    def stop(self) -> None:
        """Kill every process in the fabric's namespaces and remove the namespaces."""
        if not self._started:
            return
        names = self.namespaces()
        t0 = time.monotonic()
        for node in self.nodes.values():
            with contextlib.suppress(Exception):
                node.terminate()
        kill_inside(names)
        for name in names:
            netns.remove(name)
        forget_fabric(self.lab)   # a run's entry in the same record stays
        self.nodes.clear()
        self.net = None
        self._started = False
        self.timings["stop"] = time.monotonic() - t0

    def cli(self) -> None:
        """The Mininet CLI on this fabric (node names stand for their loopbacks)."""
        from mininet.cli import CLI
        mnlog.setLogLevel("output")  # the CLI prints through Mininet's logger
        try:
            CLI(self.net)
        finally:
            mnlog.setLogLevel("error")

    # -- build steps -------------------------------------------------------------------
    def _timed(self, step: str, fn) -> None:
        t0 = time.monotonic()
        fn()
        self.timings[step] = time.monotonic() - t0
        self._progress(f"{step}: done in {self.timings[step]:.2f} s")

    def _make_nodes(self) -> None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
        mnlog.setLogLevel("error")  # Mininet's warnings concern features we do not use
        Mininet.inited = True       # skip Mininet's root-namespace sysctl tuning
        self.net = Mininet(topo=None, build=False, controller=None, ipBase="198.19.0.0/16",
                           autoSetMacs=False, waitConnected=False)
        total = len(self.here)
        done = 0

        def make(node: str) -> FabricNode:
            # The shell has entered its new namespace once its prompt is back (Node waits
            # for it), so the name is bound to the node's namespace, never to ours.
            host = FabricNode(node, loopback=self.plan.loopback[node], marker=self.ns(node),
                              role=self.topo.role(node))
            netns.mark_process_ns(host.pid)  # ours before it has a name: clean trusts it
            netns.attach(self.ns(node), host.pid)
            netns.write_sysctls(self.ns(node), sysctls_for(
                self.topo, node, self.seed, self.seed_supported))  # setns: this thread only
            return host

        # Shell start-up is mostly waiting for a prompt: overlap it over a few threads.
        with ThreadPoolExecutor(max_workers=NODE_THREADS) as pool:
            futures = {node: pool.submit(make, node) for node in self.here}
            try:
                for node, future in futures.items():
                    self.nodes[node] = future.result()
                    self.net.hosts.append(self.nodes[node])
                    self.net.nameToNode[node] = self.nodes[node]
                    done += 1
                    if done % 32 == 0 or done == total:
                        self._progress(f"nodes: {done}/{total}")
            except BaseException:
                for node, future in futures.items():  # stop() must see every shell
                    if not future.cancel() and future.exception() is None:
                        self.nodes.setdefault(node, future.result())
                raise

    def _make_links(self) -> None:
        g = self.topo.graph
        total = g.number_of_edges()
        missing = [f"{a}--{b}" for a, b in g.edges() if (a in self.nodes) != (b in self.nodes)
                   and frozenset((a, b)) not in self.cut]
        if missing:
            raise FabricError(f"links to other machines without a VXLAN end: {missing[:3]}")
        # One netlink socket; each end is created directly in its node's namespace
        # (IFLA_NET_NS_PID on both ends), so no interface ever exists in ours. A link to
        # another machine is a VXLAN port made here, on the underlay, and moved.
        with IPRoute() as ipr:
            for i, (a, b) in enumerate(g.edges(), 1):
                pa, pb = self.plan.port(a, b), self.plan.port(b, a)
                end = self.cut.get(frozenset((a, b)))
                if end is not None:
                    port = pa if end.node == a else pb
                    add_cut_port(ipr, end, port.ifname, port.mac, self.nodes[end.node].pid)
                    continue
                if a not in self.nodes or b not in self.nodes:
                    continue     # both ends on other machines
                ipr.link("add", ifname=pa.ifname, kind="veth", mtu=MTU_BYTES, state="up",
                         address=pa.mac, net_ns_pid=self.nodes[a].pid,
                         peer={"ifname": pb.ifname, "net_ns_pid": self.nodes[b].pid,
                               "mtu": MTU_BYTES, "address": pb.mac})
                if i % 64 == 0 or i == total:
                    self._progress(f"links: {i}/{total}")
        for node, host in self.nodes.items():
            for k, port in enumerate(self.plan.ports[node]):
                PortIntf(port.ifname, host, k, port.address)

    def _configure(self) -> None:
        """Addresses, link state, shaping and routes on every node, in parallel workers.

        Each worker is a forked child with its own netlink sockets; pyroute2's message
        encoding is the cost, so two cores do it in about half the time.
        """
        nodes = list(self.here)
        workers = min(os.cpu_count() or 1, MAX_WORKERS) if len(nodes) >= 32 else 1
        if workers == 1:
            for node in nodes:
                self._configure_node(node)
            return
        children = []
        for w in range(workers):
            read_fd, write_fd = os.pipe()
            pid = os.fork()
            if pid == 0:  # child: configure every workers-th node, report, exit
                os.close(read_fd)
                code = 0
                try:
                    for node in nodes[w::workers]:
                        self._configure_node(node)
                except BaseException:
                    os.write(write_fd, traceback.format_exc().encode()[-4000:])
                    code = 1
                os._exit(code)
            os.close(write_fd)
            children.append((pid, read_fd))
        errors = []
        try:
            for pid, read_fd in children:
                with os.fdopen(read_fd, "rb") as pipe:
                    message = pipe.read().decode(errors="replace")
                _, status = os.waitpid(pid, 0)
                if status != 0:
                    errors.append(message or f"worker {pid} exited with status {status}")
        except BaseException:  # e.g. Ctrl-C: no worker outlives the build
            for pid, _ in children:
                with contextlib.suppress(ChildProcessError, ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
            raise
        if errors:
            raise FabricError("configuring the fabric failed:\n" + "\n".join(errors))

    def _wait_links_up(self, timeout_s: float = 10.0) -> None:
        """Poll until every port reports operstate UP (the kernel's linkwatch lags); a
        VXLAN port, which has no carrier of its own, UNKNOWN once it is up."""
        pending = list(self.here)
        cut = {self.plan.port(e.node, e.peer).ifname for e in self.cut.values()}
        deadline = time.monotonic() + timeout_s
        while pending:
            still = []
            for node in pending:
                with self.ipr(node) as ipr:
                    states = [link.get_attr("IFLA_OPERSTATE") in (
                        ("UP", "UNKNOWN") if link.get_attr("IFLA_IFNAME") in cut else ("UP",))
                        for link in ipr.get_links() if link.get_attr("IFLA_IFNAME") != "lo"]
                if not all(states):
                    still.append(node)
            pending = still
            if pending and time.monotonic() > deadline:
                raise FabricError(f"ports not up after {timeout_s} s on: {', '.join(pending)}")
            if pending:
                time.sleep(0.05)

    def _configure_node(self, node: str) -> None:
        shaped = port_layout() != PLAIN
        with self.ipr(node) as ipr:
            links = {link.get_attr("IFLA_IFNAME"): link for link in ipr.get_links()}
            index = {name: link["index"] for name, link in links.items()}
            ipr.addr("add", index=index["lo"], address=self.plan.loopback[node], prefixlen=32)
            ipr.link("set", index=index["lo"], state="up")
            for port in self.plan.ports[node]:
                edge = self.topo.graph.edges[node, port.peer]
                i = index[port.ifname]
                ipr.addr("add", index=i, address=port.address, prefixlen=31)
                if shaped:
                    shape(ipr, i, edge["rate_mbps"], edge["queue_bytes"])
                if not links[port.ifname]["flags"] & IFF_UP:
                    ipr.link("set", index=i, state="up")
                add_neighbour(ipr, i, port.peer_address, port.peer_mac)
            for dst, gateways in self.route_entries(node):
                hops = [{"gateway": self.plan.port(node, p).peer_address,
                         "oif": index[self.plan.port(node, p).ifname]} for p in gateways]
                kwargs = {"prefsrc": self.plan.loopback[node]}
                if len(hops) == 1:
                    kwargs.update(hops[0])
                else:
                    kwargs["multipath"] = hops
                ipr.route("add", dst=dst, **kwargs)

    def route_entries(self, node: str) -> list[tuple[str, tuple[str, ...]]]:
        """(prefix, next-hop nodes) to install on `node`.

        A /32 per destination, except that the commonest next-hop set becomes one
        aggregate (198.19.0.0/16) with /32s only for the other destinations: on nodes
        that do not forward, and on switches whose commonest set is an ECMP uplink
        group (a leaf's spines). Longest-prefix match makes this the same forwarding
        for every node's address; switches with single next hops (spines) keep only
        /32s, so an unassigned address is dropped there rather than looping.
        """
        table = self.routes[node]
        if not table:
            return []
        common, _ = Counter(table.values()).most_common(1)[0]
        if self.topo.graph.nodes[node]["forwards"] and len(common) < 2:
            return [(f"{self.plan.loopback[d]}/32", hops) for d, hops in table.items()]
        entries = [(LOOPBACK_AGGREGATE, common)]
        entries += [(f"{self.plan.loopback[d]}/32", hops)
                    for d, hops in table.items() if hops != common]
        return entries

    # -- access ------------------------------------------------------------------------
    def ns(self, node: str) -> str:
        """The name of `node`'s network namespace."""
        return netns.name_of(node, self.lab)

    def namespaces(self) -> list[str]:
        return [self.ns(n) for n in self.here]

    def netns_path(self, node: str) -> str:
        """A path to `node`'s network namespace that setns() takes."""
        return f"/proc/{self.nodes[node].pid}/ns/net"

    def ipr(self, node: str):
        """An IPRoute whose netlink socket lives in `node`'s namespace (a context)."""
        return netns.iproute(self.ns(node))

    def popen(self, node: str, args: list[str], **kwargs):
        """Start a process inside `node` (argument list, never a shell string)."""
        return self.nodes[node].popen(args, **kwargs)


def detach_shells(fabric: Fabric) -> None:
    """End the Mininet shells but keep the namespaces (a deployed fabric outlives us)."""
    for node in fabric.nodes.values():
        with contextlib.suppress(Exception):
            os.killpg(node.shell.pid, signal.SIGHUP)
            node.shell.wait(timeout=2)
