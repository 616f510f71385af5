package main

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/berth-runtime/berth/cri/daemonlog"
	"github.com/berth-runtime/berth/image/gunzip"
	"github.com/berth-runtime/berth/image/lazyd"
)

// lazyServeMode is the argument that makes berthd the lazy layer server
// (image/lazyd), which berthd starts and which outlives it. A mode of
// berthd rather than a binary of its own: the two ends of its socket are
// then always of one build, and a node installs nothing more for lazy
// pulls. The process only maps the parts of the binary it runs.
const lazyServeMode = "lazy-serve"

// lazyServeCommand is berthd's command that starts the server.
func lazyServeCommand() ([]string, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return []string{self, lazyServeMode}, nil
}

// lazyServe runs the lazy layer server until berthd asks it to exit with
// no layer left (the last lazy image removed). SIGTERM, SIGINT and SIGHUP
// are ignored: the layers are the containers' root filesystems; SIGKILL
// ends it, leaving its mounts to the next berthd to detach.
func lazyServe(args []string) int {
	cfg, err := lazyd.ParseServeConfig(args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "berthd %s: %v\n", lazyServeMode, err)
		return 2
	}
	// berthd started it with its stdout and stderr on this file already;
	// from here on it is bounded (daemonlog).
	logw, err := daemonlog.Open(filepath.Join(cfg.Dir, lazyd.LogFile), lazyd.LogMaxBytes, daemonlog.Stdio)
	if err != nil {
		fmt.Fprintf(os.Stderr, "berthd %s: %v\n", lazyServeMode, err)
		return 1
	}
	log := slog.New(slog.NewTextHandler(logw, nil)).With("component", "lazyd")
	dec, err := gunzip.Choose(cfg.GzipDecoder)
	if err != nil {
		log.Error("lazy layer server", "err", err)
		return 1
	}
	signal.Ignore(syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	err = lazyd.Serve(lazyd.ServeOptions{Dir: cfg.Dir, Fetches: cfg.Fetches, FetchQuiet: cfg.FetchQuiet, Inflate: dec.NewReader, Log: log}, lazyd.Ready)
	if err != nil {
		log.Error("lazy layer server", "err", err)
		return 1
	}
	return 0
}
