package spec

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

const testPasswd = `root:x:0:0:root:/root:/bin/sh
# a comment

daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
www-data:x:33:33:www-data:/var/www:/usr/sbin/nologin
alice:x:1002:1002::/home/alice:/bin/sh
bob:x:1005:100::/home/bob:/bin/sh
broken:x:notanumber:1::/:/bin/sh
+nisuser
`

const testGroup = `root:x:0:
wheel:x:10:root
users:x:100:
www-data:x:33:
staff:x:50:alice,www-data
video:x:44: alice
alice:x:1002:alice
`

// fakeRootfs makes <tmp>/rootfs with etc/passwd and etc/group (either may be
// "" to leave it out) and returns its path.
func fakeRootfs(t *testing.T, passwd, group string) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "rootfs")
	mustMkdir(t, filepath.Join(root, "etc"))
	if passwd != "" {
		writeFile(t, filepath.Join(root, "etc/passwd"), passwd)
	}
	if group != "" {
		writeFile(t, filepath.Join(root, "etc/group"), group)
	}
	return root
}

func mustMkdir(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, p, data string) {
	t.Helper()
	mustMkdir(t, filepath.Dir(p))
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	mustMkdir(t, filepath.Dir(link))
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// bothResolvers runs f with openat2 and with the fallback resolver.
func bothResolvers(t *testing.T, f func(t *testing.T)) {
	for _, use := range []bool{true, false} {
		name := "openat2"
		if !use {
			name = "fallback"
		}
		t.Run(name, func(t *testing.T) {
			old := useOpenat2
			useOpenat2 = use
			t.Cleanup(func() { useOpenat2 = old })
			f(t)
		})
	}
}

func wantErr(t *testing.T, err error, substrs ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("want an error containing %q, got nil", substrs)
	}
	for _, s := range substrs {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("error %q does not contain %q", err, s)
		}
	}
}

func baseInput(t *testing.T) Input {
	t.Helper()
	return Input{
		ContainerID: "c1",
		Config: &runtimeapi.ContainerConfig{
			Metadata: &runtimeapi.ContainerMetadata{Name: "app"},
			Image:    &runtimeapi.ImageSpec{Image: "docker.io/library/busybox:latest"},
			Command:  []string{"/bin/sh"},
			Args:     []string{"-c", "true"},
		},
		Pod: &runtimeapi.PodSandboxConfig{
			Metadata: &runtimeapi.PodSandboxMetadata{Name: "pod", Namespace: "ns", Uid: "uid-1"},
			Hostname: "pod-host",
		},
		RootfsPath: fakeRootfs(t, testPasswd, testGroup),
		NetNS:      "/run/berth/ns/net-1",
		IPCNS:      "/run/berth/ns/ipc-1",
		UTSNS:      "/run/berth/ns/uts-1",
	}
}

func secCtx(in *Input) *runtimeapi.LinuxContainerSecurityContext {
	if in.Config.Linux == nil {
		in.Config.Linux = &runtimeapi.LinuxContainerConfig{}
	}
	if in.Config.Linux.SecurityContext == nil {
		in.Config.Linux.SecurityContext = &runtimeapi.LinuxContainerSecurityContext{}
	}
	return in.Config.Linux.SecurityContext
}

func findMount(ms []specs.Mount, dst string) *specs.Mount {
	for i := range ms {
		if ms[i].Destination == dst {
			return &ms[i]
		}
	}
	return nil
}
