package cluster

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-runtime/berth/test/kubeenv"
)

// conformanceEnv selects the e2e tier: "1" runs the specs make test runs,
// "full" every one (make test-conformance).
const conformanceEnv = "BERTH_CONFORMANCE"

// The specs the tier runs: SIG Node's Conformance specs and the node
// conformance ones, whatever their SIG.
const conformanceFocus = sigNode + `.*` + conformanceTag + `|` + nodeConformanceTag

// The parts of conformanceFocus: a spec's text starts with its SIG and
// ends with its tags.
const (
	sigNode            = `\[sig-node\]`
	conformanceTag     = `\[Conformance\]`
	nodeConformanceTag = `\[NodeConformance\]`
)

// conformanceFocusOf narrows conformanceFocus to the specs whose text
// matches re too, between the SIG and the tags or beyond them. (Two
// expressions joined as "(a).*(b)|(b).*(a)" would miss a match of re inside
// one of the SIG's to its tags.)
func conformanceFocusOf(re string) string {
	r := "(" + re + ")"
	return strings.Join([]string{
		sigNode + ".*" + r + ".*" + conformanceTag,
		r + ".*" + sigNode + ".*" + conformanceTag,
		sigNode + ".*" + conformanceTag + ".*" + r,
		r + ".*" + nodeConformanceTag,
		nodeConformanceTag + ".*" + r,
	}, "|")
}

// quickSkips are the kinds of spec make test leaves to make
// test-conformance: Serial ones (they cannot share the cluster, so they
// run one at a time after the others), and flaky, disruptive and slow ones.
const quickSkips = `\[Serial\]|\[Flaky\]|\[Disruptive\]|\[Slow\]`

// flakeAttempts is how many times a spec runs before it counts as failed.
// Some specs allow a second for an exec probe (timeoutSeconds: 1) and fail
// at the first that takes longer, which happens on a loaded 2-core machine
// with any runtime: each exec passes through several processes (berthd,
// the shim, libcontainer's init), and each one's turn on the CPU comes
// later the more is runnable. A spec that failed once and then passed is
// printed as flaky, with its first failure, so that it is seen.
const flakeAttempts = 2

// e2eProcs is how many ginkgo processes run the parallel pass, unless
// BERTH_E2E_PROCS says: the specs mostly wait on timers (probes watched for
// minutes), so many of them share the 2 cores well.
const e2eProcs = 16

// e2eLongSpecs are the specs of make test-e2e that wait on timers for
// minutes whatever the runtime does: a probe watched for 4 minutes not to
// restart its container (12 specs), restart counts watched for 2, the node
// lease for 5, 500 pod updates for 4 and a half. They were 16 of the 276
// specs and 3,700 s of their 6,500 s of spec time (2026-11-29); on one pass
// they started wherever ginkgo's random order put them, the last ones 5
// minutes in, and the pass ended 4 minutes after the others' last spec
// (557 s). The long pass runs each on a process of its own from the start,
// beside the parallel pass of the rest, so the two end together, about 5
// minutes in. A spec renamed out of this list runs in the parallel pass.
const e2eLongSpecs = `should \*not\* be restarted|should have monotonically increasing restart count|should report node status infrequently|issue 500 podspec updates`

// e2eLongProcs is the long pass's ginkgo processes: one per long spec.
const e2eLongProcs = 16

// conformanceSkips is the one list of specs the tier skips, each with the
// reason: what the spec needs that this machine lacks. A spec that fails
// because of berth is never in it.
const conformanceSkips = "conformance-skips.txt"

