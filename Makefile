# berth — build, test, lint, run. See README.md.
GO        ?= go
BIN       := bin
# berthd reports cri/VERSION with this as semver build metadata (0.2.0-dev+3ce7510).
COMMIT    ?= $(shell git describe --tags --always --dirty 2>/dev/null)
LDFLAGS   := -X github.com/berth-runtime/berth/cri.buildCommit=$(COMMIT)
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
PREFIX    ?= /usr/local
# BERTH_GOFLAGS: every build of berth's own packages that is not -race (vet,
# the unit tests and fuzzers, staticcheck's loading, `build`, and the VM
# tier's static binaries and test binaries) uses these flags, so that a
# package compiles once per make test rather than once per tier: -trimpath,
# and Go's own DNS resolver and user lookups (netgo, osusergo), which leave
# no libc calls in berth's binaries, so that they link statically (the VM's
# disk has no libc) from the same compiled packages. The shim adds the
# seccomp tag, which changes only libcontainer's seccomp packages.
BERTH_GOFLAGS := -trimpath -tags=netgo,osusergo
BERTH_GO  := GOFLAGS='$(BERTH_GOFLAGS)' $(GO)

.PHONY: build cbins deps test test-host test-unit test-fuzz fuzz test-integration soak test-soak deps-vm test-vm test-vm-busybox test-vm-systemd test-vm-critest test-kubelet test-cluster test-e2e test-conformance deps-e2e k8s-bins kubelet-bins cluster-bins e2e-bins lint run bench bench-compare install start clean

# The shim and its helper are linked statically: they need no libc on the
# node (nor in the VM tier). The shim, one per pod for the pod's lifetime,
# is pure Go and small (its mapped pages count in every pod's memory); the
# helper carries libcontainer. The seccomp tag links libcontainer's seccomp
# support with Debian's static libseccomp (libseccomp-dev, installed by
# deps); without it every container asking for a seccomp profile would fail
# to start.
build: deps
	$(BERTH_GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/berthd ./cmd/berthctl
	CGO_ENABLED=0 $(BERTH_GO) build -ldflags '$(LDFLAGS) -s -w' -o $(BIN)/berth-shim ./cmd/berth-shim
	CGO_ENABLED=1 $(GO) build -trimpath -tags netgo,osusergo,seccomp -ldflags '$(LDFLAGS) -s -w -extldflags -static' -o $(BIN)/berth-shim-helper ./cmd/berth-shim-helper
	$(MAKE) --no-print-directory cbins

# cbins builds berth's C programs, which need no Go runtime; the tests
# build them with this target too. berth-pause, PID 1 of shared-PID pods
# (one thread, under 100 KB anonymous memory), is linked statically because
# it runs alone in an empty rootfs; berth-exec-init, which starts each exec'd
# process in a container for the shim, because it runs from a sealed memfd
# (no loader to find beside it) and a start without dynamic linking is the
# cheaper.
cbins:
	mkdir -p $(BIN)
	$(CC) -static -Os -s -Wall -Wextra -Werror -o $(BIN)/berth-pause cmd/berth-pause/pause.c
	$(CC) -static -Os -s -Wall -Wextra -Werror -o $(BIN)/berth-exec-init cmd/berth-exec-init/execinit.c

# deps installs what building (libseccomp-dev, a C compiler) and the tests
# need (Debian packages), only when missing.
deps:
	test/deps.sh

# test is the README's test command and what CI runs: the host tiers, the
# privileged suite (less the tests no kernel changes, see test/vm/run.sh) in
# a VM on unified cgroup v2 (with busybox, then systemd, as init), a stock
# kubelet, a two-node cluster, then Kubernetes' e2e suite on such a cluster
# (its specs make test-e2e runs); each tier's time is printed at the end
# (CI's budget is 40 minutes on 2 cores).
# test/tiers.sh builds the Kubernetes binaries (k8s-bins) in the background,
# at the lowest priority, while the host and VM tiers run, and runs the VM
# tier's busybox boot in the background beside the kubelet and cluster
# tiers, its systemd boot after it beside the e2e tier. Every tier's
# packages are installed first, so that no two tiers run apt at once.
TEST_TIERS := test-host test-vm-busybox test-kubelet test-cluster test-vm-systemd test-e2e
test: deps deps-vm deps-e2e
	@MAKE="$(MAKE)" BIN=$(BIN) test/tiers.sh $(TEST_TIERS)

test-host: deps lint test-unit test-fuzz test-integration test-soak

# -vet=off: lint's go vet ran every analyzer (a superset of go test's) on the
# same packages and their tests already; go test's own subset, keyed apart,
# ran again at 57 s of CPU (2026-11-29, compiled packages cached).
test-unit:
	$(BERTH_GO) test -count=1 -vet=off ./...

# The fuzzers (package:FuzzName). Their seeds (f.Add and testdata/fuzz) run
# in test-unit; fuzz runs each for FUZZTIME, test-fuzz (CI) for 1000 inputs each.
# FUZZMINIMIZE bounds how long a worker shrinks a new input (a minute by
# default, which stalls the unpack fuzzer); CI does not shrink at all. CI
# counts inputs rather than seconds: on a loaded machine a fuzz time that
# ends while a worker is busy fails the run with "context deadline exceeded".
# No vet, as in test-unit: lint vets these packages.
FUZZ_TARGETS := image/unpack:FuzzUnpack image/reference:FuzzParse image:FuzzDecodeImageBlobs image/gunzip:FuzzISAL \
	cmd/berthd/config:FuzzLoad sandbox/spec:FuzzSysctls sandbox/spec:FuzzCRIMount sandbox/podfiles:FuzzPodFiles sandbox:FuzzLogPath
FUZZTIME ?= 30s
FUZZMINIMIZE ?= 100x

fuzz:
	@start=$$(date +%s); for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t##*:}; echo "fuzz $$fn ($$pkg) for $(FUZZTIME)"; \
		$(BERTH_GO) test -vet=off -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZE) ./$$pkg || exit 1; \
	done; echo "fuzz: $(words $(FUZZ_TARGETS)) fuzzers, $(FUZZTIME) each, $$(( $$(date +%s) - start )) s in all"

