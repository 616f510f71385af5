// Command berthd is berth's node daemon: it serves the Kubernetes CRI on a unix
// socket. This file only wires the packages together; see docs/architecture.md.
package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/berth-runtime/berth/cgroups"
	"github.com/berth-runtime/berth/cmd/berthd/config"
	"github.com/berth-runtime/berth/cri"
	"github.com/berth-runtime/berth/image"
	"github.com/berth-runtime/berth/network"
	"github.com/berth-runtime/berth/network/cni"
	"github.com/berth-runtime/berth/sandbox"
	"github.com/berth-runtime/berth/sandbox/cdi"
	"github.com/berth-runtime/berth/sandbox/nri"
	"github.com/berth-runtime/berth/sandbox/shim"
)

// stopTimeout bounds the graceful stop: long-lived streams never end by themselves.
const stopTimeout = 10 * time.Second

func main() {
	if len(os.Args) > 1 && os.Args[1] == lazyServeMode {
		os.Exit(lazyServe(os.Args[2:]))
	}
	cfg, err := config.FromArgs(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "berthd: %v\n", err)
		os.Exit(2)
	}
	log := newLogger(cfg)
	if err := run(cfg, log); err != nil {
		log.Error("berthd failed", "err", err)
		os.Exit(1)
	}
}

func newLogger(cfg *config.Config) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.SlogLevel()}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}

