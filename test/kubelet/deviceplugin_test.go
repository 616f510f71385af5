package kubelet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/kubeenv"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	deviceplugin "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresources "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// The widget: a device plugin resource whose one device reaches containers
// through CDI alone. Its node has /dev/kmsg's numbers (1:11), which no
// container is allowed by default and which opens for writing without a
// capability (nothing is written); /dev/fuse's (10:229) are the device no
// rule allows.
const (
	widgetResource = "berth.test/widget" // the resource name and the CDI kind
	widgetID       = "w0"
	widgetCtrPath  = "/dev/widget"
	widgetEnv      = "BERTH_WIDGET=w0"
	widgetMount    = "/widget/info"
	widgetInfo     = "widget w0 from CDI"
)

// widgetPod requests the widget; its container prints what it got, one
// line per check, then sleeps (so that the kubelet lists its allocation).
// /dev/widget and /widget/info are widgetCtrPath and widgetMount.
const widgetPod = `apiVersion: v1
kind: Pod
metadata:
  name: widget
  namespace: e2e
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: user
    image: IMAGE
    command:
    - sh
    - -c
    - |
      echo "env: $BERTH_WIDGET"
      echo "node: $(stat -c '%t:%T %F' /dev/widget 2>&1)"
      if (exec 3>/dev/widget) 2>/tmp/err; then echo "open widget: ok"; else echo "open widget: $(cat /tmp/err)"; fi
      mknod /tmp/other c 10 229
      if (exec 3>/tmp/other) 2>/tmp/err; then echo "open other: ok"; else echo "open other: $(cat /tmp/err)"; fi
      echo "mount: $(cat /widget/info 2>&1)"
      exec sleep 3600
    resources:
      limits: {berth.test/widget: 1}
`

// TestKubeletDevicePlugin runs a device plugin (the kubelet's device
// plugin API, served from the test) whose Allocate answers with a CDI
// device name only: no device, mount or environment of its own. A static
// pod requesting its resource is admitted against the device the plugin
// advertised, and its container has the device node, may open it (the
// device cgroup lets it, and no other), and has the spec's environment
// and mount: the kubelet passed the CDI name on in the CRI's CDI_devices
// and berth resolved it against the spec in its CDI folder.
func TestKubeletDevicePlugin(t *testing.T) {
	requireTier(t)
	e := newEnv(t, "")
	writeWidgetSpec(t, e.path("widget"), e.berthd.CDIDir)
	plugin := startWidgetPlugin(t)
	pr := e.podResources()

	// The kubelet's view of the node: the widget is allocatable (no API
	// server to show the node's capacity; its pod resources API shows the
	// device manager's). Only then may the pod come: a static pod admitted
	// before would run without the device.
	kubeenv.WaitFor(t, time.Minute, "the kubelet's allocatable devices listing "+widgetResource+" "+widgetID, func() (bool, string) {
		r, err := pr.GetAllocatableResources(kubeenv.Ctx(t), &podresources.AllocatableResourcesRequest{})
		if err != nil {
			return false, err.Error()
		}
		return hasDevice(r.GetDevices(), widgetID), fmt.Sprint(r.GetDevices())
	})

	e.writeManifest("widget", widgetPod)
	p := e.waitPod(t, "widget", startTimeout, "Running", running)
	if got := plugin.allocations(); !slices.Equal(got, []string{widgetID}) {
		t.Errorf("Allocate was asked for %q, want [%s] once", got, widgetID)
	}

	// The container's own view, from its log: each check's line.
	want := []string{
		"env: w0",
		"node: 1:b character special file",
		"open widget: ok",
		"open other: sh: can't create /tmp/other: Operation not permitted", // the device cgroup is in force
		"mount: " + widgetInfo,
	}
	logPath := e.logFile(p, "user", 0)
	kubeenv.WaitFor(t, 20*time.Second, "the container's checks in "+logPath, func() (bool, string) {
		b, err := os.ReadFile(logPath)
		return err == nil && strings.Contains(string(b), " stdout F mount: "), fmt.Sprintf("%q %v", b, err)
	})
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range want {
		if !strings.Contains(string(b), " stdout F "+line+"\n") {
			t.Errorf("the container's log lacks %q:\n%s", line, b)
		}
	}

	// The kubelet's view of the pod: the device is the container's.
	r, err := pr.Get(kubeenv.Ctx(t), &podresources.GetPodResourcesRequest{PodName: p.Name, PodNamespace: p.Namespace})
	if err != nil {
		t.Fatalf("pod resources of %s: %v", p.Name, err)
	}
	if cs := r.GetPodResources().GetContainers(); len(cs) != 1 || cs[0].GetName() != "user" || !hasDevice(cs[0].GetDevices(), widgetID) {
		t.Errorf("the kubelet's pod resources of %s: %v, want container user with %s %s", p.Name, cs, widgetResource, widgetID)
	}

	// And in the pod's status, with the health the plugin reported.
	e.waitPod(t, "widget", 30*time.Second, "user's allocatedResourcesStatus: "+widgetID+" healthy", func(p *corev1.Pod) bool {
		c := ctrStatus(p, "user")
		return c != nil && slices.ContainsFunc(c.AllocatedResourcesStatus, func(s corev1.ResourceStatus) bool {
			return s.Name == widgetResource && slices.Equal(s.Resources, []corev1.ResourceHealth{{ResourceID: widgetID, Health: corev1.ResourceHealthStatusHealthy}})
		})
	})

	e.removeManifest("widget")
	kubeenv.WaitFor(t, 2*time.Minute, "berth has no pod left", func() (bool, string) {
		n, err := e.berthPodCount()
		return err == nil && n == 0, fmt.Sprintf("%d pods, %v", n, err)
	})
	if left := e.berthd.Leftovers(e.kubelet.PID()); len(left) != 0 {
		t.Errorf("berth left: %v", left)
	}
}

