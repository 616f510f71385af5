#!/usr/bin/env bash
# The cluster tier's VM node (vmnode_test.go): builds its disk and initramfs.
#
#   disk.sh OUT CONFIG BIN_DIR K8S_BIN
#
# OUT gets disk.img (ext4, the node's root) and initrd.cpio (the VM tier's
# stage 1, test/vm/boot.sh, which switches to the disk and execs systemd).
# CONFIG is a folder the test wrote, copied over the root last: the node's
# certificates, kubeconfigs, KubeletConfiguration, KubeProxyConfiguration,
# berthd's config and /etc/berth-node.env (its addresses). BIN_DIR holds
# berth's binaries (make build), K8S_BIN the tier's Kubernetes binaries.
#
# The kernel is the VM tier's (test/vm/deps.sh, in BERTH_VM_CACHE); its
# cached module tree holds only what the VM tier loads, so the networking
# modules (virtio_net, every netfilter module, which the kernel loads on
# demand through /sbin/modprobe as kube-proxy's and berth's rules ask) come
# from the same kernel package, unpacked once into bin/vmnode-modules.
set -euo pipefail

out=$1 config=$2 bindir=$3 k8sbin=$4
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../../.." && pwd)
cache=${BERTH_VM_CACHE:-/var/cache/berth-vm}
kdir="$cache/kernel/current"
[[ -f $kdir/vmlinuz ]] || { echo "vmnode: no kernel in $kdir: run test/vm/deps.sh (make deps-vm)" >&2; exit 2; }
release=$(cat "$kdir/release")

