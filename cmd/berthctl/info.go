package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// daemonConfig is the verbose Status "config" berthd reports (no credentials).
type daemonConfig struct {
	Version      string `json:"version"`
	Root         string `json:"root"`
	State        string `json:"state"`
	Socket       string `json:"socket"`
	CgroupDriver string `json:"cgroupDriver"`
	Network      string `json:"network"`
	Metrics      string `json:"metrics"`
	GzipDecoder  string `json:"gzipDecoder"`
	Registries   map[string]struct {
		Mirrors     []string `json:"mirrors"`
		PlainHTTP   bool     `json:"plainHTTP"`
		CAFile      string   `json:"caFile"`
		SkipVerify  bool     `json:"skipVerify"`
		Credentials bool     `json:"credentials"`
	} `json:"registries"`
	CDIDevices []string `json:"cdiDevices"`
}

// info prints berthd's version, folders, network mode, conditions,
// registry setup and the CDI devices containers can be given.
func info(ctx context.Context, conn *grpc.ClientConn, w io.Writer) error {
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	v, err := rt.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		return err
	}
	st, err := rt.Status(ctx, &runtimeapi.StatusRequest{Verbose: true})
	if err != nil {
		return err
	}
	var c daemonConfig
	if err := json.Unmarshal([]byte(st.Info["config"]), &c); err != nil {
		return fmt.Errorf("verbose status: %w", err)
	}
	metrics := c.Metrics
	if metrics == "" {
		metrics = "off"
	}
	fmt.Fprintf(w, "version:        %s %s (CRI %s)\n", v.RuntimeName, v.RuntimeVersion, v.RuntimeApiVersion)
	fmt.Fprintf(w, "socket:         %s\nroot:           %s\nstate:          %s\n", c.Socket, c.Root, c.State)
	fmt.Fprintf(w, "cgroup driver:  %s\nnetwork:        %s\nmetrics:        %s\n", c.CgroupDriver, c.Network, metrics)
	fmt.Fprintf(w, "gzip decoder:   %s\n", c.GzipDecoder)
	for _, cond := range st.Status.GetConditions() {
		line := fmt.Sprintf("%s=%t", cond.Type, cond.Status)
		if cond.Message != "" {
			line += " (" + cond.Message + ")"
		}
		fmt.Fprintf(w, "condition:      %s\n", line)
	}
	hosts := make([]string, 0, len(c.Registries))
	for h := range c.Registries {
		hosts = append(hosts, h)
	}
	slices.Sort(hosts)
	if len(hosts) == 0 {
		fmt.Fprintln(w, "registries:     none configured")
	}
	for _, h := range hosts {
		r := c.Registries[h]
		var attrs []string
		if len(r.Mirrors) > 0 {
			attrs = append(attrs, "mirrors "+strings.Join(r.Mirrors, ", "))
		}
		for _, a := range []struct {
			on   bool
			what string
		}{{r.PlainHTTP, "plain http"}, {r.SkipVerify, "skip verify"}, {r.CAFile != "", "ca " + r.CAFile}, {r.Credentials, "credentials"}} {
			if a.on {
				attrs = append(attrs, a.what)
			}
		}
		fmt.Fprintf(w, "registry:       %s: %s\n", h, strings.Join(attrs, "; "))
	}
	if len(c.CDIDevices) == 0 {
		fmt.Fprintln(w, "cdi devices:    none")
	}
	for _, d := range c.CDIDevices {
		fmt.Fprintf(w, "cdi device:     %s\n", d)
	}
	return nil
}
