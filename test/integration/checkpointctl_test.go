package integration

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/harness"
)

// checkpointctlBin is checkpointctl, the version test/checkpointctl pins
// (BERTH_CHECKPOINTCTL_BIN in the VM tier).
func checkpointctlBin(t *testing.T) string {
	return harness.PinnedProgram(t, "BERTH_CHECKPOINTCTL_BIN", "checkpointctl", "github.com/checkpoint-restore/checkpointctl")
}

// checkpointctlView is what checkpointctl must read from an archive of
// counterScript's container.
type checkpointctlView struct {
	container, image, id, pod string
	after                     time.Time // the checkpoint began after it
}

// ckptProcess is a process of `checkpointctl inspect --format json`'s tree.
type ckptProcess struct {
	PID      uint32        `json:"pid"`
	Command  string        `json:"command"`
	Children []ckptProcess `json:"children"`
}

// child is the first child of p that runs command.
func (p *ckptProcess) child(command string) *ckptProcess {
	for i := range p.Children {
		if p.Children[i].Command == command {
			return &p.Children[i]
		}
	}
	return nil
}

// ckptInspect is the part of `checkpointctl inspect --format json`'s
// answer for one archive that the test reads.
type ckptInspect struct {
	ContainerName string `json:"container_name"`
	Image         string `json:"image"`
	ID            string `json:"id"`
	Engine        string `json:"engine"`
	Checkpointed  string `json:"checkpointed"`
	Metadata      struct {
		PodName string `json:"pod_name"`
	}
	ProcessTree ckptProcess `json:"process_tree"`
	Files       []struct {
		PID       uint32 `json:"pid"`
		OpenFiles []struct {
			FD   string `json:"fd"`
			Path string `json:"path"`
		} `json:"open_files"`
	} `json:"file_descriptors"`
	Sockets []struct {
		PID         uint32 `json:"pid"`
		OpenSockets []struct {
			Protocol string `json:"protocol"`
			Data     struct {
				State   string `json:"state"`
				SrcPort uint32 `json:"src_port"`
			} `json:"data"`
		} `json:"open_sockets"`
	} `json:"sockets"`
}

// assertCheckpointctlReads runs checkpointctl's show and inspect on the
// archive of counterScript's container, as a user would, and fails t
// unless they print its container, image, ID and pod, when it was taken,
// its process tree (the shell and busybox's httpd under it, whose command
// is busybox's), httpd's listening socket and open files of both.
// Not --ps-tree-cmd: v1.6.0 prints blank command lines from CRIU 3.17's
// images of these processes.
func assertCheckpointctlReads(t *testing.T, archive string, want checkpointctlView) {
	t.Helper()
	bin := checkpointctlBin(t)
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(bin, append(args, archive)...).CombinedOutput()
		if err != nil {
			t.Fatalf("checkpointctl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	show := run("show")
	t.Logf("checkpointctl show:\n%s", show)
	for _, w := range []string{want.container, want.image, want.id[:12], "containerd"} {
		if !strings.Contains(show, w) {
			t.Errorf("checkpointctl show does not print %q", w)
		}
	}
	if tree := run("inspect", "--ps-tree"); !strings.Contains(tree, "Process tree") || !strings.Contains(tree, "]  busybox") {
		t.Errorf("checkpointctl inspect --ps-tree prints no process tree with busybox (httpd):\n%s", tree)
	}
	out := run("inspect", "--format", "json", "--metadata", "--files", "--sockets")
	var views []ckptInspect
	if err := json.Unmarshal([]byte(out), &views); err != nil || len(views) != 1 {
		t.Fatalf("checkpointctl inspect --format json: %v, %d archives\n%s", err, len(views), out)
	}
	v := views[0]
	if v.ContainerName != want.container || v.Image != want.image || v.ID != want.id || v.Engine != "containerd" || v.Metadata.PodName != want.pod {
		t.Errorf("checkpointctl inspect: container %q, image %q, ID %q, engine %q, pod %q; want %q, %q, %q, containerd, %q",
			v.ContainerName, v.Image, v.ID, v.Engine, v.Metadata.PodName, want.container, want.image, want.id, want.pod)
	}
	if at, err := time.Parse(time.RFC3339, v.Checkpointed); err != nil || at.Before(want.after.Truncate(time.Second)) {
		t.Errorf("checkpointctl inspect: checkpointed %q (%v), want a time from %s on", v.Checkpointed, err, want.after)
	}
	root := &v.ProcessTree
	httpd := root.child("busybox")
	if root.Command != "sh" || httpd == nil {
		t.Fatalf("checkpointctl inspect: process tree %+v, want sh with busybox (httpd) under it\n%s", *root, out)
	}
	listens := false
	for _, s := range v.Sockets {
		for _, o := range s.OpenSockets {
			listens = listens || (s.PID == httpd.PID && o.Protocol == "TCP" && o.Data.State == "LISTEN" && o.Data.SrcPort == 8080)
		}
	}
	if !listens {
		t.Errorf("checkpointctl inspect: sockets %+v, want httpd's (PID %d) listening on TCP port 8080", v.Sockets, httpd.PID)
	}
	// The shell's stdin is /dev/null (the container has none); httpd
	// works in the folder it serves.
	for _, want := range []struct {
		pid      uint32
		fd, path string
	}{{root.PID, "REG 0", "/dev/null"}, {httpd.PID, "cwd", "/www"}} {
		if !v.hasOpenFile(want.pid, want.fd, want.path) {
			t.Errorf("checkpointctl inspect: open files %+v, want %s of PID %d at %s", v.Files, want.fd, want.pid, want.path)
		}
	}
}

// hasOpenFile says whether process pid has fd (as checkpointctl names it)
// open at path.
func (v *ckptInspect) hasOpenFile(pid uint32, fd, path string) bool {
	for _, f := range v.Files {
		for _, o := range f.OpenFiles {
			if f.PID == pid && o.FD == fd && o.Path == path {
				return true
			}
		}
	}
	return false
}
