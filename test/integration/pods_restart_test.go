package integration

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/test/harness"
)

// tickerScript writes a numbered line every 100 ms.
const tickerScript = "i=0; while :; do echo tick-$i; i=$((i+1)); sleep 0.1; done"

// ticks reads the numbers of a ticker's log lines; they must count up from
// 0 without a gap or a repeat.
func ticks(t *testing.T, path string) int {
	t.Helper()
	n := 0
	for _, r := range readLog(t, path) {
		if r.stream != "stdout" || r.text != "tick-"+strconv.Itoa(n) {
			t.Fatalf("%s: record %d is %s %q, want stdout tick-%d", path, n, r.stream, r.text, n)
		}
		n++
	}
	return n
}

// alive reports whether pid is a live process: not a zombie, and not
// exiting (PF_EXITING). The second matters on hosts whose PID 1 never reaps
// orphans: the PID 1 of a pod's PID namespace, killed, stays in its exit
// until the namespace's other zombies (the orphaned containers, reparented
// to the host's PID 1) are reaped.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return false
	}
	f := strings.Fields(string(b[i+1:])) // state ppid pgrp session tty_nr tpgid flags …
	if len(f) < 7 || f[0] == "Z" || f[0] == "X" {
		return false
	}
	const pfExiting = 0x4
	flags, err := strconv.ParseUint(f[6], 10, 64)
	return err == nil && flags&pfExiting == 0
}

