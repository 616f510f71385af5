#!/bin/sh
# Stage 1 of the VM tier's boot: the /init of a small initramfs (busybox sh).
# It loads the kernel modules (test/vm/modules), mounts the ext4 disk that
# holds the test root (/dev/vda, built by test/vm/run.sh) and switches to it.
# An initramfs root cannot be pivot_root'ed, and runc pivots into every
# container rootfs, hence the real root filesystem; ext4 also matches the
# node disks berth runs on (overlayfs upper dirs, user.* xattrs).
export PATH=/usr/sbin:/usr/bin:/sbin:/bin

fail() {
	echo "berth-vm: stage 1: $*"
	# No result marker: the host reports the missing marker as a failure.
	poweroff -f
	sleep 10
	echo o >/proc/sysrq-trigger
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
echo "berth-vm: stage 1 at $(cut -d' ' -f1 /proc/uptime)s uptime, kernel $(uname -r)"

for m in $(sed -e 's/#.*//' /etc/berth-vm-modules); do
	opts=
	# No stray dummy0: the VM's only interface is lo, as the tests expect.
	[ "$m" = dummy ] && opts=numdummies=0
	modprobe "$m" $opts || echo "berth-vm: modprobe $m failed"
done

i=0
while [ ! -b /dev/vda ]; do
	i=$((i + 1))
	[ $i -gt 100 ] && fail "no /dev/vda after 10 s"
	sleep 0.1
done
mkdir -p /newroot
# noinit_itable: no background zeroing of inode tables competing with the tests.
mount -t ext4 -o noatime,noinit_itable /dev/vda /newroot || fail "cannot mount /dev/vda"
# berth.init=systemd (BERTH_VM_INIT=systemd in run.sh): Debian's systemd is
# PID 1 and runs the tests as berth-vm-tests.service.
init=/sbin/berth-vm-init
grep -q 'berth\.init=systemd' /proc/cmdline && init=/lib/systemd/systemd
[ -e "/newroot$init" ] || [ -L "/newroot$init" ] || fail "no $init on the test disk"
umount /proc /sys /dev
exec switch_root /newroot "$init"
