package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/kubeenv"
)

// The VM node: a third node of the cluster, the node users run. The VM
// tier's Debian kernel boots in qemu (TCG: no usable KVM here) with
// systemd as PID 1, unified cgroup v2, AppArmor on and a swap file; berthd
// runs from cmd/berthd/berthd.service, the tier's kubelet and kube-proxy as
// systemd services configured as kubeadm configures a node (the kubelet's
// cgroup driver from berth's RuntimeConfig, LimitedSwap, feature gates at
// their defaults, kube-proxy in nftables mode). Its one NIC is a tap on the
// host's node link; it holds the next address after the netns nodes'. It
// carries a taint, so that only the ProductionNode steps, which tolerate
// it, land there.
const (
	vmNodeName = "berth-vm-node"
	vmTaint    = "berth.test/vm-node"
	vmIndex    = 3 // 172.29.255.4, fd29:29:ff::4
)

// VM sizes, and the timeouts measured under TCG (test/cluster/README.md).
const (
	vmMemMB  = 2048
	vmSMP    = 2
	vmSwapMB = 512
	// vmBuildTimeout bounds disk.sh (the root, modules, mkfs).
	vmBuildTimeout = 3 * time.Minute
	// vmReadyTimeout bounds the way from qemu's start to the Node Ready.
	vmReadyTimeout = 8 * time.Minute
	// vmStartTimeout bounds a workload's way to Ready on the VM node.
	vmStartTimeout = 5 * time.Minute
)

// vmNode is the VM node: its folder (disk, console and kubelet logs), its
// tap and its qemu.
type vmNode struct {
	e       *env
	name    string
	ip, ip6 string
	work    *kubeenv.Work
	tap     string
	// built is closed once disk.sh ran and qemu started, or failed to
	// (buildErr); nil until the build started.
	built    chan struct{}
	buildErr error
	qemu     *exec.Cmd
	qemuDone chan struct{}
	started  time.Time // qemu's start
	console  string    // ttyS0: the kernel, systemd, the node's setup and berthd
	kubelet  string    // ttyS1: the kubelet
	podCIDRs []string  // routed by the host to ip and ip6
}

// vmEnabled: BERTH_CLUSTER_VMNODE=0 leaves the VM node out (to iterate on
// the netns nodes' steps alone).
func vmEnabled() bool { return os.Getenv("BERTH_CLUSTER_VMNODE") != "0" }

