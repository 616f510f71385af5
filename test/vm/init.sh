#!/bin/sh
# Stage 2 of the VM tier's boot: PID 1 on the test disk (/sbin/berth-vm-init,
# busybox sh). It sets the machine up as a cgroup v2 node would be (no
# systemd: the cgroupfs driver), runs the test binaries that test/vm/run.sh
# listed in /berth/plan, prints the result marker the host waits for and
# powers off.
#
# With --systemd it is not PID 1 but the oneshot berth-vm-tests.service under
# Debian's systemd (BERTH_VM_INIT=systemd): systemd has mounted the API
# filesystems and cgroup2 and owns the cgroup tree, so only the tests, the
# marker and the power-off are left to do.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TMPDIR=/tmp LANG=C

# The only line the host takes a result from: a test that prints something
# alike cannot know the nonce.
finish() {
	sync
	echo "BERTH-VM-RESULT $nonce: $1"
	if [ -n "$under_systemd" ]; then
		# -ff: reboot(2) at once, as poweroff -f under busybox init.
		systemctl poweroff -ff
	fi
	poweroff -f
	sleep 10
	echo o >/proc/sysrq-trigger
}

nonce=
under_systemd=
[ "${1:-}" = --systemd ] && under_systemd=1
step() {
	"$@" || { echo "berth-vm: setup failed: $*"; finish 100; }
}

cg=/sys/fs/cgroup
if [ -n "$under_systemd" ]; then
	nonce=$(sed -n 's/.*berth\.nonce=\([0-9a-f]*\).*/\1/p' /proc/cmdline)
	[ -d /run/systemd/system ] || { echo "berth-vm: --systemd but no /run/systemd/system"; finish 100; }
	mkdir -p /dev/mqueue
	grep -q ' /dev/mqueue ' /proc/mounts || step mount -t mqueue -o nosuid,nodev,noexec mqueue /dev/mqueue
	chmod 1777 /tmp /var/tmp
	ln -sf /proc/self/mounts /etc/mtab
	echo 1 >/proc/sys/kernel/panic_on_oops
	echo "berth-vm: systemd $(systemctl --version | head -n 1), in $(cat /proc/self/cgroup); cgroup2 controllers: $(cat $cg/cgroup.controllers)"
else
step mount -t proc -o nosuid,nodev,noexec proc /proc
step mount -t sysfs -o nosuid,nodev,noexec sysfs /sys
# AppArmor's interface (the kernel boots with apparmor=1): profiles load and
# are listed there.
step mount -t securityfs -o nosuid,nodev,noexec securityfs /sys/kernel/security
nonce=$(sed -n 's/.*berth\.nonce=\([0-9a-f]*\).*/\1/p' /proc/cmdline)
step mount -t devtmpfs -o nosuid,mode=0755 devtmpfs /dev
mkdir -p /dev/pts /dev/shm /dev/mqueue
step mount -t devpts -o nosuid,noexec,gid=5,mode=0620,ptmxmode=0666 devpts /dev/pts
step mount -t tmpfs -o nosuid,nodev,mode=1777 tmpfs /dev/shm
step mount -t mqueue -o nosuid,nodev,noexec mqueue /dev/mqueue
step mount -t tmpfs -o nosuid,nodev,mode=0755 tmpfs /run
# /tmp and /var/tmp stay on the ext4 disk, as on the host tier's machines.
chmod 1777 /tmp /var/tmp

# cgroup v2, unified, mounted as systemd mounts it, with every controller
# the kernel offers delegated from the root. PID 1 and the tests live in a
# leaf (init.scope), so that the root holds no process, as on a real node.
step mount -t cgroup2 -o nosuid,nodev,noexec,relatime,nsdelegate,memory_recursiveprot cgroup2 $cg
for c in $(cat $cg/cgroup.controllers); do
	echo "+$c" >$cg/cgroup.subtree_control || echo "berth-vm: cannot enable the $c controller"
done
step mkdir $cg/init.scope
echo $$ >$cg/init.scope/cgroup.procs || finish 100
echo "berth-vm: cgroup2 at $cg, controllers: $(cat $cg/cgroup.controllers); delegated: $(cat $cg/cgroup.subtree_control)"

step ip link set lo up
hostname berth-vm
ulimit -n 1048576
ln -sf /proc/self/mounts /etc/mtab
# A kernel oops ends the run (panic=-1 on the command line: no marker, a failure).
echo 1 >/proc/sys/kernel/panic_on_oops
fi

echo "berth-vm: ready at $(cut -d' ' -f1 /proc/uptime)s uptime; $(nproc) CPUs, $(free -m | awk '/Mem:/ {print $2}') MiB; AppArmor enabled: $(cat /sys/module/apparmor/parameters/enabled 2>/dev/null || echo no)"

# run_test NAME BINARY ARGS...: one test binary, from a fresh folder.
status=0
run_test() {
	name=$1
	shift
	mkdir -p "/tmp/run-$name"
	echo "berth-vm: >>> $name: $*"
	t0=$(cut -d' ' -f1 /proc/uptime)
	(cd "/tmp/run-$name" && "$@")
	rc=$?
	t1=$(cut -d' ' -f1 /proc/uptime)
	echo "berth-vm: <<< $name: exit $rc after $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", b - a}')s"
	[ $rc -eq 0 ] || status=1
}

export BERTH_VM=1 BERTH_INTEGRATION=1 BERTH_BIN_DIR=/berth/bin
[ -n "$under_systemd" ] && export BERTH_VM_SYSTEMD=1
. /berth/plan
# Whatever the tests did, they must leave no cgroup behind: on v2 this is
# the whole tree, checked once, independently of the tests' own checks.
# Under systemd the tree is systemd's: what the tests make is kubepods* and
# berth* (slices and scopes) and the cgroupfs parents.
if [ -n "$under_systemd" ]; then
	left=$(find $cg -mindepth 1 -type d \( -name 'kubepods*' -o -name 'berth*' \) ! -name 'berth-vm-tests.service')
else
	left=$(find $cg -mindepth 1 -type d ! -path "$cg/init.scope" ! -path "$cg/init.scope/*")
fi
if [ -n "$left" ]; then
	echo "berth-vm: cgroups left behind after the tests:"
	echo "$left" | sed 's/^/berth-vm:   /'
	status=1
fi
# How busy the emulated CPUs were since boot (/proc/stat's first line:
# user nice system idle iowait ...): under TCG a vCPU that idles costs the
# host nothing, so this says how much of the host's CPU the tier can leave
# to the tiers beside it.
busy=$(awk '/^cpu / {idle = $5 + $6; for (i = 2; i <= NF; i++) all += $i; printf "%.0f", 100 * (all - idle) / all}' /proc/stat)
echo "berth-vm: done at $(cut -d' ' -f1 /proc/uptime)s uptime; CPUs busy $busy% of it"
finish $status
