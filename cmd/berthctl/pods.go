package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func podList(ctx context.Context, conn *grpc.ClientConn, w io.Writer) error {
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	pods, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return err
	}
	ctrs, err := rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		return err
	}
	running, total := map[string]int{}, map[string]int{}
	for _, c := range ctrs.Containers {
		total[c.PodSandboxId]++
		if c.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
			running[c.PodSandboxId]++
		}
	}
	slices.SortFunc(pods.Items, func(a, b *runtimeapi.PodSandbox) int { return int(b.CreatedAt - a.CreatedAt) })
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, "POD ID\tNAMESPACE\tNAME\tSTATE\tCONTAINERS\tIP\tAGE")
	for _, p := range pods.Items {
		ip := ""
		if st, err := rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: p.Id}); err == nil {
			ip = st.Status.GetNetwork().GetIp()
		}
		state := strings.TrimPrefix(p.State.String(), "SANDBOX_")
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d/%d\t%s\t%s\n", shortID(p.Id), p.Metadata.GetNamespace(), p.Metadata.GetName(),
			state, running[p.Id], total[p.Id], ip, age(time.Unix(0, p.CreatedAt)))
	}
	return tw.Flush()
}

// age is how long ago t was, in the unit kubectl would use.
func age(t time.Time) string {
	d := time.Since(t)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// findPod resolves what a user typed: a pod ID or unique prefix of one, a
// name, or namespace/name.
func findPod(ctx context.Context, rt runtimeapi.RuntimeServiceClient, arg string) (*runtimeapi.PodSandbox, error) {
	pods, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return nil, err
	}
	var found []*runtimeapi.PodSandbox
	for _, p := range pods.Items {
		md := p.Metadata
		if p.Id == arg {
			return p, nil
		}
		if strings.HasPrefix(p.Id, arg) || md.GetName() == arg || md.GetNamespace()+"/"+md.GetName() == arg {
			found = append(found, p)
		}
	}
	switch len(found) {
	case 0:
		return nil, fmt.Errorf("no pod %q", arg)
	case 1:
		return found[0], nil
	}
	var names []string
	for _, p := range found {
		names = append(names, fmt.Sprintf("%s (%s/%s)", shortID(p.Id), p.Metadata.GetNamespace(), p.Metadata.GetName()))
	}
	return nil, fmt.Errorf("%q names %d pods: %s", arg, len(found), strings.Join(names, ", "))
}

// step is one phase of a start as verbose status shows it.
type step struct {
	Name     string        `json:"name"`
	Duration time.Duration `json:"duration"`
}

// startChart is one pod's or container's bars.
type startChart struct {
	title string
	steps []step
}

// timeline draws the pod's start phases, then each container's (oldest
// first), one bar per phase on one scale, so the longest phase of all is
// the full width.
func timeline(ctx context.Context, conn *grpc.ClientConn, w io.Writer, arg string) error {
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	pod, err := findPod(ctx, rt, arg)
	if err != nil {
		return err
	}
	ps, err := rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: pod.Id, Verbose: true})
	if err != nil {
		return err
	}
	md := pod.Metadata
	charts := []startChart{{title: fmt.Sprintf("pod %s/%s %s", md.GetNamespace(), md.GetName(), shortID(pod.Id))}}
	if charts[0].steps, err = verboseTimeline(ps.Info); err != nil {
		return fmt.Errorf("pod %s: %w", pod.Id, err)
	}
	ctrs, err := rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: pod.Id}})
	if err != nil {
		return err
	}
	slices.SortFunc(ctrs.Containers, func(a, b *runtimeapi.Container) int { return int(a.CreatedAt - b.CreatedAt) })
	for _, c := range ctrs.Containers {
		cs, err := rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: c.Id, Verbose: true})
		if err != nil {
			return err
		}
		ch := startChart{title: fmt.Sprintf("container %s %s", c.Metadata.GetName(), shortID(c.Id))}
		if ch.steps, err = verboseTimeline(cs.Info); err != nil {
			return fmt.Errorf("container %s: %w", c.Id, err)
		}
		charts = append(charts, ch)
	}
	drawCharts(w, charts)
	return nil
}

func verboseTimeline(info map[string]string) ([]step, error) {
	var v struct {
		Timeline []step `json:"timeline"`
	}
	if err := json.Unmarshal([]byte(info["info"]), &v); err != nil {
		return nil, fmt.Errorf("verbose status: %w", err)
	}
	return v.Timeline, nil
}

// barWidth is the longest bar, in terminal cells.
const barWidth = 40

// eighths draw the last cell of a bar to an eighth of a cell.
var eighths = []string{"", "▏", "▎", "▍", "▌", "▋", "▊", "▉"}

func drawCharts(w io.Writer, charts []startChart) {
	var longest time.Duration
	nameWidth := 0
	for _, c := range charts {
		for _, s := range c.steps {
			longest = max(longest, s.Duration)
			nameWidth = max(nameWidth, len(s.Name))
		}
	}
	for i, c := range charts {
		if i > 0 {
			fmt.Fprintln(w)
		}
		var total time.Duration
		for _, s := range c.steps {
			total += s.Duration
		}
		fmt.Fprintf(w, "%s  total %s\n", c.title, ms(total))
		if len(c.steps) == 0 {
			fmt.Fprintln(w, "  (no timeline recorded)")
		}
		for _, s := range c.steps {
			b := bar(s.Duration, longest)
			// Padded by cells: each block is one rune and one cell, not one byte.
			fmt.Fprintf(w, "  %-*s %s%s %10s\n", nameWidth, s.Name, b, strings.Repeat(" ", barWidth+1-utf8.RuneCountInString(b)), ms(s.Duration))
		}
	}
}

// bar is d scaled so that longest fills barWidth cells; anything above
// zero shows at least an eighth.
func bar(d, longest time.Duration) string {
	if longest <= 0 || d <= 0 {
		return ""
	}
	n := int(float64(d) / float64(longest) * barWidth * 8)
	n = max(n, 1)
	return strings.Repeat("█", n/8) + eighths[n%8]
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
}
