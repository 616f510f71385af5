#!/usr/bin/env bash
# The VM tier (`make test-vm`, docs/architecture.md, "Tests" 3): the privileged tests on a
# unified cgroup v2 kernel. It builds static test binaries (`go test -c`) and
# berthd, berthctl, berth-shim, berth-pause, berth-exec-init; puts them with busybox-static on an ext4 disk
# image; boots Debian's linux-image-amd64 (prepared by test/vm/deps.sh) in
# qemu (TCG: no KVM here) with a small initramfs (test/vm/boot.sh) that
# switches to that disk, whose init (test/vm/init.sh) mounts cgroup2 with
# every controller delegated, runs the tests and prints a result marker.
#
# The console streams to stdout and to $BERTH_VM_OUT/console.log. The exit
# status is the tests' (0 or 1); anything else fails too: a kernel panic or
# oops, a hang past the timeout, qemu dying, no result marker (status 2).
#
# Knobs (environment):
#   BERTH_VM_RUN      -test.run regexp of the integration suite (default: all
#                     of it); "cgroup" selects the cgroup-sensitive tests only
#                     ($cgroup_tests below), should the suite get too slow
#   BERTH_VM_SKIP     -test.skip regexp of the integration suite (default: the
#                     load tests that TCG is too slow for, $tcg_too_slow, and
#                     the tests no kernel changes, $kernel_independent;
#                     "" skips nothing)
#   BERTH_VM_TESTS    which binaries run, of: cgroups shim integration
#                     critest (default: the first three; critest, cri-tools'
#                     validation suite against berthd, is make
#                     test-vm-critest's, under systemd)
#   BERTH_VM_TIMEOUT  seconds from qemu's start to its exit (default 2700)
#   BERTH_VM_MEM, BERTH_VM_SMP, BERTH_VM_CPU   qemu -m, -smp, -cpu (2048, 2, max)
#   BERTH_VM_APPEND   more kernel command line (loglevel=7, debugging)
#   BERTH_VM_CACHE    where deps.sh keeps the kernel (default /var/cache/berth-vm)
#   BERTH_VM_OUT      build output and console log (default bin/vm)
#   BERTH_VM_INIT     busybox (default): init.sh is PID 1 and sets cgroup2 up
#                     itself (the cgroupfs driver); systemd: the disk also
#                     holds Debian's systemd (the host's files, see deps.sh),
#                     boot.sh switches to /lib/systemd/systemd and the unit
#                     berth-vm-tests.service runs init.sh --systemd, which
#                     runs the systemd cgroup driver's tests ($systemd_tests)
set -euo pipefail