test-fuzz:
	$(MAKE) fuzz FUZZTIME=1000x FUZZMINIMIZE=0x

# Privileged: a real berthd (built with -race) on a temp root and socket,
# driven through the CRI client against a loopback registry.
test-integration:
	BERTH_INTEGRATION=1 BERTH_RACE=1 $(GO) test -race -count=1 -timeout 25m ./test/integration/...

# The soak (privileged, issue #21): one berthd, built as `build` builds it,
# churned by pod create/start/stop/remove cycles a few at a time, ExecSync
# calls, and streaming execs and attaches into a long-lived pod, with
# containers that exit, crash and get OOM-killed. It prints berthd's and the
# shims' figures (RSS, goroutines, fds; shims, mounts, cgroups, veths,
# nftables rules and elements, IP leases, snapshots, log and state files)
# before, after each round and after, with each one's growth per 1,000
# cycles, and fails on a count that does not return to its baseline or on
# growth beyond the bounds stated in test/soak. soak is the long form (2,000
# cycles, 5 in flight, 20,000 ExecSync, 500 execs and 500 attaches);
# test-soak, in make test, the same at a tenth of the size.
SOAK_GO := BERTH_SOAK=1 BERTH_BIN_DIR=$(CURDIR)/$(BIN) $(BERTH_GO) test -count=1 -v -run '^TestSoak$$'
soak: deps build
	$(SOAK_GO) -timeout 120m ./test/soak/

test-soak: deps build
	BERTH_SOAK_CYCLES=200 BERTH_SOAK_EXECSYNC=2000 BERTH_SOAK_EXECS=50 BERTH_SOAK_ATTACHES=50 BERTH_SOAK_ROUNDS=10 \
		$(SOAK_GO) -timeout 20m ./test/soak/

