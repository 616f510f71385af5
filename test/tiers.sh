#!/usr/bin/env bash
# Runs make test's tiers (arguments: make targets) and prints each one's
# time at the end. On a fresh 2-core machine make test is bound by CPU, so
# the tiers are laid out to leave as little of it idle as they can:
# - The Kubernetes and etcd binaries that the kubelet, cluster and e2e tiers
#   run (make k8s-bins, about a third of a cold run's CPU) build in the
#   background from the start, at the lowest CPU and I/O priority, in the
#   time the host tiers leave idle (tests waiting on processes). A tier that
#   runs them waits only for its own (the kubelet tier's kubelet is built
#   first), and from then on the build runs at normal priority.
# - The VM tier's two boots run in the background, one at a time (two TCG
#   guests would share the CPU each of them needs), each beside the tiers
#   after it: the busybox boot (the privileged suite) once the host tiers are
#   done, beside the kubelet and cluster tiers, which mostly wait on the
#   kubelet's and the control plane's loops, and the VM's emulated CPUs use
#   that time; the systemd boot (the systemd driver's tests, a minute of
#   tests under TCG) after it, beside the e2e tier, whose specs mostly wait
#   on timers. A background tier's output goes to a log, printed whole when
#   it ends.
set -uo pipefail

make=${MAKE:-make}
bin=${BIN:-bin}
log=$bin/k8s-build.log
# The make target that builds what each Kubernetes tier runs, in the order
# the background build makes them: the kubelet tier starts as soon as its
# kubelet is built, beside the build of the cluster's binaries, and the
# cluster tier beside the build of the e2e tier's (e2e.test, ginkgo, agnhost).
declare -A k8s_target=([test-kubelet]=kubelet-bins [test-cluster]=cluster-bins [test-e2e]=e2e-bins)
background_tiers=" test-vm-busybox test-vm-systemd "
# The background tier a tier waits for, should it still run, rather than
# run beside it: the e2e suite's processes starved the busybox boot's suite
# (its integration tests ran past 15 minutes, or timed out inside).
declare -A not_beside=([test-e2e]=test-vm-busybox)

mkdir -p "$bin"
targets=()
for tier in "$@"; do
	[[ -n ${k8s_target[$tier]:-} ]] && targets+=("${k8s_target[$tier]}")
done

# setsid: a background job is a process group of its own, so that a failing
# tier stops all of it (go and its compilers, qemu), not only its make. The
# build writes one line per target, "TARGET: N s, exit RC", to
# $bin/k8s-build.TARGET when it is done with it.
build=""
if ((${#targets[@]})); then
	rm -f "$bin"/k8s-build.*-bins
	setsid nice -n 19 ionice -c 3 bash -c '
		make=$1 bin=$2
		shift 2
		for t in "$@"; do
			start=$(date +%s)
			"$make" --no-print-directory "$t"
			rc=$?
			echo "$t: $(($(date +%s) - start)) s, exit $rc" >"$bin/k8s-build.$t"
			((rc == 0)) || exit "$rc"
		done' k8s-build "$make" "$bin" "${targets[@]}" >"$log" 2>&1 &
	build=$!
fi
bg_pid="" bg_tier="" bg_log=""

stop_background() {
	local pid
	for pid in $build $bg_pid; do
		kill -TERM -- "-$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
	done
}
trap stop_background EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

times=""
report() { printf 'tier times:\n%b' "$times"; }

# fail ends the run with status $1, printing the background tier's log so
# far, should one be running, and the tier times.
fail() {
	if [[ -n $bg_pid ]]; then
		echo "stopping the background tier $bg_tier; its output so far ($bg_log):"
		kill -TERM -- "-$bg_pid" 2>/dev/null
		wait "$bg_pid" 2>/dev/null
		bg_pid=""
		cat "$bg_log"
	fi
	report
	exit "$1"
}

# wait_for_build waits until the background build has made TARGET, and
# stops the run when it failed, with the end of its log.
wait_for_build() {
	local target=$1 done=$bin/k8s-build.$1
	echo "waiting for the Kubernetes build of $target (background, log: $log)"
	local waited=$(date +%s)
	# Now the build is what the run waits for: it shares the CPU with the
	# background tier as an equal.
	renice -n 0 -g "$build" >/dev/null 2>&1
	ionice -c 2 -n 4 -P "$build" 2>/dev/null
	while [[ ! -s $done ]] && kill -0 "$build" 2>/dev/null; do
		sleep 1
	done
	local line
	line=$(cat "$done" 2>/dev/null)
	times+="  ${line:-$target: not built} (in the background; waited $(($(date +%s) - waited)) s for it)\n"
	if [[ $line != *", exit 0" ]]; then
		echo "the Kubernetes build failed; the end of $log:" >&2
		tail -n 40 "$log" >&2
		fail 1
	fi
}

# wait_for_background waits for the background tier, prints its output and
# stops the run when it failed.
wait_for_background() {
	echo "waiting for the background tier $bg_tier (log: $bg_log)"
	wait "$bg_pid"
	local rc=$?
	bg_pid=""
	cat "$bg_log"
	times+="  $(tail -n 1 "$bg_log") (in the background)\n"
	((rc == 0)) || fail "$rc"
}

args=("$@")
for i in "${!args[@]}"; do
	tier=${args[i]}
	[[ -n ${k8s_target[$tier]:-} ]] && wait_for_build "${k8s_target[$tier]}"
	[[ $background_tiers == *" $tier "* && -n $bg_pid ]] && wait_for_background
	[[ -n $bg_pid && ${not_beside[$tier]:-} == "$bg_tier" ]] && wait_for_background
	if [[ $background_tiers == *" $tier "* ]] && ((i + 1 < ${#args[@]})); then
		bg_tier=$tier bg_log=$bin/$tier.log
		echo "$tier runs in the background beside the tiers after it (log: $bg_log)"
		setsid bash -c \
			'start=$(date +%s); "$0" --no-print-directory "$1"; rc=$?; echo "$1: $(($(date +%s) - start)) s, exit $rc"; exit $rc' \
			"$make" "$tier" >"$bg_log" 2>&1 &
		bg_pid=$!
		continue
	fi
	start=$(date +%s)
	"$make" --no-print-directory "$tier"
	rc=$?
	times+="  $tier: $(($(date +%s) - start)) s\n"
	((rc == 0)) || fail "$rc"
done
[[ -n $bg_pid ]] && wait_for_background
report