cd "$(dirname "$0")/../.."
src=$(pwd)
GO=${GO:-go}
cache=${BERTH_VM_CACHE:-/var/cache/berth-vm}
out=${BERTH_VM_OUT:-$src/bin/vm}
# The VM's CPUs are emulated, so its tests' pace follows the host's load:
# the integration tests take 8 minutes on a quiet host, and took 903 s once
# beside make test's e2e tier, past the 15 minutes they had; beside the
# cluster tier's VM node (a second TCG guest) and other load they once ran
# past 25. The limits are for hangs, not for pace.
timeout=${BERTH_VM_TIMEOUT:-2700}
mem=${BERTH_VM_MEM:-2048}
smp=${BERTH_VM_SMP:-2}
cpu=${BERTH_VM_CPU:-max}
tests=${BERTH_VM_TESTS:-cgroups shim integration}
# The integration tests whose outcome depends on cgroups: pods and
# containers (lifecycle, resources, OOM, stats, cleanup, restart), the
# runtime's reported cgroup driver.
cgroup_tests='^Test(Pod|Container|UpdateContainerResources|RuntimeVersionStatusConfig|SystemdDriver)'
integration_run=${BERTH_VM_RUN:-.}
[[ $integration_run == cgroup ]] && integration_run=$cgroup_tests
# Load tests whose deadlines assume real CPUs: 50 pods started at once need
# more than the shim's 10 s ready timeout on 2 emulated CPUs, and CNI's
# concurrent pods took 105 s under TCG. And the crash point walks (the lazy pull's too): some 30
# berthd restarts, minutes under TCG, and a berthd built with crash points.
# Nothing in them depends on the cgroup version; the host tier runs them.
# (The VM's berthd is built without crash points, so the walks, the lazy
# layer server's too, could not run there anyway; nor could the lazy layer
# server of another protocol version, whose fake version only a crash points
# build reads.) And the writable-layer walk over 163,000 long names (106 s
# on the host's ext4, where it runs).
tcg_too_slow='TestConcurrentPodsGetDistinctIPs|TestCrashPoints(Lazy|LazyServer)?|TestPullLazyServerOfAnotherVersion|TestCNIConcurrentPods|TestWritableLayerUsageBehindLongNames'
# Tests whose outcome does not depend on the kernel, its cgroup version,
# AppArmor or the init system: the image service (pulls, registries, mirrors,
# image records; the two pull tests that check what the kernel's filesystems
# make of a layer, whiteouts and escapes, stay), the daemon's configuration,
# socket and signals, and tracing. They run in the host tier; under TCG they
# were a third of the VM tier's time, which make test's budget cannot carry.
# A new test runs in both tiers unless it is named here.
kernel_independent='TestPull(ReferenceForms|ThroughMirrors|ManifestFormatsAndCompressions|Auth|Errors|BadBlobs|ProgressTimeout|SlowButProgressingSucceeds|FetchesLayersInParallel|StreamsIntoUnpacker|RejectsLyingDiffID|RefusesLayerBombs|RefusesHugeConfig|CredentialsStayHome|RegistryFaults)'
# Resumed and ranged downloads (the big-layer ones also build a 66 MiB image,
# more than the VM's memory should carry beside the suite), and the partial
# downloads they keep: counted, freed, bounded by max_layer_bytes (58 s of
# the VM's time, 2026-11-29: a 66 MiB image again, and a pull run into its
# 10 s progress timeout beside one slowed to 12 s).
kernel_independent+='|TestPull(ResumesCutConnection|RetriesTransientLayerErrors|RangedRequestsAuthorized|ResumesAcrossPulls|DiscardsCorruptPartial|MaxConcurrentDownloads|BigLayerInRanges|BigLayerPartCut|StallWithOneDownloadSlot|RefusesBlobOverMaxLayerBytes)'
kernel_independent+='|TestPartialDownloadsCountedAndFreed'
kernel_independent+='|TestSharedLayerFetchedAndStoredOnce|TestConcurrentPullsFetchOnce|TestSlowPullBlocksNothing|TestSIGTERMDrainsInFlightPull'
# Which pulls share a download or unpack (by blob and source), and which
# wait: berthd's bookkeeping, timed by the registry's trickles and stalls.
kernel_independent+='|TestPull(NotHeldByTricklingSource|RetriesSharedLayerAfterItsPullEnded|SharedLayerBlobFailureNotRetried|SharedLayerOwnFailureRetried|WaitingOnSlotWaiterNotStalled)'
kernel_independent+='|TestImageStatusLookups|TestImageStatusUserAndSize|TestRepoTagsAndDigestsExact|TestListImages|TestRemoveImage|TestRemoveOneOfTwoTags|TestRemoveKeepsLayersOtherImagesUse|TestBerthctlImport|TestImageRemovalFreesSpace'
# ImageFsInfo sums the image records and the content store's files, not
# what the kernel says the disk holds (53 s in the VM, 2026-11-29: four
# 16 MiB random layers, gzipped and pulled).
kernel_independent+='|TestImageFsInfoCountsReturnedPull'
# What the CRI and berthctl report of pods and containers (labels,
# filters, a container being created, the start timeline), and how berthd
# treats its NRI plugins (started from plugin_path, dropped when they hang
# or crash): 54 s in the VM. The NRI tests whose plugins adjust cgroups,
# devices or mounts stay.
kernel_independent+='|TestPodAttributesAndFilters|TestListContainersDuringCreate|TestBerthctlPodsTimelineInfo|TestNRIPluginFailures|TestNRIPluginPath'
# The CRI log file's records and their rotation (the shim's writer, pipes
# and renames), and a berthd that starts beside a shim that never answers
# and a network state it cannot read: 24 s in the VM.
kernel_independent+='|TestContainerLogFormat|TestContainerLogRotation|TestStartupIsNotAllOrNothing'
# CRI requests refused before anything of the pod reaches the kernel
# (RunPodSandbox's fields, unknown IDs, a pod's metadata taken twice; user
# namespace requests of a shape berth cannot honour, checked before the
# kernel's features; a mode NODE pod's uid_map is the identity on every
# kernel), and SELinux options, which have no effect where SELinux is off, in
# the VM (AppArmor is its LSM) as on the host: 77 s of the VM's
# (2026-11-29, two runs' mean).
kernel_independent+='|TestPodValidation|TestUsernsOptionsRefused|TestSELinuxOptions'
# Likewise refused before the kernel: a CreateContainer whose image volume's
# image is not pulled yet, and containers and a pod resize an NRI plugin
# rejects (or whose sysctl adjustment berth refuses): 31 s of the VM's.
kernel_independent+='|TestImageVolumePendingMakesNothing|TestNRIRefusals'
# And two of the checkpoint tests' refusals, decided from annotations and
# the image's manifest before CRIU or any kernel call: a CRIU configuration
# file named by a pod's annotation, and checkpoint images berth cannot
# restore from (14 s of the VM's, in its serial part).
kernel_independent+='|TestCRIUConfigAnnotationRefused|TestRestoreRefused'
# What berth makes of the image and the pod's config, set the same way on
# every kernel: the user, group and supplementary groups a container runs
# with (resolved from the image's /etc/passwd and /etc/group, set by
# libcontainer's init with setresuid and setgroups) and what ContainerStatus
# says of them; the hostname (sethostname in the pod's UTS namespace) and
# the /etc/hostname, hosts and resolv.conf berth writes; the image and
# network counters the kubelet shows; port forwarding, a connection that
# berthd opens from a thread in the pod's network namespace (or the host's),
# and its refusal once the pod is stopped, which berth decides from the pod's
# state: 169 s of the VM's (2026-11-29, two runs' mean; TestContainerUsers
# alone 66 s, four images built and pushed).
kernel_independent+='|TestContainerUsers|TestPodHostnameAndDNS|TestKubeletViews|TestPodPortForward|TestPodPortForwardStoppedPod|TestPodPortForwardHostNetwork'
kernel_independent+='|TestContainerdHostsDir|TestSIGHUPReloadsRegistries'
kernel_independent+='|TestConfigErrorsNameTheKey|TestSocketIsRootOnly|TestStaleSocketIsReplaced|TestSecondDaemonOnSameSocketIsRefused|TestSignalsExitCleanly|TestFlagsOverrideConfigFile|TestLogFormatJSON'
# The CRI socket as it appears (bound in a private folder, made root's and
# 0660 there, renamed into place, watched with inotify): the daemon's
# socket, as TestSocketIsRootOnly's (15 s of the VM's, 2026-11-29).
kernel_independent+='|TestSocketRootOnlyFromTheStart'
# Lazy pull tests whose claims are the lazy layer server's and berthd's
# own: when the background fetch starts and what holds it (the proxy's
# clock: a container's reads, another pull's prioritised fetch, a killed
# berthd's lease), the mirror and credentials a chunk's range request goes
# to, a chunk another layer fetched linked from its cache rather than
# downloaded, and the cache bound berthd keeps across its restarts. The
# kernel's part of a lazy layer, a container's overlay over FUSE, its reads
# and their failures, a server's death under its mounts, the idmapped
# mount, is what the other lazy tests prove in the VM. The mirror's and the
# shared files' took 41 and 54 s of the VM's (2026-11-29, a loaded machine).
kernel_independent+='|TestPullLazy(HoldsBackgroundFetch|PullHoldsBackgroundFetch|KilledPullReleasesBackgroundFetch|ThroughAuthenticatedMirror|SharesFetchedFiles|CacheBoundAfterRestart)'
kernel_independent+='|TestTracingToOTLPCollector|TestNoTracingWithoutEndpoint|TestTracingSamplingFollowsCaller'
kernel_independent+='|TestHostsHeadersStayWithTheirHost|TestPullRefusesWideZstdWindow|TestPullInflatesWithISAL|TestGzipDecoderChosenByMeasurement|TestLinkLocalPodSubnetRefused'
# Tests that build their programs from the host's tools (go, ldd and the
# host's nginx), which the VM's disk does not have. What they prove does not
# depend on the kernel's version: the seccomp probe compares each call under
# RuntimeDefault with the same kernel unconfined, and the pause's credentials
# are set by libcontainer and the pause itself, not by the cgroup version
# (every pod of the VM's suite has a pause started the same way). The shim
# upgrade test builds the previous shim from the repository's history (git,
# go); what it proves is the shims' protocol, not the kernel's.
host_tools='TestSeccompRuntimeDefaultRunsPrograms|TestPauseHoldsNoPrivilege|TestShimUpgradeKeepsOldPods'
integration_skip=${BERTH_VM_SKIP-^($tcg_too_slow|$kernel_independent|$host_tools)\$}
vm_init=${BERTH_VM_INIT:-busybox}
# Under systemd: the tests of the systemd driver (cgroups/systemd_test.go,
# test/integration/systemd_test.go); the rest ran under busybox init.
systemd_tests='Systemd'
case $vm_init in
busybox) ;;
systemd)
	tests=${BERTH_VM_TESTS:-cgroups integration}
	integration_run=${BERTH_VM_RUN:-$systemd_tests}
	;;
