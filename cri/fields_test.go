package cri

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/reflect/protoreflect"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// This file is berth's answer to "what happens to each field the kubelet
// sends?": every field of every CRI request message, and of the messages
// nested in them, is in criFields as honoured (with the test that proves
// it), refused (with the error) or not applicable (with the reason).
// TestCRIFields fails when a cri-api upgrade brings a field nobody has
// decided on, so a new field cannot be dropped silently.
//
// Rows are per field of a message type, not per path: LinuxContainerResources
// is decided once, whether it arrives in CreateContainer or in
// UpdateContainerResources. A message-typed field is a row of its own (Mount.image
// has its own proof although ImageSpec's fields are honoured elsewhere), and so are
// the fields of its message. A map field is one row: its entry's key and value
// have no meaning apart from it.

// verdict says what berth does with one request field.
type verdict struct {
	proof string     // honoured: a test function that proves it
	code  codes.Code // refused: the gRPC code of the refusal
	why   string     // refused: the refusal in words; not applicable: the reason
}

func (v verdict) honoured() bool { return v.proof != "" }
func (v verdict) refused() bool  { return v.code != codes.OK }

func honoured(test string) verdict { return verdict{proof: test} }

func refused(code codes.Code, why string) verdict { return verdict{code: code, why: why} }

func notApplicable(why string) verdict { return verdict{why: why} }

// Reasons shared by many rows.
var (
	windowsOnly  = notApplicable("Windows only; berth runs Linux containers")
	unimplChkpt  = refused(codes.Unimplemented, "berth does not checkpoint or restore; the whole call is refused")
	unimplStream = refused(codes.Unimplemented, "StreamImages is not served; the whole call is refused")
	selinuxOff   = refused(codes.FailedPrecondition, "refused naming the field where SELinux is enabled (berth does not label); no effect where it is off")
)

