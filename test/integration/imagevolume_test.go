package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/harness"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// imageVolumeImages pushes and pulls the two images the image volume tests
// mount: "data", of two layers (an overlay), whose top layer overrides a
// file of the bottom one, with files of two owners and symlinks that point
// out of the image; and "tool", of one layer (a bind mount).
func imageVolumeImages(t *testing.T, e *podEnv) (data, tool harness.Pushed) {
	t.Helper()
	data = e.reg.Push(t, "berth/data:v1", harness.NewImage(t, harness.ImageSpec{Layers: [][]harness.File{
		{
			harness.Dir("models", 0o755), harness.Dir("models/v1", 0o755),
			harness.Reg("models/v1/weights", "bottom\n", 0o644),
			harness.Reg("readme", "data image\n", 0o644),
			{Path: "owned", Content: []byte("user's\n"), Mode: 0o600, UID: 1000, GID: 1000},
			// Absolute: the image's /models/v1, whatever the host has there.
			harness.Symlink("current", "/models/v1"),
			// Both lead to the host's /etc if resolved on the host; inside
			// the image there is no /etc.
			harness.Symlink("hostetc", "/etc"),
			harness.Symlink("up", "../../../../../../../../etc"),
		},
		{harness.Reg("models/v1/weights", "top\n", 0o644)},
	}}))
	mustPull(t, e.d, data.Name, data.ID)
	tool = e.reg.Push(t, "berth/tool:v1", harness.NewImage(t, harness.ImageSpec{Layers: [][]harness.File{
		{harness.Dir("bin", 0o755), harness.Reg("bin/tool", "#!/bin/sh\necho tool ran\n", 0o755)},
	}}))
	mustPull(t, e.d, tool.Name, tool.ID)
	return data, tool
}

// imageMount is a Mount as the kubelet sends it for an image volume: the
// image as PullImage answered it, read-only.
func imageMount(dst, image, subPath string) *runtimeapi.Mount {
	return &runtimeapi.Mount{ContainerPath: dst, Image: &runtimeapi.ImageSpec{Image: image}, ImageSubPath: subPath, Readonly: true}
}