// startVMNode writes the VM node's configuration (its certificates from
// the run's CA, kubeconfigs for the API server at server) and starts, in
// the background, the build of its disk and its boot, which run while the
// control plane and the netns nodes start. Its cleanups stop qemu and
// remove the tap and the routes.
func (e *env) startVMNode(server string) {
	t := e.t
	t.Helper()
	v := &vmNode{e: e, name: vmNodeName,
		ip: fmt.Sprintf("172.29.255.%d", 1+vmIndex), ip6: fmt.Sprintf("fd29:29:ff::%d", 1+vmIndex),
		tap: fmt.Sprintf("bct%d", os.Getpid()%100000)}
	v.work = kubeenv.NewWork(t, fmt.Sprintf("bc%d-", vmIndex), "")
	v.console, v.kubelet = v.work.Path("console.log"), v.work.Path("kubelet.log")
	e.vm = v
	t.Cleanup(func() {
		v.keepLogs()
		v.work.Remove(t)
	})
	t.Cleanup(v.teardown)

	// The registry, as a mirror of its loopback name, on the host's node
	// address: the VM's berthd pulls the test images from it.
	ln, err := net.Listen("tcp", net.JoinHostPort(hostIP, "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go forward(ln, e.reg.Host)

	config := v.work.Path("config")
	v.writeConfig(t, config, server, ln.Addr().String())
	ipCmd(t, "tuntap", "add", "dev", v.tap, "mode", "tap")
	ipCmd(t, "link", "set", v.tap, "master", e.link, "up")

	v.built = make(chan struct{})
	go func() {
		defer close(v.built)
		v.buildErr = v.build(config)
	}()
}

// build runs disk.sh and starts qemu.
func (v *vmNode) build(config string) error {
	begin := time.Now()
	out := v.work.Path("vm")
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), vmBuildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "vmnode/disk.sh", out, config, v.e.binDir, v.e.k8sBin)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("vmnode/disk.sh: %v\n%s", err, b)
	}
	fmt.Printf("cluster: %s: disk built in %s\n", v.name, time.Since(begin).Round(100*time.Millisecond))
	kdir := filepath.Join(kubeenv.EnvOr("BERTH_VM_CACHE", "/var/cache/berth-vm"), "kernel", "current")
	v.qemu = exec.Command("qemu-system-x86_64", "-nodefaults", "-display", "none", "-no-reboot",
		"-accel", "tcg", "-cpu", "max", "-m", fmt.Sprint(vmMemMB), "-smp", fmt.Sprint(vmSMP),
		"-kernel", filepath.Join(kdir, "vmlinuz"), "-initrd", filepath.Join(out, "initrd.cpio"),
		"-append", "console=ttyS0 panic=-1 loglevel=4 apparmor=1 security=apparmor berth.init=systemd"+
			" systemd.unit=berth-node.target systemd.show_status=error systemd.log_level=notice systemd.firstboot=0"+
			" systemd.unified_cgroup_hierarchy=1",
		"-drive", "file="+filepath.Join(out, "disk.img")+",format=raw,if=virtio,cache=unsafe",
		"-device", "virtio-rng-pci",
		"-netdev", "tap,id=n0,ifname="+v.tap+",script=no,downscript=no",
		"-device", "virtio-net-pci,netdev=n0,mac=52:54:00:29:ff:04",
		"-serial", "file:"+v.console, "-serial", "file:"+v.kubelet)
	qlog, err := os.Create(v.work.Path("qemu.log"))
	if err != nil {
		return err
	}
	defer qlog.Close()
	v.qemu.Stdout, v.qemu.Stderr = qlog, qlog
	v.qemu.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := v.qemu.Start(); err != nil {
		v.qemu = nil
		return err
	}
	v.started = time.Now()
	v.qemuDone = make(chan struct{})
	go func() { _ = v.qemu.Wait(); close(v.qemuDone) }()
	return nil
}

// running is nil while qemu runs.
func (v *vmNode) running() error {
	if v.qemu == nil {
		return errors.New("qemu not started")
	}
	select {
	case <-v.qemuDone:
		b, _ := os.ReadFile(v.work.Path("qemu.log"))
		return fmt.Errorf("qemu exited: %s\nconsole:\n%s", b, tail(v.console, 40))
	default:
		return nil
	}
}

// join waits for the boot, then until the node is Ready, and routes its
// pod CIDRs to it.
func (v *vmNode) join(t *testing.T) {
	t.Helper()
	<-v.built // disk.sh runs under vmBuildTimeout
	if v.buildErr != nil {
		t.Fatal(v.buildErr)
	}
	kubeenv.WaitFor(t, vmReadyTimeout, v.name+" registered", func() (bool, string) {
		if err := v.running(); err != nil {
			t.Fatal(err)
		}
		if console, _ := os.ReadFile(v.console); strings.Contains(string(console), "berth-node: setup failed") {
			t.Fatalf("%s: the node's setup failed:\n%s", v.name, tail(v.console, 40))
		}
		_, err := v.e.kubectlErr("get", "node", v.name)
		return err == nil, fmt.Sprintf("%v\nconsole:\n%s\nkubelet:\n%s", err, tail(v.console, 15), tail(v.kubelet, 15))
	})
	n := v.e.waitNodeReady(t, v.name, vmReadyTimeout-time.Since(v.started))
	fmt.Printf("cluster: %s Ready %s after qemu's start\n", v.name, time.Since(v.started).Round(100*time.Millisecond))
	for _, cidr := range n.Spec.PodCIDRs {
		via := v.ip
		if strings.Contains(cidr, ":") {
			via = v.ip6
		}
		ipCmd(t, "route", "add", cidr, "via", via, "dev", v.e.link)
		v.podCIDRs = append(v.podCIDRs, cidr)
	}
}

