package cri

import (
	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The Stream* calls (the kubelet's CRIListStreaming) answer what the List*
// call with the same filter answers, in pages: a node's list may exceed
// one message's size limit. They call the List* calls' own list functions:
// a List* call's node-wide answer is kept encoded, as one message, which
// pages cannot be cut from.

// streamPage is how many items one streamed message carries.
const streamPage = 100

// sendPages sends items streamPage at a time, wrapped by page.
func sendPages[T any, R any](items []T, page func([]T) *R, send func(*R) error) error {
	for len(items) > 0 {
		n := min(len(items), streamPage)
		if err := send(page(items[:n])); err != nil {
			return err
		}
		items = items[n:]
	}
	return nil
}

func (r *RuntimeService) StreamPodSandboxes(req *runtimeapi.StreamPodSandboxesRequest, stream grpc.ServerStreamingServer[runtimeapi.StreamPodSandboxesResponse]) error {
	items, err := r.listPods(podFilter(req.GetFilter()))
	if err != nil {
		return grpcError(err)
	}
	return sendPages(items, func(p []*runtimeapi.PodSandbox) *runtimeapi.StreamPodSandboxesResponse {
		return &runtimeapi.StreamPodSandboxesResponse{PodSandboxes: p}
	}, stream.Send)
}

func (r *RuntimeService) StreamContainers(req *runtimeapi.StreamContainersRequest, stream grpc.ServerStreamingServer[runtimeapi.StreamContainersResponse]) error {
	ctrs, err := r.listContainers(stream.Context(), containerFilter(req.GetFilter()))
	if err != nil {
		return grpcError(err)
	}
	return sendPages(ctrs, func(p []*runtimeapi.Container) *runtimeapi.StreamContainersResponse {
		return &runtimeapi.StreamContainersResponse{Containers: p}
	}, stream.Send)
}

func (r *RuntimeService) StreamContainerStats(req *runtimeapi.StreamContainerStatsRequest, stream grpc.ServerStreamingServer[runtimeapi.StreamContainerStatsResponse]) error {
	stats, _, err := r.listContainerStats(stream.Context(), containerStatsFilter(req.GetFilter()))
	if err != nil {
		return grpcError(err)
	}
	return sendPages(stats, func(p []*runtimeapi.ContainerStats) *runtimeapi.StreamContainerStatsResponse {
		return &runtimeapi.StreamContainerStatsResponse{ContainerStats: p}
	}, stream.Send)
}

func (r *RuntimeService) StreamPodSandboxStats(req *runtimeapi.StreamPodSandboxStatsRequest, stream grpc.ServerStreamingServer[runtimeapi.StreamPodSandboxStatsResponse]) error {
	resp, err := r.ListPodSandboxStats(stream.Context(), &runtimeapi.ListPodSandboxStatsRequest{Filter: req.GetFilter()})
	if err != nil {
		return err
	}
	return sendPages(resp.Stats, func(p []*runtimeapi.PodSandboxStats) *runtimeapi.StreamPodSandboxStatsResponse {
		return &runtimeapi.StreamPodSandboxStatsResponse{PodSandboxStats: p}
	}, stream.Send)
}

func (s *imageService) StreamImages(req *runtimeapi.StreamImagesRequest, stream grpc.ServerStreamingServer[runtimeapi.StreamImagesResponse]) error {
	resp, err := s.ListImages(stream.Context(), &runtimeapi.ListImagesRequest{Filter: req.GetFilter()})
	if err != nil {
		return err
	}
	return sendPages(resp.Images, func(p []*runtimeapi.Image) *runtimeapi.StreamImagesResponse {
		return &runtimeapi.StreamImagesResponse{Images: p}
	}, stream.Send)
}
