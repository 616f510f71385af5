package sandbox

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/berth-runtime/berth/network"
	"github.com/berth-runtime/berth/sandbox/apparmor"
	"github.com/berth-runtime/berth/sandbox/cdi"
	"github.com/berth-runtime/berth/sandbox/nri"
	"github.com/berth-runtime/berth/sandbox/podns"
	"github.com/berth-runtime/berth/sandbox/shim"
	"github.com/berth-runtime/berth/sandbox/spec"
	"github.com/berth-runtime/berth/sandbox/stats"
	"github.com/berth-runtime/berth/sandbox/store"
	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"
)

// Options configure the sandbox manager.
type Options struct {
	Root string // persistent: the records, features probe, apparmor
	// ContainerRoot holds the writable layers,
	// ContainerRoot/containers/<id>/{upper,work}; empty: Root.
	ContainerRoot string
	State         string // volatile: State/pods/<id>/…
	DB            *bolt.DB
	Images        Images
	Cgroups       Cgroups
	Network       network.PodNetwork
	ShimBinary    string
	// StartShim starts a pod's shim; nil: shim.Start with ShimBinary.
	StartShim ShimStarter
	// PauseBinary is the static berth-pause, PID 1 of shared-PID pods.
	PauseBinary string
	Logger      *slog.Logger
	// Metrics takes the start phase, recovery and state series; nil: none.
	Metrics prometheus.Registerer
	// CDI resolves containers' CDI devices; nil: none can be had.
	CDI *cdi.Registry
	// CRIUConfig is the file of the CRIU configuration every checkpoint
	// takes, read at each ([checkpoint] criu_config); "": none.
	CRIUConfig string
	// NRI hosts the node's NRI plugins, started with the manager; nil: off.
	NRI *nri.Host
	// HostPathTimeout bounds each look at a volume's or device's host
	// path (spec.SetHostPathTimeout); 0: spec's default.
	HostPathTimeout time.Duration
}

// Manager runs pod sandboxes and their containers.
type Manager struct {
	opts Options
	log  *slog.Logger

	pods keyedLocks // per pod: every pod and container operation

	// names serializes the check-then-reserve of pod and container names.
	names sync.Mutex

	mu    sync.Mutex
	shims map[string]*shim.Client // by pod ID

	store *store.Store     // the records of pods and containers, and their live state
	stats *stats.Collector // what they use

	features KernelFeatures
	apparmor *apparmor.Host
	metrics  *stats.Metrics // nil: no metrics
	criu     criuProbe      // whether CheckpointContainer can work here

	// nriStops holds, by container ID, a channel closed once NRI plugins
	// were told the container stopped (see tellNRIStopped).
	nriStops sync.Map
}

// New opens the manager and reconnects to the shims of the pods it had.
func New(opts Options) (*Manager, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.StartShim == nil {
		opts.StartShim = func(ctx context.Context, podDir string) (*shim.Client, error) {
			return shim.Start(ctx, opts.ShimBinary, podDir)
		}
	}
	if opts.ContainerRoot == "" {
		opts.ContainerRoot = opts.Root
	}
	if opts.HostPathTimeout > 0 {
		spec.SetHostPathTimeout(opts.HostPathTimeout)
	}
	m := &Manager{opts: opts, log: opts.Logger, shims: map[string]*shim.Client{},
		apparmor: apparmor.Setup(filepath.Join(opts.Root, "apparmor"), opts.Logger)}
	var err error
	if m.store, err = store.Open(opts.DB); err != nil {
		return nil, err
	}
	for _, r := range m.layerRoots() {
		if err := privateDir(filepath.Join(r, "containers")); err != nil {
			return nil, err
		}
	}
	if m.stats, err = m.newStats(); err != nil {
		return nil, err
	}
	// Only pod folders below, each private (podDirFor): the init of a
	// container in a user namespace traverses this one to its own.
	if err := os.MkdirAll(m.podsDir(), 0o711); err != nil {
		return nil, err
	}
	if err := os.Chmod(m.podsDir(), 0o711); err != nil {
		return nil, err
	}
	m.features = probeKernelFeatures(opts.Root, opts.Logger)
	m.metrics = stats.NewMetrics(opts.Metrics, m.store, m.shimUsage, opts.Logger)
	if err := m.recover(); err != nil {
		return nil, err
	}
	// After recovery: a plugin's first snapshot has every pod and container.
	if err := opts.NRI.Start(nriRuntime{m}); err != nil {
		return nil, err
	}
	go m.stats.Run()
	return m, nil
}

// newStats is the stats collector of the manager's records and cgroups,
// told where writable layers are.
func (m *Manager) newStats() (*stats.Collector, error) {
	return stats.New(stats.Options{Store: m.store, Cgroups: m.opts.Cgroups,
		UpperDir: func(c *store.Container) string { return m.layout(c, nil).Upper }, LayerRoot: m.layerRoot,
		LayerRoots: m.layerRoots(), ContainerRoot: m.opts.ContainerRoot, Logger: m.log})
}

// Stats answers the stats calls of the manager's pods and containers.
func (m *Manager) Stats() *stats.Collector { return m.stats }

func (m *Manager) podsDir() string              { return filepath.Join(m.opts.State, "pods") }
func (m *Manager) podDir(id string) string      { return filepath.Join(m.podsDir(), id) }
func (m *Manager) nsDir(id string) string       { return filepath.Join(m.podDir(id), "ns") }
func (m *Manager) bundleDir(p, c string) string { return filepath.Join(m.podDir(p), "containers", c) }

// layerDir is the folder of c's writable layer: under the container root
// it was made in, recorded with it (a later container_root does not move
// it), or under Root for records from before the container root.
func (m *Manager) layerDir(c *store.Container) string {
	return filepath.Join(m.layerRoot(c), "containers", c.ID)
}

// layerRoot is the root c's writable layer is under (see layerDir).
func (m *Manager) layerRoot(c *store.Container) string { return cmp.Or(c.LayerRoot, m.opts.Root) }

// layerRoots are the roots writable layers may lie under: the container
// root, and Root, where older containers have theirs.
func (m *Manager) layerRoots() []string {
	if m.opts.ContainerRoot == m.opts.Root {
		return []string{m.opts.Root}
	}
	return []string{m.opts.ContainerRoot, m.opts.Root}
}

// privateDir makes dir (and its missing parents) and sets its mode to 0700,
// also when it already existed with a wider one: folders holding files a
// container wrote must not be reachable by host users, or a setuid binary
// written by root in a container is a root shell for anyone on the node
// (the upperdir path is public in /proc/self/mountinfo).
func privateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.Chmod(dir, 0o700)
}

// openToPodRoot lets the root of pod's user namespace, if it has one,
// traverse dir: 0710 with the group of the root's host GID, as containerd
// does for bundles. The init of its containers reaches the rootfs and pod
// files through dir, and has no say over host root's folders.
func openToPodRoot(dir string, pod *store.Pod) error {
	u := namespaceOptions(pod.Config).GetUsernsOptions()
	if pod.Pins[string(podns.User)] == "" {
		return nil
	}
	if err := os.Lchown(dir, -1, int(u.Gids[0].HostId)); err != nil {
		return err
	}
	return os.Chmod(dir, 0o710)
}

// newID returns a 64-hex-digit ID, the form CRI clients show truncated.
func newID() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return hex.EncodeToString(b)
}