func (e *podEnv) shimPID(t *testing.T, pod string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(e.d.State, "pods", pod, "shim.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// TestPodRestart kills berthd with SIGKILL while two pods run and starts it
// again: containers keep running and logging meanwhile, one that exited
// meanwhile reports its real exit code and time, and every call works
// afterwards. Then one pod's shim is killed: after the next restart that
// pod is NOTREADY, its container EXITED and not running any more, and the
// removal of both pods leaks nothing.
func TestPodRestart(t *testing.T) {
	t.Parallel()
	e := startPodEnv(t, v1.Config{})
	trigger := t.TempDir()

	cfg1, cfg2 := e.podConfig("restart-1"), e.podConfig("restart-2")
	pod1, pod2 := e.runPod(t, cfg1), e.runPod(t, cfg2)
	ticker1 := e.runContainer(t, pod1, cfg1, e.ctrConfig("ticker-1", "/bin/sh", "-c", tickerScript))
	ticker2 := e.runContainer(t, pod2, cfg2, e.ctrConfig("ticker-2", "/bin/sh", "-c", tickerScript))
	wc := e.ctrConfig("waiter", "/bin/sh", "-c", "until [ -e /trigger/go ]; do sleep 0.05; done; exit 5")
	wc.Mounts = []*runtimeapi.Mount{{HostPath: trigger, ContainerPath: "/trigger"}}
	waiter := e.runContainer(t, pod1, cfg1, wc)
	// Writes nothing: no broken pipe ends it when its shim dies.
	quiet2 := e.runContainer(t, pod2, cfg2, e.ctrConfig("quiet-2", sleeper...))

	tickers := map[string]string{ticker1: e.status(t, ticker1).LogPath, ticker2: e.status(t, ticker2).LogPath}
	pids := map[string]int{}
	for _, c := range []string{ticker1, ticker2, waiter, quiet2} {
		pids[c] = e.ctrPID(t, c)
	}
	var info struct {
		Pod struct {
			PausePID int `json:"pausePID"`
		} `json:"pod"`
	}
	e.verbosePodInfo(t, pod2, &info)
	pause2 := info.Pod.PausePID
	if !alive(pause2) {
		t.Fatalf("pod 2 has no live pause process (pid %d)", pause2)
	}
	shims := map[string]int{pod1: e.shimPID(t, pod1), pod2: e.shimPID(t, pod2)}
	waiterStarted := e.status(t, waiter).StartedAt

	e.d.Kill()
	killedAt := time.Now()
	atKill := map[string]int{}
	for c, log := range tickers {
		atKill[c] = ticks(t, log)
	}
	if err := os.WriteFile(filepath.Join(trigger, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if !eventually(5*time.Second, func() bool { return !alive(pids[waiter]) }) {
		t.Fatal("the waiter did not exit while berthd was down")
	}
	for c, log := range tickers {
		if !eventually(5*time.Second, func() bool { return ticks(t, log) >= atKill[c]+5 }) {
			t.Errorf("container %s stopped logging while berthd was down (%d lines at the kill, %d now)", c, atKill[c], ticks(t, log))
		}
	}
	exitedBefore := time.Now()
	e.d.Restart()
	atRestart := ticks(t, tickers[ticker1])

	t.Run("after-restart", func(t *testing.T) {
		for _, pod := range []string{pod1, pod2} {
			if st := e.podStatus(t, pod); st.State != runtimeapi.PodSandboxState_SANDBOX_READY {
				t.Errorf("pod %s is %s after the restart", pod, st.State)
			}
			if pid := e.shimPID(t, pod); pid != shims[pod] || !alive(pid) {
				t.Errorf("pod %s: shim pid %d (alive %v), was %d", pod, pid, alive(pid), shims[pod])
			}
		}
		for _, c := range []string{ticker1, ticker2, quiet2} {
			if st := e.status(t, c); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
				t.Errorf("container %s is %s after the restart", c, st.State)
			}
			if pid := e.ctrPID(t, c); pid != pids[c] || !alive(pid) {
				t.Errorf("container %s: pid %d (alive %v), was %d", c, pid, alive(pid), pids[c])
			}
		}
		st := e.status(t, waiter)
		if st.State != runtimeapi.ContainerState_CONTAINER_EXITED || st.ExitCode != 5 || st.Reason != "Error" {
			t.Errorf("waiter: %s, exit code %d, reason %q; want EXITED, 5, Error", st.State, st.ExitCode, st.Reason)
		}
		if st.StartedAt != waiterStarted || st.FinishedAt < killedAt.UnixNano() || st.FinishedAt > exitedBefore.UnixNano() {
			t.Errorf("waiter: started %d (was %d), finished %d, want within the downtime [%d, %d]",
				st.StartedAt, waiterStarted, st.FinishedAt, killedAt.UnixNano(), exitedBefore.UnixNano())
		}
		if got := e.listContainerIDs(t, nil); !sameSet(got, []string{ticker1, ticker2, waiter, quiet2}) {
			t.Errorf("containers after the restart: %v", got)
		}
		// Every call works on what berthd had.
		if r := e.exec(t, ticker1, "/bin/echo", "hello"); r.stdout != "hello\n" {
			t.Errorf("exec after the restart: %+v", r)
		}
		if _, err := e.d.Runtime.RemoveContainer(t.Context(), &runtimeapi.RemoveContainerRequest{ContainerId: waiter}); err != nil {
			t.Errorf("RemoveContainer after the restart: %v", err)
		}
		if !eventually(5*time.Second, func() bool { return ticks(t, tickers[ticker1]) >= atRestart+3 }) {
			t.Errorf("ticker 1 wrote no line after the restart (%d lines)", atRestart)
		}
		e.stop(t, ticker1, 0)
		if st := e.status(t, ticker1); st.State != runtimeapi.ContainerState_CONTAINER_EXITED || st.ExitCode != 137 || alive(pids[ticker1]) {
			t.Errorf("ticker 1 after StopContainer: %s, exit code %d, process alive %v", st.State, st.ExitCode, alive(pids[ticker1]))
		}
		c := e.runContainer(t, pod1, cfg1, e.ctrConfig("after-restart", sleeper...))
		if r := e.exec(t, c, "/bin/true"); r.code != 0 {
			t.Errorf("exec in a container made after the restart: %+v", r)
		}
	})

	t.Run("shim-killed", func(t *testing.T) {
		shim := e.shimPID(t, pod2)
		if err := syscall.Kill(shim, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if !eventually(5*time.Second, func() bool { return !alive(shim) }) {
			t.Fatalf("shim %d survived SIGKILL", shim)
		}
		e.d.Kill()
		e.d.Restart()
		if st := e.podStatus(t, pod2); st.State != runtimeapi.PodSandboxState_SANDBOX_NOTREADY {
			t.Errorf("pod with a dead shim is %s", st.State)
		}
		for _, c := range []string{ticker2, quiet2} {
			if st := e.status(t, c); st.State != runtimeapi.ContainerState_CONTAINER_EXITED {
				t.Errorf("container %s of the pod with a dead shim is %s", c, st.State)
			}
			// EXITED is the truth: nothing of the container runs any more.
			if alive(pids[c]) {
				t.Errorf("the process of the EXITED container %s still runs (pid %d)", c, pids[c])
			}
		}
		if alive(pause2) {
			t.Errorf("the pause of the pod with a dead shim still runs (pid %d)", pause2)
		}
		if pids := harness.LiveProcessesWithArg(filepath.Join(e.d.State, "pods", pod2)); len(pids) != 0 {
			t.Errorf("shim processes of pod 2: %v", pids)
		}
		// The other pod is untouched.
		if st := e.podStatus(t, pod1); st.State != runtimeapi.PodSandboxState_SANDBOX_READY {
			t.Errorf("pod 1 is %s", st.State)
		}
		running := e.listContainerIDs(t, &runtimeapi.ContainerFilter{State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}})
		if len(running) != 1 || slices.Contains(running, ticker2) {
			t.Errorf("running containers: %v, want pod 1's after-restart only", running)
		}
	})

	e.removePod(t, pod1)
	e.removePod(t, pod2)
	e.assertNoLeaks(t)
}
