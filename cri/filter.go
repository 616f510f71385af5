package cri

import (
	"github.com/berth-runtime/berth/sandbox/store"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The CRI has a filter message per list call; each becomes the one
// store.Filter, which does the selecting.

func podFilter(f *runtimeapi.PodSandboxFilter) store.Filter {
	out := store.Filter{ID: f.GetId(), Labels: f.GetLabelSelector()}
	if s := f.GetState(); s != nil {
		st := int32(s.State)
		out.State = &st
	}
	return out
}

func containerFilter(f *runtimeapi.ContainerFilter) store.Filter {
	out := store.Filter{ID: f.GetId(), PodID: f.GetPodSandboxId(), Labels: f.GetLabelSelector()}
	if s := f.GetState(); s != nil {
		st := int32(s.State)
		out.State = &st
	}
	return out
}

func containerStatsFilter(f *runtimeapi.ContainerStatsFilter) store.Filter {
	return store.Filter{ID: f.GetId(), PodID: f.GetPodSandboxId(), Labels: f.GetLabelSelector()}
}

func podStatsFilter(f *runtimeapi.PodSandboxStatsFilter) store.Filter {
	return store.Filter{ID: f.GetId(), Labels: f.GetLabelSelector()}
}