// TestImageVolumes: image volumes (Mount.image, Mount.image_sub_path) show
// the image's files read-only, whole or from a sub-path resolved inside the
// image, idmapped in a user-namespace pod, and keep their layers while the
// container exists even after RemoveImage; a sub-path that climbs out, is
// missing or escapes through a symlink, and an image not pulled, are
// refused naming the mount, with nothing left behind.
func TestImageVolumes(t *testing.T) {
	t.Parallel()
	e := startPodEnvWith(t, v1.Config{}, harness.Options{State: stateOnTmpfs(t)})
	data, tool := imageVolumeImages(t, e)
	fsBefore := imageFsUsed(t, e)

	t.Run("whole-and-sub-path", func(t *testing.T) {
		cfg := e.podConfig("imagevol")
		pod := e.runPod(t, cfg)
		cc := e.ctrConfig("imagevol", sleeper...)
		cc.Mounts = []*runtimeapi.Mount{
			imageMount("/data", data.ID, ""),             // by image ID, as the kubelet sends it
			imageMount("/model", data.ID, "current"),     // a symlink resolved inside the image
			imageMount("/tool", tool.Name, ""),           // by name; one layer
			imageMount("/etc/readme", data.ID, "readme"), // a file
		}
		ctr := e.runContainer(t, pod, cfg, cc)
		if got := e.sh(t, ctr, "cat /data/readme /data/models/v1/weights /model/weights /etc/readme; /bin/sh /tool/bin/tool"); got != "data image\ntop\ntop\ndata image\ntool ran" {
			t.Errorf("files of the image volumes: %q", got)
		}
		for _, p := range []string{"/data/new", "/data/readme", "/model/new", "/tool/new", "/etc/readme"} {
			if got := e.sh(t, ctr, "(echo x >>"+p+") 2>&1 || true"); !strings.Contains(got, "Read-only file system") {
				t.Errorf("write to %s: %q, want EROFS", p, got)
			}
		}
		if got := imageFsUsed(t, e); got != fsBefore {
			t.Errorf("ImageFsInfo used bytes with image volumes mounted: %d, before %d: the layers must count once", got, fsBefore)
		}
		if got := leasesOf(t, e, data.ID); len(got) != 3 || !allHavePrefix(got, ctr+"/image-volume/") {
			t.Errorf("leases of the data image: %v, want the container's three volumes", got)
		}
		e.stop(t, ctr, 0)
		e.removePod(t, pod)
		e.assertNoLeaks(t)
	})

	t.Run("userns", func(t *testing.T) {
		if !usernsAdvertised(t, e) {
			t.Skipf("Linux %s: user namespaces not advertised", kernelRelease(t))
		}
		cfg := e.podConfig("imagevol-userns")
		m := rootMapping(usernsHost, 65536)
		usernsPod(cfg, &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_POD, Uids: m, Gids: m}, runtimeapi.NamespaceMode_POD)
		pod := e.runPod(t, cfg)
		cc := e.ctrConfig("imagevol", sleeper...)
		// As the kubelet sends them in such a pod: with the pod's mappings.
		cc.Mounts = []*runtimeapi.Mount{imageMount("/data", data.ID, ""), imageMount("/tool", tool.ID, "bin")}
		for _, mnt := range cc.Mounts {
			mnt.UidMappings, mnt.GidMappings = m, m
		}
		ctr := e.runContainer(t, pod, cfg, cc)
		// Without idmapping, the image's root-owned files would be
		// nobody's (65534) in the pod.
		if got := e.sh(t, ctr, "stat -c %u:%g /data /data/readme /data/owned /tool/tool; cat /data/readme"); got != "0:0\n0:0\n1000:1000\n0:0\ndata image" {
			t.Errorf("owners and reads in the userns pod: %q", got)
		}
		if got := e.sh(t, ctr, "(echo x >>/data/readme) 2>&1 || true"); !strings.Contains(got, "Read-only file system") {
			t.Errorf("write as the pod's root: %q, want EROFS", got)
		}
		e.stop(t, ctr, 0)
		e.removePod(t, pod)
		e.assertNoLeaks(t)
	})

	t.Run("refused", func(t *testing.T) {
		for _, c := range []struct {
			name    string
			mount   *runtimeapi.Mount
			code    codes.Code
			mention []string
		}{
			{"dotdot", imageMount("/m", data.ID, "models/../.."), codes.InvalidArgument, []string{"mount /m", `image_sub_path "models/../.."`}},
			{"absolute", imageMount("/m", data.ID, "/etc"), codes.InvalidArgument, []string{"mount /m", `image_sub_path "/etc"`}},
			{"absolute-symlink-out", imageMount("/m", data.ID, "hostetc"), codes.InvalidArgument, []string{"mount /m", `image_sub_path "hostetc"`, "not found in the image"}},
			{"relative-symlink-out", imageMount("/m", data.ID, "up/passwd"), codes.InvalidArgument, []string{"mount /m", `image_sub_path "up/passwd"`, "not found in the image"}},
			{"missing", imageMount("/m", data.ID, "models/v2"), codes.InvalidArgument, []string{"mount /m", `image_sub_path "models/v2"`, "not found in the image"}},
			{"not-pulled", imageMount("/m", e.reg.Host()+"/berth/absent:v1", ""), codes.NotFound, []string{"mount /m", "berth/absent:v1"}},
		} {
			t.Run(c.name, func(t *testing.T) {
				cfg := e.podConfig("imagevol-" + c.name)
				pod := e.runPod(t, cfg)
				cc := e.ctrConfig("refused", sleeper...)
				// A good image volume first: the refusal must undo it.
				cc.Mounts = []*runtimeapi.Mount{imageMount("/ok", tool.ID, ""), c.mount}
				_, err := e.d.Runtime.CreateContainer(t.Context(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, SandboxConfig: cfg, Config: cc})
				assertCode(t, err, one(c.code), c.mention...)
				if m := mountsMentioning(pod + "/containers"); len(m) != 0 {
					t.Errorf("mounts of the refused container left: %v", m)
				}
				for _, img := range []string{tool.ID, data.ID} {
					if l := leasesOf(t, e, img); len(l) != 0 {
						t.Errorf("image %s still leased after the refusal: %v", img, l)
					}
				}
				e.removePod(t, pod)
				e.assertNoLeaks(t)
			})
		}
	})

	// berthd killed while a container uses an image volume, with the
	// remains of a create a crash cut short planted beside it: the restart
	// keeps the live container's volume and its lease, and reclaims the
	// unknown container's mounted volume and lease.
	t.Run("restart", func(t *testing.T) {
		cfg := e.podConfig("imagevol-restart")
		pod := e.runPod(t, cfg)
		cc := e.ctrConfig("imagevol", sleeper...)
		cc.Mounts = []*runtimeapi.Mount{imageMount("/data", data.ID, "")}
		ctr := e.runContainer(t, pod, cfg, cc)
		e.d.Kill()
		ghost := strings.Repeat("e", 64)
		ghostVolume := filepath.Join(e.d.State, "pods", pod, "containers", ghost, "image-volumes", "0")
		if err := os.MkdirAll(ghostVolume, 0o700); err != nil {
			t.Fatal(err)
		}
		mustMount(t, "tmpfs", ghostVolume, "tmpfs", 0)
		copyLease(t, filepath.Join(e.d.Root, "meta.db"), ctr+"/image-volume/0", ghost+"/image-volume/0")
		e.d.Restart()
		if m := mountsMentioning(ghost); len(m) != 0 {
			t.Errorf("image volume of the unknown container left mounted: %v", m)
		}
		if got := leasesOf(t, e, data.ID); len(got) != 1 || got[0] != ctr+"/image-volume/0" {
			t.Errorf("leases of the data image after the restart: %v, want the live container's alone", got)
		}
		if got := e.sh(t, ctr, "cat /data/readme"); got != "data image" {
			t.Errorf("image volume after the restart: %q", got)
		}
		e.stop(t, ctr, 0)
		e.removePod(t, pod)
		e.assertNoLeaks(t)
	})

	// berthd killed at each step of a create that mounts image volumes
	// (the points learned from a run, as TestCrashPoints learns its own):
	// after the restart, the kubelet's clean-up of what it no longer wants
	// leaves no mount, lease or layer of the volumes behind.
	t.Run("crash", func(t *testing.T) {
		create := func(name string) error {
			cfg := e.podConfig(name)
			pod, err := e.d.Runtime.RunPodSandbox(t.Context(), &runtimeapi.RunPodSandboxRequest{Config: cfg})
			if err != nil {
				return err
			}
			cc := e.ctrConfig("imagevol", sleeper...)
			cc.Mounts = []*runtimeapi.Mount{imageMount("/data", data.ID, "models"), imageMount("/tool", tool.ID, "")}
			_, err = e.d.Runtime.CreateContainer(t.Context(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod.PodSandboxId, SandboxConfig: cfg, Config: cc})
			return err
		}
		log := filepath.Join(t.TempDir(), "points")
		e.d.RestartEnv("BERTH_CRASHPOINT_LOG=" + log)
		if err := create("imagevol-crash"); err != nil {
			t.Fatalf("the create without a crash: %v", err)
		}
		removeAllPods(t, e)
		if _, err := os.Stat(log); os.IsNotExist(err) {
			// The VM tier's prebuilt berthd has no crash points.
			t.Skip("berthd logged no crash point: built without the crashpoints tag")
		}
		var points []string
		for _, p := range loggedPoints(t, log) {
			if strings.Contains(p, "image volume") {
				points = append(points, p)
			}
		}
		if len(points) < 3 {
			t.Fatalf("crash points of image volumes: %v, want the lease, the folder and the mount", points)
		}
		t.Logf("crash points of image volumes: %q", points)
		for i, point := range points {
			e.d.RestartEnv("BERTH_CRASHPOINT=" + point)
			if err := create(fmt.Sprintf("imagevol-crash-%d", i)); status.Code(err) != codes.Unavailable {
				t.Errorf("at %q: CreateContainer %v, want berthd gone", point, err)
			}
			select {
			case <-e.d.Done():
			case <-time.After(10 * time.Second):
				t.Errorf("berthd did not reach crash point %q", point)
			}
			e.d.RestartEnv()
			removeAllPods(t, e)
			e.assertNoLeaks(t)
		}
	})

	// Last: it removes the data image. As containerd and CRI-O, berth lets
	// RemoveImage of an image in use succeed (the kubelet's image GC skips
	// images of running containers, but a pod must not break if someone
	// removes it anyway): the record goes, the lease keeps the layers, and
	// they are collected once the container is gone.
	t.Run("remove-image-in-use", func(t *testing.T) {
		cfg := e.podConfig("imagevol-rmi")
		pod := e.runPod(t, cfg)
		cc := e.ctrConfig("imagevol", sleeper...)
		cc.Mounts = []*runtimeapi.Mount{imageMount("/data", data.ID, "")}
		ctr := e.runContainer(t, pod, cfg, cc)
		config := filepath.Join(e.d.Root, harness.BlobsDir, strings.TrimPrefix(data.ID, "sha256:"))
		if _, err := os.Stat(config); err != nil {
			t.Fatalf("the data image's config blob: %v", err)
		}
		removeImage(t, e.d, data.ID)
		assertAbsent(t, e.d, data.ID, data.Name)
		// A collection has run once the image's config blob is gone.
		if !eventually(10*time.Second, func() bool { _, err := os.Stat(config); return os.IsNotExist(err) }) {
			t.Fatalf("the removed image's config blob %s is still there", config)
		}
		if got := e.sh(t, ctr, "cat /data/models/v1/weights /data/readme"); got != "top\ndata image" {
			t.Errorf("image volume after RemoveImage of its image: %q", got)
		}
		fsInUse := imageFsUsed(t, e)
		// Its layers are still there: the snapshots of all three images.
		harness.AssertNoLeaks(t, e.d.Root, harness.WantImages(t, harness.BusyboxImage(t, harness.ImageSpec{}), tool.Image, data.Image))
		// A new container cannot use the removed image: the kubelet pulls it first.
		cc2 := e.ctrConfig("after-rmi", sleeper...)
		cc2.Mounts = []*runtimeapi.Mount{imageMount("/data", data.ID, "")}
		_, err := e.d.Runtime.CreateContainer(t.Context(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, SandboxConfig: cfg, Config: cc2})
		assertCode(t, err, one(codes.NotFound), "mount /data", data.ID)
		e.stop(t, ctr, 0)
		e.removePod(t, pod)
		// The data image's layers are collected now (assertNoLeaks counts
		// the snapshots of the images still listed).
		e.assertNoLeaks(t)
		if got := imageFsUsed(t, e); got >= fsInUse {
			t.Errorf("ImageFsInfo used bytes after the container went: %d, not below %d with the layers leased", got, fsInUse)
		}
	})
}

