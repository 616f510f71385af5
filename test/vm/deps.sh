#!/usr/bin/env bash
# Installs what the VM tier needs on the host, only what is missing, and
# prepares Debian's kernel for the VM in a cache folder. Running it again is
# quick and changes nothing.
#
# The kernel package is downloaded and unpacked, never installed: the host's
# own boot (/boot, the bootloader, initramfs hooks) is left alone.
#
#   BERTH_VM_CACHE   cache folder (default /var/cache/berth-vm)
#   BERTH_VM_KERNEL  kernel package (default: what linux-image-amd64 depends on)
#
# Result: $BERTH_VM_CACHE/kernel/current -> <package>_<version>/ holding
# vmlinuz, release (the `uname -r`) and lib/modules/<release>/ with the
# modules listed in test/vm/modules, their dependencies and a modules.dep.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${BERTH_VM_CACHE:-/var/cache/berth-vm}
export DEBIAN_FRONTEND=noninteractive

# containernetworking-plugins and iptables are copied into the VM for the CNI
# tests, systemd (with libsystemd-shared) for BERTH_VM_INIT=systemd, apparmor
# (apparmor_parser) for the AppArmor tests (see run.sh): installed here, not
# run on the host.
packages=(qemu-system-x86 busybox-static cpio e2fsprogs containernetworking-plugins iptables systemd libsystemd-shared apparmor)
missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
updated=
if ((${#missing[@]})); then
	echo "deps-vm: installing ${missing[*]}"
	apt-get update -qq
	updated=1
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# CRIU, for the checkpoint tests (CheckpointContainer): Debian's criu and the
# two libraries it needs that a host with the packages above lacks
# (libprotobuf-c1, libnet1), downloaded and unpacked into $cache/criu, never
# installed: the host's kernel cannot run it, and the VM's disk takes it
# from there (run.sh). Its Python tools (crit) are left out.
criu_pkgs=(criu libprotobuf-c1 libnet1)
criu_stamp=$(apt-cache policy "${criu_pkgs[@]}" | awk '/Candidate:/ {print $2}' | tr '\n' ' ')
if [[ ! -x $cache/criu/root/usr/sbin/criu || $(cat "$cache/criu/stamp" 2>/dev/null) != "$criu_stamp" ]]; then
	echo "deps-vm: unpacking ${criu_pkgs[*]} in $cache/criu"
	[[ -n $updated ]] || { apt-get update -qq; updated=1; }
	mkdir -p "$cache"
	cwork=$(mktemp -d "$cache/tmp.XXXXXX")
	chown _apt "$cwork" 2>/dev/null || true
	(cd "$cwork" && apt-get download -qq "${criu_pkgs[@]}")
	for deb in "$cwork"/*.deb; do dpkg-deb -x "$deb" "$cwork/root"; done
	criu_stamp=$(apt-cache policy "${criu_pkgs[@]}" | awk '/Candidate:/ {print $2}' | tr '\n' ' ')
	echo "$criu_stamp" >"$cwork/stamp"
	rm -rf "$cache/criu" "$cwork"/*.deb
	mv "$cwork" "$cache/criu"
fi

# The kernel: the package linux-image-amd64 points at, unless pinned.
kpkg=${BERTH_VM_KERNEL:-}
if [[ -z $kpkg ]]; then
	resolve() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'; }
	kpkg=$(resolve)
	if [[ -z $kpkg && -z $updated ]]; then
		apt-get update -qq
		kpkg=$(resolve)
	fi
	[[ -n $kpkg ]] || { echo "deps-vm: cannot resolve linux-image-amd64 (apt-get update?)" >&2; exit 1; }
fi
kver=$(apt-cache policy "$kpkg" | awk '/Candidate:/ {print $2}')
[[ -n $kver && $kver != "(none)" ]] || { echo "deps-vm: no candidate for $kpkg" >&2; exit 1; }

dest="$cache/kernel/${kpkg}_$kver"
stamp=$(sha256sum "$here/modules" "$0" | sha256sum | cut -c1-16)
if [[ -f $dest/stamp && $(cat "$dest/stamp") == "$stamp" ]]; then
	ln -sfn "$(basename "$dest")" "$cache/kernel/current"
	exit 0
fi

echo "deps-vm: preparing $kpkg $kver in $dest"
mkdir -p "$cache/debs"
work=$(mktemp -d "$cache/tmp.XXXXXX")
trap 'rm -rf "$work"' EXIT
deb=$(ls "$cache/debs/${kpkg}_${kver//:/%3a}_amd64.deb" 2>/dev/null || true)
if [[ -z $deb ]]; then
	# apt's _apt user must be able to write where it downloads.
	chown _apt "$work" 2>/dev/null || true
	(cd "$work" && apt-get download -qq "$kpkg=$kver")
	mv "$work"/"$kpkg"_*.deb "$cache/debs/"
	deb=$(ls "$cache/debs/${kpkg}_${kver//:/%3a}_amd64.deb")
fi
dpkg-deb -x "$deb" "$work/x"
release=$(ls "$work/x/lib/modules")
[[ $(wc -w <<<"$release") == 1 ]] || { echo "deps-vm: unexpected module folders: $release" >&2; exit 1; }
busybox depmod -b "$work/x" "$release"

# The listed modules and, from the full modules.dep, what they depend on.
mods="$work/x/lib/modules/$release"
out="$work/out"
mkdir -p "$out/lib/modules/$release"
cp "$work/x/boot/vmlinuz-$release" "$out/vmlinuz"
cp "$work/x/boot/config-$release" "$out/config"
echo "$release" >"$out/release"
cp "$mods/modules.builtin" "$mods/modules.order" "$out/lib/modules/$release/"
for m in $(sed -e 's/#.*//' "$here/modules"); do
	n=${m//-/_}
	line=$(awk -v n="$n" '{f=$1; sub(":$","",f); b=f; sub(".*/","",b); sub("\\.ko$","",b); gsub("-","_",b); if (b==n) {print; exit}}' "$mods/modules.dep")
	[[ -n $line ]] || { echo "deps-vm: module $m is not in $kpkg" >&2; exit 1; }
	for f in $line; do
		f=${f%:}
		mkdir -p "$out/lib/modules/$release/$(dirname "$f")"
		cp "$mods/$f" "$out/lib/modules/$release/$f"
	done
done
busybox depmod -b "$out" "$release"
echo "$stamp" >"$out/stamp"
rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
mv "$out" "$dest"
ln -sfn "$(basename "$dest")" "$cache/kernel/current"
echo "deps-vm: kernel $release ready ($(du -sh "$dest/lib" | cut -f1) of modules)"
