package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/berth-runtime/berth/test/harness"
)

// checkOptions are what run.sh tells the check about the berthd it started.
type checkOptions struct {
	socket       string // berthd's CRI socket
	spec         string // the CDI spec file run.sh wrote into berthd's spec folder
	state        string // berthd's --state folder (for the leak checks)
	logs         string // a folder for the pod's container logs
	cgroupParent string // a cgroup name of the check's own, removed at the end
	berthdPID    int
}

// specFacts are what the check takes from the CDI spec: the kind, one GPU
// node's numbers (for the container that must not open it) and where
// nvidia-smi is mounted.
type specFacts struct {
	kind         string
	gpuNode      string
	major, minor int64
	nvidiaSMI    string
}

func readSpecFacts(file string) (specFacts, error) {
	s, err := cdi.ReadSpec(file, 0)
	if err != nil {
		return specFacts{}, err
	}
	f := specFacts{kind: s.Kind}
	for _, d := range s.Devices {
		if d.Name == "all" && len(d.ContainerEdits.DeviceNodes) > 0 {
			n := d.ContainerEdits.DeviceNodes[0]
			f.gpuNode, f.major, f.minor = n.Path, n.Major, n.Minor
		}
	}
	for _, m := range s.ContainerEdits.Mounts {
		if path.Base(m.ContainerPath) == "nvidia-smi" {
			f.nvidiaSMI = m.ContainerPath
		}
	}
	if f.gpuNode == "" || f.nvidiaSMI == "" {
		return f, fmt.Errorf("%s: no device \"all\" with a node, or no nvidia-smi mount: not a spec of crigpu cdi-spec", file)
	}
	return f, nil
}

// checker runs the steps against berthd, printing what each saw, and
// collects what failed; a step that cannot go on returns an error.
type checker struct {
	o        checkOptions
	facts    specFacts
	rt       runtimeapi.RuntimeServiceClient
	out      io.Writer
	checks   int
	failures []string
}

func (c *checker) expect(ok bool, format string, args ...any) {
	c.checks++
	msg := fmt.Sprintf(format, args...)
	if ok {
		fmt.Fprintf(c.out, "  ok: %s\n", msg)
		return
	}
	fmt.Fprintf(c.out, "  FAIL: %s\n", msg)
	c.failures = append(c.failures, msg)
}

// runCheck is the whole check. It returns an error when anything failed,
// after removing what it made.
func runCheck(ctx context.Context, o checkOptions, out io.Writer) error {
	facts, err := readSpecFacts(o.spec)
	if err != nil {
		return err
	}
	conn, err := dial(o.socket)
	if err != nil {
		return err
	}
	defer conn.Close()
	c := &checker{o: o, facts: facts, rt: runtimeapi.NewRuntimeServiceClient(conn), out: out}
	v, err := c.rt.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		return fmt.Errorf("CRI Version: %w", err)
	}
	fmt.Fprintf(out, "runtime: %s %s (CRI %s)\n", v.RuntimeName, v.RuntimeVersion, v.RuntimeApiVersion)

	podCfg := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: "gpu-check", Namespace: "berth-gpu", Uid: fmt.Sprintf("gpu-check-%d", os.Getpid())},
		Hostname:     "gpu-check",
		LogDirectory: o.logs,
		Linux:        &runtimeapi.LinuxPodSandboxConfig{CgroupParent: "/" + o.cgroupParent + "/pod-gpu-check"},
	}
	pod, err := c.rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: podCfg})
	if err != nil {
		return fmt.Errorf("RunPodSandbox: %w", err)
	}
	fmt.Fprintf(out, "pod %s running\n", pod.PodSandboxId)
	stepErr := c.steps(ctx, pod.PodSandboxId, podCfg)
	if stepErr != nil {
		c.failures = append(c.failures, stepErr.Error())
		fmt.Fprintf(out, "  FAIL: %v\n", stepErr)
	}
	c.cleanup(ctx, pod.PodSandboxId)

	if len(c.failures) > 0 {
		return fmt.Errorf("%d of %d checks failed:\n  %s", len(c.failures), c.checks, strings.Join(c.failures, "\n  "))
	}
	fmt.Fprintf(out, "gpu check: all %d checks passed\n", c.checks)
	return nil
}

var gpuLine = regexp.MustCompile(`(?m)^GPU [0-9]+: `)

