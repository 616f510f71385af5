package integration

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/berth-runtime/berth/test/harness"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// probeProgram is a static Go program for the seccomp tests. Its modes:
//
//	cat        copy stdin to stdout (a real binary in a shell pipeline)
//	exec-net   run itself as a child through os/exec and read its output
//	           through a pipe, then serve and dial TCP on 127.0.0.1; print OK
//	syscalls   call each system call of probeCalls with arguments the kernel
//	           refuses (flags of all ones) and print "NAME ERRNO" lines
//	           (0: it succeeded)
const probeProgram = `package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"syscall"
)

// The calls past 424 have one number on every architecture.
var probeCalls = []struct {
	name string
	nr   uintptr
	args [6]uintptr
}{
	{"pipe2", syscall.SYS_PIPE2, [6]uintptr{0, ^uintptr(0)}},
	{"keyctl", syscall.SYS_KEYCTL, [6]uintptr{^uintptr(0)}},
	{"cachestat", 451, [6]uintptr{^uintptr(0), 0, 0, ^uintptr(0)}},
	{"fchmodat2", 452, [6]uintptr{^uintptr(0), 0, 0, ^uintptr(0)}},
	{"futex_wake", 454, [6]uintptr{0, 0, 0, ^uintptr(0)}},
	{"futex_wait", 455, [6]uintptr{0, 0, 0, ^uintptr(0)}},
	{"futex_requeue", 456, [6]uintptr{0, ^uintptr(0)}},
	{"statmount", 457, [6]uintptr{0, 0, 0, ^uintptr(0)}},
	{"listmount", 458, [6]uintptr{0, 0, 0, ^uintptr(0)}},
	{"lsm_get_self_attr", 459, [6]uintptr{0, 0, 0, ^uintptr(0)}},
	{"lsm_set_self_attr", 460, [6]uintptr{0, 0, 0, ^uintptr(0)}},
	{"lsm_list_modules", 461, [6]uintptr{0, 0, ^uintptr(0)}},
	{"mseal", 462, [6]uintptr{1, 0, ^uintptr(0)}},
	{"setxattrat", 463, [6]uintptr{^uintptr(0), 0, ^uintptr(0)}},
	{"getxattrat", 464, [6]uintptr{^uintptr(0), 0, ^uintptr(0)}},
	{"listxattrat", 465, [6]uintptr{^uintptr(0), 0, ^uintptr(0)}},
	{"removexattrat", 466, [6]uintptr{^uintptr(0), 0, ^uintptr(0)}},
}

func main() {
	switch os.Args[1] {
	case "cat":
		io.Copy(os.Stdout, os.Stdin)
	case "child":
		fmt.Println("child says hi")
	case "exec-net":
		if err := execAndNet(); err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		fmt.Println("OK")
	case "syscalls":
		for _, c := range probeCalls {
			_, _, errno := syscall.Syscall6(c.nr, c.args[0], c.args[1], c.args[2], c.args[3], c.args[4], c.args[5])
			fmt.Println(c.name, int(errno))
		}
	}
}

func execAndNet() error {
	out, err := exec.Command(os.Args[0], "child").Output()
	if err != nil || string(out) != "child says hi\n" {
		return fmt.Errorf("os/exec: %q, %v", out, err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err == nil {
			fmt.Fprintln(c, "pong")
			c.Close()
		}
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		return err
	}
	defer c.Close()
	if line, err := bufio.NewReader(c).ReadString('\n'); line != "pong\n" {
		return fmt.Errorf("tcp: %q, %v", line, err)
	}
	return nil
}
`

// nginxConf runs a master and two workers (as nobody) that serve /www on
// port 8080, logging to stderr.
const nginxConf = `worker_processes 2;
pid /tmp/nginx.pid;
events { worker_connections 64; }
http {
	access_log off;
	server {
		listen 8080;
		root /www;
	}
}
`

const nginxPage = "served by an nginx worker under RuntimeDefault\n"

// seccompProgramsImage is busybox with the probe program at /probe and
// Debian's nginx with its libraries, configuration and page.
func seccompProgramsImage(t *testing.T) v1.Image {
	nginx := append(harness.HostProgramFiles(t, "/usr/sbin/nginx", "nginx-light"),
		harness.Dir("etc/nginx", 0o755),
		harness.Reg("etc/nginx/nginx.conf", nginxConf, 0o644),
		harness.Dir("var/lib/nginx", 0o755),
		harness.Dir("www", 0o755),
		harness.Reg("www/index.html", nginxPage, 0o644),
	)
	probe := []harness.File{{Path: "probe", Content: harness.StaticGoProgram(t, probeProgram), Mode: 0o755}}
	return harness.BusyboxImage(t, harness.ImageSpec{Layers: [][]harness.File{probe, nginx}})
}

