package spec

import (
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/berth-runtime/berth/cri/errkind"
)

// injectCDI applies the CDI devices the container asks for to s: those of
// its config's CDI_devices and of its cdi.k8s.io/ annotations (the older
// form device plugins still use). Only the container config's annotations
// count, as in containerd and CRI-O: the kubelet puts a device plugin's
// annotations there, and a pod-wide one would hand the device to every
// container of the pod.
func injectCDI(in Input, s *specs.Spec) error {
	names, err := requestedCDIDevices(in.Config.GetCDIDevices(), in.Config.GetAnnotations())
	if err != nil {
		return err
	}
	return in.CDI.Inject(s, names)
}

// requestedCDIDevices is the device names asked for, each once, in the
// order asked.
func requestedCDIDevices(fromConfig []*runtimeapi.CDIDevice, annotations map[string]string) ([]string, error) {
	var names []string
	for i, d := range fromConfig {
		if !parser.IsQualifiedName(d.GetName()) {
			return nil, errkind.Errorf(errkind.Invalid, "CDI_devices[%d].name %q: not a qualified CDI device name (vendor.com/class=name)", i, d.GetName())
		}
		names = append(names, d.GetName())
	}
	_, annotated, err := cdiapi.ParseAnnotations(annotations)
	if err != nil {
		return nil, errkind.Errorf(errkind.Invalid, "annotations %s*: %w", cdiapi.AnnotationPrefix, err)
	}
	// ParseAnnotations walks a map: sorted, the spec is the same every time.
	slices.Sort(annotated)
	names = append(names, annotated...)
	var once []string
	for _, n := range names {
		if !slices.Contains(once, n) {
			once = append(once, n)
		}
	}
	return once, nil
}