// steps: a container given the GPUs lists and uses them; one without
// cannot; an unknown device is refused.
func (c *checker) steps(ctx context.Context, pod string, podCfg *runtimeapi.PodSandboxConfig) error {
	all := c.facts.kind + "=all"
	fmt.Fprintf(c.out, "\n== container \"gpu\" with CDI device %s\n", all)
	gpu, err := c.runContainer(ctx, pod, podCfg, "gpu", all)
	if err != nil {
		return err
	}
	r := c.exec(ctx, gpu, 60, c.facts.nvidiaSMI, "-L")
	c.expect(r.code == 0 && gpuLine.MatchString(r.stdout), "nvidia-smi -L lists a GPU in the container")
	r = c.exec(ctx, gpu, 10, "/bin/sh", "-c", "ls -l /dev/nvidia*; echo LD_LIBRARY_PATH=$LD_LIBRARY_PATH")
	c.expect(strings.Contains(r.stdout, c.facts.gpuNode), "%s is in the container", c.facts.gpuNode)
	// The first launch JIT-compiles the PTX: allow it minutes.
	r = c.exec(ctx, gpu, 300, vecaddPath)
	c.expect(r.code == 0 && strings.Contains(r.stdout, "CUDA vector add OK on"), "cuda-vecadd computes on the GPU in the container")

	fmt.Fprintf(c.out, "\n== container \"no-gpu\" without CDI devices\n")
	plain, err := c.runContainer(ctx, pod, podCfg, "no-gpu")
	if err != nil {
		return err
	}
	r = c.exec(ctx, plain, 10, "/bin/sh", "-c", "ls -d /dev/nvidia* 2>/dev/null; true")
	c.expect(r.stdout == "", "no /dev/nvidia* in the container")
	// It may make the node itself (CAP_MKNOD): the device cgroup must
	// still refuse to open it.
	r = c.exec(ctx, plain, 10, "/bin/sh", "-c", fmt.Sprintf("mknod /tmp/gpu c %d %d && exec 3>/tmp/gpu", c.facts.major, c.facts.minor))
	c.expect(r.code != 0 && strings.Contains(r.stderr, "Operation not permitted"),
		"a node it makes with the GPU's numbers (%d:%d) cannot be opened", c.facts.major, c.facts.minor)
	r = c.exec(ctx, plain, 60, vecaddPath)
	c.expect(r.code != 0 && strings.Contains(r.stderr, "cannot load the CUDA driver"), "cuda-vecadd finds no CUDA driver")
	r = c.exec(ctx, plain, 10, c.facts.nvidiaSMI, "-L")
	c.expect(r.code != 0 || r.err != nil, "nvidia-smi does not run in the container")

	fmt.Fprintf(c.out, "\n== a container asking for an unknown device\n")
	unknown := c.facts.kind + "=no-such-gpu"
	_, err = c.rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, SandboxConfig: podCfg,
		Config: c.containerConfig("unknown", unknown)})
	fmt.Fprintf(c.out, "CreateContainer with %s: %v\n", unknown, err)
	c.expect(status.Code(err) == codes.FailedPrecondition && strings.Contains(status.Convert(err).Message(), unknown),
		"refused with FailedPrecondition naming %s", unknown)
	list, err := c.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: pod}})
	if err != nil {
		return err
	}
	c.expect(len(list.Containers) == 2, "the refused container left nothing: %d containers in the pod (want 2)", len(list.Containers))
	return nil
}

func (c *checker) containerConfig(name string, cdiDevices ...string) *runtimeapi.ContainerConfig {
	cfg := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: name},
		Image:    &runtimeapi.ImageSpec{Image: imageRef},
		Command:  []string{"/bin/sleep", "100000"},
		LogPath:  name + ".log",
	}
	for _, d := range cdiDevices {
		cfg.CDIDevices = append(cfg.CDIDevices, &runtimeapi.CDIDevice{Name: d})
	}
	return cfg
}

