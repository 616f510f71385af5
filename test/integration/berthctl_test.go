package integration

import (
	"regexp"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestBerthctlPodsTimelineInfo runs berthctl against a real berthd: the pod
// table, the start timeline with a bar and milliseconds for every phase of
// the pod (with a shared PID namespace: its pause too) and of each
// container, and the daemon's setup.
func TestBerthctlPodsTimelineInfo(t *testing.T) {
	t.Parallel()
	e := startPodEnvTOML(t, v1.Config{}, metricsTOML)
	cfg := e.podConfig("chart")
	cfg.Linux.SecurityContext = &runtimeapi.LinuxSandboxSecurityContext{
		NamespaceOptions: &runtimeapi.NamespaceOption{Pid: runtimeapi.NamespaceMode_POD}}
	pod := e.runPod(t, cfg)
	e.runContainer(t, pod, cfg, e.ctrConfig("first", sleeper...))
	e.runContainer(t, pod, cfg, e.ctrConfig("second", sleeper...))

	out, err := e.d.Berthctl("pods")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^` + pod[:13] + `\s+default\s+chart\s+READY\s+2/2\s+10\.\d+\.\d+\.\d+\s+\d+s$`).MatchString(out) {
		t.Errorf("berthctl pods:\n%s", out)
	}

	for _, arg := range []string{pod[:8], "chart", "default/chart"} {
		out, err = e.d.Berthctl("timeline", arg)
		if err != nil {
			t.Fatal(err)
		}
		sections := strings.Split(out, "\n\n")
		if len(sections) != 3 || !strings.HasPrefix(sections[0], "pod default/chart "+pod[:13]) ||
			!strings.HasPrefix(sections[1], "container first ") || !strings.HasPrefix(sections[2], "container second ") {
			t.Fatalf("timeline %s: want the pod, then first and second:\n%s", arg, out)
		}
		phases := [][]string{{"namespaces", "network", "cgroup", "files", "shim", "pause"},
			{"rootfs", "spec", "create", "start"}, {"rootfs", "spec", "create", "start"}}
		for i, sec := range sections {
			for _, ph := range phases[i] {
				// A bar of at least an eighth, then the milliseconds.
				if !regexp.MustCompile(`(?m)^  ` + ph + `\s+[█▉▊▋▌▍▎▏]+\s+\d+\.\d ms$`).MatchString(sec) {
					t.Errorf("timeline %s: no bar for %s in\n%s", arg, ph, sec)
				}
			}
			if !regexp.MustCompile(`total \d+\.\d ms`).MatchString(sec) {
				t.Errorf("timeline %s: no total in\n%s", arg, sec)
			}
		}
	}
	if _, err := e.d.Berthctl("timeline", "nosuchpod"); err == nil || !strings.Contains(err.Error(), `no pod "nosuchpod"`) {
		t.Errorf("timeline of an unknown pod: %v", err)
	}

	out, err = e.d.Berthctl("info")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"version:        berth ", "root:           " + e.d.Root, "network:        bridge",
		"metrics:        127.0.0.1:", "condition:      RuntimeReady=true", "registry:       " + e.reg.Host() + ": plain http"} {
		if !strings.Contains(out, want) {
			t.Errorf("berthctl info lacks %q:\n%s", want, out)
		}
	}
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}
