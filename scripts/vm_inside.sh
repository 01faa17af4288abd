#!/bin/sh
# PID 1 of the VM that scripts/vm_check.py boots: mounts what the testbed needs, runs
# the VM-only checks from /vagrant (provisioned by scripts/setup.sh, as the Vagrantfile
# does), prints each part between "@@AFT" markers on the serial console, and powers off.
# The disk is booted with qemu's -snapshot: nothing written here survives.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
mount -t bpf bpf /sys/fs/bpf 2>/dev/null
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
mount -o remount,rw / 2>/dev/null
hostname aft-vm
ip link set lo up

step() {   # step NAME COMMAND...: the command's output between markers, and its exit code
  name=$1; shift
  echo "@@AFT begin $name $(date +%s)"
  "$@" 2>&1
  echo "@@AFT end $name rc=$? $(date +%s)"
}

cd /vagrant
echo "@@AFT kernel $(uname -r) cpus $(nproc)"
step doctor .venv/bin/testbed doctor --format json
# the tests scripts/vm_check.py chose, one pytest argument per line
tests=$(cat /vagrant/build/vm-tests.txt)
# shellcheck disable=SC2086
step tests .venv/bin/python -m pytest -q -p no:cacheprovider --color=no -rfEsP $tests
# Soft-RoCE beside the agents; its pcaps and tables go back to the host on the second
# disk, as a tar stream
step softroce .venv/bin/python scripts/softroce_compare.py --out /tmp/softroce
if [ -b /dev/vdb ]; then tar -C /tmp -cf /dev/vdb softroce; fi
step clean_state sh -c 'ip netns list; ip -br link; rdma link show'
sync
echo "@@AFT done"
echo o > /proc/sysrq-trigger
sleep 60