// removeAllPods removes every container and pod berthd lists, as the
// kubelet's garbage collection does with what it no longer wants.
func removeAllPods(t *testing.T, e *podEnv) {
	t.Helper()
	for _, id := range e.listContainerIDs(t, nil) {
		if _, err := e.d.Runtime.RemoveContainer(t.Context(), &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil {
			t.Errorf("RemoveContainer %s: %v", id, err)
		}
	}
	for _, id := range e.listPodIDs(t, nil) {
		e.removePod(t, id)
	}
}

// imageFsUsed sums the used bytes ImageFsInfo reports for images.
func imageFsUsed(t *testing.T, e *podEnv) uint64 {
	t.Helper()
	resp, err := e.d.Images.ImageFsInfo(t.Context(), &runtimeapi.ImageFsInfoRequest{})
	if err != nil {
		t.Fatalf("ImageFsInfo: %v", err)
	}
	var used uint64
	for _, f := range resp.ImageFilesystems {
		used += f.GetUsedBytes().GetValue()
	}
	return used
}

// leasesOf lists the lease owners ImageStatus's verbose info names for ref.
func leasesOf(t *testing.T, e *podEnv, ref string) []string {
	t.Helper()
	resp, err := e.d.Images.ImageStatus(t.Context(), &runtimeapi.ImageStatusRequest{
		Image: &runtimeapi.ImageSpec{Image: ref}, Verbose: true})
	if err != nil {
		t.Fatalf("ImageStatus %s: %v", ref, err)
	}
	var info struct {
		Leases []string `json:"leases"`
	}
	if err := json.Unmarshal([]byte(resp.Info["info"]), &info); err != nil {
		t.Fatalf("image %s verbose info: %v", ref, err)
	}
	return info.Leases
}

func allHavePrefix(ss []string, prefix string) bool {
	for _, s := range ss {
		if !strings.HasPrefix(s, prefix) {
			return false
		}
	}
	return true
}

// usernsAdvertised tells whether berthd runs pods with user namespaces here.
func usernsAdvertised(t *testing.T, e *podEnv) bool {
	t.Helper()
	st, err := e.d.Runtime.Status(t.Context(), &runtimeapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	h := st.GetRuntimeHandlers()
	return len(h) == 1 && h[0].GetFeatures().GetUserNamespaces()
}
