// Package lazyd is the process boundary of lazy layers: the server that
// serves them (FUSE mounts, on-demand and background fetches, the whole
// blob's verification; the layer logic is image/lazy's) in a process of
// its own, which outlives berthd as the pods' shims do, and berthd's
// client of it. A stopped or killed berthd leaves the layers served: the
// containers on them keep reading, chunks not fetched yet included (the
// server holds the pull's registry source, credentials included, in
// memory only), and the background fetch goes on. The next berthd finds
// the server by its socket and carries on with it.
//
// The protocol is net/rpc (gob) over a unix socket that only root can
// reach (its folder is 0700). The server outlives berthd, an upgraded one
// included, so its two ends may be two builds: gob passes over the fields
// one end lacks without a word, so Status carries the server's
// ProtocolVersion, and berthd uses a server of another version only for
// the layers it already serves (image's runningLazyServer).
package lazyd

import (
	"errors"
	"flag"
	"strconv"
	"time"

	"github.com/berth-runtime/berth/image/registry"
)

// Files in the server's folder (under berthd's state folder: a node
// reboot, which ends the server, empties it).
const (
	SocketFile = "lazyd.sock"
	PIDFile    = "lazyd.pid"
	LogFile    = "lazyd.log"
)

// LogMaxBytes bounds the server's log (LogFile), rotated to LogFile.1 at
// this size (cri/daemonlog): a line a layer served or stopped, and one a
// failure, which a node that reads a broken layer for long repeats.
const LogMaxBytes = 10 << 20

// service is the name the server registers its methods under.
const service = "Lazy"

// ProtocolVersion is this build's protocol: raise it with any change to
// the calls or their arguments and replies that the other end would
// misread. A server from before it was counted answers 0; version 2 added
// Demand and EndDemand.
const ProtocolVersion = 2

// ProtocolVersionEnv names the ProtocolVersion the server's Status gives
// instead of this build's, read only by a tests' build (the crashpoints
// tag, version_crashpoints.go): a test plays a server that a berthd of
// another version left.
const ProtocolVersionEnv = "BERTH_LAZYD_PROTOCOL_VERSION"

// MountArgs hand a prepared layer (lazy.Prepare) to the server.
type MountArgs struct {
	Key   string // the snapshot key, by which berthd names the layer
	Dir   string // the layer's folder: TOC and cache
	FSDir string // where it is mounted
	// Source fetches the chunks not cached; nil: a complete layer, served
	// from its cache alone.
	Source       *registry.BlobSource
	StallTimeout time.Duration
}

// DemandArgs open a pull's demand on the server (its fetch of a layer's
// prioritised files, which the background fetches wait for), or extend
// it: it lasts For from now unless renewed, so that a berthd that dies
// mid-pull holds the background fetches For at most.
type DemandArgs struct {
	ID    string // the caller's name for it, unique
	For   time.Duration
	Renew bool // extend the open demand ID only
}

// StatusArgs ask for the server's status; with Wait, once its event count
// has passed After (a layer broke), or after waitBound.
type StatusArgs struct {
	Wait  bool
	After uint64
}

// ServeConfig is how berthd starts the server (its command line).
type ServeConfig struct {
	Dir         string        // the folder of its socket, pid and log files
	Fetches     int           // background requests of all layers together at a time
	FetchQuiet  time.Duration // their hold after on-demand fetches (lazy.Fetches)
	GzipDecoder string        // gunzip's mode for the blob verification
}

// Args are c as the server's command line flags (ParseServeConfig).
func (c ServeConfig) Args() []string {
	return []string{"--dir", c.Dir, "--fetches", strconv.Itoa(c.Fetches), "--fetch-quiet", c.FetchQuiet.String(), "--gzip-decoder", c.GzipDecoder}
}

// ParseServeConfig reads the server's command line flags (Args).
func ParseServeConfig(args []string) (ServeConfig, error) {
	fl := flag.NewFlagSet("lazy-serve", flag.ContinueOnError)
	var c ServeConfig
	fl.StringVar(&c.Dir, "dir", "", "folder of the server's socket")
	fl.IntVar(&c.Fetches, "fetches", 4, "background requests at a time, all layers together")
	fl.DurationVar(&c.FetchQuiet, "fetch-quiet", 0, "hold of the background requests after on-demand fetches")
	fl.StringVar(&c.GzipDecoder, "gzip-decoder", "", "gzip decoder of the blob verification")
	if err := fl.Parse(args); err != nil {
		return c, err
	}
	if c.Dir == "" {
		return c, errors.New("--dir is required")
	}
	return c, nil
}

// Status is what the server serves and what it counted since it started.
type Status struct {
	Version              int    // the server's ProtocolVersion
	Events               uint64 // layers that failed their verification, a count that only grows
	Layers               map[string]LayerStatus
	Demands              int    // pulls' demands open now (DemandArgs)
	ReadFailures         uint64 // reads that failed with EIO
	VerificationFailures uint64 // layers that failed their verification
}

// LayerStatus is one served layer's.
type LayerStatus struct {
	DiskBytes int64 // its cache so far
	FullSize  int64 // its cache once complete
	Complete  bool
	Broken    string // why it failed its verification; empty: it did not
	FSDir     string // where it is mounted
}

// ChunkReply names a cached chunk.
type ChunkReply struct {
	Path  string
	Found bool
}

// Empty is the argument or reply of a call that has none.
type Empty struct{}
