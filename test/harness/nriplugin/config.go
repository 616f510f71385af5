// Package nriplugin is the configuration of the integration tests' NRI
// plugin (test/integration/testdata/nriplugin): what the tests ask of it,
// in the JSON the plugin reads.
package nriplugin

import "github.com/containerd/nri/pkg/api"

// Config is what the plugin does; the adjustments, updates and failures
// apply to the containers whose name starts with Match, Reject to the
// pods too.
type Config struct {
	Match  string `json:"match"`
	Events string `json:"events,omitempty"` // file each event is appended to

	Env         map[string]string `json:"env,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Mount       *api.Mount        `json:"mount,omitempty"`
	Rlimit      *api.POSIXRlimit  `json:"rlimit,omitempty"`
	Cpuset      string            `json:"cpuset,omitempty"`
	MemoryLimit int64             `json:"memoryLimit,omitempty"`
	Device      *api.LinuxDevice  `json:"device,omitempty"`
	CDIDevice   string            `json:"cdiDevice,omitempty"`
	Hook        *api.Hook         `json:"hook,omitempty"` // a createRuntime hook
	OOMScoreAdj *int              `json:"oomScoreAdj,omitempty"`
	Sysctl      map[string]string `json:"sysctl,omitempty"`
	Unified     map[string]string `json:"unified,omitempty"` // cgroup v2 files
	// HugepageLimit is a hugetlb limit of Limit bytes for PageSize ("2MB").
	HugepageLimit *api.HugepageLimit `json:"hugepageLimit,omitempty"`

	// SyncCpuset is set on every container the plugin finds at its sync.
	SyncCpuset string `json:"syncCpuset,omitempty"`
	// UpdateCpuset is set on a container the kubelet updates, and
	// UpdateUnified's cgroup v2 files.
	UpdateCpuset  string            `json:"updateCpuset,omitempty"`
	UpdateUnified map[string]string `json:"updateUnified,omitempty"`
	// UnsolicitedCpuset is set, unasked, on a container once it started.
	UnsolicitedCpuset string `json:"unsolicitedCpuset,omitempty"`

	Reject string `json:"reject,omitempty"` // refuse the container, or the pod's resize, with this reason
	Hang   bool   `json:"hang,omitempty"`   // never answer CreateContainer
	Crash  bool   `json:"crash,omitempty"`  // exit at CreateContainer
}
