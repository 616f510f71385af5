package shim

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// File names inside the pod folder and a container's folder.
const (
	SocketFile  = "shim.sock"
	StreamFile  = "stream.sock"
	PidFile     = "shim.pid"
	LogFile     = "shim.log"
	StateRoot   = "lc"
	Containers  = "containers"
	ConfigFile  = "config.json"
	ExitFile    = "exit.json"
	StartedFile = "started.json"
	// ExecInitFile and SeccompFile, in a container's bundle, are what
	// berth-exec-init needs of it (written at create by the op process,
	// see sandbox/shim/ops/execinit.go): a container without them, one an
	// earlier shim created or one whose settings it cannot apply, execs
	// through libcontainer.
	ExecInitFile = "exec-init"
	SeccompFile  = "seccomp.bpf"
	// CRIUConfigFile, in a container's bundle, is the CRIU configuration
	// its checkpoints take: berthd writes it before each, and the spec's
	// AnnotationCRIUConfig names it (see sandbox/checkpoint.go).
	CRIUConfigFile = "criu.conf"
)

// AnnotationCRIUConfig is the spec annotation libcontainer takes the CRIU
// configuration file of a checkpoint from (without it: the host's
// /etc/criu/runc.conf). CRIU runs as the node's root and its configuration
// can have it load plugins or run programs, so the annotation is berth's
// alone: the spec names the bundle's CRIUConfigFile, a pod or container
// that asks for the annotation is refused (spec.CheckReservedAnnotations),
// and the op process checks the label before a checkpoint.
const AnnotationCRIUConfig = "org.criu.config"

// ExitRecord is exit.json: what a container's init ended with.
type ExitRecord struct {
	ExitCode   int       `json:"exitCode"`
	FinishedAt time.Time `json:"finishedAt"`
	OOMKilled  bool      `json:"oomKilled,omitempty"`
	Signal     int       `json:"signal,omitempty"`
}

// StartRecord is started.json.
type StartRecord struct {
	Pid       int       `json:"pid"`
	StartedAt time.Time `json:"startedAt"`
}

// ContainerDir is where a container's spec and records live.
func ContainerDir(podDir, id string) string {
	return filepath.Join(podDir, Containers, id)
}

// ReadRecords reads the records in a container's folder; a missing file
// gives a nil record.
func ReadRecords(dir string) (*StartRecord, *ExitRecord, error) {
	var st StartRecord
	var ex ExitRecord
	okS, err := readJSON(filepath.Join(dir, StartedFile), &st)
	if err != nil {
		return nil, nil, err
	}
	okE, err := readJSON(filepath.Join(dir, ExitFile), &ex)
	if err != nil {
		return nil, nil, err
	}
	var sp *StartRecord
	var ep *ExitRecord
	if okS {
		sp = &st
	}
	if okE {
		ep = &ex
	}
	return sp, ep, nil
}

// UnknownExitCode is reported for a container that stopped without an
// exit record (its shim died first).
const UnknownExitCode = 255

// ReadRecordedState is the state of a container whose shim is gone, from
// the records in its folder: always stopped (nothing is left to run it),
// with the recorded exit, or UnknownExitCode and no FinishedAt when the
// shim died before it. No records at all is ErrNotFound.
func ReadRecordedState(containerDir string) (State, error) {
	id := filepath.Base(containerDir)
	st, ex, err := ReadRecords(containerDir)
	if err != nil {
		return State{}, err
	}
	s := StateFromRecords(id, st, ex)
	if ex == nil {
		if _, err := os.Stat(filepath.Join(containerDir, ConfigFile)); st == nil && err != nil {
			return State{}, fmt.Errorf("%w: %s", ErrNotFound, id)
		}
		s.Status, s.ExitCode = StatusStopped, UnknownExitCode
	}
	return s, nil
}

// StateFromRecords is the state the records describe: created with
// neither, running with only started.json, stopped once exit.json is there.
func StateFromRecords(id string, st *StartRecord, ex *ExitRecord) State {
	s := State{ID: id, Status: StatusCreated}
	if st != nil {
		s.Status, s.Pid, s.StartedAt = StatusRunning, st.Pid, st.StartedAt
	}
	if ex != nil {
		s.Status, s.ExitCode, s.Signal = StatusStopped, ex.ExitCode, ex.Signal
		s.OOMKilled, s.FinishedAt = ex.OOMKilled, ex.FinishedAt
	}
	return s
}

func readJSON(path string, v any) (bool, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return false, fmt.Errorf("%s: %w", path, err)
	}
	return true, nil
}

// WriteJSONDurable writes v to path so that after a crash the file is
// either the old one or the complete new one: temp file, fsync, rename,
// fsync of the folder.
func WriteJSONDurable(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
