#!/usr/bin/env bash
# Installs the Debian packages berth's build and tests need, only those
# missing, so that running it again is quick and changes nothing. The shim
# links libseccomp statically (libseccomp-dev ships libseccomp.a), through cgo
# (gcc, pkg-config). kube-proxy in nftables mode (make test-cluster) runs
# nft. Given package names, it installs those instead
# (make bench-compare: containerd, runc).
set -euo pipefail

packages=(gcc libc6-dev pkg-config libseccomp-dev busybox-static containernetworking-plugins nftables)
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
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v go >/dev/null 2>&1; then
	echo "berth needs Go (1.26 or newer) on PATH: see README.md" >&2
	exit 1
fi
