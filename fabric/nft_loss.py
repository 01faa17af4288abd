"""Random loss by nftables where the kernel has no netem: one netdev-family table per
namespace, `numgen random` drops at the ingress of each receiving port.

The ingress hook of the port a frame arrives on sees every frame that crossed the link,
whatever sent it: forwarded, locally sent, or written to an AF_PACKET socket (which
bypasses the IP hooks and the netdev egress hook). Rules are built only from our own
port names and numbers (`check_ifname`, `nft_threshold`), and nft runs with an
argument list, never a shell. fabric.impair decides which ports lose what.
"""

from __future__ import annotations

import re
import shutil
import subprocess

from fabric import netns
from topologies.spec import IFNAME_MAX

NFT_TABLE = "aft_links"
NFT_FAMILY = "netdev"         # hook ingress: frames as they arrive on the receiving port
NFT_MOD = 1_000_000_000       # loss resolution: one in 10^9 packets
IFNAME_RE = re.compile(r"\A[A-Za-z][A-Za-z0-9_]*-eth[0-9]+\Z")
NFT_TIMEOUT_S = 10.0


def nft_threshold(loss_rate: float) -> int:
    """numgen random mod NFT_MOD < threshold drops `loss_rate` of the packets."""
    if isinstance(loss_rate, bool) or not isinstance(loss_rate, (int, float)) or \
            not 0.0 <= loss_rate <= 1.0:
        raise ValueError(f"loss_rate must be a number in [0, 1], got {loss_rate!r}")
    return round(loss_rate * NFT_MOD)


def check_ifname(ifname: str) -> str:
    """Only our own port names ever go into a rule."""
    if not isinstance(ifname, str) or not IFNAME_RE.match(ifname) or len(ifname) > IFNAME_MAX:
        raise ValueError(f"{ifname!r} is not a fabric port name")
    return ifname


def nft_script(losses: dict[str, float]) -> str:
    """The whole loss table of one namespace (replaced atomically): receiving port -> loss
    rate of the frames arriving on it. Ports without loss are not hooked at all."""
    lines = [f"add table {NFT_FAMILY} {NFT_TABLE}", f"delete table {NFT_FAMILY} {NFT_TABLE}"]
    rules = [(check_ifname(ifname), nft_threshold(loss))
             for ifname, loss in sorted(losses.items())]
    rules = [(name, threshold) for name, threshold in rules if threshold]
    if rules:
        devices = ", ".join(f'"{name}"' for name, _ in rules)
        lines += [f"table {NFT_FAMILY} {NFT_TABLE} {{", "  chain ingress {",
                  f"    type filter hook ingress devices = {{ {devices} }} priority 0; "
                  "policy accept;"]
        lines += [f'    iifname "{name}" numgen random mod {NFT_MOD} < {threshold} '
                  f'counter drop comment "{name}"' for name, threshold in rules]
        lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


def run_nft(ns: str, args: list[str], script: str | None = None) -> str:
    """Run nft inside namespace `ns` (argument list; script on stdin); its stdout."""
    path = shutil.which("nft")
    if path is None:
        raise RuntimeError("nft not found in PATH")
    with netns.entered(ns):  # the child inherits this thread's namespace
        done = subprocess.run([path, *args], input=script, capture_output=True, text=True,
                              check=False, timeout=NFT_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"nft {' '.join(args)} in {ns}: {done.stderr.strip()}")
    return done.stdout
