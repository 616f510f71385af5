package spec

import (
	"slices"
	"syscall"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestProcessArgs(t *testing.T) {
	img := ocispec.ImageConfig{Entrypoint: []string{"/entry", "-x"}, Cmd: []string{"cmd1", "cmd2"}}
	for _, tc := range []struct {
		name          string
		command, args []string
		image         ocispec.ImageConfig
		want          []string
		err           string
	}{
		{name: "command and args", command: []string{"/bin/app"}, args: []string{"a"}, image: img, want: []string{"/bin/app", "a"}},
		{name: "command ignores image", command: []string{"/bin/app"}, image: img, want: []string{"/bin/app"}},
		{name: "args use entrypoint", args: []string{"a", "b"}, image: img, want: []string{"/entry", "-x", "a", "b"}},
		{name: "args without entrypoint", args: []string{"/bin/ls", "-l"}, image: ocispec.ImageConfig{Cmd: []string{"x"}}, want: []string{"/bin/ls", "-l"}},
		{name: "image entrypoint and cmd", image: img, want: []string{"/entry", "-x", "cmd1", "cmd2"}},
		{name: "image cmd only", image: ocispec.ImageConfig{Cmd: []string{"sh"}}, want: []string{"sh"}},
		{name: "nothing", err: "no command specified"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &runtimeapi.ContainerConfig{Command: tc.command, Args: tc.args}
			got, err := processArgs(cfg, tc.image.Entrypoint, tc.image.Cmd)
			if tc.err != "" {
				wantErr(t, err, tc.err)
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestGenerateNoCommand(t *testing.T) {
	in := baseInput(t)
	in.Config.Command, in.Config.Args = nil, nil
	_, err := Generate(in)
	wantErr(t, err, "no command specified")
}

func TestEnv(t *testing.T) {
	in := baseInput(t)
	in.Image.Env = []string{"A=1", "B=2", "C=3"}
	in.Config.Envs = []*runtimeapi.KeyValue{
		{Key: "B", Value: []byte("over")},
		{Key: "D", Value: []byte("4=four")},
	}
	s, err := Generate(in)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"A=1", "B=over", "C=3", "HOSTNAME=pod-host", "D=4=four", "PATH=" + DefaultPath}
	if !slices.Equal(s.Process.Env, want) {
		t.Fatalf("env %q, want %q", s.Process.Env, want)
	}

	// An image PATH is kept; a CRI PATH overrides it in place.
	got := buildEnv([]string{"PATH=/img"}, "h", nil)
	if !slices.Equal(got, []string{"PATH=/img", "HOSTNAME=h"}) {
		t.Fatalf("env %q", got)
	}
	got = buildEnv([]string{"PATH=/img", "X=1"}, "h", []*runtimeapi.KeyValue{{Key: "PATH", Value: []byte("/cri")}})
	if !slices.Equal(got, []string{"PATH=/cri", "X=1", "HOSTNAME=h"}) {
		t.Fatalf("env %q", got)
	}
	// An explicit CRI HOSTNAME wins over the pod's.
	got = buildEnv(nil, "h", []*runtimeapi.KeyValue{{Key: "HOSTNAME", Value: []byte("mine")}})
	if !slices.Equal(got, []string{"HOSTNAME=mine", "PATH=" + DefaultPath}) {
		t.Fatalf("env %q", got)
	}
}

func TestHostNetworkHostnameEnv(t *testing.T) {
	old := hostHostname
	hostHostname = func() (string, error) { return "node-1", nil }
	t.Cleanup(func() { hostHostname = old })

	in := baseInput(t)
	in.NetNS, in.UTSNS, in.HostNet = "", "", true
	in.Pod.Hostname = ""
	s, err := Generate(in)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(s.Process.Env, "HOSTNAME=node-1") {
		t.Fatalf("env %q lacks the node's hostname", s.Process.Env)
	}
	if s.Hostname != "" {
		t.Fatalf("hostname %q set without a UTS namespace", s.Hostname)
	}
}

func TestCwdTerminal(t *testing.T) {
	for _, tc := range []struct {
		cri, image, want, err string
	}{
		{cri: "/work", image: "/img", want: "/work"},
		{image: "/img/", want: "/img"},
		{want: "/"},
		{cri: "rel", err: `working_dir "rel"`},
		{image: "rel", err: `image WorkingDir "rel"`},
	} {
		in := baseInput(t)
		in.Config.WorkingDir = tc.cri
		in.Image.WorkingDir = tc.image
		in.Config.Tty = true
		s, err := Generate(in)
		if tc.err != "" {
			wantErr(t, err, tc.err)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if s.Process.Cwd != tc.want || !s.Process.Terminal {
			t.Fatalf("cwd %q terminal %v, want %q true", s.Process.Cwd, s.Process.Terminal, tc.want)
		}
	}
}

func TestStopSignal(t *testing.T) {
	for in, want := range map[string]syscall.Signal{
		"":            syscall.SIGTERM,
		"SIGQUIT":     syscall.SIGQUIT,
		"QUIT":        syscall.SIGQUIT,
		"quit":        syscall.SIGQUIT,
		"SigUsr1":     syscall.SIGUSR1,
		"3":           syscall.SIGQUIT,
		"9":           syscall.SIGKILL,
		"SIGWINCH":    syscall.SIGWINCH,
		"SIGRTMIN":    34,
		"SIGRTMIN+3":  37,
		"RTMAX-1":     63,
		" SIGINT ":    syscall.SIGINT,
		"SIGRTMAX-30": 34,
	} {
		got, err := StopSignal(in)
		if err != nil || got != want {
			t.Errorf("StopSignal(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"SIGBOGUS", "0", "65", "-1", "SIGRTMIN+31", "RTMAX-x"} {
		if _, err := StopSignal(bad); err == nil {
			t.Errorf("StopSignal(%q): want an error", bad)
		}
	}
}
