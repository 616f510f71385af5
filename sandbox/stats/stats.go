// Package stats reads what containers and pods use: their cgroups' figures,
// sampled in the background while someone asks, the size of each writable
// layer, walked in the background, the pod network's counters, and the
// sandbox's Prometheus series. It reads the records from the store and the
// figures from the cgroups package, and changes nothing of a pod.
package stats

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/berth-runtime/berth/cgroups"
	"github.com/berth-runtime/berth/image"
	"github.com/berth-runtime/berth/network"
	"github.com/berth-runtime/berth/sandbox/podns"
	"github.com/berth-runtime/berth/sandbox/store"
	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Usage is what one container or pod uses.
type Usage struct {
	cgroups.Stats
	// CPUNanoCores is the CPU rate over the collector's last period (0
	// until it has two samples).
	CPUNanoCores uint64
	// Writable layer (containers only), and the mount point of the
	// filesystem it is on.
	LayerBytes, LayerInodes uint64
	LayerMountpoint         string
	// Memo is the same for every Usage of one sample of the cgroup, and
	// new with the next: what a caller makes of the figures and keeps
	// there (cri: the stats message) serves every call until then, as long
	// as the writable layer's figures, walked on their own time, are the
	// same.
	Memo *store.Memo
}

// statsPeriod is how often the collector samples the cgroups whose usage
// is asked for: CPU rates are over this period, and figures never older.
const statsPeriod = time.Second

// statsSteps is how many steps the collector takes in a period, each
// reading its share of the cgroups, every cgroup in the same step of each
// period: a full node's cgroups (hundreds) read in one burst would stall
// the calls running beside it for tens of milliseconds.
const statsSteps = 10

// statsInterest is how long after a stats call the collector keeps
// sampling a cgroup: the kubelet asks every 10-15 s, and nobody's cgroup is
// read while nobody asks.
const statsInterest = time.Minute

// usageCache holds the collector's last sample of each cgroup asked for,
// by the ID of its pod or container: a stats call finds it without working
// out the cgroup's path.
type usageCache struct {
	mu       sync.Mutex
	byID     map[string]*cgroupSample
	nextStep int           // the step of the next cgroup asked for: round robin
	version  atomic.Uint64 // changes with every sample stored or dropped
}

type cgroupSample struct {
	path    string
	step    int // of the collector's period in which it is read
	u       Usage
	askedAt time.Time
}

// get returns the last sample of id's cgroup and notes the interest.
func (c *usageCache) get(id string) (Usage, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.byID[id]
	if s == nil {
		return Usage{}, false
	}
	s.askedAt = time.Now()
	return s.u, true
}

// put stores a sample of id's cgroup at path; the first one has no CPU
// rate.
func (c *usageCache) put(id, path string, st cgroups.Stats) Usage {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byID == nil {
		c.byID = map[string]*cgroupSample{}
	}
	s := c.byID[id]
	if s == nil || s.path != path {
		s = &cgroupSample{path: path, step: c.nextStep, askedAt: time.Now()}
		c.nextStep = (c.nextStep + 1) % statsSteps
		c.byID[id] = s
	} else {
		s.u.CPUNanoCores = cpuRate(s.u.Stats, st)
	}
	s.u.Stats, s.u.Memo = st, &store.Memo{}
	c.version.Add(1)
	return s.u
}

func cpuRate(prev, cur cgroups.Stats) uint64 {
	dt := cur.Timestamp.Sub(prev.Timestamp)
	if dt <= 0 || cur.CPUUsageNanos < prev.CPUUsageNanos {
		return 0
	}
	return uint64(float64(cur.CPUUsageNanos-prev.CPUUsageNanos) / dt.Seconds())
}

func (c *usageCache) forget(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.byID, id)
	c.version.Add(1)
}

// watchedCgroup is a cgroup the collector samples, and whose it is.
type watchedCgroup struct{ id, path string }

// watched lists the cgroups of step asked for within statsInterest and
// forgets the others of step.
func (c *usageCache) watched(step int) []watchedCgroup {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []watchedCgroup
	for id, s := range c.byID {
		switch {
		case s.step != step:
		case time.Since(s.askedAt) > statsInterest:
			delete(c.byID, id)
			c.version.Add(1)
		default:
			out = append(out, watchedCgroup{id, s.path})
		}
	}
	return out
}