func hasDevice(devs []*podresources.ContainerDevices, id string) bool {
	for _, d := range devs {
		if d.GetResourceName() == widgetResource && slices.Contains(d.GetDeviceIds(), id) {
			return true
		}
	}
	return false
}

// podResources is a client of the kubelet's pod resources API, on its
// socket below the kubelet's root folder.
func (e *env) podResources() podresources.PodResourcesListerClient {
	e.t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(e.kubeletRoot, "pod-resources", "kubelet.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { conn.Close() })
	return podresources.NewPodResourcesListerClient(conn)
}

// writeWidgetSpec makes the widget's device node and the file its spec
// mounts in dir, and the widget's CDI spec in specDir (berthd's CDI folder).
func writeWidgetSpec(t *testing.T, dir, specDir string) {
	t.Helper()
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	node, info := filepath.Join(dir, "node"), filepath.Join(dir, "info")
	if err := unix.Mknod(node, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 11))); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(info, []byte(widgetInfo+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec, err := json.Marshal(map[string]any{
		"cdiVersion": "0.7.0",
		"kind":       widgetResource,
		"devices": []any{map[string]any{
			"name": widgetID,
			"containerEdits": map[string]any{
				"deviceNodes": []any{map[string]any{"path": widgetCtrPath, "hostPath": node}},
				"env":         []string{widgetEnv},
				"mounts":      []any{map[string]any{"hostPath": info, "containerPath": widgetMount, "options": []string{"ro", "bind"}}},
			},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(specDir, "berth-test-widget.json"), spec, 0o644); err != nil {
		t.Fatal(err)
	}
}

// widgetPlugin is a device plugin with one healthy widget, whose Allocate
// names the CDI device of each widget asked for and nothing else.
type widgetPlugin struct {
	deviceplugin.UnimplementedDevicePluginServer
	mu        sync.Mutex
	allocated []string // the device IDs Allocate was asked for, in order
}

// startWidgetPlugin serves the plugin on a socket in the kubelet's device
// plugin folder and registers it with the kubelet; a cleanup stops it and
// removes the socket.
func startWidgetPlugin(t *testing.T) *widgetPlugin {
	t.Helper()
	p := &widgetPlugin{}
	// The kubelet's device manager serves its registration socket a little
	// after its /healthz answers, and empties the folder before: the plugin's
	// socket comes after.
	kubeenv.WaitFor(t, time.Minute, "the kubelet serving "+deviceplugin.KubeletSocket, func() (bool, string) {
		conn, err := net.Dial("unix", deviceplugin.KubeletSocket)
		if err != nil {
			return false, err.Error()
		}
		conn.Close()
		return true, ""
	})
	// The kubelet's device plugin folder is fixed, whatever its --root-dir.
	endpoint := fmt.Sprintf("berth-widget-%d.sock", os.Getpid())
	socket := filepath.Join(deviceplugin.DevicePluginPath, endpoint)
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	deviceplugin.RegisterDevicePluginServer(srv, p)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("the widget plugin: %v", err)
		}
		// Serve's listener removes its socket when closed; a socket left
		// would be a leak in the kubelet's folder.
		if _, err := os.Lstat(socket); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the widget plugin's socket %s is left (%v)", socket, err)
			os.Remove(socket)
		}
	})

	conn, err := grpc.NewClient("unix://"+deviceplugin.KubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := deviceplugin.NewRegistrationClient(conn).Register(ctx, &deviceplugin.RegisterRequest{
		Version:      deviceplugin.Version,
		Endpoint:     endpoint,
		ResourceName: widgetResource,
		Options:      &deviceplugin.DevicePluginOptions{},
	}); err != nil {
		t.Fatalf("register the widget plugin with the kubelet: %v", err)
	}
	return p
}

func (p *widgetPlugin) GetDevicePluginOptions(context.Context, *deviceplugin.Empty) (*deviceplugin.DevicePluginOptions, error) {
	return &deviceplugin.DevicePluginOptions{}, nil
}

// ListAndWatch sends the one widget, healthy, and keeps the stream open
// until the kubelet or the plugin's stop ends it.
func (p *widgetPlugin) ListAndWatch(_ *deviceplugin.Empty, s deviceplugin.DevicePlugin_ListAndWatchServer) error {
	if err := s.Send(&deviceplugin.ListAndWatchResponse{Devices: []*deviceplugin.Device{{ID: widgetID, Health: deviceplugin.Healthy}}}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

// Allocate answers each container's request with the CDI names of its
// widgets only, so CDI is the one way a container can get one.
func (p *widgetPlugin) Allocate(_ context.Context, r *deviceplugin.AllocateRequest) (*deviceplugin.AllocateResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	resp := &deviceplugin.AllocateResponse{}
	for _, c := range r.GetContainerRequests() {
		cr := &deviceplugin.ContainerAllocateResponse{}
		for _, id := range c.GetDevicesIds() {
			cr.CdiDevices = append(cr.CdiDevices, &deviceplugin.CDIDevice{Name: widgetResource + "=" + id})
			p.allocated = append(p.allocated, id)
		}
		resp.ContainerResponses = append(resp.ContainerResponses, cr)
	}
	return resp, nil
}

func (p *widgetPlugin) allocations() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.allocated)
}
