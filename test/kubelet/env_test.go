package kubelet

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/kubeenv"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// guardEnv must be "1" (and the test run as root) for the tier to run.
const guardEnv = "BERTH_KUBELET"

// nodeName is the kubelet's --hostname-override: static pods are named
// "<manifest name>-<node name>".
const nodeName = "berth-e2e"

// env is one run of the tier: a loopback registry, berthd and a standalone
// kubelet on folders of their own under work.
type env struct {
	t    *testing.T
	work *kubeenv.Work // everything the run creates on disk lives below

	berthBin   string // folder with berthd, berth-shim, berth-pause, berthctl (make build)
	kubeletBin string // the kubelet (make test-kubelet builds bin/kubelet)
	configFile string // the KubeletConfiguration kept in the repository
	// kubeletExtra is added to the run's KubeletConfiguration drop-in.
	kubeletExtra string
	// prepareBerthd, when set, readies berthd before it starts (a test
	// mounts a filesystem of its own on its root, or adds to its
	// configuration); the func it returns undoes that once berthd and the
	// kubelet are gone.
	prepareBerthd func(b *kubeenv.Berthd) (undo func())
	undoBerthd    func()

	reg     *kubeenv.Registry
	image   string // 127.0.0.1:PORT/berth/busybox:e2e
	imageID string // its config digest
	subnet  string
	berthd  *kubeenv.Berthd
	conn    *grpc.ClientConn
	rt      runtimeapi.RuntimeServiceClient
	img     runtimeapi.ImageServiceClient

	host        *kubeenv.Host
	kubelet     *kubeenv.Proc
	kubeletRoot string
	manifests   string           // staticPodPath
	podLogs     string           // podLogsDir
	cgroups     *kubeenv.Cgroups // the kubelet's cgroupRoot, "/berth-kubelet-PID"
	port        int              // the kubelet's API (HTTPS): exec, attach, port-forward
	readOnly    int              // readOnlyPort: /pods
	healthz     int              // healthzPort: /healthz
}

func requireTier(t *testing.T) { kubeenv.Require(t, guardEnv, "test-kubelet") }

// newEnv checks the binaries, then starts the registry, berthd and a
// kubelet on it; kubeletExtra is added to the kubelet's configuration (YAML
// keys of a KubeletConfiguration). Everything is stopped and removed by
// cleanups registered here.
func newEnv(t *testing.T, kubeletExtra string) *env {
	t.Helper()
	return newEnvWith(t, kubeletExtra, nil)
}

// newEnvWith is newEnv with prepareBerthd run on berthd before it starts
// (nil: nothing to do).
func newEnvWith(t *testing.T, kubeletExtra string, prepareBerthd func(b *kubeenv.Berthd) (undo func())) *env {
	t.Helper()
	repo := kubeenv.RepoRoot(t)
	e := &env{t: t, kubeletExtra: kubeletExtra, prepareBerthd: prepareBerthd,
		berthBin:   kubeenv.EnvOr("BERTH_BIN_DIR", filepath.Join(repo, "bin")),
		kubeletBin: kubeenv.EnvOr("KUBELET", filepath.Join(repo, "bin", "kubelet")),
		configFile: filepath.Join(repo, "test", "kubelet", "kubelet-config.yaml"),
	}
	kubeenv.NeedFiles(t, "`make test-kubelet` (or set BERTH_BIN_DIR / KUBELET)", filepath.Join(e.berthBin, "berthd"),
		filepath.Join(e.berthBin, "berth-shim"), filepath.Join(e.berthBin, "berth-pause"), e.kubeletBin)
	e.work = kubeenv.NewWork(t, "bk-", "BERTH_KUBELET_LOGS")
	// Cleanups run last first: the kubelet takes its pods down through
	// berth, berth removes what is left, then cgroups and folders go.
	t.Cleanup(func() {
		if e.undoBerthd != nil {
			e.undoBerthd()
		}
		e.work.Remove(t, e.kubeletRoot, e.berthd.PodsFolder())
	})
	t.Cleanup(func() { e.cgroups.Remove(t) })
	t.Cleanup(e.teardownBerth)
	t.Cleanup(e.teardownKubelet)

	e.reg = kubeenv.NewRegistry(t)
	e.image, e.imageID = e.reg.PushBusybox(t, "berth/busybox:e2e")

	e.startBerthd()
	e.startKubelet()
	return e
}

func (e *env) path(elem ...string) string { return e.work.Path(elem...) }

// ---- berthd ----

func (e *env) startBerthd() {
	t := e.t
	t.Helper()
	// A bridge, nftables table and subnet of this run's own.
	e.subnet = fmt.Sprintf("10.199.%d.0/24", os.Getpid()%256)
	e.berthd = kubeenv.NewBerthd(t, e.work, e.berthBin, fmt.Sprintf("bk%d", os.Getpid()%100000), e.subnet, e.reg.Host)
	if e.prepareBerthd != nil {
		e.undoBerthd = e.prepareBerthd(e.berthd)
	}
	e.launchBerthd()
	conn, err := grpc.NewClient("unix://"+e.berthd.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	e.conn = conn
	e.rt = runtimeapi.NewRuntimeServiceClient(conn)
	e.img = runtimeapi.NewImageServiceClient(conn)
}

// launchBerthd starts berthd and waits until its socket answers Version.
func (e *env) launchBerthd() {
	e.berthd.Launch(e.t, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := e.versionOnce(ctx)
		return err
	})
}