// TestSeccompRuntimeDefaultRunsPrograms runs real programs in containers
// under berth's RuntimeDefault profile (what Pod Security "restricted"
// demands): shell pipelines (pipe2 and fork, with a busybox applet and with
// a separate binary), a Go program that uses os/exec and TCP sockets, nginx
// with worker processes serving the node, and single system calls that
// must answer as they do unconfined.
func TestSeccompRuntimeDefaultRunsPrograms(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	p := e.reg.Push(t, "berth/seccomp-programs:1", seccompProgramsImage(t))
	mustPull(t, e.d, p.Name, p.ID)
	cfg := e.podConfig("seccomp-programs")
	pod := e.runPod(t, cfg)
	ctr := func(name string, profile *runtimeapi.SecurityProfile, cmd ...string) *runtimeapi.ContainerConfig {
		c := e.ctrConfig(name, cmd...)
		c.Image.Image = p.Name
		c.Linux = &runtimeapi.LinuxContainerConfig{SecurityContext: &runtimeapi.LinuxContainerSecurityContext{Seccomp: profile}}
		return c
	}
	run := func(t *testing.T, name string, profile *runtimeapi.SecurityProfile, cmd ...string) string {
		t.Helper()
		st, out := e.runToExit(t, pod, cfg, ctr(name, profile, cmd...))
		if st.ExitCode != 0 {
			t.Errorf("%s exited %d: stdout %q, stderr %q", name, st.ExitCode, out, logText(readLog(t, st.LogPath), "stderr"))
		}
		return out
	}

	for _, c := range []struct {
		name string
		cmd  []string
		want string
	}{
		{"pipeline", []string{"/bin/sh", "-c", "echo piped | cat"}, "piped\n"},
		{"pipeline-binary", []string{"/bin/sh", "-c", "echo piped | /probe cat | /probe cat"}, "piped\n"},
		{"go-exec-net", []string{"/probe", "exec-net"}, "OK\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if out := run(t, c.name, runtimeDefault(), c.cmd...); out != c.want {
				t.Errorf("%q under RuntimeDefault printed %q, want %q", c.cmd, out, c.want)
			}
		})
	}

	t.Run("syscalls", func(t *testing.T) {
		unconfined := probeErrnos(t, run(t, "syscalls-unconfined",
			&runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_Unconfined}, "/probe", "syscalls"))
		confined := probeErrnos(t, run(t, "syscalls-runtime-default", runtimeDefault(), "/probe", "syscalls"))
		checkProbeErrnos(t, unconfined, confined)
	})

	t.Run("nginx", func(t *testing.T) {
		id := e.runContainer(t, pod, cfg, ctr("nginx", runtimeDefault(), "/usr/sbin/nginx", "-g", "daemon off;"))
		if got := httpGet(t, fmt.Sprintf("http://%s:8080/", e.podIP(t, pod))); got != nginxPage {
			t.Errorf("GET from nginx under RuntimeDefault: %q, want %q", got, nginxPage)
		}
		if ps := e.sh(t, id, "ps -o args"); strings.Count(ps, "nginx: worker process") != 2 {
			t.Errorf("want an nginx master and two workers, ps shows:\n%s", ps)
		}
		e.stop(t, id, 10)
	})
	e.removePod(t, pod)
	e.assertNoLeaks(t)
}

// probeErrnos parses the probe's "NAME ERRNO" lines.
func probeErrnos(t *testing.T, out string) map[string]unix.Errno {
	t.Helper()
	m := map[string]unix.Errno{}
	for line := range strings.Lines(out) {
		name, n, _ := strings.Cut(strings.TrimSpace(line), " ")
		v, err := strconv.Atoi(n)
		if err != nil {
			t.Fatalf("probe output %q", out)
		}
		m[name] = unix.Errno(v)
	}
	return m
}

// checkProbeErrnos holds RuntimeDefault's answers to the probe's calls
// against the unconfined ones. keyctl is refused (EPERM: the filter is on);
// every other call is allowed, so it answers as unconfined, with one
// exception by design: a call the shim's libseccomp cannot name is left out
// of the filter by libcontainer, whose filter answers ENOSYS for every call
// numbered past the last one it names, so the program sees a kernel without
// that call and takes its fallback. Those are logged.
func checkProbeErrnos(t *testing.T, unconfined, confined map[string]unix.Errno) {
	t.Helper()
	if len(confined) != len(unconfined) || len(confined) == 0 {
		t.Fatalf("probe answered %v unconfined, %v under RuntimeDefault", unconfined, confined)
	}
	if confined["keyctl"] != unix.EPERM || unconfined["keyctl"] == unix.EPERM {
		t.Errorf("keyctl: %v under RuntimeDefault, %v unconfined; want EPERM only under RuntimeDefault",
			confined["keyctl"], unconfined["keyctl"])
	}
	var unnamed []string
	for name, want := range unconfined {
		got := confined[name]
		switch {
		case name == "keyctl" || got == want:
		case got == unix.ENOSYS:
			unnamed = append(unnamed, name)
		default:
			t.Errorf("%s: %v (%d) under RuntimeDefault, %v (%d) unconfined", name, got, got, want, want)
		}
	}
	if len(unnamed) > 0 {
		slices.Sort(unnamed)
		t.Logf("the shim's libseccomp cannot name %v: under RuntimeDefault they answer ENOSYS, as on a kernel without them", unnamed)
	}
}
