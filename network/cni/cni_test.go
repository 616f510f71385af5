package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/berth-runtime/berth/network"
)

// fakeEnv is a CNI network whose plugins are shell scripts that log each
// call (command, container, netns, args, ifname, stdin) to calls and answer
// ADD with a fixed result; ADD fails while the file fail exists.
type fakeEnv struct {
	*Network
	confDir, calls, fail string
}

const fakePlugin = `#!/bin/sh
stdin=$(cat)
printf '%%s|%%s|%%s|%%s|%%s|%%s|%%s\n' "$(basename "$0")" "$CNI_COMMAND" "$CNI_CONTAINERID" "$CNI_NETNS" "$CNI_ARGS" "$CNI_IFNAME" "$stdin" >> %[1]s
case "$CNI_COMMAND" in
ADD)
	if [ -e %[2]s ] && [ "$(basename "$0")" = fakefail ]; then
		echo '{"cniVersion":"1.0.0","code":11,"msg":"fake failure"}'
		exit 1
	fi
	echo '{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"'"$CNI_NETNS"'"}],"ips":[{"address":"fd00::5/64","interface":0},{"address":"10.1.2.3/24","gateway":"10.1.2.1","interface":0}]}'
	;;
VERSION)
	echo '{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}'
	;;
esac
`

const fakeList = `{"cniVersion":"1.0.0","name":"fakenet","plugins":[
	{"type":"fake","capabilities":{"portMappings":true,"bandwidth":true}},
	{"type":"fakefail"}]}`

func newFakeEnv(t *testing.T) *fakeEnv {
	t.Helper()
	dir := t.TempDir()
	e := &fakeEnv{confDir: filepath.Join(dir, "net.d"), calls: filepath.Join(dir, "calls"), fail: filepath.Join(dir, "fail")}
	bin := filepath.Join(dir, "bin")
	for _, name := range []string{"fake", "fakefail"} {
		writeFile(t, filepath.Join(bin, name), fmt.Sprintf(fakePlugin, e.calls, e.fail), 0o755)
	}
	n, err := New(Config{ConfDir: e.confDir, BinDirs: []string{filepath.Join(dir, "nobin"), bin},
		CacheDir: filepath.Join(dir, "cache"), StateDir: filepath.Join(dir, "pods")}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	e.Network = n
	return e
}

type call struct {
	plugin, command, container, netns, args, ifname string
	conf                                            map[string]any
}

// takeCalls returns the plugin calls since the last takeCalls.
func (e *fakeEnv) takeCalls(t *testing.T) []call {
	t.Helper()
	b, err := os.ReadFile(e.calls)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(e.calls)
	var out []call
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(line, "|", 7)
		c := call{plugin: f[0], command: f[1], container: f[2], netns: f[3], args: f[4], ifname: f[5]}
		if err := json.Unmarshal([]byte(f[6]), &c.conf); err != nil {
			t.Fatalf("stdin of %s: %v: %s", f[0], err, f[6])
		}
		out = append(out, c)
	}
	return out
}

func commands(calls []call) string {
	var s []string
	for _, c := range calls {
		s = append(s, c.command+" "+c.plugin)
	}
	return strings.Join(s, ", ")
}

const podID = "0123456789abcdef"

var testPod = network.PodInfo{ID: podID, Name: "web", Namespace: "default", UID: "u-1",
	Annotations: map[string]string{EgressBandwidthAnnotation: "1M"}}

func TestReadyFollowsTheFolder(t *testing.T) {
	e := newFakeEnv(t)
	ok, why := e.Ready()
	if ok || !strings.Contains(why, "no network configuration in "+e.confDir) {
		t.Fatalf("Ready with no folder = %v, %q", ok, why)
	}
	if _, err := e.Attach(t.Context(), testPod, "/proc/self/ns/net", nil); err == nil || !strings.Contains(err.Error(), "not ready") {
		t.Fatalf("Attach while not ready: %v", err)
	}
	writeFile(t, filepath.Join(e.confDir, "10-fake.conflist"), fakeList, 0o644)
	if ok, why := e.Ready(); !ok {
		t.Fatalf("Ready after a configuration appeared = false, %q", why)
	}
	writeFile(t, filepath.Join(e.confDir, "05-broken.conf"), "{", 0o644)
	if ok, why := e.Ready(); ok || !strings.Contains(why, "05-broken.conf") {
		t.Fatalf("Ready with a broken first file = %v, %q", ok, why)
	}
	os.Remove(filepath.Join(e.confDir, "05-broken.conf"))
	writeFile(t, filepath.Join(e.confDir, "05-missing.conflist"), `{"cniVersion":"1.0.0","name":"m","plugins":[{"type":"calico"}]}`, 0o644)
	if ok, why := e.Ready(); ok || !strings.Contains(why, `plugin "calico" not found`) {
		t.Fatalf("Ready with a missing plugin = %v, %q", ok, why)
	}
	if e.takeCalls(t) != nil {
		t.Error("Ready ran plugins")
	}
}

