package kubeenv

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// KubeletSysctls are the kernel settings a kubelet's container manager
// changes at start (protectKernelDefaults: false).
var KubeletSysctls = []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic",
	"kernel/panic_on_oops", "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes"}

// kubeletHostPaths are written by a kubelet whatever its flags say: the
// device plugin socket's folder and /var/log/containers (its symlinks to
// the pod logs).
var kubeletHostPaths = []string{"/var/lib/kubelet", "/var/lib/kubelet/device-plugins", "/var/log/containers"}

// devicePluginSocket is a kubelet's, at a fixed path: two kubelets on one
// host would share it, so a run refuses a host where one serves it.
const devicePluginSocket = "/var/lib/kubelet/device-plugins/kubelet.sock"

// Host is what of the host a run with a kubelet may change, as it was at
// the start.
type Host struct {
	sysctls map[string]string
	missing []string // kubeletHostPaths that did not exist
}

// RecordHost fails t when a kubelet already runs on this host, else notes
// the values of sysctls and which kubelet host folders are missing.
func RecordHost(t *testing.T, sysctls []string) *Host {
	t.Helper()
	if conn, err := net.Dial("unix", devicePluginSocket); err == nil {
		conn.Close()
		t.Fatalf("a kubelet already serves %s on this host: the tier needs a host without one", devicePluginSocket)
	}
	h := &Host{sysctls: map[string]string{}}
	for _, s := range sysctls {
		if b, err := os.ReadFile("/proc/sys/" + s); err == nil {
			h.sysctls[s] = strings.TrimSpace(string(b))
		}
	}
	for _, d := range kubeletHostPaths {
		if _, err := os.Lstat(d); errors.Is(err, fs.ErrNotExist) {
			h.missing = append(h.missing, d)
		}
	}
	return h
}

// Restore removes the device plugin socket, the kubelet's symlinks to pod
// logs below work (a leak: it removes them with the pods), the kubelet host
// folders that were missing, and sets back the sysctls that changed.
func (h *Host) Restore(t *testing.T, work string) {
	if h == nil {
		return
	}
	if err := os.Remove(devicePluginSocket); err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("teardown: %v", err)
	}
	links, _ := os.ReadDir("/var/log/containers")
	for _, l := range links {
		p := filepath.Join("/var/log/containers", l.Name())
		if dst, err := os.Readlink(p); err == nil && strings.HasPrefix(dst, work+"/") {
			t.Errorf("teardown: the kubelet left %s -> %s", p, dst)
			os.Remove(p)
		}
	}
	for i := len(h.missing) - 1; i >= 0; i-- { // deepest first
		if err := os.RemoveAll(h.missing[i]); err != nil {
			t.Errorf("teardown: %v", err)
		}
	}
	for s, v := range h.sysctls {
		b, _ := os.ReadFile("/proc/sys/" + s)
		if strings.TrimSpace(string(b)) != v {
			if err := os.WriteFile("/proc/sys/"+s, []byte(v), 0o644); err != nil {
				t.Errorf("teardown: restore %s=%s: %v", s, v, err)
			}
		}
	}
}