// teardown stops qemu (the VM's pods go with it) and removes the routes
// to its pods and the tap.
func (v *vmNode) teardown() {
	t := v.e.t
	if v.built != nil {
		<-v.built
	}
	if v.qemu != nil && v.running() == nil {
		_ = v.qemu.Process.Signal(syscall.SIGTERM)
		select {
		case <-v.qemuDone:
		case <-time.After(10 * time.Second):
			_ = v.qemu.Process.Kill()
			<-v.qemuDone
		}
	}
	// The VM went without closing its connections: the API server's to
	// and from it (the kubelet's and kube-proxy's watches, its own to the
	// kubelet) would hold its shutdown past its grace. They are the run's
	// own sockets, to the node's addresses only.
	for _, ip := range []string{v.ip, "[" + v.ip6 + "]"} {
		if out, err := exec.Command("ss", "-K", "-t", "dst", ip).CombinedOutput(); err != nil {
			t.Errorf("teardown: ss -K dst %s: %v %s", ip, err, out)
		}
	}
	for _, cidr := range v.podCIDRs {
		if out, err := exec.Command("ip", "route", "del", cidr).CombinedOutput(); err != nil {
			t.Errorf("teardown: ip route del %s: %v %s", cidr, err, out)
		}
	}
	if out, err := exec.Command("ip", "link", "del", v.tap).CombinedOutput(); err != nil && !strings.Contains(string(out), "Cannot find") {
		t.Errorf("teardown: ip link del %s: %v %s", v.tap, err, out)
	}
	if t.Failed() {
		t.Logf("%s console (last 60 lines):\n%s", v.name, tail(v.console, 60))
		t.Logf("%s kubelet (last 60 lines):\n%s", v.name, tail(v.kubelet, 60))
	}
}

// keepLogs copies the VM's console and kubelet log into the run's folder.
func (v *vmNode) keepLogs() {
	for _, f := range []string{v.console, v.kubelet} {
		if b, err := os.ReadFile(f); err == nil {
			_ = os.WriteFile(v.e.path(v.name+"-"+filepath.Base(f)), b, 0o644)
		}
	}
}

