package integration

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/test/harness"
)

// What a cluster shows of berth's containers and pods: the image as the pod
// spec named it with its repo digest (kubectl get pod -o yaml: image,
// imageID), and the pod's network counters (the kubelet's /stats/summary).
func TestKubeletViews(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	img := imageStatus(t, e.d, e.image)
	if len(img.GetRepoDigests()) != 1 {
		t.Fatalf("pulled image has repo digests %v, want one", img.GetRepoDigests())
	}
	podCfg := e.podConfig("views")
	pod := e.runPod(t, podCfg)
	cfg := e.ctrConfig("web", webServer("views")...)
	// As the kubelet asks: the image ID, and the name the pod spec used.
	cfg.Image = &runtimeapi.ImageSpec{Image: img.Id, UserSpecifiedImage: e.image, Annotations: map[string]string{"example.com/arch": "amd64"}}
	ctr := e.runContainer(t, pod, podCfg, cfg)

	st, err := e.d.Runtime.ContainerStatus(ctx(t), &runtimeapi.ContainerStatusRequest{ContainerId: ctr})
	if err != nil {
		t.Fatal(err)
	}
	if s := st.Status; s.Image.GetImage() != e.image || s.Image.GetUserSpecifiedImage() != e.image ||
		!maps.Equal(s.Image.GetAnnotations(), cfg.Image.Annotations) || s.ImageRef != img.RepoDigests[0] || s.ImageId != img.Id {
		t.Errorf("ContainerStatus image %q (annotations %v), image_ref %q, image_id %q; want %q (%v), %q, %q",
			s.Image.GetImage(), s.Image.GetAnnotations(), s.ImageRef, s.ImageId, e.image, cfg.Image.Annotations, img.RepoDigests[0], img.Id)
	}
	list, err := e.d.Runtime.ListContainers(ctx(t), &runtimeapi.ListContainersRequest{})
	if err != nil || len(list.Containers) != 1 {
		t.Fatalf("ListContainers = %v, %v", list, err)
	}
	if c := list.Containers[0]; c.Image.GetImage() != e.image || c.ImageRef != img.RepoDigests[0] || c.ImageId != img.Id {
		t.Errorf("ListContainers image %q, image_ref %q, image_id %q", c.Image.GetImage(), c.ImageRef, c.ImageId)
	}

	// Traffic from the host to the pod (a refused connection is enough:
	// SYN in, RST out) shows in the pod's own counters.
	ip := e.podIP(t, pod)
	if conn, err := net.DialTimeout("tcp", net.JoinHostPort(ip, "1"), 3*time.Second); err == nil {
		conn.Close()
	}
	stats, err := e.d.Runtime.PodSandboxStats(ctx(t), &runtimeapi.PodSandboxStatsRequest{PodSandboxId: pod})
	if err != nil {
		t.Fatal(err)
	}
	eth0 := stats.Stats.GetLinux().GetNetwork().GetDefaultInterface()
	if eth0.GetName() != "eth0" || eth0.GetRxBytes().GetValue() == 0 || eth0.GetTxBytes().GetValue() == 0 {
		t.Errorf("pod network stats %v, want eth0 with bytes in and out", stats.Stats.GetLinux().GetNetwork())
	}

	// A pod on the host network has no interface of its own to report.
	hostCfg := e.podConfig("hostnet")
	hostCfg.Linux.SecurityContext = &runtimeapi.LinuxSandboxSecurityContext{
		NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE}}
	hostPod := e.runPod(t, hostCfg)
	hs, err := e.d.Runtime.PodSandboxStats(ctx(t), &runtimeapi.PodSandboxStatsRequest{PodSandboxId: hostPod})
	if err != nil || hs.Stats.GetLinux().GetNetwork() != nil {
		t.Errorf("host-network pod stats network = %v, %v; want none", hs.GetStats().GetLinux().GetNetwork(), err)
	}
	for _, p := range []string{pod, hostPod} {
		if _, err := e.d.Runtime.RemovePodSandbox(ctx(t), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p}); err != nil {
			t.Fatal(err)
		}
	}
	e.assertNoLeaks(t)
}

// The kubelet sends the node's pod CIDR once the control plane allocated it:
// new pods get addresses from it, it survives a restart, it waits while pods
// hold addresses in the old subnet, and a bad one names the field.
func TestUpdateRuntimeConfigPodCIDR(t *testing.T) {
	bridge, _ := harness.TestNetwork(t)
	// No subnet in the file: the kubelet's pod CIDR may replace the default.
	e := startPodEnvTOML(t, v1.Config{}, fmt.Sprintf("\n[network]\nbridge = %q\n", bridge))
	cidr := netip.MustParsePrefix(fmt.Sprintf("10.198.%d.0/24", os.Getpid()%256))
	update := func(podCIDR string) error {
		_, err := e.d.Runtime.UpdateRuntimeConfig(ctx(t), &runtimeapi.UpdateRuntimeConfigRequest{
			RuntimeConfig: &runtimeapi.RuntimeConfig{NetworkConfig: &runtimeapi.NetworkConfig{PodCidr: podCIDR}}})
		return err
	}
	if err := update("10.198.0.1/24"); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "pod_cidr") {
		t.Errorf("UpdateRuntimeConfig(host address) = %v, want InvalidArgument naming pod_cidr", err)
	}
	if err := update(""); err != nil {
		t.Errorf("UpdateRuntimeConfig(empty) = %v, want OK (nothing to change)", err)
	}
	if err := update(cidr.String()); err != nil {
		t.Fatalf("UpdateRuntimeConfig(%s) = %v", cidr, err)
	}
	inCIDR := func(pod string) bool {
		ip, err := netip.ParseAddr(e.podIP(t, pod))
		return err == nil && cidr.Contains(ip)
	}
	a := e.runPod(t, e.podConfig("cidr-a"))
	if !inCIDR(a) {
		t.Errorf("pod address %s not in the pod CIDR %s", e.podIP(t, a), cidr)
	}
	if err := update("10.197.0.0/24"); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("UpdateRuntimeConfig while a pod holds an address = %v, want FailedPrecondition", err)
	}
	e.d.Restart()
	if err := update(cidr.String()); err != nil {
		t.Errorf("the same CIDR again = %v", err)
	}
	b := e.runPod(t, e.podConfig("cidr-b"))
	if !inCIDR(a) || !inCIDR(b) {
		t.Errorf("after a restart: pods at %s and %s, want both in %s", e.podIP(t, a), e.podIP(t, b), cidr)
	}
	for _, p := range []string{a, b} {
		if _, err := e.d.Runtime.RemovePodSandbox(ctx(t), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p}); err != nil {
			t.Fatal(err)
		}
	}
	e.assertNoLeaks(t)
}
