package cri

import (
	"bufio"
	"io/fs"
	"iter"
	"maps"
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
// And the other way: every field of every CRI response message, and of
// the messages nested in them, is in criResponseFields as filled (with the
// test that reads it from berth) or not applicable (with the reason), or
// in responseGaps, so a field berth never fills is as visible as a dropped
// request field. A message berth sends back as the kubelet sent it (a
// pod's namespace options, a container's mounts) is proved for all its
// fields by the test that reads it back whole.
//
// Rows are per field of a message type, not per path: LinuxContainerResources
// is decided once, whether it arrives in CreateContainer or in
// UpdateContainerResources. A message-typed field is a row of its own (Mount.image
// has its own proof although ImageSpec's fields are honoured elsewhere), and so are
// the fields of its message. A map field is one row: its entry's key and value
// have no meaning apart from it. The fields of Windows messages, and those
// leading to them, need no row: they are Windows-only (windowsField).

// verdict says what berth does with one request field, or how it fills one
// response field.
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

// filled is a response field's honoured: the test that reads it from berth.
func filled(test string) verdict { return verdict{proof: test} }

// Reasons shared by many rows.
var (
	windowsOnly = notApplicable("Windows only; berth runs Linux containers")
	selinuxOff  = refused(codes.FailedPrecondition, "refused naming the field where SELinux is enabled (berth does not label); no effect where it is off")
	oneHandler  = notApplicable(`berth has one runtime handler, the default, named "": the empty string is the answer`)
	podNoTarget = notApplicable("a container's option (the target of a debug container's PID namespace); a pod's namespace options, echoed in its status, never carry one")
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

	"runtime.v1.LinuxPodSandboxConfig.cgroup_parent":    honoured("TestPodCgroupOfTheKubelet"),
	"runtime.v1.LinuxPodSandboxConfig.security_context": honoured("TestPauseHoldsNoPrivilege"),
	"runtime.v1.LinuxPodSandboxConfig.sysctls":          honoured("TestPodSysctls"),
	"runtime.v1.LinuxPodSandboxConfig.overhead":         notApplicable("the kubelet sizes the pod cgroup, overhead included; the CRI gives it for VM runtimes (berth records it, and tells NRI plugins)"),
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
	"runtime.v1.UpdatePodSandboxResourcesRequest.overhead":       notApplicable("the kubelet sizes the pod cgroup, overhead included; the CRI gives it for VM runtimes (berth records it, and tells NRI plugins)"),
	"runtime.v1.UpdatePodSandboxResourcesRequest.resources":      honoured("TestUpdatePodSandboxResources"),

	// Checkpoint and restore
	"runtime.v1.CheckpointContainerRequest.container_id": honoured("TestCheckpointContainer"),
	"runtime.v1.CheckpointContainerRequest.location":     honoured("TestCheckpointContainer"),
	"runtime.v1.CheckpointContainerRequest.timeout":      honoured("TestCheckpointContainer"),
	"runtime.v1.CheckpointPodRequest.pod_sandbox_id":     honoured("TestCheckpointPod"),
	"runtime.v1.CheckpointPodRequest.output_path":        honoured("TestCheckpointPod"),
	"runtime.v1.CheckpointPodRequest.container_ids":      honoured("TestCheckpointPod"),
	"runtime.v1.CheckpointPodRequest.options":            honoured("TestCheckpointPodRefused"),
	"runtime.v1.RestorePodRequest.checkpoint_path":       honoured("TestRestorePod"),
	"runtime.v1.RestorePodRequest.config":                honoured("TestRestorePod"),
	"runtime.v1.RestorePodRequest.runtime_handler":       honoured("TestRestorePodRefused"),
	"runtime.v1.RestorePodRequest.options":               honoured("TestRestorePodRefused"),
	"runtime.v1.RestorePodRequest.container_configs":     honoured("TestRestorePod"),

	// ImageService
	"runtime.v1.ListImagesRequest.filter":        honoured("TestListImages"),
	"runtime.v1.ImageFilter.image":               honoured("TestListImages"),
	"runtime.v1.StreamImagesRequest.filter":      honoured("TestListImages"),
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

// criResponseFields: what berth sends back, field by field (see the note
// at the top). Rows are per field of a message type, as in criFields.
var criResponseFields = map[protoreflect.FullName]verdict{
	"runtime.v1.VersionResponse.version":                             filled("TestVersion"),
	"runtime.v1.VersionResponse.runtime_name":                        filled("TestVersion"),
	"runtime.v1.VersionResponse.runtime_version":                     filled("TestVersion"),
	"runtime.v1.VersionResponse.runtime_api_version":                 filled("TestVersion"),
	"runtime.v1.RunPodSandboxResponse.pod_sandbox_id":                filled("TestPodLifecycle"),
	"runtime.v1.PodSandboxStatusResponse.status":                     filled("TestPodAttributesAndFilters"),
	"runtime.v1.PodSandboxStatus.id":                                 filled("TestPodAttributesAndFilters"),
	"runtime.v1.PodSandboxStatus.metadata":                           filled("TestPodAttributesAndFilters"),
	"runtime.v1.PodSandboxMetadata.name":                             filled("TestPodAttributesAndFilters"),
	"runtime.v1.PodSandboxMetadata.uid":                              filled("TestPodAttributesAndFilters"),
	"runtime.v1.PodSandboxMetadata.namespace":                        filled("TestPodAttributesAndFilters"),
	"runtime.v1.PodSandboxMetadata.attempt":                          filled("TestPodAttributesAndFilters"),
	"runtime.v1.PodSandboxStatus.state":                              filled("TestContainerEvents"),
	"runtime.v1.PodSandboxStatus.created_at":                         filled("TestPodAttributesAndFilters"),
	"runtime.v1.PodSandboxStatus.network":                            filled("TestDualStackPodNetwork"),
	"runtime.v1.PodSandboxNetworkStatus.ip":                          filled("TestDualStackPodNetwork"),
	"runtime.v1.PodSandboxNetworkStatus.additional_ips":              filled("TestDualStackPodNetwork"),
	"runtime.v1.PodIP.ip":                                            filled("TestDualStackPodNetwork"),
	"runtime.v1.PodSandboxStatus.linux":                              filled("TestPodNamespaces"),
	"runtime.v1.LinuxPodSandboxStatus.namespaces":                    filled("TestPodNamespaces"),
	"runtime.v1.Namespace.options":                                   filled("TestPodNamespaces"),
	"runtime.v1.NamespaceOption.network":                             filled("TestPodNamespaces"),
	"runtime.v1.NamespaceOption.pid":                                 filled("TestPodNamespaces"),
	"runtime.v1.NamespaceOption.ipc":                                 filled("TestPodNamespaces"),
	"runtime.v1.NamespaceOption.target_id":                           podNoTarget,
	"runtime.v1.NamespaceOption.userns_options":                      filled("TestUserNamespacePod"),
	"runtime.v1.UserNamespace.mode":                                  filled("TestUserNamespacePod"),
	"runtime.v1.UserNamespace.uids":                                  filled("TestUserNamespacePod"),
	"runtime.v1.IDMapping.host_id":                                   filled("TestUserNamespacePod"),
	"runtime.v1.IDMapping.container_id":                              filled("TestUserNamespacePod"),
	"runtime.v1.IDMapping.length":                                    filled("TestUserNamespacePod"),
	"runtime.v1.UserNamespace.gids":                                  filled("TestUserNamespacePod"),
	"runtime.v1.PodSandboxStatus.labels":                             filled("TestPodAttributesAndFilters"),
	"runtime.v1.PodSandboxStatus.annotations":                        filled("TestPodAttributesAndFilters"),
	"runtime.v1.PodSandboxStatus.runtime_handler":                    oneHandler,
	"runtime.v1.PodSandboxStatusResponse.info":                       filled("TestUpdatePodSandboxResources"),
	"runtime.v1.PodSandboxStatusResponse.containers_statuses":        filled("TestStatusFields"),
	"runtime.v1.ContainerStatus.id":                                  filled("TestPodAttributesAndFilters"),
	"runtime.v1.ContainerStatus.metadata":                            filled("TestPodAttributesAndFilters"),
	"runtime.v1.ContainerMetadata.name":                              filled("TestPodAttributesAndFilters"),
	"runtime.v1.ContainerMetadata.attempt":                           filled("TestPodAttributesAndFilters"),
	"runtime.v1.ContainerStatus.state":                               filled("TestContainerStop"),
	"runtime.v1.ContainerStatus.created_at":                          filled("TestPodAttributesAndFilters"),
	"runtime.v1.ContainerStatus.started_at":                          filled("TestPodRestart"),
	"runtime.v1.ContainerStatus.finished_at":                         filled("TestContainerStop"),
	"runtime.v1.ContainerStatus.exit_code":                           filled("TestContainerStop"),
	"runtime.v1.ContainerStatus.image":                               filled("TestKubeletViews"),
	"runtime.v1.ImageSpec.image":                                     filled("TestKubeletViews"),
	"runtime.v1.ImageSpec.annotations":                               filled("TestKubeletViews"),
	"runtime.v1.ImageSpec.user_specified_image":                      filled("TestKubeletViews"),
	"runtime.v1.ImageSpec.runtime_handler":                           oneHandler,
	"runtime.v1.ContainerStatus.image_ref":                           filled("TestKubeletViews"),
	"runtime.v1.ContainerStatus.reason":                              filled("TestStatusFields"),
	"runtime.v1.ContainerStatus.message":                             filled("TestStatusFields"),
	"runtime.v1.ContainerStatus.labels":                              filled("TestPodAttributesAndFilters"),
	"runtime.v1.ContainerStatus.annotations":                         filled("TestPodAttributesAndFilters"),
	"runtime.v1.ContainerStatus.mounts":                              filled("TestContainerBindMounts"),
	"runtime.v1.Mount.container_path":                                filled("TestContainerBindMounts"),
	"runtime.v1.Mount.host_path":                                     filled("TestContainerBindMounts"),
	"runtime.v1.Mount.readonly":                                      filled("TestContainerBindMounts"),
	"runtime.v1.Mount.selinux_relabel":                               filled("TestContainerBindMounts"),
	"runtime.v1.Mount.propagation":                                   filled("TestContainerBindMounts"),
	"runtime.v1.Mount.uidMappings":                                   filled("TestContainerBindMounts"),
	"runtime.v1.Mount.gidMappings":                                   filled("TestContainerBindMounts"),
	"runtime.v1.Mount.recursive_read_only":                           filled("TestContainerBindMounts"),
	"runtime.v1.Mount.image":                                         filled("TestContainerBindMounts"),
	"runtime.v1.Mount.image_sub_path":                                filled("TestContainerBindMounts"),
	"runtime.v1.Mount.mount_options":                                 filled("TestContainerBindMounts"),
	"runtime.v1.ContainerStatus.log_path":                            filled("TestContainerLogFormat"),
	"runtime.v1.ContainerStatus.resources":                           filled("TestStatusFields"),
	"runtime.v1.ContainerResources.linux":                            filled("TestStatusFields"),
	"runtime.v1.LinuxContainerResources.cpu_period":                  filled("TestStatusFields"),
	"runtime.v1.LinuxContainerResources.cpu_quota":                   filled("TestStatusFields"),
	"runtime.v1.LinuxContainerResources.cpu_shares":                  filled("TestAppliedResourcesInvertSpecResources"),
	"runtime.v1.LinuxContainerResources.memory_limit_in_bytes":       filled("TestStatusFields"),
	"runtime.v1.LinuxContainerResources.oom_score_adj":               filled("TestAppliedResourcesInvertSpecResources"),
	"runtime.v1.LinuxContainerResources.cpuset_cpus":                 filled("TestAppliedResourcesInvertSpecResources"),
	"runtime.v1.LinuxContainerResources.cpuset_mems":                 filled("TestAppliedResourcesInvertSpecResources"),
	"runtime.v1.LinuxContainerResources.unified":                     filled("TestAppliedResourcesInvertSpecResources"),
	"runtime.v1.ContainerStatus.image_id":                            filled("TestKubeletViews"),
	"runtime.v1.ContainerStatus.user":                                filled("TestContainerUsers"),
	"runtime.v1.ContainerUser.linux":                                 filled("TestContainerUsers"),
	"runtime.v1.LinuxContainerUser.uid":                              filled("TestContainerUsers"),
	"runtime.v1.LinuxContainerUser.gid":                              filled("TestContainerUsers"),
	"runtime.v1.LinuxContainerUser.supplemental_groups":              filled("TestContainerUsers"),
	"runtime.v1.ContainerStatus.stop_signal":                         filled("TestContainerStopSignal"),
	"runtime.v1.PodSandboxStatusResponse.timestamp":                  filled("TestStatusFields"),
	"runtime.v1.ListPodSandboxResponse.items":                        filled("TestPodAttributesAndFilters"),
	"runtime.v1.PodSandbox.id":                                       filled("TestPodAttributesAndFilters"),
	"runtime.v1.PodSandbox.metadata":                                 filled("TestPodAttributesAndFilters"),
	"runtime.v1.PodSandbox.state":                                    filled("TestPodAttributesAndFilters"),
	"runtime.v1.PodSandbox.created_at":                               filled("TestPodAttributesAndFilters"),
	"runtime.v1.PodSandbox.labels":                                   filled("TestPodAttributesAndFilters"),
	"runtime.v1.PodSandbox.annotations":                              filled("TestPodAttributesAndFilters"),
	"runtime.v1.PodSandbox.runtime_handler":                          oneHandler,
	"runtime.v1.StreamPodSandboxesResponse.pod_sandboxes":            filled("TestPodAttributesAndFilters"),
	"runtime.v1.CreateContainerResponse.container_id":                filled("TestPodLifecycle"),
	"runtime.v1.ListContainersResponse.containers":                   filled("TestPodAttributesAndFilters"),
	"runtime.v1.Container.id":                                        filled("TestPodAttributesAndFilters"),
	"runtime.v1.Container.pod_sandbox_id":                            filled("TestPodAttributesAndFilters"),
	"runtime.v1.Container.metadata":                                  filled("TestPodAttributesAndFilters"),
	"runtime.v1.Container.image":                                     filled("TestKubeletViews"),
	"runtime.v1.Container.image_ref":                                 filled("TestKubeletViews"),
	"runtime.v1.Container.state":                                     filled("TestPodAttributesAndFilters"),
	"runtime.v1.Container.created_at":                                filled("TestPodAttributesAndFilters"),
	"runtime.v1.Container.labels":                                    filled("TestPodAttributesAndFilters"),
	"runtime.v1.Container.annotations":                               filled("TestPodAttributesAndFilters"),
	"runtime.v1.Container.image_id":                                  filled("TestKubeletViews"),
	"runtime.v1.StreamContainersResponse.containers":                 filled("TestPodAttributesAndFilters"),
	"runtime.v1.ContainerStatusResponse.status":                      filled("TestStatusFields"),
	"runtime.v1.ContainerStatusResponse.info":                        filled("TestUpdateContainerResources"),
	"runtime.v1.ExecSyncResponse.stdout":                             filled("TestContainerExecSync"),
	"runtime.v1.ExecSyncResponse.stderr":                             filled("TestContainerExecSync"),
	"runtime.v1.ExecSyncResponse.exit_code":                          filled("TestContainerExecSync"),
	"runtime.v1.ExecResponse.url":                                    filled("TestContainerExecStream"),
	"runtime.v1.AttachResponse.url":                                  filled("TestStreamingAttach"),
	"runtime.v1.PortForwardResponse.url":                             filled("TestPodPortForward"),
	"runtime.v1.ContainerStatsResponse.stats":                        filled("TestContainerAndPodStats"),
	"runtime.v1.ContainerStats.attributes":                           filled("TestContainerAndPodStats"),
	"runtime.v1.ContainerAttributes.id":                              filled("TestContainerAndPodStats"),
	"runtime.v1.ContainerAttributes.metadata":                        filled("TestContainerAndPodStats"),
	"runtime.v1.ContainerAttributes.labels":                          filled("TestContainerAndPodStats"),
	"runtime.v1.ContainerAttributes.annotations":                     filled("TestStatsFiguresFilled"),
	"runtime.v1.ContainerStats.cpu":                                  filled("TestContainerAndPodStats"),
	"runtime.v1.CpuUsage.timestamp":                                  filled("TestContainerAndPodStats"),
	"runtime.v1.CpuUsage.usage_core_nano_seconds":                    filled("TestContainerAndPodStats"),
	"runtime.v1.UInt64Value.value":                                   filled("TestContainerAndPodStats"),
	"runtime.v1.CpuUsage.usage_nano_cores":                           filled("TestStatsFiguresFilled"),
	"runtime.v1.CpuUsage.psi":                                        filled("TestContainerAndPodPSI"),
	"runtime.v1.PsiStats.Full":                                       filled("TestContainerAndPodPSI"),
	"runtime.v1.PsiData.Total":                                       filled("TestContainerAndPodPSI"),
	"runtime.v1.PsiData.Avg10":                                       filled("TestPSIMessages"),
	"runtime.v1.PsiData.Avg60":                                       filled("TestPSIMessages"),
	"runtime.v1.PsiData.Avg300":                                      filled("TestPSIMessages"),
	"runtime.v1.PsiStats.Some":                                       filled("TestContainerAndPodPSI"),
	"runtime.v1.ContainerStats.memory":                               filled("TestContainerAndPodStats"),
	"runtime.v1.MemoryUsage.timestamp":                               filled("TestContainerAndPodStats"),
	"runtime.v1.MemoryUsage.working_set_bytes":                       filled("TestContainerAndPodStats"),
	"runtime.v1.MemoryUsage.usage_bytes":                             filled("TestStatsFiguresFilled"),
	"runtime.v1.MemoryUsage.rss_bytes":                               filled("TestStatsFiguresFilled"),
	"runtime.v1.MemoryUsage.page_faults":                             filled("TestStatsFiguresFilled"),
	"runtime.v1.MemoryUsage.major_page_faults":                       filled("TestStatsFiguresFilled"),
	"runtime.v1.MemoryUsage.psi":                                     filled("TestContainerAndPodPSI"),
	"runtime.v1.MemoryUsage.available_bytes":                         filled("TestCRIMetricsFigures"),
	"runtime.v1.ContainerStats.swap":                                 filled("TestCRIMetricsFigures"),
	"runtime.v1.SwapUsage.timestamp":                                 filled("TestCRIMetricsFigures"),
	"runtime.v1.SwapUsage.swap_available_bytes":                      filled("TestCRIMetricsFigures"),
	"runtime.v1.SwapUsage.swap_usage_bytes":                          filled("TestCRIMetricsFigures"),
	"runtime.v1.ContainerStats.writable_layer":                       filled("TestContainerAndPodStats"),
	"runtime.v1.FilesystemUsage.timestamp":                           filled("TestContainerAndPodStats"),
	"runtime.v1.FilesystemUsage.fs_id":                               filled("TestContainerAndPodStats"),
	"runtime.v1.FilesystemIdentifier.mountpoint":                     filled("TestContainerAndPodStats"),
	"runtime.v1.FilesystemUsage.used_bytes":                          filled("TestContainerAndPodStats"),
	"runtime.v1.FilesystemUsage.inodes_used":                         filled("TestContainerAndPodStats"),
	"runtime.v1.ContainerStats.io":                                   filled("TestContainerAndPodPSI"),
	"runtime.v1.IoUsage.timestamp":                                   filled("TestContainerAndPodPSI"),
	"runtime.v1.IoUsage.psi":                                         filled("TestContainerAndPodPSI"),
	"runtime.v1.ListContainerStatsResponse.stats":                    filled("TestContainerAndPodStats"),
	"runtime.v1.StreamContainerStatsResponse.container_stats":        filled("TestContainerAndPodStats"),
	"runtime.v1.PodSandboxStatsResponse.stats":                       filled("TestContainerAndPodStats"),
	"runtime.v1.PodSandboxStats.attributes":                          filled("TestContainerAndPodStats"),
	"runtime.v1.PodSandboxAttributes.id":                             filled("TestContainerAndPodStats"),
	"runtime.v1.PodSandboxAttributes.metadata":                       filled("TestContainerAndPodStats"),
	"runtime.v1.PodSandboxAttributes.labels":                         filled("TestContainerAndPodStats"),
	"runtime.v1.PodSandboxAttributes.annotations":                    filled("TestStatsFiguresFilled"),
	"runtime.v1.PodSandboxStats.linux":                               filled("TestContainerAndPodStats"),
	"runtime.v1.LinuxPodSandboxStats.cpu":                            filled("TestContainerAndPodStats"),
	"runtime.v1.LinuxPodSandboxStats.memory":                         filled("TestContainerAndPodStats"),
	"runtime.v1.LinuxPodSandboxStats.network":                        filled("TestKubeletViews"),
	"runtime.v1.NetworkUsage.timestamp":                              filled("TestKubeletViews"),
	"runtime.v1.NetworkUsage.default_interface":                      filled("TestKubeletViews"),
	"runtime.v1.NetworkInterfaceUsage.name":                          filled("TestKubeletViews"),
	"runtime.v1.NetworkInterfaceUsage.rx_bytes":                      filled("TestKubeletViews"),
	"runtime.v1.NetworkInterfaceUsage.rx_errors":                     filled("TestStatsFiguresFilled"),
	"runtime.v1.NetworkInterfaceUsage.tx_bytes":                      filled("TestKubeletViews"),
	"runtime.v1.NetworkInterfaceUsage.tx_errors":                     filled("TestStatsFiguresFilled"),
	"runtime.v1.LinuxPodSandboxStats.process":                        filled("TestContainerAndPodStats"),
	"runtime.v1.ProcessUsage.timestamp":                              filled("TestContainerAndPodStats"),
	"runtime.v1.ProcessUsage.process_count":                          filled("TestContainerAndPodStats"),
	"runtime.v1.LinuxPodSandboxStats.containers":                     filled("TestContainerAndPodStats"),
	"runtime.v1.LinuxPodSandboxStats.io":                             filled("TestContainerAndPodPSI"),
	"runtime.v1.ListPodSandboxStatsResponse.stats":                   filled("TestContainerAndPodStats"),
	"runtime.v1.StreamPodSandboxStatsResponse.pod_sandbox_stats":     filled("TestContainerAndPodStats"),
	"runtime.v1.StatusResponse.status":                               filled("TestStatus"),
	"runtime.v1.RuntimeStatus.conditions":                            filled("TestStatus"),
	"runtime.v1.RuntimeCondition.type":                               filled("TestStatus"),
	"runtime.v1.RuntimeCondition.status":                             filled("TestStatus"),
	"runtime.v1.RuntimeCondition.reason":                             filled("TestStatus"),
	"runtime.v1.RuntimeCondition.message":                            filled("TestStatus"),
	"runtime.v1.StatusResponse.info":                                 filled("TestStatus"),
	"runtime.v1.StatusResponse.runtime_handlers":                     filled("TestStatus"),
	"runtime.v1.RuntimeHandler.name":                                 filled("TestStatus"),
	"runtime.v1.RuntimeHandler.features":                             filled("TestStatus"),
	"runtime.v1.RuntimeHandlerFeatures.recursive_read_only_mounts":   filled("TestRuntimeFeaturesDecided"),
	"runtime.v1.RuntimeHandlerFeatures.user_namespaces":              filled("TestRuntimeFeaturesDecided"),
	"runtime.v1.StatusResponse.features":                             filled("TestStatus"),
	"runtime.v1.RuntimeFeatures.supplemental_groups_policy":          filled("TestRuntimeFeaturesDecided"),
	"runtime.v1.RuntimeFeatures.user_namespaces_host_network":        filled("TestRuntimeFeaturesDecided"),
	"runtime.v1.RuntimeFeatures.mount_options":                       filled("TestRuntimeFeaturesDecided"),
	"runtime.v1.RestorePodResponse.pod_sandbox_id":                   filled("TestRestorePod"),
	"runtime.v1.RestorePodResponse.restored_containers":              filled("TestRestorePod"),
	"runtime.v1.RestoredContainer.name":                              filled("TestRestorePod"),
	"runtime.v1.RestoredContainer.container_id":                      filled("TestRestorePod"),
	"runtime.v1.ContainerEventResponse.container_id":                 filled("TestContainerEvents"),
	"runtime.v1.ContainerEventResponse.container_event_type":         filled("TestContainerEvents"),
	"runtime.v1.ContainerEventResponse.created_at":                   filled("TestContainerEvents"),
	"runtime.v1.ContainerEventResponse.pod_sandbox_status":           filled("TestContainerEvents"),
	"runtime.v1.ContainerEventResponse.containers_statuses":          filled("TestContainerEvents"),
	"runtime.v1.ListMetricDescriptorsResponse.descriptors":           filled("TestCRIMetrics"),
	"runtime.v1.MetricDescriptor.name":                               filled("TestCRIMetrics"),
	"runtime.v1.MetricDescriptor.help":                               filled("TestStatsFiguresFilled"),
	"runtime.v1.MetricDescriptor.label_keys":                         filled("TestCRIMetrics"),
	"runtime.v1.ListPodSandboxMetricsResponse.pod_metrics":           filled("TestCRIMetrics"),
	"runtime.v1.PodSandboxMetrics.pod_sandbox_id":                    filled("TestCRIMetrics"),
	"runtime.v1.PodSandboxMetrics.metrics":                           filled("TestCRIMetrics"),
	"runtime.v1.Metric.name":                                         filled("TestCRIMetrics"),
	"runtime.v1.Metric.timestamp":                                    filled("TestStatsFiguresFilled"),
	"runtime.v1.Metric.metric_type":                                  filled("TestStatsFiguresFilled"),
	"runtime.v1.Metric.label_values":                                 filled("TestCRIMetrics"),
	"runtime.v1.Metric.value":                                        filled("TestCRIMetrics"),
	"runtime.v1.PodSandboxMetrics.container_metrics":                 filled("TestCRIMetrics"),
	"runtime.v1.ContainerMetrics.container_id":                       filled("TestCRIMetrics"),
	"runtime.v1.ContainerMetrics.metrics":                            filled("TestCRIMetrics"),
	"runtime.v1.StreamPodSandboxMetricsResponse.pod_sandbox_metrics": filled("TestCRIMetrics"),
	"runtime.v1.RuntimeConfigResponse.linux":                         filled("TestRuntimeConfig"),
	"runtime.v1.LinuxRuntimeConfiguration.cgroup_driver":             filled("TestRuntimeConfig"),
	"runtime.v1.ListImagesResponse.images":                           filled("TestListImages"),
	"runtime.v1.Image.id":                                            filled("TestListImages"),
	"runtime.v1.Image.repo_tags":                                     filled("TestListImages"),
	"runtime.v1.Image.repo_digests":                                  filled("TestListImages"),
	"runtime.v1.Image.size":                                          filled("TestListImages"),
	"runtime.v1.Image.uid":                                           filled("TestImageStatusUserAndSize"),
	"runtime.v1.Int64Value.value":                                    filled("TestImageStatusUserAndSize"),
	"runtime.v1.Image.username":                                      filled("TestImageStatusUserAndSize"),
	"runtime.v1.Image.spec":                                          filled("TestImport"),
	"runtime.v1.Image.pinned":                                        filled("TestImport"),
	"runtime.v1.StreamImagesResponse.images":                         filled("TestListImages"),
	"runtime.v1.ImageStatusResponse.image":                           filled("TestImageStatusLookups"),
	"runtime.v1.ImageStatusResponse.info":                            filled("TestImageStatusLookups"),
	"runtime.v1.PullImageResponse.image_ref":                         filled("TestPullReferenceForms"),
	"runtime.v1.ImageFsInfoResponse.image_filesystems":               filled("TestImageFsInfo"),
	"runtime.v1.ImageFsInfoResponse.container_filesystems":           filled("TestImageFsInfo"),
}

// Gaps shared by rows of responseGaps.
const (
	hugepagesGap = "filled from the container's record where the host has the hugetlb controller (sandbox.appliedResources); no test runs on a host with hugepages"
)

// responseGaps lists response fields berth leaves unset where it could
// fill them, or fills with no test that shows it: each is a known gap
// waiting for a fill or a test, logged by TestCRIFields.
var responseGaps = map[protoreflect.FullName]string{
	"runtime.v1.ImageSpec.image_ref":                                "set nowhere: ContainerStatus.mounts echoes the kubelet's mounts, whose image carries the image ID the kubelet sent; the 1.37 kubelet asks ImageStatus for a volume's digest instead of reading it here",
	"runtime.v1.LinuxContainerResources.hugepage_limits":            hugepagesGap,
	"runtime.v1.HugepageLimit.page_size":                            hugepagesGap,
	"runtime.v1.HugepageLimit.limit":                                hugepagesGap,
	"runtime.v1.LinuxContainerResources.memory_swap_limit_in_bytes": "filled from the container's record where the host accounts swap (sandbox.appliedResources); no test asks for a swap limit and reads it back",
	"runtime.v1.NetworkUsage.interfaces":                            "filled for a pod with interfaces beside eth0 (podNetworkStats); no test makes such a pod",
}

// knownDropped lists request fields that berth neither honours nor refuses.
// Each is a known gap waiting for a decision; TestCRIFields tolerates them
// and logs them, so the list can only shrink by a decision.
var knownDropped = map[protoreflect.FullName]string{}

// requestFields returns the full name of every field reachable from the
// request message of a RuntimeService or ImageService call, each message
// type walked once. Map entries are not walked (see the note at the top).
func requestFields() []protoreflect.FullName {
	return walkFields(protoreflect.MethodDescriptor.Input)
}

// responseFields is requestFields for the calls' response messages.
func responseFields() []protoreflect.FullName {
	return walkFields(protoreflect.MethodDescriptor.Output)
}

// walkFields returns the fields reachable from the message side gives of
// each call.
func walkFields(side func(protoreflect.MethodDescriptor) protoreflect.MessageDescriptor) []protoreflect.FullName {
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
			walk(side(methods.Get(i)))
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
	tests := testFunctions(t)
	t.Run("requests", func(t *testing.T) {
		n := checkFields(t, requestFields(), criFields, knownDropped, tests)
		t.Logf("%d request fields: %d honoured, %d refused, %d not applicable, %d known dropped",
			n.all, n.honoured, n.refused, n.notApplicable, n.gaps)
	})
	t.Run("responses", func(t *testing.T) {
		n := checkFields(t, responseFields(), criResponseFields, responseGaps, tests)
		if n.refused > 0 {
			t.Errorf("%d response fields are marked refused: a response field is filled or not applicable", n.refused)
		}
		t.Logf("%d response fields: %d filled, %d not applicable, %d gaps",
			n.all, n.honoured, n.notApplicable, n.gaps)
	})
}

// windowsField: a field of a Windows message, or one leading to it, is
// Windows-only, on either side; berth runs Linux containers.
func windowsField(name protoreflect.FullName) bool {
	return strings.HasPrefix(string(name.Parent().Name()), "Windows") || name.Name() == "windows"
}

// fieldCounts are how checkFields found the walked fields decided.
type fieldCounts struct{ all, honoured, refused, notApplicable, gaps int }

// checkFields fails for each walked field without a decision or a gap, a
// decision without its test or reason, and a row naming a field no
// message has; it logs the gaps.
func checkFields(t *testing.T, walked []protoreflect.FullName, decided map[protoreflect.FullName]verdict,
	gaps map[protoreflect.FullName]string, tests map[string]bool) fieldCounts {
	n := fieldCounts{all: len(walked), gaps: len(gaps)}
	for _, name := range walked {
		v, ok := decided[name]
		if !ok && windowsField(name) {
			v, ok = windowsOnly, true
		}
		if why, gap := gaps[name]; gap {
			if ok {
				t.Errorf("%s is both decided and a known gap", name)
			}
			t.Logf("known gap: %s (%s)", name, why)
			continue
		}
		switch {
		case !ok:
			t.Errorf("%s: no decision; add it as honoured or filled (with its test), refused (with its error) or not applicable (with why)", name)
		case v.honoured():
			n.honoured++
			if !tests[v.proof] {
				t.Errorf("%s: proved by %s, but no func %s( is in any _test.go", name, v.proof, v.proof)
			}
		case v.refused():
			n.refused++
			if v.why == "" {
				t.Errorf("%s: refused with %v, but the error is not described", name, v.code)
			}
		default:
			n.notApplicable++
			if v.why == "" {
				t.Errorf("%s: not applicable, but no reason is given", name)
			}
		}
	}
	for _, rows := range []iter.Seq[protoreflect.FullName]{maps.Keys(decided), maps.Keys(gaps)} {
		for name := range rows {
			if !slices.Contains(walked, name) {
				t.Errorf("%s is listed, but no CRI message walked here carries it (renamed or removed by cri-api?)", name)
			}
		}
	}
	return n
}