# The kubelet end-to-end tier (privileged): a stock kubelet in standalone mode
# runs static pods on a berthd of its own (test/kubelet, a module of its own so
# that k8s.io/kubernetes stays out of berth's go.mod). bin/kubelet is built
# from that module, and rebuilt only when its go.mod or go.sum changes.
# test/kubeenv, the test helpers this tier shares with test-cluster, is in
# none of the Kubernetes binaries: a change to it rebuilds only the tests.
test-kubelet: deps build $(BIN)/kubelet
	cd test/kubelet && BERTH_KUBELET=1 BERTH_BIN_DIR=$(CURDIR)/$(BIN) KUBELET=$(CURDIR)/$(BIN)/kubelet \
		$(GO) test -count=1 -timeout 20m -v .

KUBELET_VERSION = $(shell awk '$$1 == "k8s.io/kubernetes" { print $$2 }' test/kubelet/go.mod)
$(BIN)/kubelet: test/kubelet/go.mod test/kubelet/go.sum
	cd test/kubelet && $(GO) build -trimpath -ldflags '-s -w -X k8s.io/component-base/version.gitVersion=$(KUBELET_VERSION)' \
		-o $(CURDIR)/$(BIN)/kubelet k8s.io/kubernetes/cmd/kubelet

# The whole-flow tier (privileged): etcd, a control plane, a kubelet and
# kube-proxy of the current Kubernetes release run a one-node cluster on
# berth, driven as a user drives it, with kubectl (test/cluster, a module
# of its own; etcd 3.6 in test/cluster/etcd, one more, as Kubernetes 1.37
# needs etcd 3.7's client libraries). The binaries go to bin/cluster/, built
# in one go build (the packages they share compile once) and rebuilt only
# when their go.mod or go.sum changes; -s -w: no symbol tables, a shorter link.
CLUSTER_CMDS := kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet kubectl
CLUSTER_BINS := $(addprefix $(BIN)/cluster/,$(CLUSTER_CMDS))
test-cluster: deps build $(CLUSTER_BINS) $(BIN)/cluster/etcd
	cd test/cluster && BERTH_CLUSTER=1 BERTH_BIN_DIR=$(CURDIR)/$(BIN) CLUSTER_BIN_DIR=$(CURDIR)/$(BIN)/cluster \
		$(GO) test -count=1 -timeout 25m -v .

CLUSTER_K8S_VERSION = $(shell awk '$$1 == "k8s.io/kubernetes" { print $$2 }' test/cluster/go.mod)
$(CLUSTER_BINS) &: test/cluster/go.mod test/cluster/go.sum
	cd test/cluster && $(GO) build -trimpath -ldflags '-s -w -X k8s.io/component-base/version.gitVersion=$(CLUSTER_K8S_VERSION)' \
		-o $(CURDIR)/$(BIN)/cluster/ $(addprefix k8s.io/kubernetes/cmd/,$(CLUSTER_CMDS))

# The e2e tier (privileged, issue #23): Kubernetes' own e2e suite (e2e.test,
# run by ginkgo) against the cluster tier's cluster, here of two nodes, with
# the suite's images built offline (agnhost and nnp from the kubernetes
# module, the rest from Debian packages) and served by its loopback
# registry. SIG Node's Conformance specs and the NodeConformance ones, less
# those in test/cluster/conformance-skips.txt (each with its reason), on
# E2E_PROCS ginkgo processes, a failed spec run twice at most (flaky if it
# passes then); it prints what ran, passed, failed and was skipped, the
# time, and where the reports (JUnit, ginkgo's JSON, the output) are kept
# (BERTH_E2E_REPORT, else /tmp/berth-e2e-TIME). test-e2e leaves
# out the Serial, Slow, Flaky and Disruptive specs; test-conformance runs them
# too, the Serial ones one at a time after the others.
#
# deps-e2e installs the Debian packages the e2e images are built of.
E2E_IMAGE_DEBS := bash-static netcat-openbsd curl nginx-light hostname util-linux
deps-e2e:
	test/deps.sh $(E2E_IMAGE_DEBS)

