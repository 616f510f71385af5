package integration

import (
	"maps"
	"slices"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestPodAttributesAndFilters checks that labels, annotations and metadata
// come back exactly as given from the status and list calls of pods and
// containers, and that every filter of ListPodSandbox and ListContainers
// selects what it should.
func TestPodAttributesAndFilters(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})

	// Keys and values a sloppy round trip would change: prefixes, empty
	// values, unicode, JSON-looking and multi-line text.
	odd := map[string]string{
		"example.com/empty":     "",
		"example.com/unicode":   "ünïcödé ✓",
		"example.com/json":      `{"a": [1, 2], "b": "c"}`,
		"example.com/multiline": "line 1\nline 2\n",
		"tier":                  "test",
	}
	podCfg := func(name string, attempt uint32) *runtimeapi.PodSandboxConfig {
		cfg := e.podConfig(name)
		cfg.Metadata.Attempt = attempt
		maps.Copy(cfg.Labels, odd)
		maps.Copy(cfg.Annotations, odd)
		cfg.Annotations["pod"] = name
		return cfg
	}
	cfgA, cfgB := podCfg("attrs-a", 0), podCfg("attrs-b", 3)
	podA, podB := e.runPod(t, cfgA), e.runPod(t, cfgB)

	ctrCfg := func(name string, attempt uint32, cmd ...string) *runtimeapi.ContainerConfig {
		cfg := e.ctrConfig(name, cmd...)
		cfg.Metadata.Attempt = attempt
		maps.Copy(cfg.Labels, odd)
		cfg.Annotations = maps.Clone(odd)
		cfg.Annotations["ctr"] = name
		return cfg
	}
	cfgs := map[string]*runtimeapi.ContainerConfig{
		"running": ctrCfg("running", 0, sleeper...),
		"created": ctrCfg("created", 1, sleeper...),
		"exited":  ctrCfg("exited", 2, "/bin/true"),
	}
	running := e.runContainer(t, podA, cfgA, cfgs["running"])
	created := e.create(t, podA, cfgA, cfgs["created"])
	exited := e.create(t, podB, cfgB, cfgs["exited"])
	e.start(t, exited)
	e.waitState(t, exited, runtimeapi.ContainerState_CONTAINER_EXITED)
	// Pod B stops; its container stays, exited.
	if _, err := e.d.Runtime.StopPodSandbox(t.Context(), &runtimeapi.StopPodSandboxRequest{PodSandboxId: podB}); err != nil {
		t.Fatal(err)
	}
	ctrName := map[string]string{running: "running", created: "created", exited: "exited"}
	podOf := map[string]string{running: podA, created: podA, exited: podB}

	t.Run("echoed", func(t *testing.T) {
		for pod, cfg := range map[string]*runtimeapi.PodSandboxConfig{podA: cfgA, podB: cfgB} {
			st := e.podStatus(t, pod)
			assertAttrs(t, "PodSandboxStatus "+pod, st.Metadata, cfg.Metadata, st.Labels, cfg.Labels, st.Annotations, cfg.Annotations)
		}
		list, err := e.d.Runtime.ListPodSandbox(t.Context(), &runtimeapi.ListPodSandboxRequest{})
		if err != nil || len(list.Items) != 2 {
			t.Fatalf("ListPodSandbox = %v, %v", list.GetItems(), err)
		}
		for _, p := range list.Items {
			cfg := map[string]*runtimeapi.PodSandboxConfig{podA: cfgA, podB: cfgB}[p.Id]
			if cfg == nil {
				t.Fatalf("ListPodSandbox lists unknown pod %s", p.Id)
			}
			assertAttrs(t, "ListPodSandbox "+p.Id, p.Metadata, cfg.Metadata, p.Labels, cfg.Labels, p.Annotations, cfg.Annotations)
			if p.CreatedAt == 0 {
				t.Errorf("pod %s: created_at is 0", p.Id)
			}
			if want := map[string]runtimeapi.PodSandboxState{podA: runtimeapi.PodSandboxState_SANDBOX_READY,
				podB: runtimeapi.PodSandboxState_SANDBOX_NOTREADY}[p.Id]; p.State != want {
				t.Errorf("pod %s: state %s, want %s", p.Id, p.State, want)
			}
		}
		for id, name := range ctrName {
			cfg := cfgs[name]
			st := e.status(t, id)
			assertAttrs(t, "ContainerStatus "+name, st.Metadata, cfg.Metadata, st.Labels, cfg.Labels, st.Annotations, cfg.Annotations)
			if st.Image.GetImage() != e.image {
				t.Errorf("ContainerStatus %s image = %v, want %s", name, st.Image, e.image)
			}
		}
		ctrs, err := e.d.Runtime.ListContainers(t.Context(), &runtimeapi.ListContainersRequest{})
		if err != nil || len(ctrs.Containers) != 3 {
			t.Fatalf("ListContainers = %v, %v", ctrs.GetContainers(), err)
		}
		for _, c := range ctrs.Containers {
			cfg := cfgs[ctrName[c.Id]]
			if cfg == nil {
				t.Fatalf("ListContainers lists unknown container %s", c.Id)
			}
			assertAttrs(t, "ListContainers "+c.Id, c.Metadata, cfg.Metadata, c.Labels, cfg.Labels, c.Annotations, cfg.Annotations)
			if c.PodSandboxId != podOf[c.Id] {
				t.Errorf("container %s: pod %s, want %s", c.Id, c.PodSandboxId, podOf[c.Id])
			}
			if want := map[string]runtimeapi.ContainerState{"running": runtimeapi.ContainerState_CONTAINER_RUNNING,
				"created": runtimeapi.ContainerState_CONTAINER_CREATED, "exited": runtimeapi.ContainerState_CONTAINER_EXITED}[ctrName[c.Id]]; c.State != want || c.CreatedAt == 0 {
				t.Errorf("container %s: state %s, created_at %d; want %s and a time", c.Id, c.State, c.CreatedAt, want)
			}
		}
	})

	t.Run("pod-filters", func(t *testing.T) {
		state := func(s runtimeapi.PodSandboxState) *runtimeapi.PodSandboxStateValue {
			return &runtimeapi.PodSandboxStateValue{State: s}
		}
		ready, notReady := runtimeapi.PodSandboxState_SANDBOX_READY, runtimeapi.PodSandboxState_SANDBOX_NOTREADY
		for _, c := range []struct {
			name   string
			filter *runtimeapi.PodSandboxFilter
			want   []string
		}{
			{"none", nil, []string{podA, podB}},
			{"empty", &runtimeapi.PodSandboxFilter{}, []string{podA, podB}},
			{"full-id", &runtimeapi.PodSandboxFilter{Id: podA}, []string{podA}},
			{"id-prefix", &runtimeapi.PodSandboxFilter{Id: podB[:12]}, []string{podB}},
			{"unknown-id", &runtimeapi.PodSandboxFilter{Id: "0000000000000000"}, nil},
			{"ready", &runtimeapi.PodSandboxFilter{State: state(ready)}, []string{podA}},
			{"notready", &runtimeapi.PodSandboxFilter{State: state(notReady)}, []string{podB}},
			{"label", &runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{"app": "attrs-b"}}, []string{podB}},
			{"shared-label", &runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{"tier": "test"}}, []string{podA, podB}},
			{"empty-value-label", &runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{"example.com/empty": ""}}, []string{podA, podB}},
			{"labels-and", &runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{"tier": "test", "app": "attrs-a"}}, []string{podA}},
			{"label-mismatch", &runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{"app": "nope"}}, nil},
			{"missing-label", &runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{"absent": ""}}, nil},
			{"id-and-state", &runtimeapi.PodSandboxFilter{Id: podA, State: state(notReady)}, nil},
			{"all-three", &runtimeapi.PodSandboxFilter{Id: podB, State: state(notReady), LabelSelector: map[string]string{"tier": "test"}}, []string{podB}},
		} {
			if got := e.listPodIDs(t, c.filter); !sameSet(got, c.want) {
				t.Errorf("%s: ListPodSandbox = %v, want %v", c.name, got, c.want)
			}
		}
	})

	t.Run("container-filters", func(t *testing.T) {
		state := func(s runtimeapi.ContainerState) *runtimeapi.ContainerStateValue {
			return &runtimeapi.ContainerStateValue{State: s}
		}
		for _, c := range []struct {
			name   string
			filter *runtimeapi.ContainerFilter
			want   []string
		}{
			{"none", nil, []string{running, created, exited}},
			{"full-id", &runtimeapi.ContainerFilter{Id: created}, []string{created}},
			{"id-prefix", &runtimeapi.ContainerFilter{Id: exited[:12]}, []string{exited}},
			{"unknown-id", &runtimeapi.ContainerFilter{Id: "0000000000000000"}, nil},
			{"pod-a", &runtimeapi.ContainerFilter{PodSandboxId: podA}, []string{running, created}},
			{"pod-b", &runtimeapi.ContainerFilter{PodSandboxId: podB}, []string{exited}},
			{"unknown-pod", &runtimeapi.ContainerFilter{PodSandboxId: "0000000000000000"}, nil},
			{"running", &runtimeapi.ContainerFilter{State: state(runtimeapi.ContainerState_CONTAINER_RUNNING)}, []string{running}},
			{"created", &runtimeapi.ContainerFilter{State: state(runtimeapi.ContainerState_CONTAINER_CREATED)}, []string{created}},
			{"exited", &runtimeapi.ContainerFilter{State: state(runtimeapi.ContainerState_CONTAINER_EXITED)}, []string{exited}},
			{"label", &runtimeapi.ContainerFilter{LabelSelector: map[string]string{"container": "created"}}, []string{created}},
			{"shared-label", &runtimeapi.ContainerFilter{LabelSelector: map[string]string{"tier": "test"}}, []string{running, created, exited}},
			{"label-mismatch", &runtimeapi.ContainerFilter{LabelSelector: map[string]string{"container": "nope"}}, nil},
			{"pod-and-state", &runtimeapi.ContainerFilter{PodSandboxId: podA, State: state(runtimeapi.ContainerState_CONTAINER_CREATED)}, []string{created}},
			{"pod-and-label", &runtimeapi.ContainerFilter{PodSandboxId: podB, LabelSelector: map[string]string{"container": "running"}}, nil},
			{"id-and-pod", &runtimeapi.ContainerFilter{Id: running, PodSandboxId: podA}, []string{running}},
		} {
			if got := e.listContainerIDs(t, c.filter); !sameSet(got, c.want) {
				t.Errorf("%s: ListContainers = %v, want %v", c.name, got, c.want)
			}
		}
	})

	e.removePod(t, podA)
	e.removePod(t, podB)
	e.assertNoLeaks(t)
}