// TestConformance runs Kubernetes' own e2e suite (e2e.test, with ginkgo,
// both of the release in go.mod) against the tier's cluster of two nodes,
// with the suite's images built offline (e2eimages_test.go): the specs of
// conformanceFocus not in the skip list, the long ones (e2eLongSpecs) on
// processes of their own beside the rest on e2eProcs ginkgo processes, then
// (in the full run) the Serial ones one at a time. It prints what ran, passed,
// failed and was skipped, and the time; any failure fails it. The suite's
// reports (JUnit and ginkgo's JSON) and output are kept in a folder of
// their own, BERTH_E2E_REPORT or /tmp/berth-e2e-TIME.
func TestConformance(t *testing.T) {
	requireTier(t)
	mode := os.Getenv(conformanceEnv)
	switch mode {
	case "":
		t.Skipf("the e2e tier runs with %s=1 (make test) or %s=full (make test-conformance)", conformanceEnv, conformanceEnv)
	case "1", "full":
	default:
		t.Fatalf("%s=%q: want 1 or full", conformanceEnv, mode)
	}
	skips := readSkipList(t, conformanceSkips)
	begin := time.Now()
	e := newEnv(t, false)
	kubeenv.NeedFiles(t, "`make test-conformance` (or set CLUSTER_BIN_DIR)",
		e.bin("e2e.test"), e.bin("ginkgo"), e.bin("agnhost"), e.bin("nonewprivs"))
	repoList := e.pushE2EImages(t)
	t.Cleanup(func() { e.deleteE2ENamespaces(t) })
	t.Logf("cluster of two nodes and the e2e images up in %s", time.Since(begin).Round(time.Second))

	report := kubeenv.EnvOr("BERTH_E2E_REPORT", filepath.Join(os.TempDir(), "berth-e2e-"+time.Now().Format("20060102-150405")))
	skip := strings.Join(skips, "|")
	procs := e2eProcs
	if n, err := strconv.Atoi(os.Getenv("BERTH_E2E_PROCS")); err == nil && n > 0 {
		procs = n
	}
	// BERTH_E2E_FOCUS narrows the run to some specs (a regular expression),
	// as when looking into a failure; BERTH_E2E_PROCS sets the number of
	// ginkgo processes of the parallel pass. The passes of a phase run at
	// once, each of its own specs: the long ones beside the others, unless
	// the run is narrowed.
	focus := conformanceFocus
	var first []e2ePass
	if f := os.Getenv("BERTH_E2E_FOCUS"); f != "" {
		focus = conformanceFocusOf(f)
		first = []e2ePass{{name: "parallel", procs: procs, focus: focus, labels: "!Serial", skip: skip}}
	} else {
		first = []e2ePass{
			{name: "long", procs: e2eLongProcs, focus: conformanceFocusOf(e2eLongSpecs), labels: "!Serial", skip: skip},
			{name: "parallel", procs: procs, focus: focus, labels: "!Serial", skip: skip, others: e2eLongSpecs},
		}
	}
	phases := [][]e2ePass{first}
	if mode == "1" {
		for i := range first {
			first[i].deferred = quickSkips
		}
	} else {
		phases = append(phases, []e2ePass{{name: "serial", procs: 1, focus: focus, labels: "Serial", skip: skip}})
	}
	var total e2eCounts
	for _, phase := range phases {
		start := time.Now()
		runs := make([]*e2eRun, len(phase))
		for i, p := range phase {
			runs[i] = e.startE2E(t, p, filepath.Join(report, p.name), repoList)
		}
		for _, r := range runs {
			c := r.wait(t)
			t.Logf("e2e %s: %s in %s", r.pass.name, c, time.Since(start).Round(time.Second))
			total.add(c)
		}
	}
	for _, s := range total.suiteSkips {
		t.Logf("skipped by the suite: %s", s)
	}
	t.Logf("e2e (%s): %s in %s; reports (JUnit, ginkgo JSON, output) in %s", mode, total, time.Since(begin).Round(time.Second), report)
	for _, f := range total.flaky {
		t.Logf("flaky (passed at a later attempt; the first failure): %s", f)
	}
	for _, f := range total.failed {
		t.Errorf("failed: %s", f)
	}
}

// deleteE2ENamespaces deletes the namespaces the suite left (it deletes
// its own without waiting) and waits until no pod is left on either node,
// so that the nodes' teardowns find berth holding nothing.
func (e *env) deleteE2ENamespaces(t *testing.T) {
	if out, err := e.kubectlErr("delete", "namespace", "-l", "e2e-run", "--wait=false"); err != nil {
		t.Errorf("teardown: %v %s", err, out)
	}
	kubeenv.WaitFor(t, 5*time.Minute, "no pod left of the e2e suite", func() (bool, string) {
		out, err := e.kubectlErr("get", "pods", "--all-namespaces", "-o", "name")
		return err == nil && strings.TrimSpace(out) == "", fmt.Sprint(out, err)
	})
}