*)
	echo "test-vm: BERTH_VM_INIT=$vm_init: want busybox or systemd" >&2
	exit 2
	;;
esac

kdir="$cache/kernel/current"
if [[ ! -f $kdir/vmlinuz ]]; then
	echo "test-vm: no kernel in $kdir: run test/vm/deps.sh (make deps-vm)" >&2
	exit 2
fi
release=$(cat "$kdir/release")

t_start=$(date +%s.%N)
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}'; }

# --- the test disk's root ---------------------------------------------------
rm -rf "$out/root" "$out/initrd"
root="$out/root"
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,run,tmp,var/tmp,var/lib,root,lib/modules,berth/bin,berth/tests}

echo "test-vm: building binaries"
# Static, as in the harness (daemon.go) but without -race: there is no
# libc in the VM, and no Go toolchain either (BERTH_BIN_DIR, see harness.Main).
# Go's own resolver and user lookups (netgo, osusergo) leave berthd and the
# test binaries without C, so they link statically; these are the Makefile's
# BERTH_GOFLAGS, with which the host tier compiled the same packages, and
# noisal: a static berthd cannot load ISA-L (image/gunzip), so it inflates
# gzip layers with the builtin decoder.
static=(-trimpath -tags netgo,osusergo,noisal -ldflags '-extldflags -static')
$GO build "${static[@]}" -o "$root/berth/bin/" ./cmd/berthd ./cmd/berthctl
CGO_ENABLED=1 $GO build -trimpath -tags netgo,osusergo,seccomp -ldflags '-extldflags -static' \
	-o "$root/berth/bin/" ./cmd/berth-shim ./cmd/berth-shim-helper
