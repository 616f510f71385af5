// Command nriplugin is the integration tests' NRI plugin, written against
// the protocol's stub: it records each event it is told of in a file, and
// adjusts, updates, refuses, hangs on or crashes at the containers its
// configuration names, and refuses resizes of the pods it names. Started by a test (-config, -socket) or by berthd
// from its plugin_path (the configuration then comes from
// plugin_config_path).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"strings"
	"sync"

	"github.com/berth-runtime/berth/test/harness/nriplugin"
	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

type plugin struct {
	cfg  nriplugin.Config
	stub stub.Stub  // for its unsolicited updates
	mu   sync.Mutex // one event line at a time
}

func main() {
	cfgJSON := flag.String("config", "", "configuration (JSON); else the one berthd passes")
	socket := flag.String("socket", "", "berthd's NRI socket, for a plugin started outside berthd")
	name := flag.String("name", "berthtest", "plugin name")
	flag.Parse()
	p := &plugin{}
	if *cfgJSON != "" {
		if err := json.Unmarshal([]byte(*cfgJSON), &p.cfg); err != nil {
			log.Fatal(err)
		}
	}
	opts := []stub.Option{}
	if *socket != "" {
		opts = append(opts, stub.WithSocketPath(*socket), stub.WithPluginName(*name), stub.WithPluginIdx("50"))
	}
	s, err := stub.New(p, opts...)
	if err != nil {
		log.Fatal(err)
	}
	p.stub = s
	if err := s.Run(context.Background()); err != nil {
		log.Fatal(err)
	}
}

func (p *plugin) Configure(_ context.Context, cfg, _, _ string) (api.EventMask, error) {
	if cfg != "" {
		if err := json.Unmarshal([]byte(cfg), &p.cfg); err != nil {
			return 0, err
		}
	}
	return 0, nil // every event the plugin implements
}

func (p *plugin) record(event string, ctr *api.Container) {
	if ctr != nil {
		event += " " + ctr.Name
	}
	p.recordLine(event)
}