// versionOnce asks Version on a connection of its own (the shared client may
// be in reconnect back-off right after a restart).
func (e *env) versionOnce(ctx context.Context) (*runtimeapi.VersionResponse, error) {
	conn, err := grpc.NewClient("unix://"+e.berthd.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return runtimeapi.NewRuntimeServiceClient(conn).Version(ctx, &runtimeapi.VersionRequest{})
}

// teardownBerth removes the pods berth still holds (after the kubelet
// stopped), then stops berthd and removes its bridge and nftables table.
func (e *env) teardownBerth() {
	t := e.t
	if e.berthd == nil || e.berthd.Proc == nil {
		return
	}
	if e.berthd.Running() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		if pods, err := e.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{}); err == nil {
			for _, p := range pods.Items {
				if _, err := e.rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.Id}); err != nil {
					t.Errorf("teardown: remove pod %s (%s): %v", p.Id, p.Metadata.GetName(), err)
				}
			}
		} else {
			t.Errorf("teardown: list pods: %v", err)
		}
		cancel()
	}
	e.berthd.Teardown(t)
	if e.conn != nil {
		e.conn.Close()
	}
}

// ---- kubelet ----

func (e *env) startKubelet() {
	t := e.t
	t.Helper()
	e.kubeletRoot, e.manifests, e.podLogs = e.path("kubelet"), e.path("manifests"), e.path("pod-logs")
	dropins := e.path("kubelet.conf.d")
	kubeenv.Mkdirs(t, e.kubeletRoot, e.manifests, e.podLogs, dropins, e.path("tmp"))
	e.host = kubeenv.RecordHost(t, kubeenv.KubeletSysctls)
	e.cgroups = kubeenv.MakeCgroupRoot(t, fmt.Sprintf("/berth-kubelet-%d", os.Getpid()))

	resolv := e.path("resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver 192.0.2.53\nsearch berth-e2e.test\noptions ndots:2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.port, e.readOnly, e.healthz = kubeenv.FreePort(t), kubeenv.FreePort(t), kubeenv.FreePort(t)
	// What differs per run goes into a drop-in; the repository's file holds
	// everything a host like this needs.
	dropin := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: %s
podLogsDir: %s
volumePluginDir: %s
cgroupRoot: %s
resolvConf: %s
address: 127.0.0.1
port: %d
readOnlyPort: %d
healthzBindAddress: 127.0.0.1
healthzPort: %d
`, e.manifests, e.podLogs, e.path("volume-plugins"), e.cgroups.Root, resolv, e.port, e.readOnly, e.healthz) + e.kubeletExtra
	if err := os.WriteFile(filepath.Join(dropins, "50-run.conf"), []byte(dropin), 0o644); err != nil {
		t.Fatal(err)
	}

	e.kubelet = kubeenv.Start(t, "kubelet", e.path("kubelet.log"), e.kubeletBin,
		"--config", e.configFile,
		"--config-dir", dropins,
		"--root-dir", e.kubeletRoot,
		"--cert-dir", filepath.Join(e.kubeletRoot, "pki"),
		"--container-runtime-endpoint", "unix://"+e.berthd.Socket,
		"--hostname-override", nodeName,
		"--v", "2")
	e.kubelet.WaitUp(t, 90*time.Second, func() error { return kubeenv.Healthz(e.healthz) })
}

// teardownKubelet removes every static pod and lets the kubelet take them
// down (so berth removes them the way a node does), stops the kubelet by
// its PID, then removes what it made: cgroups, mounts, folders, and the
// sysctls it changed are set back.
func (e *env) teardownKubelet() {
	t := e.t
	if e.kubelet != nil && e.kubelet.Running() {
		ents, _ := os.ReadDir(e.manifests)
		for _, ent := range ents {
			os.Remove(filepath.Join(e.manifests, ent.Name()))
		}
		if len(ents) > 0 {
			// The kubelet stops pods at once, but only its container GC
			// (every minute) removes their sandboxes.
			deadline := time.Now().Add(2 * time.Minute)
			for time.Now().Before(deadline) {
				if n, err := e.berthPodCount(); err == nil && n == 0 {
					break
				}
				time.Sleep(time.Second)
			}
		}
		if !e.kubelet.Stop(syscall.SIGTERM, 30*time.Second) {
			t.Errorf("kubelet did not stop within 30s of SIGTERM (killed)")
		}
	}
	if e.kubelet != nil && t.Failed() {
		t.Logf("kubelet log (last 150 lines of %s):\n%s", e.kubelet.Log, e.kubelet.Tail(150))
	}
	e.host.Restore(t, e.work.Dir)
}

func (e *env) berthPodCount() (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := e.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return 0, err
	}
	return len(r.Items), nil
}