// assertAttrs compares metadata, labels and annotations exactly.
func assertAttrs(t *testing.T, what string, md, wantMD proto.Message, labels, wantLabels, annots, wantAnnots map[string]string) {
	t.Helper()
	if !proto.Equal(md, wantMD) {
		t.Errorf("%s: metadata %v, want %v", what, md, wantMD)
	}
	if !maps.Equal(labels, wantLabels) {
		t.Errorf("%s: labels %q, want %q", what, labels, wantLabels)
	}
	if !maps.Equal(annots, wantAnnots) {
		t.Errorf("%s: annotations %q, want %q", what, annots, wantAnnots)
	}
}

// TestPodValidation checks RunPodSandbox's refusals (each naming the field
// and leaving nothing behind), NotFound for unknown IDs, the idempotence of
// stop and remove, and that a pod's metadata runs once at a time.
func TestPodValidation(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})

	t.Run("invalid-config", func(t *testing.T) {
		for _, c := range []struct {
			name    string
			edit    func(*runtimeapi.PodSandboxConfig) *runtimeapi.PodSandboxConfig
			mention string
		}{
			{"no-config", func(*runtimeapi.PodSandboxConfig) *runtimeapi.PodSandboxConfig { return nil }, "config"},
			{"no-metadata", func(c *runtimeapi.PodSandboxConfig) *runtimeapi.PodSandboxConfig { c.Metadata = nil; return c }, "metadata"},
			{"no-name", func(c *runtimeapi.PodSandboxConfig) *runtimeapi.PodSandboxConfig { c.Metadata.Name = ""; return c }, "metadata.name"},
			{"no-namespace", func(c *runtimeapi.PodSandboxConfig) *runtimeapi.PodSandboxConfig {
				c.Metadata.Namespace = ""
				return c
			}, "metadata.namespace"},
			{"no-uid", func(c *runtimeapi.PodSandboxConfig) *runtimeapi.PodSandboxConfig { c.Metadata.Uid = ""; return c }, "metadata.uid"},
		} {
			t.Run(c.name, func(t *testing.T) {
				_, err := e.d.Runtime.RunPodSandbox(t.Context(), &runtimeapi.RunPodSandboxRequest{Config: c.edit(e.podConfig("invalid"))})
				assertCode(t, err, one(codes.InvalidArgument), c.mention)
				e.assertNoLeaks(t)
			})
		}
	})

	t.Run("unknown-ids", func(t *testing.T) {
		const unknown = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
		_, err := e.d.Runtime.PodSandboxStatus(t.Context(), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: unknown})
		assertCode(t, err, one(codes.NotFound), unknown)
		_, err = e.d.Runtime.ContainerStatus(t.Context(), &runtimeapi.ContainerStatusRequest{ContainerId: unknown})
		assertCode(t, err, one(codes.NotFound), unknown)
		_, err = e.d.Runtime.StartContainer(t.Context(), &runtimeapi.StartContainerRequest{ContainerId: unknown})
		assertCode(t, err, one(codes.NotFound), unknown)
		_, err = e.d.Runtime.ExecSync(t.Context(), &runtimeapi.ExecSyncRequest{ContainerId: unknown, Cmd: []string{"/bin/true"}})
		assertCode(t, err, one(codes.NotFound), unknown)
		_, err = e.d.Runtime.CreateContainer(t.Context(), &runtimeapi.CreateContainerRequest{
			PodSandboxId: unknown, Config: e.ctrConfig("orphan", "/bin/true")})
		assertCode(t, err, one(codes.NotFound), unknown)
		for _, call := range []struct {
			name string
			fn   func() error
		}{
			{"StopPodSandbox", func() error {
				_, err := e.d.Runtime.StopPodSandbox(t.Context(), &runtimeapi.StopPodSandboxRequest{PodSandboxId: unknown})
				return err
			}},
			{"RemovePodSandbox", func() error {
				_, err := e.d.Runtime.RemovePodSandbox(t.Context(), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: unknown})
				return err
			}},
			{"RemoveContainer", func() error {
				_, err := e.d.Runtime.RemoveContainer(t.Context(), &runtimeapi.RemoveContainerRequest{ContainerId: unknown})
				return err
			}},
		} {
			if err := call.fn(); err != nil {
				t.Errorf("%s of an unknown ID: %v, want OK", call.name, err)
			}
		}
		e.assertNoLeaks(t)
	})

	t.Run("same-metadata", func(t *testing.T) {
		cfg := e.podConfig("twice")
		pod := e.runPod(t, cfg)
		e.runContainer(t, pod, cfg, e.ctrConfig("first", sleeper...))
		_, err := e.d.Runtime.RunPodSandbox(t.Context(), &runtimeapi.RunPodSandboxRequest{Config: cfg})
		assertCode(t, err, one(codes.AlreadyExists), "twice", pod)
		// As the kubelet does: stop the attempt, run the next one (same
		// name, namespace, uid and cgroup parent), remove the old one later.
		if _, err := e.d.Runtime.StopPodSandbox(t.Context(), &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod}); err != nil {
			t.Fatal(err)
		}
		_, err = e.d.Runtime.RunPodSandbox(t.Context(), &runtimeapi.RunPodSandboxRequest{Config: cfg})
		assertCode(t, err, one(codes.AlreadyExists), "twice", pod)
		next := proto.Clone(cfg).(*runtimeapi.PodSandboxConfig)
		next.Metadata.Attempt = 1
		pod1 := e.runPod(t, next)
		second := e.runContainer(t, pod1, next, e.ctrConfig("second", sleeper...))
		if got := e.listPodIDs(t, nil); !sameSet(got, []string{pod, pod1}) {
			t.Errorf("pods = %v, want the two attempts %s %s", got, pod, pod1)
		}
		e.removePodCgroup(t, pod, false)
		if st := e.podStatus(t, pod1); st.State != runtimeapi.PodSandboxState_SANDBOX_READY {
			t.Errorf("the next attempt is %s after the removal of the first", st.State)
		}
		if r := e.exec(t, second, "/bin/echo", "alive"); r.stdout != "alive\n" {
			t.Errorf("exec in the next attempt's container: %+v", r)
		}
		e.removePod(t, pod1)
		// Removed, the same metadata runs again, as a new sandbox.
		again := e.runPod(t, cfg)
		if again == pod {
			t.Errorf("the pod ran again with the removed pod's ID %s", pod)
		}
		if st := e.podStatus(t, again); st.State != runtimeapi.PodSandboxState_SANDBOX_READY || !proto.Equal(st.Metadata, cfg.Metadata) {
			t.Errorf("pod run again: %v", st)
		}
		if got := e.listPodIDs(t, nil); !slices.Equal(got, []string{again}) {
			t.Errorf("pods = %v, want only %s", got, again)
		}
		e.removePod(t, again)
		e.assertNoLeaks(t)
	})
}