var criFields = map[protoreflect.FullName]verdict{
	// Version
	"runtime.v1.VersionRequest.version": notApplicable("the kubelet's API version, for information; berth serves v1 only and says so in the answer"),

	// RunPodSandbox and its config (also in CreateContainer and PullImage as sandbox_config)
	"runtime.v1.RunPodSandboxRequest.config":          honoured("TestPodLifecycle"),
	"runtime.v1.RunPodSandboxRequest.runtime_handler": honoured("TestUnknownRuntimeHandlerRefused"),
	"runtime.v1.PodSandboxConfig.metadata":            honoured("TestPodValidation"),
	"runtime.v1.PodSandboxMetadata.name":              honoured("TestPodAttributesAndFilters"),
	"runtime.v1.PodSandboxMetadata.uid":               honoured("TestPodAttributesAndFilters"),
	"runtime.v1.PodSandboxMetadata.namespace":         honoured("TestPodAttributesAndFilters"),
	"runtime.v1.PodSandboxMetadata.attempt":           honoured("TestPodAttributesAndFilters"),
	"runtime.v1.PodSandboxConfig.hostname":            honoured("TestPodHostnameAndDNS"),
	"runtime.v1.PodSandboxConfig.log_directory":       honoured("TestLogPathConfinement"),
	"runtime.v1.PodSandboxConfig.dns_config":          honoured("TestPodHostnameAndDNS"),
	"runtime.v1.DNSConfig.servers":                    honoured("TestPodHostnameAndDNS"),
	"runtime.v1.DNSConfig.searches":                   honoured("TestPodHostnameAndDNS"),
	"runtime.v1.DNSConfig.options":                    honoured("TestPodHostnameAndDNS"),
	"runtime.v1.PodSandboxConfig.port_mappings":       honoured("TestHostPorts"),
	"runtime.v1.PortMapping.protocol":                 honoured("TestHostPorts"),
	"runtime.v1.PortMapping.container_port":           honoured("TestHostPorts"),
	"runtime.v1.PortMapping.host_port":                honoured("TestHostPorts"),
	"runtime.v1.PortMapping.host_ip":                  honoured("TestHostPorts"),
	"runtime.v1.PodSandboxConfig.labels":              honoured("TestPodAttributesAndFilters"),
	"runtime.v1.PodSandboxConfig.annotations":         honoured("TestPodAttributesAndFilters"),
	"runtime.v1.PodSandboxConfig.linux":               honoured("TestPodLifecycle"),
	"runtime.v1.PodSandboxConfig.windows":             windowsOnly,

	"runtime.v1.LinuxPodSandboxConfig.cgroup_parent":    honoured("TestPodCgroupOfTheKubelet"),
	"runtime.v1.LinuxPodSandboxConfig.security_context": honoured("TestPauseHoldsNoPrivilege"),
	"runtime.v1.LinuxPodSandboxConfig.sysctls":          honoured("TestPodSysctls"),
	"runtime.v1.LinuxPodSandboxConfig.overhead":         notApplicable("the kubelet sizes the pod cgroup, overhead included; the CRI gives it for VM runtimes"),
	"runtime.v1.LinuxPodSandboxConfig.resources":        honoured("TestUpdatePodSandboxResources"),

	"runtime.v1.LinuxSandboxSecurityContext.namespace_options":          honoured("TestPodNamespaces"),
	"runtime.v1.LinuxSandboxSecurityContext.selinux_options":            selinuxOff,
	"runtime.v1.LinuxSandboxSecurityContext.run_as_user":                honoured("TestPauseHoldsNoPrivilege"),
	"runtime.v1.LinuxSandboxSecurityContext.run_as_group":               honoured("TestPauseHoldsNoPrivilege"),
	"runtime.v1.LinuxSandboxSecurityContext.readonly_rootfs":            notApplicable("the pause's root is read-only whatever is asked; the pause writes nothing"),
	"runtime.v1.LinuxSandboxSecurityContext.supplemental_groups":        notApplicable("the pause runs without supplementary groups; each container's config carries the pod's groups"),
	"runtime.v1.LinuxSandboxSecurityContext.supplemental_groups_policy": notApplicable("as supplemental_groups: the containers' own field is honoured"),
	"runtime.v1.LinuxSandboxSecurityContext.privileged":                 honoured("TestPrivilegedNeedsPrivilegedPod"),
	"runtime.v1.LinuxSandboxSecurityContext.seccomp":                    honoured("TestPauseSeccomp"),
	"runtime.v1.LinuxSandboxSecurityContext.apparmor":                   honoured("TestPauseAppArmor"),
	"runtime.v1.LinuxSandboxSecurityContext.seccomp_profile_path":       honoured("TestPauseSeccomp"),

	"runtime.v1.NamespaceOption.network":        honoured("TestPodNamespaces"),
	"runtime.v1.NamespaceOption.pid":            honoured("TestPodNamespaces"),
	"runtime.v1.NamespaceOption.ipc":            honoured("TestPodNamespaces"),
	"runtime.v1.NamespaceOption.target_id":      honoured("TestDebugTargetPIDNamespace"),
	"runtime.v1.NamespaceOption.userns_options": honoured("TestUserNamespacePod"),
	"runtime.v1.UserNamespace.mode":             honoured("TestUsernsOptionsRefused"),
	"runtime.v1.UserNamespace.uids":             honoured("TestUserNamespacePod"),
	"runtime.v1.UserNamespace.gids":             honoured("TestUserNamespacePod"),
	"runtime.v1.IDMapping.host_id":              honoured("TestCheckUserns"),
	"runtime.v1.IDMapping.container_id":         honoured("TestCheckUserns"),
	"runtime.v1.IDMapping.length":               honoured("TestCheckUserns"),

	"runtime.v1.SELinuxOption.user":  selinuxOff,
	"runtime.v1.SELinuxOption.role":  selinuxOff,
	"runtime.v1.SELinuxOption.type":  selinuxOff,
	"runtime.v1.SELinuxOption.level": selinuxOff,

	"runtime.v1.Int64Value.value": honoured("TestContainerUsers"),

	"runtime.v1.SecurityProfile.profile_type":  honoured("TestSeccomp"),
	"runtime.v1.SecurityProfile.localhost_ref": honoured("TestSeccompLocalhost"),

	"runtime.v1.LinuxContainerResources.cpu_period":                 honoured("TestContainerResources"),
	"runtime.v1.LinuxContainerResources.cpu_quota":                  honoured("TestContainerResources"),
	"runtime.v1.LinuxContainerResources.cpu_shares":                 honoured("TestContainerResources"),
	"runtime.v1.LinuxContainerResources.memory_limit_in_bytes":      honoured("TestContainerResources"),
	"runtime.v1.LinuxContainerResources.oom_score_adj":              honoured("TestContainerResources"),
	"runtime.v1.LinuxContainerResources.cpuset_cpus":                honoured("TestContainerResources"),
	"runtime.v1.LinuxContainerResources.cpuset_mems":                honoured("TestContainerResources"),
	"runtime.v1.LinuxContainerResources.hugepage_limits":            honoured("TestSpecResources"),
	"runtime.v1.HugepageLimit.page_size":                            honoured("TestSpecResources"),
	"runtime.v1.HugepageLimit.limit":                                honoured("TestSpecResources"),
	"runtime.v1.LinuxContainerResources.unified":                    honoured("TestSpecResources"),
	"runtime.v1.LinuxContainerResources.memory_swap_limit_in_bytes": honoured("TestSpecResources"),

	"runtime.v1.WindowsPodSandboxConfig.security_context":        windowsOnly,
	"runtime.v1.WindowsSandboxSecurityContext.run_as_username":   windowsOnly,
	"runtime.v1.WindowsSandboxSecurityContext.credential_spec":   windowsOnly,
	"runtime.v1.WindowsSandboxSecurityContext.host_process":      windowsOnly,
	"runtime.v1.WindowsSandboxSecurityContext.namespace_options": windowsOnly,
	"runtime.v1.WindowsNamespaceOption.network":                  windowsOnly,
	"runtime.v1.WindowsContainerConfig.resources":                windowsOnly,
	"runtime.v1.WindowsContainerConfig.security_context":         windowsOnly,
	"runtime.v1.WindowsContainerResources.cpu_shares":            windowsOnly,
	"runtime.v1.WindowsContainerResources.cpu_count":             windowsOnly,
	"runtime.v1.WindowsContainerResources.cpu_maximum":           windowsOnly,
	"runtime.v1.WindowsContainerResources.memory_limit_in_bytes": windowsOnly,
	"runtime.v1.WindowsContainerResources.rootfs_size_in_bytes":  windowsOnly,
	"runtime.v1.WindowsContainerResources.affinity_cpus":         windowsOnly,
	"runtime.v1.WindowsCpuGroupAffinity.cpu_mask":                windowsOnly,
	"runtime.v1.WindowsCpuGroupAffinity.cpu_group":               windowsOnly,
	"runtime.v1.WindowsContainerSecurityContext.run_as_username": windowsOnly,
	"runtime.v1.WindowsContainerSecurityContext.credential_spec": windowsOnly,
	"runtime.v1.WindowsContainerSecurityContext.host_process":    windowsOnly,
	"runtime.v1.ContainerConfig.windows":                         windowsOnly,
	"runtime.v1.UpdateContainerResourcesRequest.windows":         windowsOnly,

	// Pod calls by ID, and the pod lists
	"runtime.v1.StopPodSandboxRequest.pod_sandbox_id":   honoured("TestPodLifecycle"),
	"runtime.v1.RemovePodSandboxRequest.pod_sandbox_id": honoured("TestPodLifecycle"),
	"runtime.v1.PodSandboxStatusRequest.pod_sandbox_id": honoured("TestPodLifecycle"),
	"runtime.v1.PodSandboxStatusRequest.verbose":        honoured("TestUpdatePodSandboxResources"),
	"runtime.v1.ListPodSandboxRequest.filter":           honoured("TestListPodsFilter"),
	"runtime.v1.StreamPodSandboxesRequest.filter":       honoured("TestPodAttributesAndFilters"),
	"runtime.v1.PodSandboxFilter.id":                    honoured("TestListPodsFilter"),
	"runtime.v1.PodSandboxFilter.state":                 honoured("TestListPodsFilter"),
	"runtime.v1.PodSandboxStateValue.state":             honoured("TestListPodsFilter"),
	"runtime.v1.PodSandboxFilter.label_selector":        honoured("TestPodAttributesAndFilters"),

	// CreateContainer and its config
	"runtime.v1.CreateContainerRequest.pod_sandbox_id": honoured("TestPodLifecycle"),
	"runtime.v1.CreateContainerRequest.config":         honoured("TestPodLifecycle"),
	"runtime.v1.CreateContainerRequest.sandbox_config": notApplicable("berth uses the config the pod was run with; the kubelet resends it for runtimes without state"),
	"runtime.v1.ContainerConfig.metadata":              honoured("TestPodAttributesAndFilters"),
	"runtime.v1.ContainerMetadata.name":                honoured("TestPodAttributesAndFilters"),
	"runtime.v1.ContainerMetadata.attempt":             honoured("TestPodAttributesAndFilters"),
	"runtime.v1.ContainerConfig.image":                 honoured("TestKubeletViews"),
	"runtime.v1.ImageSpec.image":                       honoured("TestImageStatusLookups"),
	"runtime.v1.ImageSpec.annotations":                 notApplicable("free-form metadata with no keys berth acts on; kept and shown back in ContainerStatus.image"),
	"runtime.v1.ImageSpec.user_specified_image":        honoured("TestKubeletViews"),
	"runtime.v1.ImageSpec.runtime_handler":             honoured("TestUnknownRuntimeHandlerRefused"),
	"runtime.v1.ImageSpec.image_ref":                   notApplicable("the digest of an image volume's image, for the runtime to report; the kubelet sends Mount.image.image as PullImage answered it, which berth looks up"),
	"runtime.v1.ContainerConfig.command":               honoured("TestProcessArgs"),
	"runtime.v1.ContainerConfig.args":                  honoured("TestProcessArgs"),
	"runtime.v1.ContainerConfig.working_dir":           honoured("TestCwdTerminal"),
	"runtime.v1.ContainerConfig.envs":                  honoured("TestEnv"),
	"runtime.v1.KeyValue.key":                          honoured("TestEnv"),
	"runtime.v1.KeyValue.value":                        honoured("TestEnv"),
	"runtime.v1.ContainerConfig.mounts":                honoured("TestContainerBindMounts"),
	"runtime.v1.Mount.container_path":                  honoured("TestContainerBindMounts"),
	"runtime.v1.Mount.host_path":                       honoured("TestContainerBindMounts"),
	"runtime.v1.Mount.readonly":                        honoured("TestContainerBindMounts"),
	"runtime.v1.Mount.selinux_relabel":                 selinuxOff,
	"runtime.v1.Mount.propagation":                     honoured("TestContainerBindMounts"),
	"runtime.v1.Mount.uidMappings":                     honoured("TestUserNSMounts"),
	"runtime.v1.Mount.gidMappings":                     honoured("TestUserNSMounts"),
	"runtime.v1.Mount.recursive_read_only":             honoured("TestRecursiveReadOnlyMount"),
	"runtime.v1.Mount.image":                           honoured("TestImageVolumes"),
	"runtime.v1.Mount.image_sub_path":                  honoured("TestImageVolumes"),
	"runtime.v1.Mount.mount_options":                   honoured("TestContainerMountOptions"),
	"runtime.v1.ContainerConfig.devices":               honoured("TestCRIDevices"),
	"runtime.v1.Device.container_path":                 honoured("TestCRIDevices"),
	"runtime.v1.Device.host_path":                      honoured("TestCRIDevices"),
	"runtime.v1.Device.permissions":                    honoured("TestCRIDevices"),
	"runtime.v1.ContainerConfig.labels":                honoured("TestPodAttributesAndFilters"),
	"runtime.v1.ContainerConfig.annotations":           honoured("TestPodAttributesAndFilters"),
	"runtime.v1.ContainerConfig.log_path":              honoured("TestContainerLogFormat"),
	"runtime.v1.ContainerConfig.stdin":                 honoured("TestStreamingAttach"),
	"runtime.v1.ContainerConfig.stdin_once":            honoured("TestStreamingAttach"),
	"runtime.v1.ContainerConfig.tty":                   honoured("TestStreamingAttach"),
	"runtime.v1.ContainerConfig.linux":                 honoured("TestPodLifecycle"),
	"runtime.v1.ContainerConfig.CDI_devices":           honoured("TestCDIDevices"),
	"runtime.v1.CDIDevice.name":                        honoured("TestCDIDevices"),
	"runtime.v1.ContainerConfig.stop_signal":           honoured("TestContainerStopSignal"),

	"runtime.v1.LinuxContainerConfig.resources":        honoured("TestContainerResources"),
	"runtime.v1.LinuxContainerConfig.security_context": honoured("TestContainerUsers"),

	"runtime.v1.LinuxContainerSecurityContext.capabilities":               honoured("TestCapabilities"),
	"runtime.v1.Capability.add_capabilities":                              honoured("TestCapabilities"),
	"runtime.v1.Capability.drop_capabilities":                             honoured("TestCapabilities"),
	"runtime.v1.Capability.add_ambient_capabilities":                      honoured("TestCapabilitiesAmbientAndErrors"),
	"runtime.v1.LinuxContainerSecurityContext.privileged":                 honoured("TestPrivilegedNeedsPrivilegedPod"),
	"runtime.v1.LinuxContainerSecurityContext.namespace_options":          honoured("TestDebugTargetPIDNamespace"),
	"runtime.v1.LinuxContainerSecurityContext.selinux_options":            selinuxOff,
	"runtime.v1.LinuxContainerSecurityContext.run_as_user":                honoured("TestContainerUsers"),
	"runtime.v1.LinuxContainerSecurityContext.run_as_group":               honoured("TestContainerUsers"),
	"runtime.v1.LinuxContainerSecurityContext.run_as_username":            honoured("TestContainerUsers"),
	"runtime.v1.LinuxContainerSecurityContext.readonly_rootfs":            honoured("TestNoNewPrivsReadonlyRootfs"),
	"runtime.v1.LinuxContainerSecurityContext.supplemental_groups":        honoured("TestContainerUsers"),
	"runtime.v1.LinuxContainerSecurityContext.supplemental_groups_policy": honoured("TestContainerUsers"),
	"runtime.v1.LinuxContainerSecurityContext.no_new_privs":               honoured("TestNoNewPrivsReadonlyRootfs"),
	"runtime.v1.LinuxContainerSecurityContext.masked_paths":               honoured("TestProcMountUnmasked"),
	"runtime.v1.LinuxContainerSecurityContext.readonly_paths":             honoured("TestProcMountUnmasked"),
	"runtime.v1.LinuxContainerSecurityContext.seccomp":                    honoured("TestSeccomp"),
	"runtime.v1.LinuxContainerSecurityContext.apparmor":                   honoured("TestAppArmor"),
	"runtime.v1.LinuxContainerSecurityContext.apparmor_profile":           honoured("TestAppArmor"),
	"runtime.v1.LinuxContainerSecurityContext.seccomp_profile_path":       honoured("TestSeccomp"),

	// Container calls by ID, and the container lists
	"runtime.v1.StartContainerRequest.container_id":  honoured("TestPodLifecycle"),
	"runtime.v1.StopContainerRequest.container_id":   honoured("TestContainerStop"),
	"runtime.v1.StopContainerRequest.timeout":        honoured("TestStopContainerStuck"),
	"runtime.v1.RemoveContainerRequest.container_id": honoured("TestPodLifecycle"),
	"runtime.v1.ListContainersRequest.filter":        honoured("TestPodAttributesAndFilters"),
	"runtime.v1.StreamContainersRequest.filter":      honoured("TestPodAttributesAndFilters"),
	"runtime.v1.ContainerFilter.id":                  honoured("TestPodAttributesAndFilters"),
	"runtime.v1.ContainerFilter.state":               honoured("TestPodAttributesAndFilters"),
	"runtime.v1.ContainerStateValue.state":           honoured("TestPodAttributesAndFilters"),
	"runtime.v1.ContainerFilter.pod_sandbox_id":      honoured("TestPodAttributesAndFilters"),
	"runtime.v1.ContainerFilter.label_selector":      honoured("TestPodAttributesAndFilters"),
	"runtime.v1.ContainerStatusRequest.container_id": honoured("TestStatusFields"),
	"runtime.v1.ContainerStatusRequest.verbose":      honoured("TestUpdateContainerResources"),

	"runtime.v1.UpdateContainerResourcesRequest.container_id": honoured("TestUpdateContainerResources"),
	"runtime.v1.UpdateContainerResourcesRequest.linux":        honoured("TestUpdateContainerResources"),
	"runtime.v1.UpdateContainerResourcesRequest.annotations":  notApplicable("free-form hints for experimental resources; berth defines no such keys"),
	"runtime.v1.ReopenContainerLogRequest.container_id":       honoured("TestContainerLogRotation"),

	// Exec, attach, port-forward
	"runtime.v1.ExecSyncRequest.container_id":      honoured("TestContainerExecSync"),
	"runtime.v1.ExecSyncRequest.cmd":               honoured("TestContainerExecSync"),
	"runtime.v1.ExecSyncRequest.timeout":           honoured("TestContainerExecSync"),
	"runtime.v1.ExecRequest.container_id":          honoured("TestContainerExecStream"),
	"runtime.v1.ExecRequest.cmd":                   honoured("TestContainerExecStream"),
	"runtime.v1.ExecRequest.tty":                   honoured("TestContainerExecStream"),
	"runtime.v1.ExecRequest.stdin":                 honoured("TestContainerExecStream"),
	"runtime.v1.ExecRequest.stdout":                honoured("TestContainerExecStream"),
	"runtime.v1.ExecRequest.stderr":                honoured("TestContainerExecStream"),
	"runtime.v1.AttachRequest.container_id":        honoured("TestStreamingAttach"),
	"runtime.v1.AttachRequest.stdin":               honoured("TestStreamingAttach"),
	"runtime.v1.AttachRequest.tty":                 honoured("TestStreamingAttach"),
	"runtime.v1.AttachRequest.stdout":              honoured("TestStreamingAttach"),
	"runtime.v1.AttachRequest.stderr":              honoured("TestStreamingAttach"),
	"runtime.v1.PortForwardRequest.pod_sandbox_id": honoured("TestPodPortForward"),
	"runtime.v1.PortForwardRequest.port":           honoured("TestPodPortForward"),

	// Stats
	"runtime.v1.ContainerStatsRequest.container_id":    honoured("TestContainerAndPodStats"),
	"runtime.v1.ListContainerStatsRequest.filter":      honoured("TestContainerAndPodStats"),
	"runtime.v1.StreamContainerStatsRequest.filter":    honoured("TestContainerAndPodStats"),
	"runtime.v1.ContainerStatsFilter.id":               honoured("TestContainerAndPodStats"),
	"runtime.v1.ContainerStatsFilter.pod_sandbox_id":   honoured("TestContainerAndPodStats"),
	"runtime.v1.ContainerStatsFilter.label_selector":   honoured("TestContainerAndPodStats"),
	"runtime.v1.PodSandboxStatsRequest.pod_sandbox_id": honoured("TestContainerAndPodStats"),
	"runtime.v1.ListPodSandboxStatsRequest.filter":     honoured("TestContainerAndPodStats"),
	"runtime.v1.StreamPodSandboxStatsRequest.filter":   honoured("TestContainerAndPodStats"),
	"runtime.v1.PodSandboxStatsFilter.id":              honoured("TestContainerAndPodStats"),
	"runtime.v1.PodSandboxStatsFilter.label_selector":  honoured("TestContainerAndPodStats"),

	// Runtime
	"runtime.v1.UpdateRuntimeConfigRequest.runtime_config": honoured("TestUpdateRuntimeConfigPodCIDR"),
	"runtime.v1.RuntimeConfig.network_config":              honoured("TestUpdateRuntimeConfigPodCIDR"),
	"runtime.v1.NetworkConfig.pod_cidr":                    honoured("TestUpdateRuntimeConfigPodCIDR"),
	"runtime.v1.StatusRequest.verbose":                     honoured("TestRuntimeVersionStatusConfig"),

	"runtime.v1.UpdatePodSandboxResourcesRequest.pod_sandbox_id": honoured("TestUpdatePodSandboxResources"),
	"runtime.v1.UpdatePodSandboxResourcesRequest.overhead":       notApplicable("the kubelet sizes the pod cgroup, overhead included; the CRI gives it for VM runtimes"),
	"runtime.v1.UpdatePodSandboxResourcesRequest.resources":      honoured("TestUpdatePodSandboxResources"),

	// Checkpoint and restore
	"runtime.v1.CheckpointContainerRequest.container_id": unimplChkpt,
	"runtime.v1.CheckpointContainerRequest.location":     unimplChkpt,
	"runtime.v1.CheckpointContainerRequest.timeout":      unimplChkpt,
	"runtime.v1.CheckpointPodRequest.pod_sandbox_id":     unimplChkpt,
	"runtime.v1.CheckpointPodRequest.output_path":        unimplChkpt,
	"runtime.v1.CheckpointPodRequest.container_ids":      unimplChkpt,
	"runtime.v1.CheckpointPodRequest.options":            unimplChkpt,
	"runtime.v1.RestorePodRequest.checkpoint_path":       unimplChkpt,
	"runtime.v1.RestorePodRequest.config":                unimplChkpt,
	"runtime.v1.RestorePodRequest.runtime_handler":       unimplChkpt,
	"runtime.v1.RestorePodRequest.options":               unimplChkpt,
	"runtime.v1.RestorePodRequest.container_configs":     unimplChkpt,

	// ImageService
	"runtime.v1.ListImagesRequest.filter":        honoured("TestListImages"),
	"runtime.v1.ImageFilter.image":               honoured("TestListImages"),
	"runtime.v1.StreamImagesRequest.filter":      unimplStream,
	"runtime.v1.ImageStatusRequest.image":        honoured("TestImageStatusLookups"),
	"runtime.v1.ImageStatusRequest.verbose":      honoured("TestImageStatusLookups"),
	"runtime.v1.PullImageRequest.image":          honoured("TestPullReferenceForms"),
	"runtime.v1.PullImageRequest.auth":           honoured("TestPullAuth"),
	"runtime.v1.AuthConfig.username":             honoured("TestPullAuth"),
	"runtime.v1.AuthConfig.password":             honoured("TestPullAuth"),
	"runtime.v1.AuthConfig.auth":                 honoured("TestPullAuth"),
	"runtime.v1.AuthConfig.server_address":       notApplicable("the kubelet picks the credentials for the image's registry; berth sends them to the image's host only, whatever this says"),
	"runtime.v1.AuthConfig.identity_token":       honoured("TestPullAuth"),
	"runtime.v1.AuthConfig.registry_token":       honoured("TestPullAuth"),
	"runtime.v1.PullImageRequest.sandbox_config": notApplicable("for runtimes that pull per pod (VMs); berth's image store is the node's"),
	"runtime.v1.RemoveImageRequest.image":        honoured("TestRemoveImage"),
}