func run(cfg *config.Config, log *slog.Logger) error {
	// Root and State 0711 as containerd does: nobody else needs to list
	// them, and the folders below them that hold container-written files
	// are 0700 (the sandbox manager sees to those; a pod in a user namespace
	// opens its own to its root group). The init of such a pod's container
	// must traverse State to its bundle. The modes are set on every start,
	// so an older or hand-made tree gets them too.
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{{cfg.Root, 0o711}, {cfg.State, 0o711}} {
		if err := os.MkdirAll(d.path, d.mode); err != nil {
			return err
		}
		if err := os.Chmod(d.path, d.mode); err != nil {
			return err
		}
	}

	dbPath := filepath.Join(cfg.Root, "meta.db")
	db, err := bolt.Open(dbPath, 0o600, &bolt.Options{Timeout: time.Second})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return fmt.Errorf("%s is locked: another berthd is using root %s", dbPath, cfg.Root)
	}
	if err != nil {
		return fmt.Errorf("open %s: %w", dbPath, err)
	}
	defer db.Close()

	metrics, err := newMetricsEndpoint(cfg.Metrics.Address)
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	defer metrics.close()
	stopTracing, err := setupTracing(cfg.Tracing, log)
	if err != nil {
		return fmt.Errorf("tracing: %w", err)
	}
	defer stopTracing()

	lazyServer, err := lazyServeCommand()
	if err != nil {
		return err
	}
	images, err := image.New(image.Options{
		Root:                   cfg.Root,
		DB:                     db,
		Registries:             cfg.Registries,
		ProgressTimeout:        cfg.Image.PullProgressTimeout.Duration,
		MaxLayerBytes:          cfg.Image.MaxLayerBytes,
		MaxLayerEntries:        cfg.Image.MaxLayerEntries,
		MaxConcurrentDownloads: cfg.Image.DownloadBound(),
		GzipDecoder:            cfg.Image.GzipDecoder,
		Lazy:                   cfg.Image.Lazy,
		LazyFetches:            cfg.Image.LazyFetchBound(),
		LazyFetchQuiet:         cfg.Image.LazyFetchQuiet.Duration,
		LazyCacheMaxBytes:      cfg.Image.LazyCacheBound(),
		LazyServer:             lazyServer,
		LazyDir:                filepath.Join(cfg.State, "lazyd"),
		Logger:                 log.With("component", "image"),
		Metrics:                metrics.Registerer(),
	})
	if err != nil {
		return fmt.Errorf("image service: %w", err)
	}
	defer images.Close() // before db.Close: stops the background collector, flushes the layers

	cg, err := cgroups.New(cgroups.Driver(cfg.CgroupDriver))
	if err != nil {
		return fmt.Errorf("cgroups: %w", err)
	}
	shimBinary, err := findShim(cfg.ShimBinary)
	if err != nil {
		return err
	}
	pauseBinary, err := findPause(shimBinary)
	if err != nil {
		return err
	}
	podNet, err := newPodNetwork(cfg, log.With("component", "network"))
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	cdiRegistry := cdi.New(cfg.CDI.SpecDirs)
	nriHost, err := newNRI(cfg.NRI, cdiRegistry, cg, log.With("component", "nri"), metrics.Registerer())
	if err != nil {
		return err
	}
	pods, err := sandbox.New(sandbox.Options{
		Root: cfg.Root, ContainerRoot: cfg.ContainerRoot(), State: cfg.State, DB: db, Images: images, Cgroups: cg, Network: podNet,
		ShimBinary: shimBinary, PauseBinary: pauseBinary, Logger: log.With("component", "sandbox"), Metrics: metrics.Registerer(),
		CDI: cdiRegistry, CRIUConfig: cfg.Checkpoint.CRIUConfig, NRI: nriHost, HostPathTimeout: cfg.HostPathTimeout.Duration,
	})
	if err != nil {
		return fmt.Errorf("sandbox manager: %w", err)
	}
	defer nriHost.Stop() // the plugins berthd started go with it

	streams, err := cri.NewStreamServer(cri.StreamOptions{
		Address: cfg.Stream.Address, Port: cfg.Stream.Port, IdleTimeout: cfg.Stream.IdleTimeout.Duration,
		TLSCert: cfg.Stream.TLSCert, TLSKey: cfg.Stream.TLSKey,
	}, pods)
	if err != nil {
		return err
	}
	defer streams.Shutdown()
	go func() {
		if err := streams.Serve(); err != nil {
			log.Error("stream server failed", "err", err)
		}
	}()

	runtime := cri.NewRuntimeService(cri.Config{
		Root: cfg.Root, ContainerRoot: cfg.ContainerRoot(), State: cfg.State, Socket: cfg.Socket,
		CgroupDriver: cfg.CgroupDriver, Registries: cfg.Registries,
		NetworkMode: cfg.Network.Mode, MetricsAddress: metrics.Addr(), GzipDecoder: images.GzipDecoder(),
		Logger: log.With("component", "cri"),
	}, pods, podNet).WithStreams(streams)
	srv := cri.NewServer(cri.ServerOptions{
		Socket:    cfg.Socket,
		Logger:    log.With("component", "cri"),
		Runtime:   runtime,
		Images:    cri.NewImageService(images, pods.Stats()),
		Extension: cri.NewExtensionServer(images),
		Metrics:   metrics.Registerer(),
	})
	if err := srv.Listen(); err != nil {
		return err
	}

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	served := make(chan error, 1)
	go func() { served <- srv.Serve() }()
	go metrics.serve(log)
	log.Info("berthd serving", "socket", cfg.Socket, "stream", streams.Addr(), "metrics", metrics.Addr(), "version", cri.RuntimeVersion,
		"root", cfg.Root, "container_root", cfg.ContainerRoot(), "state", cfg.State, "network", cfg.Network.Mode, "cgroup_driver", cfg.CgroupDriver, "cgroups", cg.Mode().String())

	for {
		select {
		case sig := <-sigs:
			if sig == syscall.SIGHUP {
				reloadRegistries(cfg, log, images, runtime)
				continue
			}
			log.Info("stopping", "signal", sig.String())
			srv.Shutdown(stopTimeout)
			<-served
			log.Info("stopped")
			return nil
		case err := <-served:
			srv.Shutdown(stopTimeout)
			return fmt.Errorf("serve: %w", err)
		}
	}
}

// reloadRegistries reads the config file (and its config_path folder)
// again and applies its registry settings: pulls from then on use them.
// A file with any problem changes nothing. Other settings need a restart.
func reloadRegistries(cfg *config.Config, log *slog.Logger, images *image.Service, runtime *cri.RuntimeService) {
	next, err := config.Load(cfg.Path, cfg.PathMustExist)
	if err == nil {
		err = images.SetRegistries(next.Registries)
	}
	if err != nil {
		log.Error("SIGHUP: registry settings not reloaded, the old ones stay", "err", err)
		return
	}
	runtime.SetRegistries(next.Registries)
	hosts := make([]string, 0, len(next.Registries))
	for h := range next.Registries {
		hosts = append(hosts, h)
	}
	slices.Sort(hosts)
	log.Info("SIGHUP: registry settings reloaded (other settings take a restart)", "config", cfg.Path, "hosts", hosts)
}

