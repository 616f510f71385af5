#!/usr/bin/env bash
# Runs make test's tiers (arguments: make targets) in order and prints each
# one's time at the end. The Kubernetes and etcd binaries that the kubelet
# and cluster tiers run (make k8s-bins) are built in the background while the
# tiers before them run, at the lowest CPU and I/O priority: on a fresh
# 2-core machine they are about half of make test's compile work, and the
# host and VM tiers leave part of the machine idle (tests waiting on
# processes, the VM's idle guest). A tier that runs them waits for that
# build first.
set -uo pipefail

make=${MAKE:-make}
bin=${BIN:-bin}
log=$bin/k8s-build.log
k8s_tiers=" test-kubelet test-cluster "

build=""
for tier in "$@"; do
	[[ $k8s_tiers == *" $tier "* ]] && build=pending
done

# setsid: the build is a process group of its own, so that a failing tier
# stops all of it (go and its compilers), not only its make.
if [[ -n $build ]]; then
	mkdir -p "$bin"
	setsid nice -n 19 ionice -c 3 bash -c \
		'start=$(date +%s); "$0" --no-print-directory k8s-bins; rc=$?; echo "k8s-bins: $(($(date +%s) - start)) s, exit $rc"; exit $rc' \
		"$make" >"$log" 2>&1 &
	build=$!
fi

stop_build() {
	if [[ -n $build ]]; then
		kill -TERM -- "-$build" 2>/dev/null
		wait "$build" 2>/dev/null
	fi
}
trap stop_build EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

times=""
report() { printf 'tier times:\n%b' "$times"; }

# wait_for_build waits for the background build, and stops the run when it
# failed, with the end of its log.
wait_for_build() {
	echo "waiting for the Kubernetes build (background, log: $log)"
	local waited=$(date +%s)
	wait "$build"
	local rc=$?
	build=""
	times+="  $(tail -n 1 "$log") (in the background; waited $(($(date +%s) - waited)) s for it)\n"
	if ((rc != 0)); then
		echo "the Kubernetes build failed; the end of $log:" >&2
		tail -n 40 "$log" >&2
		report
		exit 1
	fi
}

for tier in "$@"; do
	[[ -n $build && $k8s_tiers == *" $tier "* ]] && wait_for_build
	start=$(date +%s)
	"$make" --no-print-directory "$tier"
	rc=$?
	times+="  $tier: $(($(date +%s) - start)) s\n"
	if ((rc != 0)); then
		report
		exit "$rc"
	fi
done
report
