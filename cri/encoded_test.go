package cri

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/sandbox/store"
)

// statsSample is a container's stats message as berthd makes it, with
// labels and annotations as the kubelet sets them.
func statsSample(i int) *runtimeapi.ContainerStats {
	u := func(v uint64) *runtimeapi.UInt64Value { return &runtimeapi.UInt64Value{Value: v} }
	return &runtimeapi.ContainerStats{
		Attributes: &runtimeapi.ContainerAttributes{Id: fmt.Sprintf("%064x", i),
			Metadata: &runtimeapi.ContainerMetadata{Name: "c", Attempt: 1},
			Labels: map[string]string{"io.kubernetes.pod.name": fmt.Sprint("pod-", i), "io.kubernetes.pod.namespace": "default",
				"io.kubernetes.container.name": "c", "io.kubernetes.pod.uid": fmt.Sprint("uid-", i)},
			Annotations: map[string]string{"io.kubernetes.container.hash": "1a2b3c", "io.kubernetes.container.restartCount": "0",
				"io.kubernetes.container.terminationMessagePath": "/dev/termination-log"}},
		Cpu: &runtimeapi.CpuUsage{Timestamp: 1700000000000000000, UsageCoreNanoSeconds: u(123456789), UsageNanoCores: u(4567)},
		Memory: &runtimeapi.MemoryUsage{Timestamp: 1700000000000000000, WorkingSetBytes: u(1 << 20), UsageBytes: u(2 << 20),
			RssBytes: u(1 << 19), PageFaults: u(300), MajorPageFaults: u(uint64(i))},
		WritableLayer: &runtimeapi.FilesystemUsage{Timestamp: 1700000000000000000,
			FsId: &runtimeapi.FilesystemIdentifier{Mountpoint: "/var/lib/berth"}, UsedBytes: u(4096), InodesUsed: u(3)},
	}
}

// roundTrip encodes msg as gRPC does and decodes the bytes into a new
// message of its type.
func roundTrip[M proto.Message](t testing.TB, msg M) M {
	t.Helper()
	codec := encoding.GetCodecV2("proto")
	data, err := codec.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	defer data.Free()
	out := msg.ProtoReflect().New().Interface().(M)
	if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(data.Materialize())}, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestEncodedDecodesAsMessage: a list of encoded stats messages, mixed with
// one made on the spot (a container listed without usage), reaches a
// client as the messages themselves, at the top of a list, in a streamed
// page and inside a pod's stats.
func TestEncodedDecodesAsMessage(t *testing.T) {
	plain := []*runtimeapi.ContainerStats{statsSample(1), {Attributes: statsSample(2).Attributes}, statsSample(3)}
	var sent []*runtimeapi.ContainerStats
	for _, s := range plain {
		e, err := encoded(s)
		if err != nil {
			t.Fatal(err)
		}
		if e.Attributes != nil || len(e.ProtoReflect().GetUnknown()) == 0 {
			t.Fatalf("encoded message has fields %v, unknown %d bytes: want only the encoding", e.Attributes, len(e.ProtoReflect().GetUnknown()))
		}
		sent = append(sent, e)
	}
	sent[1] = plain[1] // as made for one call
	for _, c := range []struct{ sent, want proto.Message }{
		{&runtimeapi.ListContainerStatsResponse{Stats: sent}, &runtimeapi.ListContainerStatsResponse{Stats: plain}},
		{&runtimeapi.StreamContainerStatsResponse{ContainerStats: sent}, &runtimeapi.StreamContainerStatsResponse{ContainerStats: plain}},
		{&runtimeapi.PodSandboxStatsResponse{Stats: &runtimeapi.PodSandboxStats{Linux: &runtimeapi.LinuxPodSandboxStats{Containers: sent}}},
			&runtimeapi.PodSandboxStatsResponse{Stats: &runtimeapi.PodSandboxStats{Linux: &runtimeapi.LinuxPodSandboxStats{Containers: plain}}}},
	} {
		if got := roundTrip(t, c.sent); !proto.Equal(got, c.want) {
			t.Errorf("%T decodes as\n%v\nwant\n%v", c.sent, got, c.want)
		}
		if proto.Size(c.sent) != proto.Size(c.want) {
			t.Errorf("%T: %d bytes encoded, the messages %d", c.sent, proto.Size(c.sent), proto.Size(c.want))
		}
	}
}

// BenchmarkListContainerStatsEncode: gRPC's encoding of a node-wide
// answer (500 containers) of messages, and of the same encoded ahead.
func BenchmarkListContainerStatsEncode(b *testing.B) {
	var plain, enc []*runtimeapi.ContainerStats
	for i := range 500 {
		s := statsSample(i)
		e, err := encoded(s)
		if err != nil {
			b.Fatal(err)
		}
		plain, enc = append(plain, s), append(enc, e)
	}
	codec := encoding.GetCodecV2("proto")
	for _, c := range []struct {
		name  string
		stats []*runtimeapi.ContainerStats
	}{{"messages", plain}, {"encoded", enc}} {
		b.Run(c.name, func(b *testing.B) {
			resp := &runtimeapi.ListContainerStatsResponse{Stats: c.stats}
			for b.Loop() {
				data, err := codec.Marshal(resp)
				if err != nil {
					b.Fatal(err)
				}
				data.Free()
			}
		})
	}
}