func (p *plugin) recordLine(line string) {
	if p.cfg.Events == "" {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	f, err := os.OpenFile(p.cfg.Events, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	fmt.Fprintln(f, line)
}

func (p *plugin) matches(ctr *api.Container) bool { return strings.HasPrefix(ctr.Name, p.cfg.Match) }

func (p *plugin) Synchronize(_ context.Context, _ []*api.PodSandbox, ctrs []*api.Container) ([]*api.ContainerUpdate, error) {
	var updates []*api.ContainerUpdate
	for _, c := range ctrs {
		p.record("Synchronize", c)
		if p.cfg.SyncCpuset != "" && p.matches(c) {
			u := &api.ContainerUpdate{ContainerId: c.Id}
			u.SetLinuxCPUSetCPUs(p.cfg.SyncCpuset)
			updates = append(updates, u)
		}
	}
	return updates, nil
}

func (p *plugin) RunPodSandbox(_ context.Context, _ *api.PodSandbox) error {
	p.record("RunPodSandbox", nil)
	return nil
}

func (p *plugin) UpdatePodSandbox(_ context.Context, pod *api.PodSandbox, _, res *api.LinuxResources) error {
	p.recordLine(fmt.Sprintf("UpdatePodSandbox memory %d", res.GetMemory().GetLimit().GetValue()))
	if p.cfg.Reject != "" && strings.HasPrefix(pod.Name, p.cfg.Match) {
		return errors.New(p.cfg.Reject)
	}
	return nil
}

func (p *plugin) PostUpdatePodSandbox(_ context.Context, _ *api.PodSandbox) error {
	p.record("PostUpdatePodSandbox", nil)
	return nil
}

func (p *plugin) StopPodSandbox(_ context.Context, _ *api.PodSandbox) error {
	p.record("StopPodSandbox", nil)
	return nil
}

func (p *plugin) RemovePodSandbox(_ context.Context, _ *api.PodSandbox) error {
	p.record("RemovePodSandbox", nil)
	return nil
}

func (p *plugin) CreateContainer(_ context.Context, _ *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	p.record("CreateContainer", ctr)
	if !p.matches(ctr) {
		return nil, nil, nil
	}
	switch {
	case p.cfg.Hang:
		select {}
	case p.cfg.Crash:
		os.Exit(3)
	case p.cfg.Reject != "":
		return nil, nil, errors.New(p.cfg.Reject)
	}
	return p.adjustment(), nil, nil
}

func (p *plugin) adjustment() *api.ContainerAdjustment {
	a := &api.ContainerAdjustment{}
	for k, v := range p.cfg.Env {
		a.AddEnv(k, v)
	}
	for k, v := range p.cfg.Annotations {
		a.AddAnnotation(k, v)
	}
	if p.cfg.Mount != nil {
		a.AddMount(p.cfg.Mount)
	}
	if r := p.cfg.Rlimit; r != nil {
		a.AddRlimit(r.Type, r.Hard, r.Soft)
	}
	if p.cfg.Cpuset != "" {
		a.SetLinuxCPUSetCPUs(p.cfg.Cpuset)
	}
	if p.cfg.MemoryLimit != 0 {
		a.SetLinuxMemoryLimit(p.cfg.MemoryLimit)
	}
	if p.cfg.Device != nil {
		a.AddDevice(p.cfg.Device)
	}
	if p.cfg.CDIDevice != "" {
		a.AddCDIDevice(&api.CDIDevice{Name: p.cfg.CDIDevice})
	}
	if p.cfg.Hook != nil {
		a.AddHooks(&api.Hooks{CreateRuntime: []*api.Hook{p.cfg.Hook}})
	}
	if p.cfg.OOMScoreAdj != nil {
		a.SetLinuxOomScoreAdj(p.cfg.OOMScoreAdj)
	}
	for k, v := range p.cfg.Sysctl {
		a.SetLinuxSysctl(k, v)
	}
	for k, v := range p.cfg.Unified {
		a.AddLinuxUnified(k, v)
	}
	if h := p.cfg.HugepageLimit; h != nil {
		a.AddLinuxHugepageLimit(h.PageSize, h.Limit)
	}
	return a
}

func (p *plugin) PostCreateContainer(_ context.Context, _ *api.PodSandbox, ctr *api.Container) error {
	p.record("PostCreateContainer", ctr)
	return nil
}

func (p *plugin) StartContainer(_ context.Context, _ *api.PodSandbox, ctr *api.Container) error {
	p.record("StartContainer", ctr)
	return nil
}

func (p *plugin) PostStartContainer(_ context.Context, _ *api.PodSandbox, ctr *api.Container) error {
	p.record("PostStartContainer", ctr)
	if p.cfg.UnsolicitedCpuset != "" && p.matches(ctr) {
		// Not while berth waits for this answer: an update of its own.
		go func() {
			u := &api.ContainerUpdate{ContainerId: ctr.Id}
			u.SetLinuxCPUSetCPUs(p.cfg.UnsolicitedCpuset)
			if failed, err := p.stub.UpdateContainers([]*api.ContainerUpdate{u}); err != nil || len(failed) > 0 {
				log.Fatalf("unsolicited update: %v, failed %v", err, failed)
			}
		}()
	}
	return nil
}

func (p *plugin) UpdateContainer(_ context.Context, _ *api.PodSandbox, ctr *api.Container, _ *api.LinuxResources) ([]*api.ContainerUpdate, error) {
	p.record("UpdateContainer", ctr)
	if (p.cfg.UpdateCpuset == "" && len(p.cfg.UpdateUnified) == 0) || !p.matches(ctr) {
		return nil, nil
	}
	u := &api.ContainerUpdate{ContainerId: ctr.Id}
	if p.cfg.UpdateCpuset != "" {
		u.SetLinuxCPUSetCPUs(p.cfg.UpdateCpuset)
	}
	for k, v := range p.cfg.UpdateUnified {
		u.AddLinuxUnified(k, v)
	}
	return []*api.ContainerUpdate{u}, nil
}

func (p *plugin) PostUpdateContainer(_ context.Context, _ *api.PodSandbox, ctr *api.Container) error {
	p.record("PostUpdateContainer", ctr)
	return nil
}

func (p *plugin) StopContainer(_ context.Context, _ *api.PodSandbox, ctr *api.Container) ([]*api.ContainerUpdate, error) {
	p.record("StopContainer", ctr)
	return nil, nil
}

func (p *plugin) RemoveContainer(_ context.Context, _ *api.PodSandbox, ctr *api.Container) error {
	p.record("RemoveContainer", ctr)
	return nil
}
