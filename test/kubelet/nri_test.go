package kubelet

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/kubeenv"
	corev1 "k8s.io/api/core/v1"
)

const pinnedPod = `apiVersion: v1
kind: Pod
metadata:
  name: placed
  namespace: e2e
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: pinned
    image: IMAGE
    command: ["sleep", "3600"]
  - name: free
    image: IMAGE
    command: ["sleep", "3600"]
`

// TestKubeletNRICpuset places a pod's container on CPU 0 through NRI
// under the real kubelet: berthd with [nri] on starts the integration
// tests' plugin (test/integration/testdata/nriplugin, written against the
// protocol's stub) from its plugin_path, configured to set cpuset CPU 0 on
// containers named "pinned", as a resource policy plugin would; the
// container's Cpus_allowed_list says 0, its sibling's does not.
//
// A resource policy of containers/nri-plugins (topology-aware, balloons)
// is what an operator would run here; the module proxy refuses that
// module (403), so the test's own plugin stands in for it.
func TestKubeletNRICpuset(t *testing.T) {
	requireTier(t)
	if runtime.NumCPU() < 2 {
		t.Fatal("needs 2 CPUs: a cpuset of CPU 0 would be every CPU, proving nothing")
	}
	plugin := buildNRIPlugin(t)
	e := newEnvWith(t, "", func(b *kubeenv.Berthd) func() {
		dir := t.TempDir()
		if err := os.Rename(plugin, filepath.Join(dir, "10-pinner")); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "10-pinner.conf"), []byte(`{"match": "pinned", "cpuset": "0"}`), 0o644); err != nil {
			t.Fatal(err)
		}
		b.AddConfig(t, fmt.Sprintf("[nri]\ndisable = false\ndisable_connections = true\nsocket_path = %q\nplugin_path = %q\nplugin_config_path = %q\n",
			filepath.Join(dir, "nri.sock"), dir, dir))
		return func() {}
	})
	e.writeManifest("placed", pinnedPod)
	p := e.waitPod(t, "placed", startTimeout, "both containers running", func(p *corev1.Pod) bool {
		for _, name := range []string{"pinned", "free"} {
			if c := ctrStatus(p, name); c == nil || c.State.Running == nil {
				return false
			}
		}
		return true
	})
	cpus := func(name string) string {
		c := e.runningContainer(t, string(p.UID), name)
		for _, line := range strings.Split(e.exec(t, c.Id, "cat", "/proc/self/status"), "\n") {
			if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
				return strings.TrimSpace(v)
			}
		}
		t.Fatalf("%s: no Cpus_allowed_list in /proc/self/status", name)
		return ""
	}
	if got := cpus("pinned"); got != "0" {
		t.Errorf("pinned container's CPUs %q, want the plugin's 0", got)
	}
	if got := cpus("free"); got == "0" {
		t.Errorf("the container the plugin leaves alone runs on CPU 0 alone too")
	}
	e.removeManifest("placed")
	kubeenv.WaitFor(t, 2*time.Minute, "berth has no pod left", func() (bool, string) {
		n, err := e.berthPodCount()
		return err == nil && n == 0, fmt.Sprintf("%d pods, %v", n, err)
	})
}

// buildNRIPlugin builds the integration tests' NRI plugin from the
// repository's module.
func buildNRIPlugin(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "nriplugin")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "./test/integration/testdata/nriplugin")
	cmd.Dir = kubeenv.RepoRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the NRI plugin: %v\n%s", err, out)
	}
	return bin
}