// readSkipList reads the skip list: a spec's regular expression and,
// after " # ", why it is skipped, on each line that is neither blank nor a
// comment. A line without a reason, or whose expression does not compile,
// fails t.
func readSkipList(t *testing.T, name string) []string {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var skips []string
	s := bufio.NewScanner(f)
	for n := 1; s.Scan(); n++ {
		line := strings.TrimSpace(s.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		spec, reason, _ := strings.Cut(line, " # ")
		spec = strings.TrimSpace(spec)
		if strings.TrimSpace(reason) == "" {
			t.Fatalf("%s:%d: %q has no reason (SPEC # REASON)", name, n, line)
		}
		if _, err := regexp.Compile(spec); err != nil {
			t.Fatalf("%s:%d: %v", name, n, err)
		}
		skips = append(skips, spec)
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	return skips
}

// e2ePass is one ginkgo run of the suite.
type e2ePass struct {
	name     string
	procs    int
	focus    string // the specs run (a regular expression)
	labels   string // ginkgo's label filter
	skip     string // the skip list's specs (regular expressions)
	deferred string // the kinds of spec left to make test-conformance, if any
	others   string // the specs of focus that another pass runs, if any
}

// skips is every spec pass p leaves out, as one regular expression.
func (p e2ePass) skips() string {
	return strings.Join(slices.DeleteFunc([]string{p.deferred, p.others, p.skip}, func(s string) bool { return s == "" }), "|")
}

// e2eRun is a pass of the suite under way: ginkgo, its output and the
// folder of its reports.
type e2eRun struct {
	pass   e2ePass
	cmd    *exec.Cmd
	out    *os.File
	dir    string
	output string
}

// startE2E starts pass p of the suite with ginkgo against the cluster, its
// reports and output in dir.
func (e *env) startE2E(t *testing.T, p e2ePass, dir, repoList string) *e2eRun {
	t.Helper()
	kubeenv.Mkdirs(t, dir)
	output := filepath.Join(dir, "ginkgo.log")
	out, err := os.Create(output)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(e.bin("ginkgo"),
		fmt.Sprintf("--procs=%d", p.procs), fmt.Sprintf("--flake-attempts=%d", flakeAttempts), "--focus="+p.focus, "--skip="+p.skips(), "--label-filter="+p.labels,
		"--timeout=4h", "--no-color", "--output-dir="+dir, "--junit-report=junit.xml", "--json-report=report.json",
		e.bin("e2e.test"), "--",
		"--kubeconfig="+e.admin, "--provider=skeleton", "--kube-test-repo-list="+repoList,
		"--kubectl-path="+e.bin("kubectl"), "--disable-log-dump", "--e2e-output-dir="+dir,
		// The suite names one runtime endpoint: the first node's berth.
		"--container-runtime-endpoint=unix://"+e.nodes[0].berthd.Socket, "--container-runtime-process-name=berthd")
	cmd.Env = append(os.Environ(), "KUBE_TEST_REPO_LIST="+repoList, "KUBECONFIG="+e.admin)
	cmd.Stdout, cmd.Stderr = out, out
	// A group of its own: a test that fails before waiting for the run
	// ends ginkgo with its processes.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	t.Logf("e2e %s: %s (output: %s)", p.name, strings.Join(cmd.Args, " "), output)
	if err := cmd.Start(); err != nil {
		out.Close()
		t.Fatalf("e2e %s: %v", p.name, err)
	}
	r := &e2eRun{pass: p, cmd: cmd, out: out, dir: dir, output: output}
	t.Cleanup(func() {
		if r.cmd.ProcessState == nil {
			syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
			r.cmd.Wait()
			r.out.Close()
		}
	})
	return r
}

// wait waits for the run's ginkgo to end and counts its pass's specs.
func (r *e2eRun) wait(t *testing.T) e2eCounts {
	t.Helper()
	runErr := r.cmd.Wait()
	r.out.Close()
	p := r.pass
	c, err := countE2E(filepath.Join(r.dir, "report.json"), p)
	if err != nil {
		t.Fatalf("e2e %s: %v (ginkgo: %v); the end of its output:\n%s", p.name, err, runErr, tailFile(r.output, 60))
	}
	if runErr != nil && len(c.failed) == 0 {
		t.Errorf("e2e %s: ginkgo: %v, with no spec failed; the end of its output:\n%s", p.name, runErr, tailFile(r.output, 60))
	}
	return c
}

// e2eCounts are a run's specs: those run (passed or failed), those of the
// focus left out (by the skip list, or left to make test-conformance),
// those the suite skipped itself (what the cluster lacks, as the spec
// says), and the failures.
type e2eCounts struct {
	ran, passed, listed, deferred, skippedBySuite int
	failed                                        []string
	flaky                                         []string // passed after failing
	suiteSkips                                    []string
}

func (c e2eCounts) String() string {
	return fmt.Sprintf("%d ran, %d passed (%d of them flaky), %d failed, %d skipped (%d by %s, %d by the suite), %d left to make test-conformance",
		c.ran, c.passed, len(c.flaky), len(c.failed), c.listed+c.skippedBySuite, c.listed, conformanceSkips, c.skippedBySuite, c.deferred)
}

func (c *e2eCounts) add(o e2eCounts) {
	c.ran += o.ran
	c.passed += o.passed
	c.listed += o.listed
	c.deferred += o.deferred
	c.skippedBySuite += o.skippedBySuite
	c.failed = append(c.failed, o.failed...)
	c.flaky = append(c.flaky, o.flaky...)
	c.suiteSkips = append(c.suiteSkips, o.suiteSkips...)
}

// ginkgoReport is what the counts need of ginkgo's JSON report.
type ginkgoReport []struct {
	SpecReports []struct {
		ContainerHierarchyTexts  []string
		ContainerHierarchyLabels [][]string
		LeafNodeType             string
		LeafNodeText             string
		LeafNodeLabels           []string
		State                    string
		NumAttempts              int
		Failure                  ginkgoFailure
		// AdditionalFailures holds, for a spec that passed at a later
		// attempt, the failures of the attempts before.
		AdditionalFailures []struct{ Failure ginkgoFailure }
	}
}

type ginkgoFailure struct {
	Message  string
	Location struct {
		FileName   string
		LineNumber int
	}
}

func (f ginkgoFailure) String() string {
	// A failure ginkgo kept from an earlier attempt starts with a line of
	// its own saying so; the cause is on the next.
	msg := strings.TrimSpace(f.Message)
	if rest, ok := strings.CutPrefix(msg, "Failure recorded during attempt "); ok {
		_, msg, _ = strings.Cut(rest, ":")
	}
	return fmt.Sprintf("%s (%s:%d)", firstLine(msg), f.Location.FileName, f.Location.LineNumber)
}

// countE2E counts pass p's specs in its ginkgo JSON report.
func countE2E(path string, p e2ePass) (e2eCounts, error) {
	var c e2eCounts
	b, err := os.ReadFile(path)
	if err != nil {
		return c, err
	}
	var r ginkgoReport
	if err := json.Unmarshal(b, &r); err != nil {
		return c, fmt.Errorf("%s: %v", path, err)
	}
	focus, skip, deferred := regexp.MustCompile(p.focus), regexp.MustCompile(p.skip), regexp.MustCompile(p.deferred)
	others := regexp.MustCompile(p.others)
	for _, suite := range r {
		for _, s := range suite.SpecReports {
			text := strings.Join(append(slices.Clone(s.ContainerHierarchyTexts), s.LeafNodeText), " ")
			failure := text + ": " + s.Failure.String()
			if s.LeafNodeType != "It" {
				// The suite's own nodes (setup, reports): only a failure counts.
				if s.State != "passed" && s.State != "skipped" {
					c.failed = append(c.failed, s.LeafNodeType+" "+failure)
				}
				continue
			}
			switch s.State {
			case "passed":
				c.ran++
				c.passed++
				if s.NumAttempts > 1 && len(s.AdditionalFailures) > 0 {
					c.flaky = append(c.flaky, text+": "+s.AdditionalFailures[0].Failure.String())
				}
			case "skipped", "pending":
				labels := slices.Concat(append(slices.Clone(s.ContainerHierarchyLabels), s.LeafNodeLabels)...)
				if !focus.MatchString(text) || slices.Contains(labels, "Serial") != (p.labels == "Serial") ||
					p.others != "" && others.MatchString(text) {
					continue // not of this pass
				}
				if s.Failure.Message != "" {
					c.skippedBySuite++
					c.suiteSkips = append(c.suiteSkips, text+": "+firstLine(s.Failure.Message))
				} else if p.deferred != "" && deferred.MatchString(text) {
					c.deferred++
				} else if skip.MatchString(text) {
					c.listed++
				}
			default: // failed, panicked, timedout, interrupted, aborted
				c.ran++
				c.failed = append(c.failed, s.State+" "+failure)
			}
		}
	}
	return c, nil
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return line
}

// tailFile is the last n lines of the file at path.
func tailFile(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