// newPodNetwork builds the network of [network] mode: the built-in bridge,
// set up now, or the CNI plugins. Either reports NetworkReady=false with
// the reason until it can take pods, and tries again at every pod.
func newPodNetwork(cfg *config.Config, log *slog.Logger) (network.PodNetwork, error) {
	if cfg.Network.Mode == config.NetworkCNI {
		cniDir := filepath.Join(cfg.Root, "network", "cni")
		cacheDir := cfg.Network.CNICacheDir
		if cacheDir == "" {
			cacheDir = filepath.Join(cniDir, "cache")
		}
		n, err := cni.New(cni.Config{ConfDir: cfg.Network.CNIConfDir, BinDirs: cfg.Network.CNIBinDirs,
			CacheDir: cacheDir, StateDir: filepath.Join(cniDir, "pods")}, log)
		if err != nil {
			return nil, err
		}
		n.Ready() // logs what it found
		return n, nil
	}
	netCfg := network.DefaultConfig()
	netCfg.Bridge, netCfg.Subnet, netCfg.MTU, netCfg.Masquerade = cfg.Network.Bridge, cfg.Network.Subnet, cfg.Network.MTU, cfg.Network.Masquerade
	netCfg.Subnet6 = cfg.Network.Subnet6
	netCfg.SubnetFixed = cfg.Network.SubnetSet
	netCfg.StateDir = filepath.Join(cfg.Root, "network")
	netCfg.TableName = cfg.Network.Bridge // one network: one bridge, one nftables table
	n, err := network.New(netCfg, log)
	if err != nil {
		return nil, err
	}
	if err := n.Setup(); err != nil {
		log.Warn("pod network is not ready", "err", err)
	}
	return n, nil
}

// findShim returns the configured shim, else the berth-shim installed beside
// berthd: the two are built and shipped together.
func findShim(configured string) (string, error) {
	if configured != "" {
		return configured, nil
	}
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(filepath.Dir(self), "berth-shim")
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("berth-shim not found beside berthd (%w): install it there or set shim_binary", err)
	}
	return bin, nil
}

// findPause returns the berth-pause installed beside the shim: the two are
// built and shipped together. berth-shim-helper, which the shim finds
// beside itself, and berth-exec-init, sealed once here for every shim, are
// checked for here too, so that a node without them fails at start rather
// than at its first pod.
func findPause(shimBinary string) (string, error) {
	helper := filepath.Join(filepath.Dir(shimBinary), shim.HelperBinary)
	if _, err := os.Stat(helper); err != nil {
		return "", fmt.Errorf("%s not found beside berth-shim (%w): install it there", shim.HelperBinary, err)
	}
	if _, err := shim.SealedExecInit(filepath.Join(filepath.Dir(shimBinary), shim.ExecInitBinary)); err != nil {
		return "", fmt.Errorf("%w: install it there", err)
	}
	pause := filepath.Join(filepath.Dir(shimBinary), "berth-pause")
	if _, err := os.Stat(pause); err != nil {
		return "", fmt.Errorf("berth-pause not found beside berth-shim (%w): install it there", err)
	}
	return pause, nil
}

// newNRI is the host of NRI plugins [nri] asks for; nil when it is off.
func newNRI(c config.NRI, cdi nri.CDI, cg nri.Cgroups, log *slog.Logger, reg prometheus.Registerer) (*nri.Host, error) {
	if c.Disable {
		return nil, nil
	}
	h, err := nri.New(nri.Options{SocketPath: c.SocketPath, PluginPath: c.PluginPath, PluginConfigPath: c.PluginConfigPath,
		RegistrationTimeout: c.PluginRegistrationTimeout.Duration, RequestTimeout: c.PluginRequestTimeout.Duration,
		DisableConnections: c.DisableConnections, Version: cri.RuntimeVersion, Logger: log, Metrics: reg, CDI: cdi, Cgroups: cg})
	if err != nil {
		return nil, err
	}
	return h, nil
}