func TestAttachDetach(t *testing.T) {
	e := newFakeEnv(t)
	writeFile(t, filepath.Join(e.confDir, "10-fake.conflist"), fakeList, 0o644)
	netns := "/proc/self/ns/net" // a live namespace, as a pin is
	att, err := e.Attach(t.Context(), testPod, netns, []network.PortMapping{
		{Protocol: "TCP", ContainerPort: 80, HostPort: 8080}, {Protocol: "UDP", ContainerPort: 53}})
	if err != nil {
		t.Fatal(err)
	}
	if att.IP.String() != "10.1.2.3" || len(att.AdditionalIPs) != 1 || att.AdditionalIPs[0].String() != "fd00::5" ||
		att.Gateway.String() != "10.1.2.1" || len(att.Ports) != 1 {
		t.Errorf("attachment %+v", att)
	}
	calls := e.takeCalls(t)
	if commands(calls) != "ADD fake, ADD fakefail" {
		t.Fatalf("calls: %s", commands(calls))
	}
	wantArgs := "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;K8S_POD_INFRA_CONTAINER_ID=" + podID + ";K8S_POD_UID=u-1"
	for _, c := range calls {
		if c.container != podID || c.netns != netns || c.ifname != "eth0" || c.args != wantArgs {
			t.Errorf("%s %s: container %q netns %q ifname %q args %q", c.command, c.plugin, c.container, c.netns, c.ifname, c.args)
		}
	}
	rc, _ := json.Marshal(calls[0].conf["runtimeConfig"])
	if want := `{"bandwidth":{"egressBurst":4294967295,"egressRate":1000000},"portMappings":[{"containerPort":80,"hostPort":8080,"protocol":"tcp"}]}`; string(rc) != want {
		t.Errorf("runtimeConfig %s\nwant %s", rc, want)
	}
	if _, ok := calls[1].conf["runtimeConfig"]; ok {
		t.Errorf("a plugin without capabilities got runtimeConfig: %v", calls[1].conf)
	}
	if calls[1].conf["prevResult"] == nil {
		t.Error("the second plugin got no prevResult")
	}
	if _, err := os.Stat(e.recordPath(podID)); err != nil {
		t.Fatalf("no pod record after ADD: %v", err)
	}

	// A changed configuration does not change what DEL runs.
	writeFile(t, filepath.Join(e.confDir, "01-other.conflist"), `{"cniVersion":"1.0.0","name":"other","plugins":[{"type":"fake"}]}`, 0o644)
	if err := e.Detach(t.Context(), testPod, netns); err != nil {
		t.Fatal(err)
	}
	calls = e.takeCalls(t)
	if commands(calls) != "DEL fakefail, DEL fake" {
		t.Fatalf("calls: %s", commands(calls))
	}
	for _, c := range calls {
		if c.netns != netns || c.args != wantArgs || c.conf["name"] != "fakenet" || c.conf["prevResult"] == nil {
			t.Errorf("DEL %s: netns %q args %q conf %v", c.plugin, c.netns, c.args, c.conf)
		}
	}
	if _, err := os.Stat(e.recordPath(podID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pod record after DEL: %v", err)
	}
	// Idempotent: nothing recorded, nothing to run.
	if err := e.Detach(t.Context(), testPod, netns); err != nil {
		t.Fatal(err)
	}
	if calls := e.takeCalls(t); len(calls) != 0 {
		t.Errorf("a second Detach ran %s", commands(calls))
	}
}

func TestDetachWithoutNamespace(t *testing.T) {
	e := newFakeEnv(t)
	writeFile(t, filepath.Join(e.confDir, "10-fake.conflist"), fakeList, 0o644)
	pin := filepath.Join(t.TempDir(), "net") // what a pin is after a reboot: an empty file
	writeFile(t, pin, "", 0o644)
	if _, err := e.Attach(t.Context(), testPod, pin, nil); err != nil {
		t.Fatal(err)
	}
	e.takeCalls(t)
	if err := e.Detach(t.Context(), testPod, pin); err != nil {
		t.Fatal(err)
	}
	calls := e.takeCalls(t)
	if commands(calls) != "DEL fakefail, DEL fake" {
		t.Fatalf("calls: %s", commands(calls))
	}
	for _, c := range calls {
		if c.netns != "" {
			t.Errorf("DEL with a namespace that is gone got CNI_NETNS=%q, want empty", c.netns)
		}
	}
}

func TestFailedAddIsUndone(t *testing.T) {
	e := newFakeEnv(t)
	writeFile(t, filepath.Join(e.confDir, "10-fake.conflist"), fakeList, 0o644)
	writeFile(t, e.fail, "", 0o644)
	_, err := e.Attach(t.Context(), testPod, "/proc/self/ns/net", nil)
	if err == nil || !strings.Contains(err.Error(), "fake failure") || !strings.Contains(err.Error(), `"fakenet"`) ||
		!strings.Contains(err.Error(), "10-fake.conflist") {
		t.Fatalf("Attach with a failing plugin: %v", err)
	}
	if got := commands(e.takeCalls(t)); got != "ADD fake, ADD fakefail, DEL fakefail, DEL fake" {
		t.Errorf("calls: %s", got)
	}
	if _, err := os.Stat(e.recordPath(podID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pod record after an undone ADD: %v", err)
	}
}

func TestReconcile(t *testing.T) {
	e := newFakeEnv(t)
	writeFile(t, filepath.Join(e.confDir, "10-fake.conflist"), fakeList, 0o644)
	live, gone := testPod, testPod
	live.ID, gone.ID = "aaaa", "bbbb"
	for _, p := range []network.PodInfo{live, gone} {
		if _, err := e.Attach(t.Context(), p, "/proc/self/ns/net", nil); err != nil {
			t.Fatal(err)
		}
	}
	e.takeCalls(t)
	// The configuration is gone: DEL needs only the records.
	os.RemoveAll(e.confDir)
	if err := e.Reconcile(context.Background(), map[string]bool{"aaaa": true}); err != nil {
		t.Fatal(err)
	}
	calls := e.takeCalls(t)
	// Pods are reconciled in parallel: keep each pod's calls in order.
	slices.SortStableFunc(calls, func(a, b call) int { return strings.Compare(a.container, b.container) })
	var got []string
	for _, c := range calls {
		got = append(got, c.command+" "+c.plugin+" "+c.container)
	}
	want := "CHECK fake aaaa, CHECK fakefail aaaa, DEL fakefail bbbb, DEL fake bbbb"
	if strings.Join(got, ", ") != want {
		t.Errorf("calls: %s\nwant   %s", strings.Join(got, ", "), want)
	}
	pods, _ := e.recordedPods()
	if len(pods) != 1 || pods[0] != "aaaa" {
		t.Errorf("records left: %v", pods)
	}
}

func TestBadPodInput(t *testing.T) {
	e := newFakeEnv(t)
	writeFile(t, filepath.Join(e.confDir, "10-fake.conflist"), fakeList, 0o644)
	for name, tc := range map[string]struct {
		pod   network.PodInfo
		netns string
		ports []network.PortMapping
	}{
		"bad id":        {network.PodInfo{ID: "../x"}, "/proc/self/ns/net", nil},
		"no netns":      {testPod, "", nil},
		"bad protocol":  {testPod, "/proc/self/ns/net", []network.PortMapping{{Protocol: "ICMP", ContainerPort: 1, HostPort: 1}}},
		"bad bandwidth": {network.PodInfo{ID: "x", Annotations: map[string]string{IngressBandwidthAnnotation: "lots"}}, "/proc/self/ns/net", nil},
	} {
		if _, err := e.Attach(t.Context(), tc.pod, tc.netns, tc.ports); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if calls := e.takeCalls(t); len(calls) != 0 {
		t.Errorf("bad input ran plugins: %s", commands(calls))
	}
	if pods, _ := e.recordedPods(); len(pods) != 0 {
		t.Errorf("bad input left records: %v", pods)
	}
}

// BenchmarkReady is the cost of reading the folder again at every Ready
// and Attach instead of watching it.
func BenchmarkReady(b *testing.B) {
	dir := b.TempDir()
	bin, conf := filepath.Join(dir, "bin"), filepath.Join(dir, "net.d")
	files := map[string]string{"bin/bridge": "", "bin/portmap": "", "net.d/10.conflist": bridgeList,
		"net.d/20.conf": bridgeConf, "net.d/30.conf": bridgeConf}
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
			b.Fatal(err)
		}
	}
	n, err := New(Config{ConfDir: conf, BinDirs: []string{bin}, CacheDir: dir, StateDir: dir}, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if ok, why := n.Ready(); !ok {
			b.Fatal(why)
		}
	}
}
