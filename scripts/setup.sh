#!/usr/bin/env bash
# The one installer, used by README (make demo/test/bench), .ci/run and the Vagrantfile.
# Installs the Debian 12 packages the testbed needs and a virtualenv (.venv) made
# from the system Python that can import Mininet, with the pinned Python dependencies.
# Idempotent: a second run installs nothing (it only checks).
#
#   bash scripts/setup.sh          # what the testbed, its tests and benchmarks need
#   bash scripts/setup.sh --vm     # and what `make vm-check` needs (qemu, debootstrap)
#   bash scripts/setup.sh --guest  # in the users' VM: and Soft-RoCE (rdma-core, perftest)
#                                  # with a kernel whose rxe follows network namespaces
set -euo pipefail
vm=0 guest=0
case "${1:-}" in
  "") ;;
  --vm) vm=1 ;;
  --guest) guest=1 ;;
  *) echo "setup.sh: unknown option '$1' (allowed: --vm, --guest)" >&2; exit 2 ;;
esac

here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
say() { printf '[setup] %s\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
  echo "setup.sh: needs root (apt-get, and the testbed itself builds namespaces): run it with sudo" >&2
  exit 2
fi

# -- system packages ------------------------------------------------------------------
# mininet: nodes and CLI; bridge-utils: plain-Mininet baseline of the benchmark;
# tcpdump/tshark: pcaps and decoding; iperf3/iputils-ping: measurements and checks;
# nftables: loss injection; sudo: README's commands; python3-venv: the virtualenv;
# linux-perf: scripts/profile_packet.py (where a packet's CPU goes); gcc, python3-dev,
# zlib1g-dev: the compiled data path (scripts/build_compiled.py); clang, libbpf-dev: the
# switch-side eBPF programs (scripts/build_bpf.py compiles them, fabric.libbpf loads
# them through Debian's libbpf1); vagrant: the suite validates the Vagrantfile;
# openssh-server, openssh-client: the cluster tests' servers each run an sshd of their
# own, in their own namespaces (this machine's own sshd is not started: see below);
# chromium: the results pages' browser tests (tests/browser.py), headless.
packages=(mininet bridge-utils iproute2 tcpdump tshark iperf3 iputils-ping nftables
          python3 python3-venv python3-pip python3-setuptools sudo make procps linux-perf
          gcc python3-dev zlib1g-dev clang libbpf-dev vagrant openssh-server openssh-client
          chromium)
# make vm-check (scripts/vm_check.py): a Debian disk image booted under qemu
if [ "$vm" = 1 ]; then
  packages+=(qemu-system-x86 debootstrap e2fsprogs)
fi
# the VM: Soft-RoCE's userland (rdma-core's providers and tools, perftest's ib_write_bw),
# and scripts/softroce_compare.py's real RDMA peers
if [ "$guest" = 1 ]; then
  packages+=(rdma-core ibverbs-providers ibverbs-utils perftest)
fi
missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # a package's services (openssh-server's sshd on port 22) are not started on a machine
  # that had none: invoke-rc.d asks policy-rc.d, and 101 means "not now"
  policy=/usr/sbin/policy-rc.d
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy"
    trap 'rm -f "$policy"' EXIT
  fi
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
  if [ -n "$(trap -p EXIT)" ]; then rm -f "$policy"; trap - EXIT; fi
else
  say "system packages: all present"
fi

# -- the VM's kernel: rdma_rxe opens its UDP socket in the namespace of the netdev it is
# bound to where it has per-namespace sockets (rxe_ns.c); Debian 12's 6.1 and
# bookworm-backports' 6.12 have none and open it in the initial namespace only, so no rxe device on a fabric endpoint's port could talk. Debian
# 13's backported kernel (trixie-backports) has it: its image and modules only (its
# linux-image package's hooks need Debian 13's run-parts), the rest of the system stays
# Debian 12's. The boot loader's newest kernel is this one from the next boot on.
if [ "$guest" = 1 ]; then
  src=/etc/apt/sources.list.d/aft-rxe-kernel.sources
  if [ ! -f "$src" ]; then
    printf '%s\n' "Types: deb" "URIs: http://deb.debian.org/debian" \
      "Suites: trixie-backports" "Components: main" \
      "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" > "$src"
    apt-get update -q
  fi
  abi=$(apt-cache show linux-image-amd64/trixie-backports \
        | sed -n 's/.*linux-image-\([^ ,]*-amd64\) (=.*/\1/p' | head -1)
  if [ -z "$abi" ]; then
    echo "setup.sh: no kernel in trixie-backports (apt-cache show linux-image-amd64)" >&2
    exit 1
  fi
  if [ ! -f "/boot/vmlinuz-$abi" ]; then
    say "installing kernel $abi (trixie-backports) for Soft-RoCE across namespaces"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      "linux-binary-$abi" "linux-modules-$abi"
    cp "/usr/lib/modules/$abi/vmlinuz" "/boot/vmlinuz-$abi"
    for f in config System.map; do
      if [ -f "/usr/lib/modules/$abi/$f" ]; then cp "/usr/lib/modules/$abi/$f" "/boot/$f-$abi"; fi
    done
    depmod "$abi"
    update-initramfs -c -k "$abi"
    if command -v update-grub >/dev/null; then update-grub; fi
  else
    say "kernel $abi: present"
  fi
fi

# -- the Python that can import mininet -------------------------------------------------
# python3 on PATH may be another interpreter (pyenv, a venv): ask each candidate.
py=""
for cand in /usr/bin/python3 /usr/bin/python3.*; do
  case "$cand" in *-config|*m) continue ;; esac
  if [ -x "$cand" ] && "$cand" -c "import mininet" 2>/dev/null; then py=$cand; break; fi
done
if [ -z "$py" ]; then
  echo "setup.sh: no system Python can import mininet (is the mininet package installed?)" >&2
  exit 2
fi

# -- virtualenv -------------------------------------------------------------------------
venv="$here/.venv"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import mininet" 2>/dev/null; then
  say "creating $venv from $py (with system site packages, for Mininet)"
  rm -rf "$venv"
  "$py" -m venv --system-site-packages "$venv"
fi
stamp="$venv/.installed"
want=$(cat requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "installing pinned Python packages"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r requirements.txt
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
      --no-build-isolation -e .
  echo "$want" > "$stamp"
else
  say "python packages: all present ($venv)"
fi
# -- the compiled data path (traffic.engine): rebuilds only the modules whose source changed
"$venv/bin/python" scripts/build_compiled.py
"$venv/bin/python" scripts/build_bpf.py
say "ready: $("$venv/bin/python" --version), testbed at $venv/bin/testbed"
