package cri

import (
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// requestSubject is what a request names of its pod, container and image,
// as slog key-value pairs, for the log line of a failed call.
func requestSubject(req any) []any {
	var out []any
	if r, ok := req.(interface{ GetPodSandboxId() string }); ok && r.GetPodSandboxId() != "" {
		out = append(out, "pod_id", r.GetPodSandboxId())
	}
	if r, ok := req.(interface{ GetContainerId() string }); ok && r.GetContainerId() != "" {
		out = append(out, "container_id", r.GetContainerId())
	}
	switch r := req.(type) {
	case *runtimeapi.RunPodSandboxRequest:
		out = append(out, podNames(r.GetConfig().GetMetadata())...)
	case *runtimeapi.CreateContainerRequest:
		out = append(out, podNames(r.GetSandboxConfig().GetMetadata())...)
		out = append(out, "container", r.GetConfig().GetMetadata().GetName(), "image", r.GetConfig().GetImage().GetImage())
	case *runtimeapi.PullImageRequest:
		out = append(out, "image", r.GetImage().GetImage())
		out = append(out, podNames(r.GetSandboxConfig().GetMetadata())...)
	}
	return out
}

func podNames(md *runtimeapi.PodSandboxMetadata) []any {
	if md == nil {
		return nil
	}
	return []any{"pod", md.Name, "namespace", md.Namespace}
}

// describeCall names the pod and container of a request that carries only
// their IDs: an operator reads "web-0 in shop", not 64 hex digits.
func (r *RuntimeService) describeCall(req any) []any {
	if r.pods == nil {
		return nil
	}
	podID := ""
	if q, ok := req.(interface{ GetPodSandboxId() string }); ok {
		podID = q.GetPodSandboxId()
	}
	var out []any
	if q, ok := req.(interface{ GetContainerId() string }); ok && q.GetContainerId() != "" {
		if c, err := r.pods.GetContainer(q.GetContainerId()); err == nil {
			out = append(out, "container", c.Config.GetMetadata().GetName())
			podID = c.PodID
		}
	}
	if _, named := req.(*runtimeapi.RunPodSandboxRequest); podID == "" || named {
		return out
	}
	if p, err := r.pods.GetPod(podID); err == nil {
		out = append(out, podNames(p.Config.GetMetadata())...)
	}
	return out
}
