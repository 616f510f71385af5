package ops

import (
	"bufio"
	"encoding/json"
	"fmt"
	"log"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/moby/sys/capability"
	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/specconv"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

func loadSpec(bundle string) (*specs.Spec, error) {
	b, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil, err
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return nil, fmt.Errorf("config.json: %w", err)
	}
	if spec.Process == nil || len(spec.Process.Args) == 0 {
		return nil, fmt.Errorf("config.json: no process args")
	}
	return &spec, nil
}

// lcConfig converts the spec. specconv resolves relative paths against the
// working directory (runc runs in the bundle); the shim serves many
// bundles at once, so they are made absolute here instead.
func lcConfig(id, bundle string, spec *specs.Spec) (*configs.Config, error) {
	if spec.Root == nil {
		return nil, fmt.Errorf("config.json: no root")
	}
	if !filepath.IsAbs(spec.Root.Path) {
		spec.Root.Path = filepath.Join(bundle, spec.Root.Path)
	}
	for i, m := range spec.Mounts {
		if m.Source != "" && !filepath.IsAbs(m.Source) && isBind(m) {
			spec.Mounts[i].Source = filepath.Join(bundle, m.Source)
		}
	}
	systemd := spec.Linux != nil && strings.Count(spec.Linux.CgroupsPath, ":") == 2
	cfg, err := specconv.CreateLibcontainerConfig(&specconv.CreateOpts{
		CgroupName:       id,
		UseSystemdCgroup: systemd,
		Spec:             spec,
	})
	if err != nil {
		return nil, err
	}
	fitOOMScoreAdj(id, cfg)
	fitCapabilities(id, cfg)
	return cfg, nil
}

func isBind(m specs.Mount) bool {
	return m.Type == "bind" || slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind")
}

// lcProcess builds the container's init process from spec.Process (the
// parts that libcontainer takes from the Process, not the Config).
func lcProcess(p *specs.Process) (*libcontainer.Process, error) {
	rl, err := rlimits(p.Rlimits)
	if err != nil {
		return nil, err
	}
	lp := &libcontainer.Process{
		Args:            p.Args,
		Env:             p.Env,
		Cwd:             p.Cwd,
		UID:             int(p.User.UID),
		GID:             int(p.User.GID),
		Rlimits:         rl,
		AppArmorProfile: p.ApparmorProfile,
		Label:           p.SelinuxLabel,
		Scheduler:       p.Scheduler,
		IOPriority:      p.IOPriority,
		LogLevel:        initLogLevel(),
	}
	for _, g := range p.User.AdditionalGids {
		lp.AdditionalGroups = append(lp.AdditionalGroups, int(g))
	}
	return lp, nil
}

// initLogLevel is the log level of libcontainer's init for a process: the
// level the shim forwards its lines at (logrus's), as runc passes its own.
// Without it, the init's C stage (nsexec) writes every debug line, some
// twenty per start that the shim reads, decodes and drops.
func initLogLevel() string {
	return strconv.Itoa(int(logrus.GetLevel()))
}

var rlimitTypes = map[string]int{
	"RLIMIT_CPU": unix.RLIMIT_CPU, "RLIMIT_FSIZE": unix.RLIMIT_FSIZE,
	"RLIMIT_DATA": unix.RLIMIT_DATA, "RLIMIT_STACK": unix.RLIMIT_STACK,
	"RLIMIT_CORE": unix.RLIMIT_CORE, "RLIMIT_RSS": unix.RLIMIT_RSS,
	"RLIMIT_NPROC": unix.RLIMIT_NPROC, "RLIMIT_NOFILE": unix.RLIMIT_NOFILE,
	"RLIMIT_MEMLOCK": unix.RLIMIT_MEMLOCK, "RLIMIT_AS": unix.RLIMIT_AS,
	"RLIMIT_LOCKS": unix.RLIMIT_LOCKS, "RLIMIT_SIGPENDING": unix.RLIMIT_SIGPENDING,
	"RLIMIT_MSGQUEUE": unix.RLIMIT_MSGQUEUE, "RLIMIT_NICE": unix.RLIMIT_NICE,
	"RLIMIT_RTPRIO": unix.RLIMIT_RTPRIO, "RLIMIT_RTTIME": unix.RLIMIT_RTTIME,
}

func rlimits(in []specs.POSIXRlimit) ([]configs.Rlimit, error) {
	var out []configs.Rlimit
	for _, r := range in {
		t, ok := rlimitTypes[r.Type]
		if !ok {
			return nil, fmt.Errorf("unknown rlimit %q", r.Type)
		}
		out = append(out, configs.Rlimit{Type: t, Hard: r.Hard, Soft: r.Soft})
	}
	return out, nil
}

// Lowering oom_score_adj needs CAP_SYS_RESOURCE, which some hosts (nested
// containers) do not give even to root. runc init would then fail the whole
// container on the write, so the shim finds out once whether it can lower
// its own value and, if not, drops such a setting with a warning.
var canLowerOOM = sync.OnceValues(func() (bool, int) {
	const path = "/proc/self/oom_score_adj"
	b, err := os.ReadFile(path)
	if err != nil {
		return false, 0
	}
	cur, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || cur <= -1000 {
		return false, cur
	}
	if os.WriteFile(path, []byte(strconv.Itoa(cur-1)), 0) != nil {
		return false, cur
	}
	os.WriteFile(path, []byte(strconv.Itoa(cur)), 0) // raising back is always allowed
	return true, cur
})

func fitOOMScoreAdj(id string, cfg *configs.Config) {
	if cfg.OomScoreAdj == nil {
		return
	}
	ok, cur := canLowerOOM()
	if !ok && *cfg.OomScoreAdj < cur {
		log.Printf("container %s: cannot lower oom_score_adj to %d (no CAP_SYS_RESOURCE); keeping %d", id, *cfg.OomScoreAdj, cur)
		cfg.OomScoreAdj = nil
	}
}

// boundingSet is the shim's own capability bounding set, by name
// ("CAP_CHOWN"). A container cannot be given a capability outside it: the
// capset in runc init would fail with EPERM.
var boundingSet = sync.OnceValue(func() map[string]bool {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return nil
	}
	defer f.Close()
	var mask uint64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "CapBnd:"); ok {
			mask, err = strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				return nil
			}
		}
	}
	set := map[string]bool{}
	for _, c := range capability.ListKnown() {
		if mask&(1<<uint(c)) != 0 {
			set["CAP_"+strings.ToUpper(c.String())] = true
		}
	}
	return set
})

// fitCapabilities drops, with a warning, capabilities the shim does not
// have itself (the same as "all capabilities" meaning the current ones in
// other runtimes).
func fitCapabilities(id string, cfg *configs.Config) {
	have := boundingSet()
	if cfg.Capabilities == nil || have == nil {
		return
	}
	dropped := map[string]bool{}
	keep := func(list []string) []string {
		return slices.DeleteFunc(list, func(c string) bool {
			if have[c] {
				return false
			}
			dropped[c] = true
			return true
		})
	}
	c := cfg.Capabilities
	c.Bounding, c.Effective, c.Permitted = keep(c.Bounding), keep(c.Effective), keep(c.Permitted)
	c.Inheritable, c.Ambient = keep(c.Inheritable), keep(c.Ambient)
	if len(dropped) > 0 {
		names := slices.Sorted(maps.Keys(dropped))
		log.Printf("container %s: dropping capabilities the shim lacks: %s", id, strings.Join(names, ","))
	}
}
