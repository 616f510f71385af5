package store

import (
	"reflect"
	"syscall"
	"testing"

	"github.com/berth-runtime/berth/cgroups"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestSignalInForce checks the order StopContainer picks its signal in
// (stop_signal, the image's, SIGTERM) and the CRI names, real-time ones
// included, mapping to the signals an image's STOPSIGNAL names.
func TestSignalInForce(t *testing.T) {
	for _, c := range []struct {
		name    string
		cfg     runtimeapi.Signal
		image   string
		wantSig syscall.Signal
		wantCRI runtimeapi.Signal
	}{
		{"default", 0, "", syscall.SIGTERM, runtimeapi.Signal_SIGNAL_SIGTERM},
		{"image", 0, "SIGQUIT", syscall.SIGQUIT, runtimeapi.Signal_SIGNAL_SIGQUIT},
		{"image-number", 0, "10", syscall.SIGUSR1, runtimeapi.Signal_SIGNAL_SIGUSR1},
		{"image-alias-first-name", 0, "SIGIOT", syscall.SIGABRT, runtimeapi.Signal_SIGNAL_SIGABRT},
		{"config-wins", runtimeapi.Signal_SIGNAL_SIGUSR1, "SIGQUIT", syscall.SIGUSR1, runtimeapi.Signal_SIGNAL_SIGUSR1},
		{"config-alias-kept", runtimeapi.Signal_SIGNAL_SIGIOT, "", syscall.SIGABRT, runtimeapi.Signal_SIGNAL_SIGIOT},
		{"rtmin", runtimeapi.Signal_SIGNAL_SIGRTMIN, "", 34, runtimeapi.Signal_SIGNAL_SIGRTMIN},
		{"rtmin-plus", runtimeapi.Signal_SIGNAL_SIGRTMINPLUS15, "", 49, runtimeapi.Signal_SIGNAL_SIGRTMINPLUS15},
		{"rtmax-minus", runtimeapi.Signal_SIGNAL_SIGRTMAXMINUS14, "", 50, runtimeapi.Signal_SIGNAL_SIGRTMAXMINUS14},
		{"image-rtmax", 0, "RTMAX", 64, runtimeapi.Signal_SIGNAL_SIGRTMAX},
		{"image-unnamed", 0, "33", 33, runtimeapi.Signal_SIGNAL_RUNTIME_DEFAULT},
		{"bad-record", 0, "SIGNOPE", syscall.SIGTERM, runtimeapi.Signal_SIGNAL_SIGTERM},
	} {
		c0 := &Container{Config: &runtimeapi.ContainerConfig{StopSignal: c.cfg}, StopSignal: c.image}
		sig, cri := c0.SignalInForce()
		if sig != c.wantSig || cri != c.wantCRI {
			t.Errorf("%s: got %v %v, want %v %v", c.name, sig, cri, c.wantSig, c.wantCRI)
		}
	}
	if _, err := CRISignal(999); err == nil {
		t.Error("CRISignal(999): no error")
	}
	// Every name the CRI has maps to a signal.
	for v, name := range runtimeapi.Signal_name {
		if v == 0 {
			continue
		}
		if _, err := CRISignal(runtimeapi.Signal(v)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestContainerRecordKeepsResources: the limits in force survive the
// record's round trip, so status after a restart shows them from the view.
func TestContainerRecordKeepsResources(t *testing.T) {
	want := &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 50000, MemoryLimitInBytes: 96 << 20}
	res, err := cgroups.SpecResources(want, cgroups.V2, 0)
	if err != nil {
		t.Fatal(err)
	}
	c := &Container{ID: "c", Config: &runtimeapi.ContainerConfig{}, Resources: res}
	b, err := marshalRecord(c, c.Config, &c.RawConfig)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeContainer(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Resources, res) || !proto.Equal(appliedResources(got), want) {
		t.Errorf("resources after the round trip: %+v (%v), want %+v (%v)", got.Resources, appliedResources(got), res, want)
	}
}