// knownDropped lists request fields that berth neither honours nor refuses.
// Each is a known gap waiting for a decision; TestCRIFields tolerates them
// and logs them, so the list can only shrink by a decision.
var knownDropped = map[protoreflect.FullName]string{}

// requestFields returns the full name of every field reachable from the
// request message of a RuntimeService or ImageService call, each message
// type walked once. Map entries are not walked (see the note at the top).
func requestFields() []protoreflect.FullName {
	file := runtimeapi.File_staging_src_k8s_io_cri_api_pkg_apis_runtime_v1_api_proto
	var fields []protoreflect.FullName
	walked := map[protoreflect.FullName]bool{}
	var walk func(protoreflect.MessageDescriptor)
	walk = func(m protoreflect.MessageDescriptor) {
		if walked[m.FullName()] {
			return
		}
		walked[m.FullName()] = true
		for i := range m.Fields().Len() {
			f := m.Fields().Get(i)
			fields = append(fields, f.FullName())
			if f.Message() != nil && !f.IsMap() {
				walk(f.Message())
			}
		}
	}
	for _, service := range []string{"RuntimeService", "ImageService"} {
		methods := file.Services().ByName(protoreflect.Name(service)).Methods()
		for i := range methods.Len() {
			walk(methods.Get(i).Input())
		}
	}
	return fields
}