# E2E_PROCS: the ginkgo processes of the parallel pass. The specs mostly
# wait on timers (probes watched for minutes, restart back-offs): the 276 of
# make test-e2e take 125 minutes of spec time, 33 minutes on 4 processes and
# 10 on 16. The 16 longest (4 to 5 minutes each) run beside it in a pass of
# their own, one process each, so that none starts late (test/cluster/README.md).
E2E_PROCS ?= 16
E2E_GO = cd test/cluster && BERTH_CONFORMANCE=$(1) BERTH_E2E_PROCS=$(E2E_PROCS) BERTH_CLUSTER=1 BERTH_BIN_DIR=$(CURDIR)/$(BIN) \
	CLUSTER_BIN_DIR=$(CURDIR)/$(BIN)/cluster BERTH_E2E_REPORT=$(CURDIR)/$(BIN)/e2e-report \
	$(GO) test -count=1 -v -timeout $(2) -run '^TestConformance$$' .
test-e2e: deps deps-e2e build e2e-bins
	rm -rf $(BIN)/e2e-report
	$(call E2E_GO,1,150m)

test-conformance: deps deps-e2e build e2e-bins
	rm -rf $(BIN)/e2e-report
	$(call E2E_GO,full,300m)

# e2e.test is a test binary of the kubernetes module (test/cluster/e2etools.go
# keeps its requirements in go.mod); ginkgo, agnhost and nnp are tools of
# test/cluster's go.mod, built with cgo as the cluster's binaries are, so
# that they compile from the packages those left in the build cache.
E2E_TOOLS := $(addprefix $(BIN)/cluster/,ginkgo agnhost nonewprivs)
$(BIN)/cluster/e2e.test: test/cluster/go.mod test/cluster/go.sum
	cd test/cluster && $(GO) test -c -vet=off -trimpath -ldflags '-s -w -X k8s.io/component-base/version.gitVersion=$(CLUSTER_K8S_VERSION)' \
		-o $(CURDIR)/$@ k8s.io/kubernetes/test/e2e
$(E2E_TOOLS) &: test/cluster/go.mod test/cluster/go.sum
	cd test/cluster && $(GO) build -trimpath -ldflags '-s -w' -o $(CURDIR)/$(BIN)/cluster/ \
		github.com/onsi/ginkgo/v2/ginkgo k8s.io/kubernetes/test/images/agnhost k8s.io/kubernetes/test/images/nonewprivs

# k8s-bins: every Kubernetes and etcd binary the kubelet, cluster and e2e
# tiers run; kubelet-bins, cluster-bins and e2e-bins: each tier's.
k8s-bins: kubelet-bins cluster-bins e2e-bins
kubelet-bins: $(BIN)/kubelet
cluster-bins: $(CLUSTER_BINS) $(BIN)/cluster/etcd
e2e-bins: cluster-bins $(BIN)/cluster/e2e.test $(E2E_TOOLS)

$(BIN)/cluster/etcd: test/cluster/etcd/go.mod test/cluster/etcd/go.sum
	cd test/cluster/etcd && $(GO) build -trimpath -ldflags '-s -w' -o $(CURDIR)/$(BIN)/cluster/etcd go.etcd.io/etcd/server/v3

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(BERTH_GO) vet ./...
	$(BERTH_GO) run $(STATICCHECK) ./...

run: build
	$(BIN)/berthd

# bench prints the numbers issues ask for; it asserts nothing.
bench: deps
	BERTH_BENCH=1 $(GO) test -count=1 -timeout 30m -v ./test/bench/ | grep -E '^(pull|exec|pod|teardown|rss|memory|network|step|scale|--- FAIL|ok|FAIL)'