// TestListedContainerOncePerStatus: a container's list entry is encoded
// once per status of it, shared by the lists until the view makes a new
// status, and reaches a client as the container's message.
func TestListedContainerOncePerStatus(t *testing.T) {
	ctr := &store.Container{ID: "c1", PodID: "p1", ImageID: "sha256:aa", RepoDigest: "busybox@sha256:bb", ImageName: "busybox",
		CreatedAt: time.Unix(1700000000, 5), Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "c"},
			Image:  &runtimeapi.ImageSpec{Image: "sha256:aa", UserSpecifiedImage: "busybox"},
			Labels: map[string]string{"a": "1"}, Annotations: map[string]string{"b": "2"}}}
	want := &runtimeapi.Container{Id: "c1", PodSandboxId: "p1", Metadata: ctr.Config.Metadata,
		Image:    &runtimeapi.ImageSpec{Image: "busybox", UserSpecifiedImage: "busybox"},
		ImageRef: "busybox@sha256:bb", ImageId: "sha256:aa", State: runtimeapi.ContainerState_CONTAINER_RUNNING,
		CreatedAt: ctr.CreatedAt.UnixNano(), Labels: ctr.Config.Labels, Annotations: ctr.Config.Annotations}

	running := &store.ContainerStatus{Container: ctr, State: runtimeapi.ContainerState_CONTAINER_RUNNING, Memo: &store.Memo{}}
	first, err := listedContainer(running)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := listedContainer(running); again != first {
		t.Error("the same status was encoded twice")
	}
	if got := roundTrip(t, &runtimeapi.ListContainersResponse{Containers: []*runtimeapi.Container{first}}); !proto.Equal(got.Containers[0], want) {
		t.Errorf("listed as\n%v\nwant\n%v", got.Containers[0], want)
	}

	exited := &store.ContainerStatus{Container: ctr, State: runtimeapi.ContainerState_CONTAINER_EXITED, Memo: &store.Memo{}}
	next, err := listedContainer(exited)
	if err != nil {
		t.Fatal(err)
	}
	if got := roundTrip(t, next); got.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Errorf("the next status is listed %v, want EXITED", got.State)
	}
}

// TestKeptAnswer: a node-wide answer is made once per version of the state
// it is made of, reaches a client as the message made, and is made again
// at the next version (a new sample, a container added or removed: see
// sandbox/stats's TestStatsVersion) or after an answer that must not be kept;
// a filtered one is made for each call, and neither served nor kept.
func TestKeptAnswer(t *testing.T) {
	var k kept[*runtimeapi.ListContainerStatsResponse]
	made := 0
	answer := func(keep bool, ids ...int) func() (*runtimeapi.ListContainerStatsResponse, bool, error) {
		return func() (*runtimeapi.ListContainerStatsResponse, bool, error) {
			made++
			resp := &runtimeapi.ListContainerStatsResponse{}
			for _, i := range ids {
				resp.Stats = append(resp.Stats, statsSample(i))
			}
			return resp, keep, nil
		}
	}
	get := func(f store.Filter, version uint64, make func() (*runtimeapi.ListContainerStatsResponse, bool, error), wantMade int, wantIDs ...int) {
		t.Helper()
		resp, err := k.answer(f, version, make)
		if err != nil {
			t.Fatal(err)
		}
		got := roundTrip(t, resp)
		want := &runtimeapi.ListContainerStatsResponse{}
		for _, i := range wantIDs {
			want.Stats = append(want.Stats, statsSample(i))
		}
		if made != wantMade || !proto.Equal(got, want) {
			t.Errorf("at version %d: made %d times, answered %d entries; want made %d times, entries %v", version, made, len(got.Stats), wantMade, wantIDs)
		}
	}
	all, one := store.Filter{}, store.Filter{ID: "c1"}
	get(all, 1, answer(true, 1, 2), 1, 1, 2)
	get(all, 1, answer(true, 1, 2, 3), 1, 1, 2) // kept
	get(one, 1, answer(true, 3), 2, 3)
	get(all, 1, answer(true, 1, 2, 3), 2, 1, 2) // the filtered one was not kept
	get(all, 2, answer(true, 1, 2, 3), 3, 1, 2, 3)
	get(all, 3, answer(false, 1), 4, 1)
	get(all, 3, answer(true, 1, 4), 5, 1, 4) // the last one was not kept
	get(all, 3, answer(true), 5, 1, 4)
}