// Cgroups reads the cgroups of pods and containers.
type Cgroups interface {
	ContainerCgroupsPath(podCgroup, containerID string) string
	Stats(cgroupsPath string) (cgroups.Stats, error)
	Details(cgroupsPath string) (cgroups.Details, error)
}

// Options say where the collector finds what it reads.
type Options struct {
	Store   *store.Store
	Cgroups Cgroups
	// UpperDir is the folder of a container's writable layer that its
	// files are written to.
	UpperDir func(*store.Container) string
	// LayerRoot is the root a container's writable layer is under (the
	// container root it was made in); LayerRoots are every such root.
	LayerRoot  func(*store.Container) string
	LayerRoots []string
	// ContainerRoot is the root new writable layers are made under: the
	// CRI's container filesystem.
	ContainerRoot string
	Logger        *slog.Logger
}

// Collector answers the stats calls of pods and containers.
type Collector struct {
	opts   Options
	usages usageCache
	layers layerUsages
	// layerMounts maps the roots writable layers are under to the mount
	// point of their filesystem (see layerMount).
	layerMounts sync.Map
	// layerDevices maps those mount points to their device, as
	// ContainerDetails labels their figures (see mountSource).
	layerDevices sync.Map
}

// New finds the filesystem of each root writable layers are under: a root
// that cannot be found fails berthd's start, not a stats call. Run starts
// the sampling.
func New(opts Options) (*Collector, error) {
	s := &Collector{opts: opts}
	for _, r := range opts.LayerRoots {
		if _, err := s.layerMount(r); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Run samples every watched cgroup each statsPeriod, off the request
// path, in statsSteps steps, for ever. A cgroup that is gone or unreadable
// is dropped: the next call reads it itself and says why.
func (s *Collector) Run() {
	tick := time.NewTicker(statsPeriod / statsSteps)
	for step := 0; ; step = (step + 1) % statsSteps {
		<-tick.C
		for _, w := range s.usages.watched(step) {
			st, err := s.opts.Cgroups.Stats(w.path)
			if err != nil {
				s.usages.forget(w.id)
				continue
			}
			s.usages.put(w.id, w.path, st)
		}
	}
}

// layerMount is the mount point of the filesystem of root, a root writable
// layers are under: their FsId. Found once per root (stats calls are
// many), also for a root the container root no longer is, which older
// containers' layers are still under.
func (s *Collector) layerMount(root string) (string, error) {
	if mp, ok := s.layerMounts.Load(root); ok {
		return mp.(string), nil
	}
	mp, err := image.Mountpoint(root)
	if err != nil {
		return "", err
	}
	s.layerMounts.Store(root, mp)
	return mp, nil
}

// Forget drops what the collector keeps of a removed container.
func (s *Collector) Forget(id string) {
	s.layers.forget(id)
	s.usages.forget(id)
}

// ContainerUsage reads a container's cgroup and writable layer. A container
// without a cgroup (not started, or exited and deleted) has no usage:
// ok is false. The collector's sample answers when there is one: no path
// is worked out then (a node-wide list asks this for every container).
func (s *Collector) ContainerUsage(c *store.Container) (u Usage, ok bool, err error) {
	if u, ok = s.usages.get(c.ID); !ok {
		pod, err := s.opts.Store.Pod(c.PodID)
		if err != nil {
			return u, false, err
		}
		if u, ok, err = s.usage(c.ID, s.opts.Cgroups.ContainerCgroupsPath(pod.Cgroup, c.ID)); !ok || err != nil {
			return u, ok, err
		}
	}
	u.LayerBytes, u.LayerInodes = s.layerUsage(c)
	if u.LayerMountpoint, err = s.layerMount(s.opts.LayerRoot(c)); err != nil {
		return u, false, err
	}
	return u, true, nil
}

func (s *Collector) layerUsage(c *store.Container) (bytes, inodes uint64) {
	return s.layers.usage(c.ID, func() string { return s.opts.UpperDir(c) }, s.opts.Logger)
}

// ContainerFsUsage is the space the writable layers under the container
// root use, and its filesystem's mount point: the CRI's container
// filesystem. The figures are each layer's last walk (see layerUsages),
// so a layer's growth shows within layerUsageMaxAge and a new one's
// after its first walk; the layers of containers made under another root
// (before container_root changed) are not on this filesystem, and not
// counted.
func (s *Collector) ContainerFsUsage() image.FsUsage {
	mp, _ := s.layerMount(s.opts.ContainerRoot) // found in New, cannot fail here
	u := image.FsUsage{Mountpoint: mp, Timestamp: time.Now()}
	for _, c := range s.opts.Store.ContainersOf("") {
		if s.opts.LayerRoot(c) == s.opts.ContainerRoot {
			b, n := s.layerUsage(c)
			u.UsedBytes += b
			u.Inodes += n
		}
	}
	return u
}

// Version changes whenever a container's stats could: with a
// container added, removed or changed, a sample of the collector stored or
// dropped, and new figures of a writable layer. A node-wide list made at
// one version (cri keeps it, encoded) is the answer until it changes:
// the collector stores a tenth of its samples every tenth of a second,
// while the kubelet and monitoring agents may ask far more often.
// (A sum of counters that only grow changes whenever one does.)
func (s *Collector) Version() uint64 {
	return s.opts.Store.Version() + s.usages.version.Load() + s.layers.version.Load()
}

// layerUsageMaxAge is how old a writable layer's figures may get before a
// stats call starts walking it again.
const layerUsageMaxAge = 10 * time.Second

// layerUsages caches the size of each container's writable layer: walking a
// big layer takes long, so stats calls answer with the last figures and the
// walk runs in the background, one per container at a time and
// layerWalkers on the node (a full node's layers all go stale together).
type layerUsages struct {
	mu      sync.Mutex
	byID    map[string]*layerUsage
	walkers chan struct{}
	version atomic.Uint64 // changes when a layer's figures do
}

// layerWalkers is how many writable layers are walked at once.
const layerWalkers = 2

type layerUsage struct {
	bytes, inodes uint64
	at            time.Time // when the figures were taken; zero: none yet
	walking       bool
}

// usage returns the last figures for container id (zero before the first
// walk ends) and starts a walk of its upper folder when they are stale.
func (l *layerUsages) usage(id string, upper func() string, log *slog.Logger) (bytes, inodes uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byID == nil {
		l.byID, l.walkers = map[string]*layerUsage{}, make(chan struct{}, layerWalkers)
	}
	u := l.byID[id]
	if u == nil {
		u = &layerUsage{}
		l.byID[id] = u
	}
	if !u.walking && time.Since(u.at) > layerUsageMaxAge {
		u.walking = true
		go l.walk(u, upper(), log)
	}
	return u.bytes, u.inodes
}

func (l *layerUsages) walk(u *layerUsage, upper string, log *slog.Logger) {
	l.walkers <- struct{}{}
	du, err := diskUsage(upper, layerWalkLimits)
	<-l.walkers
	if err != nil {
		log.Warn("writable layer usage", "dir", upper, "err", err)
	} else if du.skipped > 0 {
		// Counted without them: a container must not freeze its figures
		// (and escape eviction) by making one entry unreadable.
		log.Warn("writable layer usage: entries not counted", "dir", upper, "skipped", du.skipped, "err", du.firstErr)
	}
	if du.tooDeep > 0 {
		log.Warn("writable layer usage: folders nested deeper than one walk holds, their content not counted; the figures do not go down meanwhile",
			"dir", upper, "folders", du.tooDeep, "depth", layerWalkLimits.maxDepth())
	}
	if du.linkShares > 0 {
		log.Warn("writable layer usage: more hard-linked files than one walk remembers; the rest counted by their share at each name",
			"dir", upper, "remembered", layerWalkLimits.linkedFiles, "names", du.linkShares)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	u.walking = false
	if err != nil {
		return
	}
	if du.tooDeep > 0 {
		// Part of the layer was not counted: a container must not lower its
		// figures (and escape eviction) by nesting folders that deep.
		du.bytes, du.inodes = max(du.bytes, u.bytes), max(du.inodes, u.inodes)
	}
	if du.bytes != u.bytes || du.inodes != u.inodes {
		l.version.Add(1)
	}
	u.bytes, u.inodes, u.at = du.bytes, du.inodes, time.Now()
}

// forget drops a removed container's figures.
func (l *layerUsages) forget(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.byID, id)
	l.version.Add(1)
}

// PodUsage reads a pod's cgroup, which holds its containers'.
func (s *Collector) PodUsage(pod *store.Pod) (Usage, bool, error) {
	if pod.Cgroup == "" {
		return Usage{}, false, nil
	}
	if u, ok := s.usages.get(pod.ID); ok {
		return u, true, nil
	}
	return s.usage(pod.ID, pod.Cgroup)
}

// usage reads the cgroup at path of pod or container id, which nobody
// asked for lately (with no CPU rate yet), and has the collector sample it
// from now on.
func (s *Collector) usage(id, path string) (Usage, bool, error) {
	st, err := s.opts.Cgroups.Stats(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Usage{}, false, nil
	}
	if err != nil {
		return Usage{}, false, err
	}
	return s.usages.put(id, path, st), true, nil
}

// layerFigures is what one walk of a writable layer found.
type layerFigures struct {
	// bytes are regular files' sizes (a hard-linked file once) and
	// folders' blocks, as du counts them (a folder of a million names is
	// megabytes of disk); inodes are the entries, the top folder included.
	bytes, inodes uint64
	skipped       int   // entries that could not be looked at, or folders not read
	firstErr      error // why the first was skipped
	// linkShares counts the names of hard-linked files met once the walk
	// remembered its limit of them: each counts its share of the file's
	// size (see countFile).
	linkShares int
	// shed counts the names the walk let go of past its limit of held
	// bytes, and read again later (see layerWalk.shed): all counted.
	shed int
	// tooDeep counts the folders deeper than the walk's limit holds
	// (walkLimits.maxDepth): counted, their content not.
	tooDeep int
	// peakHeld is the most bytes of path and names the walk held at once:
	// what walkLimits.heldBytes bounds, give or take one read of names.
	peakHeld int
}

// maxWalkFDs bounds the folder descriptors one walk holds open: one per
// level of the folder it is in, up to this many; deeper, the top ones are
// closed and opened again through ".." on the way back up.
const maxWalkFDs = 64

// walkLimits bound the memory of one walk, whatever a container makes.
type walkLimits struct {
	// linkedFiles bounds the hard-linked files the walk remembers, so that
	// each counts once (16 bytes of key each): past it, see countFile.
	linkedFiles int
	// heldBytes bounds the folder levels and names the walk holds: each
	// folder on its path keeps its place and at most one read of its
	// names (namesBufSize). Past it, the walk lets go of the names held
	// by the highest folders, keeping where to read them again (see
	// layerWalk.shed); the folders themselves bound how deep it goes (see
	// maxDepth).
	heldBytes int
}

// layerWalkLimits are the walks' limits: a few MiB of hard-link map, and
// 16 MiB of path and names, whose folders alone only a chain some two
// hundred thousand deep passes.
var layerWalkLimits = walkLimits{linkedFiles: 1 << 16, heldBytes: 16 << 20}

// maxDepth is how deep a walk goes within heldBytes: the folders on its
// path, and the deepest one's names, all that is left once the others'
// are shed. A folder deeper is counted, its content not.
func (l walkLimits) maxDepth() int {
	return max(1, (l.heldBytes-maxReadHeld)/frameBytes)
}

// namesBufSize is one getdents read: the most names a folder on the walk's
// path holds at a time.
const namesBufSize = 32 << 10

// frameBytes and nameOverhead are what the walk counts against its
// heldBytes limit for a folder on its path and for a name, beside its
// bytes: the size of walkFrame and of a dirName, near enough.
const frameBytes, nameOverhead = 80, 24

// maxReadHeld is the most one read of names counts against heldBytes: a
// dirent takes at least 24 bytes of the buffer and more than its name, so
// a name and its overhead take at most twice its dirent.
const maxReadHeld = 2 * namesBufSize

// walkFrame is a folder on the walk's path from the top to where it is.
type walkFrame struct {
	fd       int // -1 while closed (the walk is deeper than maxWalkFDs below)
	dev, ino uint64
	names    []dirName // read and not visited yet
	held     int       // bytes of names counted against the heldBytes limit
	pos      int64     // the folder offset the next read starts at
	read     bool      // every name read: nothing left to read from fd
	// moved says fd's offset is not pos: names read were shed, and are to
	// be read again from pos.
	moved bool
}

// dirName is a name read from a folder, and the folder offset a read
// starts at to return it again.
type dirName struct {
	name  string
	start int64
}

// diskUsage counts the space the files and folders under dir take (a
// hard-linked file once) and its entries. It never builds a path: each
// folder is opened relative to its parent's descriptor (openat, fstatat),
// so a container's chain of folders deeper than PATH_MAX is counted like
// any other; so is everything beside an entry that cannot be looked at,
// which is only counted in skipped. Folders are read a buffer at a time, so
// a folder of millions of names is never held whole. Only a top folder that
// cannot be opened fails the walk; one that is gone is empty.
func diskUsage(dir string, limits walkLimits) (du layerFigures, err error) {
	top, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return du, nil
	}
	if err != nil {
		return du, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	w := layerWalk{limits: limits, maxDepth: limits.maxDepth(), linked: map[fileID]struct{}{}, buf: make([]byte, namesBufSize)}
	var st unix.Stat_t
	if err := unix.Fstat(top, &st); err != nil {
		unix.Close(top)
		return du, &os.PathError{Op: "stat", Path: dir, Err: err}
	}
	w.countFolder(&st)
	w.push(top, &st)
	for len(w.path) > 0 {
		w.step()
	}
	return w.du, nil
}

// fileID tells a hard-linked file's other names apart from new files.
type fileID struct{ dev, ino uint64 }

type layerWalk struct {
	limits   walkLimits
	maxDepth int
	du       layerFigures
	path     []walkFrame
	open     int // frames of path whose fd is open: the last ones
	held     int // bytes of path and its names, against limits.heldBytes
	// bare is how many frames at the top of path hold no names: shed
	// starts below them, so that a deep path is not looked over at each
	// step.
	bare   int
	linked map[fileID]struct{}
	buf    []byte // getdents
}

// step visits the next entry of the deepest folder (whose fd is open),
// reading more of it when its names read are done, or leaves the folder
// when it has none left.
func (w *layerWalk) step() {
	if w.held > w.limits.heldBytes {
		w.shed()
	}
	cur := &w.path[len(w.path)-1]
	if len(cur.names) == 0 && !cur.read {
		w.readNames(cur)
	}
	if len(cur.names) == 0 {
		w.pop()
		return
	}
	name := cur.names[0].name
	cur.names = cur.names[1:]
	cost := len(name) + nameOverhead
	cur.held -= cost
	w.held -= cost
	var st unix.Stat_t
	if err := unix.Fstatat(cur.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		w.skip(err) // ENOENT: removed since the folder was read
		return
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		if !w.countFile(&st) {
			return // another name of a file counted
		}
	case unix.S_IFDIR:
		w.countFolder(&st)
		if len(w.path) >= w.maxDepth {
			w.du.tooDeep++
			return
		}
		w.enter(cur.fd, name)
		return
	default: // a symlink whose target is too long for its inode takes a block
		w.du.bytes += uint64(st.Blocks) * 512
	}
	w.du.inodes++
}

// enter opens the folder name of the folder open at parent and makes it the
// deepest.
func (w *layerWalk) enter(parent int, name string) {
	// Not following a symlink swapped in since the stat.
	fd, err := unix.Openat(parent, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		w.skip(err)
		return
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		w.skip(err)
		return
	}
	w.push(fd, &st)
}

// countFolder counts a folder's entry and blocks, as du does.
func (w *layerWalk) countFolder(st *unix.Stat_t) {
	w.du.inodes++
	w.du.bytes += uint64(st.Blocks) * 512
}

// countFile counts a regular file's size, a hard-linked file's once: its
// other names are found in linked, and false says it was counted before.
// Once linked holds its limit, a hard-linked file not in it counts its
// share at each name (size/links), which adds up to its size when, as in a
// writable layer, all its names are in the walk: the bytes stay near right
// (its inode, though, counts at each name), and the map stays bounded.
func (w *layerWalk) countFile(st *unix.Stat_t) bool {
	if st.Nlink <= 1 {
		w.du.bytes += uint64(st.Size)
		return true
	}
	id := fileID{uint64(st.Dev), st.Ino} //nolint:unconvert // Dev's type differs between architectures
	if _, seen := w.linked[id]; seen {
		return false
	}
	if len(w.linked) < w.limits.linkedFiles {
		w.linked[id] = struct{}{}
		w.du.bytes += uint64(st.Size)
		return true
	}
	w.du.linkShares++
	w.du.bytes += uint64(st.Size) / uint64(st.Nlink)
	return true
}

// push makes the folder open at fd the deepest; past maxWalkFDs open, the
// highest open folder is closed, its place in the folder kept.
func (w *layerWalk) push(fd int, st *unix.Stat_t) {
	w.path = append(w.path, walkFrame{fd: fd, dev: uint64(st.Dev), ino: st.Ino}) //nolint:unconvert // Dev's type differs between architectures
	w.held += frameBytes
	w.du.peakHeld = max(w.du.peakHeld, w.held)
	if w.open++; w.open > maxWalkFDs {
		w.close(&w.path[len(w.path)-w.open])
	}
}

// close closes a folder above the deepest ones; pos keeps where its next
// read starts (a directory offset, which lseek takes back on a new open).
func (w *layerWalk) close(f *walkFrame) {
	unix.Close(f.fd)
	f.fd = -1
	w.open--
}

// pop leaves the deepest folder. A parent that was closed is opened again
// as its ".."; if that is no longer the same folder (the container moved
// it meanwhile), the parent's remaining entries are skipped.
func (w *layerWalk) pop() {
	done := w.path[len(w.path)-1]
	w.path = w.path[:len(w.path)-1]
	w.held -= frameBytes + done.held
	// The parent reads its names again if it shed them: it is not bare.
	w.bare = max(0, min(w.bare, len(w.path)-1))
	if len(w.path) > 0 {
		if parent := &w.path[len(w.path)-1]; parent.fd < 0 {
			w.reopen(parent, done.fd)
		}
	}
	if done.fd >= 0 {
		unix.Close(done.fd)
		w.open--
	}
}

func (w *layerWalk) reopen(f *walkFrame, childFD int) {
	if childFD < 0 {
		w.skipRest(f, unix.EBADF) // the child was not reopened either
		return
	}
	fd, err := unix.Openat(childFD, "..", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		w.skipRest(f, err)
		return
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || uint64(st.Dev) != f.dev || st.Ino != f.ino { //nolint:unconvert // Dev's type differs between architectures
		unix.Close(fd)
		w.skipRest(f, errors.New("a folder was moved during the walk"))
		return
	}
	if !f.read {
		if _, err := unix.Seek(fd, f.pos, io.SeekStart); err != nil {
			unix.Close(fd)
			w.skipRest(f, err)
			return
		}
	}
	f.fd, f.moved = fd, false
	w.open++
}

// skipRest gives up a folder whose place was lost: its names read and
// not visited, and those not read (one more skipped: their number is not
// known).
func (w *layerWalk) skipRest(f *walkFrame, err error) {
	w.du.skipped += len(f.names)
	w.noteSkip(err)
	w.held -= f.held
	f.names, f.held = nil, 0
	w.skipUnread(f, err)
}

// skipUnread gives up reading more of a folder.
func (w *layerWalk) skipUnread(f *walkFrame, err error) {
	if !f.read {
		f.read = true
		w.du.skipped++
		w.noteSkip(err)
	}
}

// skip notes an entry not counted; one removed since its folder was read
// is simply gone.
func (w *layerWalk) skip(err error) {
	if errors.Is(err, unix.ENOENT) {
		return
	}
	w.du.skipped++
	w.noteSkip(err)
}

func (w *layerWalk) noteSkip(err error) {
	if w.du.firstErr == nil {
		w.du.firstErr = err
	}
}

// shed lets go of the names held by the highest folders on the path, down
// to half the heldBytes limit (so that it runs seldom), keeping in each
// folder the offset its first name not visited is read from: the walk
// reads them again when it is back in that folder, and still counts
// everything. The deepest folder keeps its names; within maxDepth, the
// folders and those names are within the limit. A chain of folders each
// full of long names costs one more read per folder shed, not memory.
func (w *layerWalk) shed() {
	for ; w.bare < len(w.path)-1 && w.held > w.limits.heldBytes/2; w.bare++ {
		f := &w.path[w.bare]
		if len(f.names) == 0 {
			continue
		}
		w.du.shed += len(f.names)
		w.held -= f.held
		f.pos, f.moved = f.names[0].start, true
		f.names, f.held = nil, 0
	}
}

// readNames reads the next names of the folder f, open; at the end (or on
// an error, skipped) it is marked read.
func (w *layerWalk) readNames(f *walkFrame) {
	if f.moved {
		if _, err := unix.Seek(f.fd, f.pos, io.SeekStart); err != nil {
			w.skipUnread(f, err)
			return
		}
		f.moved = false
	}
	for len(f.names) == 0 {
		n, err := unix.Getdents(f.fd, w.buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			w.skipUnread(f, err)
			return
		}
		if n <= 0 {
			f.read = true
			return
		}
		f.names = appendNames(f.names, w.buf[:n], &f.pos)
	}
	for _, n := range f.names {
		f.held += len(n.name) + nameOverhead
	}
	w.held += f.held
	w.du.peakHeld = max(w.du.peakHeld, w.held)
}

// The layout of struct linux_dirent64, which getdents returns.
var (
	direntOff    = int(unsafe.Offsetof(unix.Dirent{}.Off))
	direntReclen = int(unsafe.Offsetof(unix.Dirent{}.Reclen))
	direntName   = int(unsafe.Offsetof(unix.Dirent{}.Name))
)

// appendNames appends to names those of the dirents in buf, read from
// offset *pos of their folder, without "." and ".." and deleted entries,
// each with the offset it is read again from; *pos becomes the offset
// after them. (unix.ParseDirent drops the offsets.)
func appendNames(names []dirName, buf []byte, pos *int64) []dirName {
	if len(names) == 0 {
		names = make([]dirName, 0, countDirents(buf)) // one allocation a read
	}
	for rec, rest := nextDirent(buf); rec != nil; rec, rest = nextDirent(rest) {
		ino := binary.NativeEndian.Uint64(rec)
		name := rec[direntName:]
		if i := bytes.IndexByte(name, 0); i >= 0 {
			name = name[:i]
		}
		start := *pos
		*pos = int64(binary.NativeEndian.Uint64(rec[direntOff:]))
		if ino == 0 || string(name) == "." || string(name) == ".." {
			continue
		}
		names = append(names, dirName{string(name), start})
	}
	return names
}

// countDirents is how many dirents buf holds.
func countDirents(buf []byte) (n int) {
	for rec, rest := nextDirent(buf); rec != nil; rec, rest = nextDirent(rest) {
		n++
	}
	return n
}

// nextDirent splits the first dirent of buf from the rest; rec is nil when
// buf holds no whole one.
func nextDirent(buf []byte) (rec, rest []byte) {
	if len(buf) <= direntName {
		return nil, nil
	}
	reclen := int(binary.NativeEndian.Uint16(buf[direntReclen:]))
	if reclen <= direntName || reclen > len(buf) {
		return nil, nil
	}
	return buf[:reclen], buf[reclen:]
}

// PodNetworkUsage reads the counters of the pod's interfaces from inside its
// network namespace. A pod on the host network, or one whose namespace is
// gone (stopped), has none of its own: ok is false.
func (s *Collector) PodNetworkUsage(pod *store.Pod) (ifaces []network.InterfaceStats, ok bool, err error) {
	pin := pod.Pins[string(podns.Net)]
	if pin == "" || pod.State != runtimeapi.PodSandboxState_SANDBOX_READY {
		return nil, false, nil
	}
	ifaces, err = network.PodInterfaceStats(pin)
	return ifaces, err == nil, err
}
