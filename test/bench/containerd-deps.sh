#!/usr/bin/env bash
# Installs what `make bench-compare` compares berth with, only when missing:
# Debian's containerd (1.6), runc and the CNI reference plugins. Only this
# target needs them; berth itself and its tests do not.
set -euo pipefail

packages=(containerd runc containernetworking-plugins)
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