// testFunctions returns the names of the Test functions in the module's
// _test.go files, so a row cannot name a test that does not exist.
func testFunctions(t *testing.T) map[string]bool {
	t.Helper()
	decl := regexp.MustCompile(`^func (Test\w+)\(`)
	names := map[string]bool{}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "vendor") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		lines := bufio.NewScanner(f)
		lines.Buffer(nil, 1<<20)
		for lines.Scan() {
			if m := decl.FindStringSubmatch(lines.Text()); m != nil {
				names[m[1]] = true
			}
		}
		return lines.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func TestCRIFields(t *testing.T) {
	walked := requestFields()
	tests := testFunctions(t)
	var honouredN, refusedN, naN int
	for _, name := range walked {
		v, decided := criFields[name]
		if why, dropped := knownDropped[name]; dropped {
			if decided {
				t.Errorf("%s is both in criFields and knownDropped", name)
			}
			t.Logf("known dropped: %s (%s)", name, why)
			continue
		}
		switch {
		case !decided:
			t.Errorf("%s: no decision; add it to criFields as honoured (with its test), refused (with its error) or not applicable (with why)", name)
		case v.honoured():
			honouredN++
			if !tests[v.proof] {
				t.Errorf("%s: honoured by %s, but no func %s( is in any _test.go", name, v.proof, v.proof)
			}
		case v.refused():
			refusedN++
			if v.why == "" {
				t.Errorf("%s: refused with %v, but the error is not described", name, v.code)
			}
		default:
			naN++
			if v.why == "" {
				t.Errorf("%s: not applicable, but no reason is given", name)
			}
		}
	}
	for name := range criFields {
		if !slices.Contains(walked, name) {
			t.Errorf("criFields names %s, which no CRI request carries (renamed or removed by cri-api?)", name)
		}
	}
	for name := range knownDropped {
		if !slices.Contains(walked, name) {
			t.Errorf("knownDropped names %s, which no CRI request carries", name)
		}
	}
	t.Logf("%d request fields: %d honoured, %d refused, %d not applicable, %d known dropped",
		len(walked), honouredN, refusedN, naN, len(knownDropped))
}