# --- the module tree: the VM tier's plus the kernel's networking ---------------
mods="$src/bin/vmnode-modules/$release"
if [[ ! -f $mods/done ]]; then
	deb=$(ls "$cache"/debs/linux-image-"$release"_*.deb | head -n 1)
	rm -rf "$mods"
	mkdir -p "$mods"
	dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$mods" --wildcards \
		"./lib/modules/$release/kernel/net/*" \
		"./lib/modules/$release/kernel/drivers/net/virtio_net.ko" \
		"./lib/modules/$release/kernel/drivers/net/net_failover.ko" \
		"./lib/modules/$release/kernel/drivers/net/veth.ko" \
		"./lib/modules/$release/kernel/drivers/net/dummy.ko"
	cp -an "$kdir/lib/modules/$release/." "$mods/lib/modules/$release/"
	busybox depmod -b "$mods" "$release"
	touch "$mods/done"
fi

rm -rf "$out/root" "$out/initrd"
root="$out/root"
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,usr/local/bin,usr/local/sbin,etc,proc,sys,dev,run,tmp,var/tmp,var/lib,var/log,root,lib/modules}

. "$src/test/vm/lib.sh" # copy_host_file, copy_systemd, add_busybox, write_users, add_criu
# install_bin SRC DEST: a binary of the tree or of the tier, with its libraries.
install_bin() {
	install -D -m 0755 "$1" "$root$2"
	local lib
	for lib in $(ldd "$1" 2>/dev/null | grep -o '/[^ ]*' || true); do
		[[ -e $root$lib ]] || install -D "$(readlink -f "$lib")" "$root$lib"
	done
}

# berth (make build) and the tier's kubelet and kube-proxy.
for b in berthd berthctl berth-shim berth-shim-helper berth-pause berth-exec-init; do
	install_bin "$bindir/$b" "/usr/local/bin/$b"
done
install_bin "$k8sbin/kubelet" /usr/local/bin/kubelet
install_bin "$k8sbin/kube-proxy" /usr/local/bin/kube-proxy
# nft (kube-proxy's nftables mode runs it), iproute2's ip (the node's
# addresses without duplicate address detection), apparmor_parser (berthd
# loads its default profile with it).
for f in /usr/sbin/nft /usr/sbin/ip /usr/sbin/apparmor_parser; do
	copy_host_file "$f"
done
# Debian's criu, for the kubelet's checkpoints (the Checkpoint step).
add_criu "$cache" || { echo "vmnode: no criu in $cache/criu: run test/vm/deps.sh (make deps-vm)" >&2; exit 2; }

# Debian's systemd, as the VM tier's systemd boot has it (test/vm/run.sh).
copy_systemd

# busybox-static's applets where nothing above is.
add_busybox "$root"
cp -a "$mods/lib/modules/$release" "$root/lib/modules/"
write_users
: >"$root/etc/machine-id"
printf 'NAME="berth VM node"\nID=debian\n' >"$root/etc/os-release"
echo "hosts: files dns" >"$root/etc/nsswitch.conf"

# --- units ------------------------------------------------------------------
# The boot's target (systemd.unit= on the command line): the node's network
# and swap, berthd from the tree's unit, the kubelet and kube-proxy.
sd="$root/etc/systemd/system"
mkdir -p "$sd/berthd.service.d"
install -m 0644 "$src/cmd/berthd/berthd.service" "$sd/berthd.service"
cat >"$sd/berth-node.target" <<'EOF'
[Unit]
Description=berth cluster VM node
Wants=berth-node-setup.service berthd.service kubelet.service kube-proxy.service
EOF
cat >"$sd/berth-node-setup.service" <<'EOF'
[Unit]
Description=the node's addresses, routes, forwarding and swap file
DefaultDependencies=no
After=sysinit.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/berth-node-setup
StandardOutput=tty
StandardError=tty
TTYPath=/dev/console
EOF
# berthd's unit as make install installs it; only its log goes to the
# console, which the test reads.
cat >"$sd/berthd.service.d/vmnode.conf" <<'EOF'
[Unit]
Requires=berth-node-setup.service
After=berth-node-setup.service

[Service]
StandardOutput=tty
StandardError=tty
TTYPath=/dev/console
EOF
# The kubelet as a kubeadm node runs it (its log on the second serial port).
cat >"$sd/kubelet.service" <<'EOF'
[Unit]
Description=kubelet
Wants=berthd.service
After=berthd.service berth-node-setup.service

[Service]
EnvironmentFile=/etc/berth-node.env
ExecStart=/usr/local/bin/kubelet --config /etc/kubernetes/kubelet.yaml --kubeconfig /etc/kubernetes/kubelet.conf --hostname-override ${NODE_NAME} --node-ip ${NODE_IP},${NODE_IP6} --node-labels berth.test/vm-node=true --v 1
Restart=always
RestartSec=2
StandardOutput=tty
StandardError=tty
TTYPath=/dev/ttyS1
TTYVHangup=no

[Install]
WantedBy=multi-user.target
EOF
cat >"$sd/kube-proxy.service" <<'EOF'
[Unit]
Description=kube-proxy
After=berth-node-setup.service

[Service]
ExecStart=/usr/local/bin/kube-proxy --config /etc/kubernetes/kube-proxy.yaml --v 1
Restart=always
RestartSec=2
StandardOutput=append:/var/log/kube-proxy.log
StandardError=append:/var/log/kube-proxy.log
EOF
cat >"$root/usr/local/sbin/berth-node-setup" <<'EOF'
#!/bin/sh
# The VM node's network: eth0 (a tap on the host's node bridge) holds the
# node's addresses and routes the test ranges to the host's; the node
# forwards to its pods. Then a swap file.
set -e
# The test fails at once on this line rather than wait for the node.
trap 'rc=$?; [ $rc = 0 ] || echo "berth-node: setup failed (exit $rc)"' EXIT
. /etc/berth-node.env
echo "berth-node: setup at $(cut -d' ' -f1 /proc/uptime)s uptime"
mkdir -p /dev/mqueue
grep -q ' /dev/mqueue ' /proc/mounts || mount -t mqueue -o nosuid,nodev,noexec mqueue /dev/mqueue
chmod 1777 /tmp /var/tmp
ln -sf /proc/self/mounts /etc/mtab
hostname "$NODE_NAME"
echo "$NODE_NAME" >/etc/hostname
printf '127.0.0.1\tlocalhost\n::1\tlocalhost\n%s\t%s\n' "$NODE_IP" "$NODE_NAME" >/etc/hosts
# iproute2's ip, by its path: busybox's sh runs its own applet otherwise.
# replace, not add: the setup runs again should berthd, which requires it,
# fail to start.
ip=/usr/sbin/ip
$ip link set lo up
$ip addr replace "$NODE_IP/32" dev eth0
$ip addr replace "$NODE_IP6/128" dev eth0 nodad
$ip link set eth0 up
$ip route replace "$HOST_IP" dev eth0
$ip route replace "$TEST_RANGE" via "$HOST_IP" dev eth0 src "$NODE_IP"
$ip -6 route replace "$HOST_IP6" dev eth0
$ip -6 route replace "$TEST_RANGE6" via "$HOST_IP6" dev eth0 src "$NODE_IP6"
sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1
modprobe br_netfilter
# A swap file, as LimitedSwap needs swap on the node.
if ! grep -q '^/swapfile ' /proc/swaps; then
	dd if=/dev/zero of=/swapfile bs=1M count="$SWAP_MB" 2>/dev/null
	chmod 600 /swapfile
	mkswap /swapfile >/dev/null
	swapon /swapfile
fi
echo "berth-node: ready at $(cut -d' ' -f1 /proc/uptime)s uptime; $(nproc) CPUs; cgroup $(awk '$2 == "/sys/fs/cgroup" {print $3}' /proc/mounts); AppArmor enabled: $(cat /sys/module/apparmor/parameters/enabled); swap: $(awk '/SwapTotal/ {print $2, $3}' /proc/meminfo)"
EOF
chmod 0755 "$root/usr/local/sbin/berth-node-setup"
mkdir -p "$root/var/lib/kubelet" "$root/etc/kubernetes/manifests" "$root/etc/berth"

# The test's files last.
cp -a "$config/." "$root/"

# --- the initramfs: the VM tier's stage 1, with virtio_net ---------------------
ird="$out/initrd"
mkdir -p "$ird"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,newroot,lib/modules}
add_busybox "$ird"
cp -a "$kdir/lib/modules/$release" "$ird/lib/modules/"
m="$ird/lib/modules/$release/kernel"
for f in drivers/net/virtio_net.ko drivers/net/net_failover.ko net/core/failover.ko; do
	install -D "$mods/lib/modules/$release/kernel/$f" "$m/$f"
done
busybox depmod -b "$ird" "$release"
{ cat "$src/test/vm/modules"; echo virtio_net; } >"$ird/etc/berth-vm-modules"
install -m 0755 "$src/test/vm/boot.sh" "$ird/init"
(cd "$ird" && find . -print0 | cpio --null -o -H newc -R 0:0 --quiet) >"$out/initrd.cpio"

# --- the disk: the root plus room for images, containers and the swap file ----
size_mb=$(($(du -sm "$root" | cut -f1) + 3072))
rm -f "$out/disk.img"
truncate -s "${size_mb}M" "$out/disk.img"
mkfs.ext4 -q -F -L berth-node -d "$root" "$out/disk.img"
rm -rf "$root" "$ird"
echo "vmnode: disk ${size_mb} MiB, kernel $release"
