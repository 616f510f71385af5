#!/usr/bin/env bash
# The GPU check (test/gpu/README.md): a berthd of its own gives a container
# the host's NVIDIA GPUs through a CDI spec and CDI_devices; nvidia-smi -L
# and a CUDA vector add run in it, a container without the device cannot
# use it, an unknown device is refused. Not part of `make test`.
#
#   test/gpu/run.sh build       on a machine with Go, gcc and busybox-static:
#                               builds test/gpu/out and packs it with bin/ and
#                               this script into test/gpu/out/gpu-check.tar.gz
#                               (after `make build`)
#   test/gpu/run.sh             as root on the GPU host, from the repository
#                               root or the unpacked tarball: the check (needs
#                               the NVIDIA driver only)
#   test/gpu/run.sh --dry-run   as root anywhere: the same check against a
#                               fake driver (fake nodes, libcuda, nvidia-smi)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=test/gpu/out
# berthd, berthctl, berth-shim, berth-shim-helper, berth-pause and berth-exec-init (`make build`'s); the
# integration harness reads the same variable.
BIN=${BERTH_BIN_DIR:-bin}

die() { echo "run.sh: $*" >&2; exit 1; }

build() {
	for f in "$BIN/berthd" "$BIN/berthctl" "$BIN/berth-shim" "$BIN/berth-shim-helper" "$BIN/berth-pause" "$BIN/berth-exec-init"; do
		[ -x "$f" ] || die "$f missing: run make build first"
	done
	rm -rf "$OUT"
	mkdir -p "$OUT/fake"
	# Static: the GPU host may have no Go, and any libc.
	CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$OUT/crigpu" ./test/gpu/crigpu
	# Dynamic against glibc: it dlopens the driver (see vecadd.c).
	gcc -O2 -Wall -Wextra -Werror -std=c11 -D_GNU_SOURCE -o "$OUT/cuda-vecadd" test/gpu/vecadd.c -ldl
	gcc -O2 -Wall -Wextra -Werror -std=c11 -D_GNU_SOURCE -shared -fPIC -Wl,-soname,libcuda.so.1 \
		-o "$OUT/fake/libcuda.so.1" test/gpu/fakecuda.c
	"$OUT/crigpu" image --vecadd "$OUT/cuda-vecadd" --out "$OUT/image"
	# One file to copy: the GPU host unpacks it anywhere and runs
	# test/gpu/run.sh from there.
	local tarball=$OUT/gpu-check.tar.gz
	tar -czf "$tarball.tmp" --exclude "$tarball.tmp" --transform "s,^$BIN/,bin/," \
		"$BIN/berthd" "$BIN/berthctl" "$BIN/berth-shim" "$BIN/berth-shim-helper" "$BIN/berth-pause" "$BIN/berth-exec-init" test/gpu/run.sh "$OUT"
	mv "$tarball.tmp" "$tarball"
	echo "built $OUT; on the GPU host: mkdir gpu-check && tar -xzf gpu-check.tar.gz -C gpu-check && cd gpu-check && test/gpu/run.sh (as root)"
}

case "${1:-}" in
build) build; exit 0 ;;
--dry-run) DRY=1 ;;
"") DRY=0 ;;
*) die "usage: $0 [build | --dry-run]" ;;
esac

[ "$(id -u)" = 0 ] || die "run as root (berthd needs it)"
for f in "$BIN/berthd" "$BIN/berthctl" "$BIN/berth-shim" "$BIN/berth-shim-helper" "$BIN/berth-pause" "$BIN/berth-exec-init" "$OUT/crigpu" "$OUT/image/index.json"; do
	[ -e "$f" ] || die "$f missing: run make build and test/gpu/run.sh build (on a machine with Go) first"
done

# Everything of this run is below WORK (short: the socket path has a limit),
# named after this shell's PID: its bridge, nftables tables and cgroup.
WORK=$(mktemp -d /tmp/berth-gpu.XXXXXX)
SOCKET=$WORK/state/berth.sock
BRIDGE=bgpu$$
CGROUP=berth-gpu-$$
BERTHD_PID=
STATUS=1