// runContainer creates and starts a container and waits until it runs.
func (c *checker) runContainer(ctx context.Context, pod string, podCfg *runtimeapi.PodSandboxConfig, name string, cdiDevices ...string) (string, error) {
	resp, err := c.rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, SandboxConfig: podCfg,
		Config: c.containerConfig(name, cdiDevices...)})
	if err != nil {
		return "", fmt.Errorf("CreateContainer %s: %w", name, err)
	}
	id := resp.ContainerId
	if _, err := c.rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
		return "", fmt.Errorf("StartContainer %s: %w", name, err)
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		st, err := c.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
		if err != nil {
			return "", fmt.Errorf("ContainerStatus %s: %w", name, err)
		}
		switch st.Status.State {
		case runtimeapi.ContainerState_CONTAINER_RUNNING:
			fmt.Fprintf(c.out, "container %s (%s) running\n", name, id)
			return id, nil
		case runtimeapi.ContainerState_CONTAINER_EXITED:
			return "", fmt.Errorf("container %s exited at start: %s %s", name, st.Status.Reason, st.Status.Message)
		}
	}
	return "", fmt.Errorf("container %s not running after 30s", name)
}

type execResult struct {
	stdout, stderr string
	code           int32
	err            error
}

// exec runs cmd in a container (ExecSync, timeout seconds) and prints it
// with what it wrote.
func (c *checker) exec(ctx context.Context, id string, timeout int64, cmd ...string) execResult {
	resp, err := c.rt.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: cmd, Timeout: timeout})
	var r execResult
	if err != nil {
		r.err, r.code = err, -1
		fmt.Fprintf(c.out, "$ %s\n  (ExecSync: %v)\n", strings.Join(cmd, " "), err)
		return r
	}
	r.stdout, r.stderr, r.code = string(resp.Stdout), string(resp.Stderr), resp.ExitCode
	fmt.Fprintf(c.out, "$ %s   (exit %d)\n", strings.Join(cmd, " "), r.code)
	for _, text := range []string{r.stdout, r.stderr} {
		for line := range strings.Lines(text) {
			fmt.Fprintf(c.out, "  | %s", strings.TrimSuffix(line, "\n")+"\n")
		}
	}
	return r
}

// cleanup removes the pod and checks that berth left nothing of it: no
// pod or container, no mount below its state folder (its own private
// bind mount of state/pods aside), no process started from there but
// berthd, and no cgroup below the check's parent, which it then removes.
func (c *checker) cleanup(ctx context.Context, pod string) {
	fmt.Fprintf(c.out, "\n== cleanup\n")
	if _, err := c.rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod}); err != nil {
		c.expect(false, "StopPodSandbox: %v", err)
	}
	if _, err := c.rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod}); err != nil {
		c.expect(false, "RemovePodSandbox: %v", err)
	}
	pods, err := c.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	ctrs, err2 := c.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	c.expect(errors.Join(err, err2) == nil && len(pods.GetItems()) == 0 && len(ctrs.GetContainers()) == 0,
		"no pod or container left (%d pods, %d containers, %v)", len(pods.GetItems()), len(ctrs.GetContainers()), errors.Join(err, err2))

	// The shims exit once their pod is gone; give them a moment.
	var left []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		left = c.leftovers()
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	c.expect(len(left) == 0, "nothing of the pod left on the host %q", left)
	harness.RemoveCgroupTree(c.o.cgroupParent)
	c.expect(len(harness.CgroupDirs(c.o.cgroupParent)) == 0, "cgroup parent %s removed", c.o.cgroupParent)
}

func (c *checker) leftovers() []string {
	var left []string
	mounts, err := harness.MountPointsUnder(c.o.state)
	if err != nil {
		left = append(left, err.Error())
	}
	for _, m := range mounts {
		if m != filepath.Join(c.o.state, "pods") {
			left = append(left, "mount "+m)
		}
	}
	for _, pid := range harness.LiveProcessesWithArg(c.o.state) {
		if pid != c.o.berthdPID && pid != os.Getpid() {
			left = append(left, fmt.Sprintf("process %d", pid))
		}
	}
	left = append(left, harness.CgroupDirsUnder(c.o.cgroupParent)...)
	return left
}

func dial(socket string) (*grpc.ClientConn, error) {
	return grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// removePods removes every pod berthd has: what an interrupted check left
// (its pods outlive berthd by design, so run.sh removes them first).
func removePods(ctx context.Context, socket string) error {
	conn, err := dial(socket)
	if err != nil {
		return err
	}
	defer conn.Close()
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	pods, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range pods.Items {
		fmt.Printf("removing pod %s left by an interrupted check\n", p.Id)
		_, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.Id})
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