# bench-compare runs berth's workload and the same against Debian's containerd
# 1.6 (runc, CNI bridge + portmap), installed for this target only, and prints
# both medians and the ratio per measure; it asserts nothing. Its rows at 250
# pods make it long (half an hour on a quiet 2-core machine), its probe rows
# (issue #36) about 5 minutes a counted round more; BERTH_BENCH_ROUNDS=1 and
# BERTH_BENCH_ROWS=pods (or pull, or probes) shorten it. Its lazy rows (issue
# #40, BERTH_BENCH_ROWS=lazy) pull a 2 GB eStargz image built once into
# ~/.cache/berth-bench (BERTH_BENCH_LAZY_MB sets a smaller size), with berth
# and with containerd + the stargz snapshotter (/dev/fuse), whose
# containerd-stargz-grpc the test builds from test/stargz (minutes the first
# time, Go's build cache after; BERTH_STARGZ_BIN names a built one).
bench-compare: deps
	test/deps.sh containerd runc
	BERTH_BENCH=1 BERTH_BENCH_COMPARE=1 $(GO) test -count=1 -timeout 90m -v -run '^(TestCompareContainerd|TestCompareLazy)$$' ./test/bench/ | grep -E '^(compare|--- FAIL|ok|FAIL|\s+\S+_test.go)'

install: build
	install -d $(PREFIX)/bin /etc/berth
	install -m 0755 $(BIN)/berthd $(BIN)/berthctl $(BIN)/berth-shim $(BIN)/berth-shim-helper $(BIN)/berth-pause $(BIN)/berth-exec-init $(PREFIX)/bin/
	if [ -d /run/systemd/system ]; then install -m 0644 cmd/berthd/berthd.service /etc/systemd/system/ && systemctl daemon-reload; fi

# start runs the installed berthd on its defaults: under systemd when the
# machine runs it, else in the background with its log in /var/log/berthd.log.
start:
	if [ -d /run/systemd/system ]; then systemctl enable --now berthd; \
	else nohup $(PREFIX)/bin/berthd >>/var/log/berthd.log 2>&1 & \
	  for i in $$(seq 50); do [ -S /run/berth/berth.sock ] && break; sleep 0.1; done; \
	  [ -S /run/berth/berth.sock ] && echo "berthd is serving on /run/berth/berth.sock (log: /var/log/berthd.log)"; fi

# deps-vm installs what the VM tier needs (qemu-system-x86, busybox-static,
# cpio, e2fsprogs), only when missing, and unpacks Debian's kernel (never
# installed: the host's boot is left alone) into /var/cache/berth-vm.
deps-vm:
	test/vm/deps.sh

# test-vm: the privileged tests (cgroups, sandbox/shim, test/integration) in
# a qemu VM (TCG) on Debian's kernel with cgroup v2 unified; see test/vm/run.sh
# for its knobs (BERTH_VM_RUN filters the integration suite). Two boots: with
# busybox as init (the cgroupfs driver, the whole suite), then with Debian's
# systemd as PID 1 (test-vm-systemd: the systemd driver's tests).
# test-vm is both boots, one after the other; make test runs them as tiers of
# their own (test/tiers.sh).
test-vm: test-vm-busybox test-vm-systemd

test-vm-busybox: deps-vm
	GO=$(GO) test/vm/run.sh

test-vm-systemd: deps-vm
	GO=$(GO) BERTH_VM_INIT=systemd BERTH_VM_OUT=$(CURDIR)/$(BIN)/vm-systemd test/vm/run.sh

# test-vm-critest: cri-tools' validation suite (critest, the version
# test/critest/tool pins) against berthd in the VM under systemd, cgroup v2,
# AppArmor; it prints critest's counts. Not in make test: see
# test/critest's package comment for its time under TCG.
test-vm-critest: deps-vm
	GO=$(GO) BERTH_VM_INIT=systemd BERTH_VM_TESTS=critest BERTH_VM_TIMEOUT=2700 BERTH_VM_OUT=$(CURDIR)/$(BIN)/vm-critest test/vm/run.sh

clean:
	rm -rf $(BIN)
