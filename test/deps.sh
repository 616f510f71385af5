#!/usr/bin/env bash
# Installs the Debian packages berth's build and tests need, only those
# missing, so that running it again is quick and changes nothing. The shim
# links libseccomp statically (libseccomp-dev ships libseccomp.a), through cgo
# (gcc, pkg-config). berthd inflates gzip layers with ISA-L: libisal-dev
# has its header, and brings libisal2, which berthd loads at run time and
# image/gunzip's tests require. kube-proxy in nftables mode (make
# test-cluster) runs nft. Given package names, it installs those instead
# (make bench-compare: containerd, runc).
set -euo pipefail

packages=(gcc libc6-dev pkg-config libseccomp-dev libisal-dev busybox-static containernetworking-plugins nftables nginx-light)
if (($#)); then
	packages=("$@")
fi

missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
	echo "installing: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	# Packages with a service (nginx-light, the seccomp test's web server;
	# containerd for bench-compare) would start it from their postinst: a
	# policy-rc.d that denies starts, only while apt runs and only where the
	# machine has none, keeps the tests' packages from serving on the node.
	policy=/usr/sbin/policy-rc.d
	if [[ ! -e $policy ]]; then
		printf '#!/bin/sh\nexit 101\n' >"$policy"
		chmod 0755 "$policy"
		trap 'rm -f "$policy"' EXIT
	fi
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v go >/dev/null 2>&1; then
	echo "berth needs Go (1.26 or newer) on PATH: see README.md" >&2
	exit 1
fi
