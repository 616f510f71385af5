package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/kubeenv"
	"golang.org/x/sys/unix"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

// The test's own DRA driver: one device on the node, handed to a container
// as a CDI device whose spec the driver writes into berthd's CDI folder
// when the kubelet prepares a claim and removes when it unprepares it.
const (
	draDriver  = "dra.berth.test"
	draDevice  = "dev0"
	draCDIKind = "dra.berth.test/device"
	// draCtrPath is the device node in the container. The node the driver
	// makes has /dev/kmsg's numbers (1:11), which no container gets by
	// default, so opening it shows CDI's device cgroup rule; opening it for
	// writing needs no capability, and the test writes nothing.
	draCtrPath = "/dev/berth-dra"
	draEnv     = "BERTH_DRA_CLAIM"
)

// draDriverImpl is the kubeletplugin.DRAPlugin: Prepare writes a CDI spec
// per claim (named by the claim's UID, so that no cached spec can answer for
// it), Unprepare removes it.
type draDriverImpl struct {
	t      *testing.T
	cdiDir string
	node   string // the host's device node

	mu         sync.Mutex
	unprepared map[types.UID]bool
}

func (d *draDriverImpl) specPath(uid types.UID) string {
	return filepath.Join(d.cdiDir, "berth-dra-"+string(uid)+".json")
}

func (d *draDriverImpl) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	result := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		result[c.UID] = d.prepare(c)
	}
	return result, nil
}

func (d *draDriverImpl) prepare(c *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	id := draCDIKind + "=" + string(c.UID)
	spec := map[string]any{
		"cdiVersion": "0.7.0",
		"kind":       draCDIKind,
		"devices": []any{map[string]any{
			"name": string(c.UID),
			"containerEdits": map[string]any{
				"deviceNodes": []any{map[string]any{"path": draCtrPath, "hostPath": d.node}},
				"env":         []string{draEnv + "=" + c.Name},
			},
		}},
	}
	b, err := json.Marshal(spec)
	if err == nil {
		err = os.WriteFile(d.specPath(c.UID), b, 0o644)
	}
	if err != nil {
		return kubeletplugin.PrepareResult{Err: err}
	}
	var devices []kubeletplugin.Device
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == draDriver {
			devices = append(devices, kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device, CDIDeviceIDs: []string{id}})
		}
	}
	return kubeletplugin.PrepareResult{Devices: devices}
}

func (d *draDriverImpl) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	result := map[types.UID]error{}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range claims {
		err := os.Remove(d.specPath(c.UID))
		if errors.Is(err, os.ErrNotExist) {
			err = nil // Unprepare is asked again after a kubelet restart
		}
		result[c.UID] = err
		d.unprepared[c.UID] = true
	}
	return result, nil
}

func (d *draDriverImpl) wasUnprepared(uid types.UID) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.unprepared[uid]
}

// HandleError logs: every error of the slice publisher is retried (the
// test then checks the slice is there).
func (d *draDriverImpl) HandleError(_ context.Context, err error, msg string) {
	d.t.Logf("DRA driver: %s: %v", msg, err)
}

func (d *draDriverImpl) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

// startDRADriver runs the driver of node n in the test process: it
// registers with the node's kubelet through the kubelet's plugin
// registration folder, serves the DRA calls on a socket in its own folder
// under the kubelet's root, and publishes one device in a ResourceSlice of
// the node, whose spec it writes into the node's berth's CDI folder.
func (e *env) startDRADriver(t *testing.T, n *node) *draDriverImpl {
	t.Helper()
	node := e.path("dra-device")
	if err := unix.Mknod(node, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 11))); err != nil {
		t.Fatal(err)
	}
	d := &draDriverImpl{t: t, cdiDir: n.berthd.CDIDir, node: node, unprepared: map[types.UID]bool{}}
	cfg, err := clientcmd.BuildConfigFromFlags("", e.admin)
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	registry := filepath.Join(n.kubeletRoot, "plugins_registry")
	data := filepath.Join(n.kubeletRoot, "plugins", draDriver)
	kubeenv.Mkdirs(t, registry, data)
	helper, err := kubeletplugin.Start(context.Background(), d,
		kubeletplugin.DriverName(draDriver), kubeletplugin.NodeName(n.name), kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(registry), kubeletplugin.PluginDataDirectoryPath(data),
		kubeletplugin.HealthService(false))
	if err != nil {
		t.Fatalf("start the DRA driver: %v", err)
	}
	t.Cleanup(helper.Stop)
	kubeenv.WaitFor(t, time.Minute, "the kubelet to register the DRA driver", func() (bool, string) {
		s := helper.RegistrationStatus()
		return s != nil && s.PluginRegistered, fmt.Sprint(s)
	})
	err = helper.PublishResources(context.Background(), resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		n.name: {Slices: []resourceslice.Slice{{Devices: []resourceapi.Device{{Name: draDevice}}}}},
	}})
	if err != nil {
		t.Fatalf("publish the DRA driver's ResourceSlice: %v", err)
	}
	return d
}