make --no-print-directory BIN="$root/berth/bin" cbins

plan="$root/berth/plan"
echo "# written by test/vm/run.sh; sourced by /sbin/berth-vm-init" >"$plan"
for t in $tests; do
	case $t in
	cgroups)
		pkg=./cgroups args=(-test.v -test.count=1 -test.timeout=5m)
		[[ $vm_init == systemd ]] && args+=(-test.run="$systemd_tests")
		;;
	shim) pkg=./sandbox/shim args=(-test.v -test.count=1 -test.timeout=5m) ;;
	integration)
		pkg=./test/integration
		args=(-test.v -test.count=1 -test.timeout=40m -test.run="$integration_run" -test.skip="$integration_skip")
		# TestCRIMetricsFigures' container program: the VM has no Go.
		CGO_ENABLED=0 GOFLAGS= $GO build -trimpath -o "$root/berth/tests/metered" ./test/integration/testdata/metered
		# The NRI tests' plugin, likewise.
		CGO_ENABLED=0 GOFLAGS= $GO build -trimpath -o "$root/berth/tests/nriplugin" ./test/integration/testdata/nriplugin
		# The checkpoint tests' checkpointctl, test/checkpointctl's version.
		(cd test/checkpointctl && CGO_ENABLED=0 GOFLAGS= GOWORK=off $GO build -trimpath -o "$root/berth/tests/checkpointctl" github.com/checkpoint-restore/checkpointctl)
		# The protocol's sample plugin, from its module pinned in testdata.
		(cd test/integration/testdata/ulimitadjuster && CGO_ENABLED=0 GOFLAGS= $GO build -trimpath \
			-o "$root/berth/tests/ulimit-adjuster" github.com/containerd/nri/plugins/ulimit-adjuster)
		if [[ -n $integration_skip ]]; then
			echo "test-vm: integration tests skipped in the VM: $integration_skip (BERTH_VM_SKIP)"
		fi
		;;
	critest)
		# cri-tools' suite (test/critest/tool pins it), driven by
		# test/critest against a berthd of the tree.
		pkg=./test/critest args=(-test.v -test.count=1 -test.timeout=40m)
		(cd test/critest/tool && $GO test -c "${static[@]}" -o "$root/berth/tests/critest" sigs.k8s.io/cri-tools/cmd/critest)
		# The AppArmor specs load their profiles with sudo apparmor_parser
		# (the VM runs everything as root), and the profiles include the
		# host's abi, tunables and abstractions. Not the host's parser.conf (it
		# names a features file the disk lacks: berthd's own profile failed to
		# load with it), but an empty one: without any, the parser warns on
		# stderr, which the suite takes for a failed load.
		printf '#!/bin/sh\nexec "$@"\n' >"$root/usr/bin/sudo"
		chmod 0755 "$root/usr/bin/sudo"
		mkdir -p "$root/etc/apparmor.d" "$root/etc/apparmor"
		echo '# empty: apparmor_parser on its defaults' >"$root/etc/apparmor/parser.conf"
		cp -a /etc/apparmor.d/abi /etc/apparmor.d/tunables /etc/apparmor.d/abstractions "$root/etc/apparmor.d/"
		;;
	*)
		echo "test-vm: unknown test binary $t in BERTH_VM_TESTS (want cgroups, shim, integration, critest)" >&2
		exit 2
		;;
	esac
	$GO test -c "${static[@]}" -o "$root/berth/tests/$t.test" "$pkg"
	printf 'run_test %q' "$t" >>"$plan"
	[[ $t == critest ]] && printf ' env BERTH_CRITEST_BIN=/berth/tests/critest' >>"$plan"
	[[ $t == integration ]] && printf ' env BERTH_METERED_BIN=/berth/tests/metered BERTH_NRIPLUGIN_BIN=/berth/tests/nriplugin BERTH_CHECKPOINTCTL_BIN=/berth/tests/checkpointctl BERTH_ULIMIT_ADJUSTER_BIN=/berth/tests/ulimit-adjuster' >>"$plan"
	printf ' %q' "/berth/tests/$t.test" >>"$plan"
	printf ' %q' "${args[@]}" >>"$plan"
	echo >>"$plan"