// tail is the end of a log file.
func tail(path string, lines int) string {
	b, _ := os.ReadFile(path)
	all := strings.Split(strings.TrimRight(strings.ReplaceAll(string(b), "\r", ""), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// forward carries each connection ln accepts to target, until ln closes.
func forward(ln net.Listener, target string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			r, err := net.Dial("tcp", target)
			if err != nil {
				return
			}
			defer r.Close()
			go func() { _, _ = io.Copy(r, c); r.(*net.TCPConn).CloseWrite() }()
			_, _ = io.Copy(c, r)
		}()
	}
}

// writeConfig writes the files disk.sh copies over the VM's root: the
// node's certificates and kubeconfigs (paths of the VM), the kubelet's and
// kube-proxy's configurations, berthd's and the node's addresses.
func (v *vmNode) writeConfig(t *testing.T, dir, server, mirror string) {
	t.Helper()
	p := v.e.pki
	pkiDir := filepath.Join(dir, "etc/kubernetes/pki")
	kubeenv.Mkdirs(t, pkiDir, filepath.Join(dir, "etc/berth"))
	files := map[string]string{}
	copyPair := func(name string, pair certPair) {
		files["etc/kubernetes/pki/"+name+".crt"] = readFile(t, pair.cert)
		files["etc/kubernetes/pki/"+name+".key"] = readFile(t, pair.key)
	}
	files["etc/kubernetes/pki/ca.crt"] = readFile(t, p.caFile)
	copyPair("kubelet", p.issue(t, "kubelet-serving-"+v.name, "system:node:"+v.name, []string{"system:nodes"}, v.ip, v.ip6, v.name))
	copyPair("kubelet-client", p.issue(t, "kubelet-"+v.name, "system:node:"+v.name, []string{"system:nodes"}))
	copyPair("kube-proxy", p.issue(t, "kube-proxy-"+v.name, "system:kube-proxy", nil))
	kubeconfig := func(user string) string {
		return "apiVersion: v1\nkind: Config\n" +
			"clusters:\n- name: berth\n  cluster:\n    server: " + server + "\n    certificate-authority: /etc/kubernetes/pki/ca.crt\n" +
			"users:\n- name: " + user + "\n  user:\n    client-certificate: /etc/kubernetes/pki/" + user + ".crt\n    client-key: /etc/kubernetes/pki/" + user + ".key\n" +
			"contexts:\n- name: default\n  context: {cluster: berth, user: " + user + "}\ncurrent-context: default\n"
	}
	files["etc/kubernetes/kubelet.conf"] = kubeconfig("kubelet-client")
	files["etc/kubernetes/kube-proxy.conf"] = kubeconfig("kube-proxy")
	files["etc/kubernetes/kubelet.yaml"] = fmt.Sprintf(vmKubeletConfig, vmTaint, kubeletNoEviction)
	files["etc/kubernetes/kube-proxy.yaml"] = fmt.Sprintf(vmKubeProxyConfig, v.name, clusterCIDR+","+clusterCIDR6)
	files["etc/berth/config.toml"] = fmt.Sprintf(vmBerthConfig, v.e.reg.Host, "http://"+mirror)
	files["etc/resolv.conf"] = "nameserver 192.0.2.53\noptions ndots:2\n"
	files["etc/berth-node.env"] = fmt.Sprintf("NODE_NAME=%s\nNODE_IP=%s\nNODE_IP6=%s\nHOST_IP=%s\nHOST_IP6=%s\nTEST_RANGE=%s\nTEST_RANGE6=%s\nSWAP_MB=%d\n",
		v.name, v.ip, v.ip6, hostIP, hostIP6, testRange, testRange6, vmSwapMB)
	for name, data := range files {
		mode := os.FileMode(0o644)
		if strings.HasSuffix(name, ".key") {
			mode = 0o600
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), mode); err != nil {
			t.Fatal(err)
		}
	}
}

// vmKubeletConfig is the VM node's KubeletConfiguration: what kubeadm
// writes for a node, plus LimitedSwap and the taint. No cgroupDriver: the
// kubelet takes it from berth's RuntimeConfig (systemd); failCgroupV1 at
// its default. One feature gate: PodAndContainerStatsFromCRI (beta, off by
// default in 1.37), so that the summary API's pod and container stats,
// PSI among them, are berth's and not cadvisor's reading of the same
// cgroups (the StatsSummary step).
const vmKubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
authorization:
  mode: Webhook
tlsCertFile: /etc/kubernetes/pki/kubelet.crt
tlsPrivateKeyFile: /etc/kubernetes/pki/kubelet.key
containerRuntimeEndpoint: unix:///run/berth/berth.sock
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
staticPodPath: /etc/kubernetes/manifests
rotateCertificates: false
failSwapOn: false
memorySwap:
  swapBehavior: LimitedSwap
featureGates:
  PodAndContainerStatsFromCRI: true
registerWithTaints:
- key: %s
  effect: NoSchedule
%s`

const vmKubeProxyConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection:
  kubeconfig: /etc/kubernetes/kube-proxy.conf
hostnameOverride: %s
clusterCIDR: %s
`

// vmBerthConfig: the systemd cgroup driver; the pod CIDRs from the
// kubelet; the loopback registry's name mirrored to the host's node
// address, where the test carries it.
const vmBerthConfig = `cgroup_driver = "systemd"

[network]
masquerade = false

[registry.%q]
mirrors = [%q]
`