cleanup() {
	set +e
	if [ -n "$BERTHD_PID" ]; then
		# Pods outlive berthd by design: remove what a check that was
		# interrupted left, while berthd still runs.
		"$OUT/crigpu" remove-pods --socket "$SOCKET" || STATUS=1
		kill -TERM "$BERTHD_PID" 2>/dev/null
		for _ in $(seq 200); do kill -0 "$BERTHD_PID" 2>/dev/null || break; sleep 0.1; done
		if kill -0 "$BERTHD_PID" 2>/dev/null; then
			echo "cleanup: berthd did not stop within 20s of SIGTERM: killed" >&2
			kill -KILL "$BERTHD_PID"
			STATUS=1
		fi
		wait "$BERTHD_PID" 2>/dev/null
	fi
	# Anything still started from WORK is a shim berth failed to stop.
	for p in /proc/[0-9]*; do
		if [ "${p#/proc/}" != $$ ] && tr '\0' ' ' 2>/dev/null <"$p/cmdline" | grep -qF "$WORK"; then
			echo "cleanup: process ${p#/proc/} still runs from $WORK: killed" >&2
			kill -KILL "${p#/proc/}"
			STATUS=1
		fi
	done
	# berthd keeps STATE/pods a private bind mount of itself on purpose;
	# any other mount below WORK is a leak.
	umount -l "$WORK/state/pods" 2>/dev/null
	while read -r m; do
		echo "cleanup: mount $m left: unmounted" >&2
		umount -l "$m"
		STATUS=1
	done < <(awk -v w="$WORK/" 'index($5, w) == 1 {print $5}' /proc/self/mountinfo | sort -r)
	ip link del "$BRIDGE" 2>/dev/null
	if command -v nft >/dev/null; then
		nft delete table ip "$BRIDGE" 2>/dev/null
		nft delete table netdev "$BRIDGE" 2>/dev/null
	else
		echo "cleanup: no nft command: remove the nftables tables ip $BRIDGE and netdev $BRIDGE by hand" >&2
	fi
	# crigpu removes the check's cgroup; this is for a run that stopped early.
	for d in /sys/fs/cgroup/"$CGROUP" /sys/fs/cgroup/*/"$CGROUP"; do
		[ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null
	done
	if [ "$STATUS" != 0 ] && [ -f "$WORK/berthd.log" ]; then
		echo "--- berthd log (last 60 lines)" >&2
		tail -n 60 "$WORK/berthd.log" >&2
	fi
	rm -rf "$WORK"
	if [ "$STATUS" = 0 ]; then echo "GPU CHECK PASSED"; else echo "GPU CHECK FAILED"; fi
	exit "$STATUS"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

mkdir -p "$WORK/cdi" "$WORK/logs"
SPEC=$WORK/cdi/nvidia-gpu.json
if [ "$DRY" = 1 ]; then
	echo "== dry run: a fake NVIDIA driver below $WORK/fake (no GPU is used)"
	[ -e "$OUT/fake/libcuda.so.1" ] || die "$OUT/fake/libcuda.so.1 missing: run test/gpu/run.sh build"
	"$OUT/crigpu" fake-driver --root "$WORK/fake" --libcuda "$OUT/fake/libcuda.so.1"
	"$OUT/crigpu" cdi-spec --root "$WORK/fake" --out "$SPEC"
else
	echo "== the host's NVIDIA driver"
	command -v nvidia-smi >/dev/null || die "nvidia-smi not found: is the NVIDIA driver installed?"
	nvidia-smi -L
	# nvidia-uvm (CUDA's memory manager) and its nodes appear when the first
	# CUDA program runs as root; nvidia-modprobe, from the driver, makes them.
	if [ ! -e /dev/nvidia-uvm ] && command -v nvidia-modprobe >/dev/null; then
		nvidia-modprobe -u -c=0
	fi
	"$OUT/crigpu" cdi-spec --out "$SPEC"
fi

cat >"$WORK/berthd.toml" <<EOF
[network]
bridge = "$BRIDGE"
subnet = "10.254.$(($$ % 250)).0/24"
masquerade = false

[cdi]
spec_dirs = ["$WORK/cdi"]
EOF
"$BIN/berthd" --config "$WORK/berthd.toml" --root "$WORK/root" --state "$WORK/state" \
	--socket "$SOCKET" --log-level debug >"$WORK/berthd.log" 2>&1 &
BERTHD_PID=$!
for _ in $(seq 300); do
	[ -S "$SOCKET" ] && "$BIN/berthctl" --socket "$SOCKET" info >/dev/null 2>&1 && break
	kill -0 "$BERTHD_PID" 2>/dev/null || die "berthd exited at start"
	sleep 0.1
done
echo "== berthd $BERTHD_PID on $SOCKET"
"$BIN/berthctl" --socket "$SOCKET" info | grep 'cdi device' || die "berthd lists no CDI device of $SPEC"
"$BIN/berthctl" --socket "$SOCKET" image import "$OUT/image"

"$OUT/crigpu" check --socket "$SOCKET" --spec "$SPEC" --state "$WORK/state" --logs "$WORK/logs" \
	--cgroup-parent "$CGROUP" --berthd-pid "$BERTHD_PID"
STATUS=0