done
echo "test-vm: built in $(elapsed "$t_start")s"

. "$src/test/vm/lib.sh" # copy_host_file, copy_systemd, add_busybox, write_users, add_criu

# busybox-static as /bin/busybox (the test images are made from it) and
# every applet.
add_busybox "$root"
write_users
printf '127.0.0.1\tlocalhost berth-vm\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$root/etc/hosts"
echo "hosts: files dns" >"$root/etc/nsswitch.conf"
: >"$root/etc/resolv.conf"
echo berth-vm >"$root/etc/hostname"
cp -a "$kdir/lib/modules/$release" "$root/lib/modules/"
install -m 0755 test/vm/init.sh "$root/sbin/berth-vm-init"
# The unit `make install` installs, for TestSystemdUnitRestartKeepsContainers.
install -m 0644 cmd/berthd/berthd.service "$root/berth/berthd.service"

# Host programs the tests run, with the shared libraries they load: the
# reference CNI plugins (test/deps.sh installs them) and iptables (nft), which
# the CNI tests and the portmap plugin call, with its extensions; and
# apparmor_parser, with which berthd loads its default AppArmor profile and
# the AppArmor tests theirs (the kernel boots with AppArmor as its LSM); and
# mkfs.ext4, with which TestDiskFull makes its small root (busybox has no
# mkfs for ext4).
host_files=(/usr/lib/cni/* /usr/lib/x86_64-linux-gnu/xtables/*.so
	/usr/sbin/{iptables,iptables-save,iptables-restore,ip6tables,ip6tables-save,ip6tables-restore}
	/usr/sbin/apparmor_parser /usr/sbin/mkfs.ext4)
for f in "${host_files[@]}"; do
	if [[ -e $f ]]; then copy_host_file "$f"; else echo "test-vm: not on this host, not in the VM: $f"; fi
done

# Debian's criu, for the checkpoint tests (add_criu).
if ! add_criu "$cache"; then
	echo "test-vm: no criu in $cache/criu: run test/vm/deps.sh; the checkpoint tests will fail"
fi

# Debian's systemd (copy_systemd). No dbus: as root, the systemd cgroup
# manager falls back to systemd's private socket (/run/systemd/private)
# without a bus.
if [[ $vm_init == systemd ]]; then
	copy_systemd
	[[ -x $root/lib/systemd/systemd ]] || { echo "test-vm: no /lib/systemd/systemd in the image: run test/vm/deps.sh" >&2; exit 2; }
	# The one unit the boot starts (systemd.unit= on the command line), with
	# no default dependencies: nothing else starts, no getty, udev, journald
	# or network. PID 1 mounts the API filesystems and brings lo up itself.
	mkdir -p "$root/etc/systemd/system"
	cat >"$root/etc/systemd/system/berth-vm-tests.service" <<'EOF'
[Unit]
Description=berth VM tier tests
DefaultDependencies=no

[Service]
Type=oneshot
ExecStart=/sbin/berth-vm-init --systemd
StandardInput=null
StandardOutput=tty
StandardError=tty
TTYPath=/dev/console
TimeoutStartSec=infinity
LimitNOFILE=1048576
EOF
	: >"$root/etc/machine-id"
	printf 'NAME="berth VM"\nID=debian\n' >"$root/etc/os-release"
fi

# --- the initramfs: busybox, the modules, boot.sh as /init -------------------
ird="$out/initrd"
mkdir -p "$ird"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,newroot,lib/modules}
add_busybox "$ird"
cp -a "$kdir/lib/modules/$release" "$ird/lib/modules/"
cp test/vm/modules "$ird/etc/berth-vm-modules"
install -m 0755 test/vm/boot.sh "$ird/init"
(cd "$ird" && find . -print0 | cpio --null -o -H newc -R 0:0 --quiet) >"$out/initrd.cpio"

# --- the disk: the root plus room for the tests' images and containers -------
size_mb=$(($(du -sm "$root" | cut -f1) + 3072))
rm -f "$out/disk.img"
truncate -s "${size_mb}M" "$out/disk.img"
mkfs.ext4 -q -F -L berth-vm -d "$root" "$out/disk.img"
echo "test-vm: disk ${size_mb} MiB, initramfs $(du -h "$out/initrd.cpio" | cut -f1), ready after $(elapsed "$t_start")s"

# --- boot ---------------------------------------------------------------------
init_append=
if [[ $vm_init == systemd ]]; then
	init_append="berth.init=systemd systemd.unit=berth-vm-tests.service systemd.show_status=error systemd.log_level=notice systemd.firstboot=0"
fi
nonce=$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
log="$out/console.log"
: >"$log"
echo "test-vm: booting $release, init $vm_init (qemu -accel tcg -smp $smp -m $mem -cpu $cpu), timeout ${timeout}s; console in $log"
t_boot=$(date +%s.%N)
qemu-system-x86_64 -nographic -no-reboot -accel tcg -cpu "$cpu" -m "$mem" -smp "$smp" \
	-kernel "$kdir/vmlinuz" -initrd "$out/initrd.cpio" \
	-append "console=ttyS0 panic=-1 loglevel=4 apparmor=1 security=apparmor berth.nonce=$nonce $init_append ${BERTH_VM_APPEND:-}" \
	-drive "file=$out/disk.img,format=raw,if=virtio,cache=unsafe" \
	-device virtio-rng-pci -nic none \
	</dev/null >"$log" 2>&1 &
qpid=$!
# Streamed without the firmware's terminal resets and escape sequences.
tail -n +1 -f --pid="$qpid" "$log" | sed -u -e 's/\x1bc//g' -e 's/\x1b\[[0-9;?]*[A-Za-z]//g' -e 's/\r$//' &
tpid=$!
cleanup() {
	kill "$qpid" 2>/dev/null || true
	kill "$tpid" 2>/dev/null || true
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT TERM

marker="^BERTH-VM-RESULT $nonce: "
deadline=$((SECONDS + timeout))
why= seen_at= ready=
while kill -0 "$qpid" 2>/dev/null; do
	if [[ -z $ready ]] && grep -aq '^berth-vm: ready at' "$log"; then
		ready=$(elapsed "$t_boot")
	fi
	if [[ -z $seen_at ]] && grep -aq "$marker" "$log"; then
		seen_at=$SECONDS
	fi
	if [[ -n $seen_at ]] && ((SECONDS - seen_at > 30)); then
		why="qemu still running 30 s after the result: killed"
		break
	fi
	if ((SECONDS >= deadline)); then
		why="timeout: no result within ${timeout}s: killed qemu"
		break
	fi
	sleep 1
done
if kill -0 "$qpid" 2>/dev/null; then
	kill "$qpid"
	for _ in 1 2 3 4 5; do kill -0 "$qpid" 2>/dev/null || break; sleep 1; done
	kill -9 "$qpid" 2>/dev/null || true
fi
wait "$qpid" && qrc=0 || qrc=$?
wait "$tpid" 2>/dev/null || true
trap - EXIT INT TERM
total=$(elapsed "$t_start")

result=$(tr -d '\r' <"$log" | sed -n "s/$marker\([0-9]*\)\$/\1/p" | tail -n 1)
echo
echo "test-vm: ---------------------------------------------------------------"
tr -d '\r' <"$log" | grep -a -E '^berth-vm: (<<< |done at)|^ *--- FAIL' | sed 's/^/test-vm: /' || true
echo "test-vm: boot to tests ${ready:-?}s, VM ran $(elapsed "$t_boot")s, total (build+boot+tests) ${total}s"
if tr -d '\r' <"$log" | grep -a -q -E '^\[ *[0-9]+\.[0-9]+\] (Kernel panic|BUG: |Oops: )'; then
	echo "test-vm: FAIL: the kernel panicked or oopsed (see $log)"
	exit 2
fi
if [[ -n $why && -z $result ]]; then
	echo "test-vm: FAIL: $why"
	exit 2
fi
if [[ -z $result ]]; then
	echo "test-vm: FAIL: no result marker (qemu exit status $qrc)"
	exit 2
fi
if [[ $result == 0 ]]; then
	echo "test-vm: PASS"
	exit 0
fi
echo "test-vm: FAIL: the tests in the VM exited with status $result"
exit 1