const draYAML = `apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: berth-test}
spec:
  selectors:
  - cel: {expression: 'device.driver == "dra.berth.test"'}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: dra-claim, namespace: e2e}
spec:
  devices:
    requests:
    - name: dev
      exactly: {deviceClassName: berth-test}
---
apiVersion: v1
kind: Pod
metadata: {name: dra, namespace: e2e}
spec:
  terminationGracePeriodSeconds: 0
  resourceClaims:
  - {name: dev, resourceClaimName: dra-claim}
  containers:
  - name: main
    image: IMAGE
    command: ["sleep", "3600"]
    resources:
      claims: [{name: dev}]
`

// dra: a pod with a ResourceClaim is scheduled on the device the driver
// published on the second node (the only one with it), the kubelet has the
// driver prepare it, berth applies the CDI spec the driver wrote (the
// device node opens, the variable is set), and deleting the pod has the
// claim unprepared (its spec removed).
func (e *env) dra(t *testing.T) {
	n := e.nodes[1]
	d := e.startDRADriver(t, n)
	kubeenv.WaitFor(t, time.Minute, "the driver's ResourceSlice", func() (bool, string) {
		out, err := e.kubectlErr("get", "resourceslices", "--field-selector", "spec.driver="+draDriver, "-o", "jsonpath={.items[*].spec.devices[*].name}")
		return err == nil && out == draDevice, fmt.Sprintf("%q %v", out, err)
	})
	// Cleanups run last first: the pod goes before the driver stops, so
	// that the kubelet can still unprepare its claim.
	t.Cleanup(func() {
		_, _ = e.kubectlErr("delete", "-n", ns, "pod/dra", "resourceclaim/dra-claim", "--ignore-not-found", "--timeout", "2m")
		_, _ = e.kubectlErr("delete", "deviceclass/berth-test", "--ignore-not-found")
	})
	e.apply(t, draYAML)
	p := e.waitPod(t, ns, "dra", startTimeout, "Running", running)
	if p.Spec.NodeName != n.name {
		t.Errorf("pod dra scheduled to %q, want %s, the node of the device", p.Spec.NodeName, n.name)
	}

	var claim resourceapi.ResourceClaim
	if err := json.Unmarshal([]byte(e.kubectl(t, "get", "resourceclaim", "-n", ns, "dra-claim", "-o", "json")), &claim); err != nil {
		t.Fatal(err)
	}
	if a := claim.Status.Allocation; a == nil || len(a.Devices.Results) != 1 || a.Devices.Results[0].Device != draDevice ||
		len(claim.Status.ReservedFor) != 1 || claim.Status.ReservedFor[0].UID != p.UID {
		t.Errorf("claim status: %+v, want %s allocated and reserved for pod %s", claim.Status, draDevice, p.UID)
	}
	if got := e.exec(t, ns, "dra", "sh", "-c", openScript(draCtrPath)); got != "open\n" {
		t.Errorf("open %s in the pod: %q", draCtrPath, got)
	}
	if got := e.exec(t, ns, "dra", "sh", "-c", "stat -c '%t:%T' "+draCtrPath+"; echo $"+draEnv); got != "1:b\ndra-claim\n" {
		t.Errorf("device numbers and $%s in the pod: %q, want 1:b and the claim's name", draEnv, got)
	}
	if _, err := os.Stat(d.specPath(claim.UID)); err != nil {
		t.Errorf("the prepared claim's CDI spec: %v", err)
	}

	e.kubectl(t, "delete", "-n", ns, "pod/dra", "--timeout", "2m")
	kubeenv.WaitFor(t, time.Minute, "the kubelet to unprepare the claim", func() (bool, string) {
		_, err := os.Stat(d.specPath(claim.UID))
		return d.wasUnprepared(claim.UID) && errors.Is(err, os.ErrNotExist), fmt.Sprintf("unprepared %v, spec %v", d.wasUnprepared(claim.UID), err)
	})
	if out := e.kubectl(t, "get", "resourceclaim", "-n", ns, "dra-claim", "-o", "jsonpath={.status.reservedFor}"); strings.TrimSpace(out) != "" {
		t.Errorf("claim still reserved after its pod went: %s", out)
	}
}

// openScript opens the character device at path for writing (and writes
// nothing) and says whether that worked, with the error when not.
func openScript(path string) string {
	return fmt.Sprintf("if [ ! -c %[1]s ]; then echo not a device; elif (exec 3>%[1]s) 2>/tmp/err; then echo open; else cat /tmp/err; fi", path)
}
