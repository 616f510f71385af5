package crilog

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

type record struct {
	stream, tag, content string
}

// readLog parses a CRI log file and checks each record's timestamp.
func readLog(t *testing.T, path string) []record {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []record
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), " ", 4)
		if len(parts) != 4 {
			t.Fatalf("malformed record %q", sc.Text())
		}
		if _, err := time.Parse(time.RFC3339Nano, parts[0]); err != nil {
			t.Fatalf("timestamp %q: %v", parts[0], err)
		}
		if parts[2] != "F" && parts[2] != "P" {
			t.Fatalf("tag %q", parts[2])
		}
		out = append(out, record{parts[1], parts[2], parts[3]})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func copyString(t *testing.T, path, stream, in string) []record {
	t.Helper()
	w, err := Open(path, "")
	if err != nil {
		t.Fatal(err)
	}
	w.Copy(stream, strings.NewReader(in))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return readLog(t, path)
}

func TestLines(t *testing.T) {
	got := copyString(t, filepath.Join(t.TempDir(), "log"), Stdout, "a\n\nb c\nlast")
	want := []record{{"stdout", "F", "a"}, {"stdout", "F", ""}, {"stdout", "F", "b c"}, {"stdout", "P", "last"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestSplitLongLine(t *testing.T) {
	line := strings.Repeat("x", 100_000)
	got := copyString(t, filepath.Join(t.TempDir(), "log"), Stderr, line+"\nnext\n")
	var joined strings.Builder
	for i, r := range got[:len(got)-1] {
		last := i == len(got)-2
		if (r.tag == "F") != last || r.stream != "stderr" {
			t.Fatalf("record %d: %s %s", i, r.stream, r.tag)
		}
		if !last && len(r.content) != MaxRecord {
			t.Fatalf("partial record %d has %d bytes", i, len(r.content))
		}
		joined.WriteString(r.content)
	}
	if joined.String() != line || len(got) != 100_000/MaxRecord+2 {
		t.Fatalf("reassembled %d bytes in %d records", joined.Len(), len(got))
	}
	if got[len(got)-1] != (record{"stderr", "F", "next"}) {
		t.Fatalf("last record %v", got[len(got)-1])
	}
}

// A line of exactly MaxRecord bytes is one F record, not P plus an empty F.
func TestExactRecord(t *testing.T) {
	line := strings.Repeat("y", MaxRecord)
	got := copyString(t, filepath.Join(t.TempDir(), "log"), Stdout, line+"\n")
	if len(got) != 1 || got[0].tag != "F" || got[0].content != line {
		t.Fatalf("got %d records", len(got))
	}
}

// A long unterminated line at EOF: P records only, the last one the rest
// (no newline was written, so no record says the line ended).
func TestPartialAtEOF(t *testing.T) {
	line := strings.Repeat("z", MaxRecord+10)
	got := copyString(t, filepath.Join(t.TempDir(), "log"), Stdout, line)
	if len(got) != 2 || got[0].tag != "P" || got[1].tag != "P" || got[1].content != "zzzzzzzzzz" {
		t.Fatalf("got %v", got)
	}
}

// Lines arriving in small chunks are reassembled, not split at read edges.
func TestChunkedReads(t *testing.T) {
	pr, pw := io.Pipe()
	path := filepath.Join(t.TempDir(), "log")
	w, err := Open(path, "")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { w.Copy(Stdout, pr); close(done) }()
	for _, s := range []string{"he", "llo\nwor", "ld\n"} {
		pw.Write([]byte(s))
	}
	pw.Close()
	<-done
	w.Close()
	got := readLog(t, path)
	if len(got) != 2 || got[0].content != "hello" || got[1].content != "world" {
		t.Fatalf("got %v", got)
	}
}

func TestConcurrentStreams(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	w, err := Open(path, "")
	if err != nil {
		t.Fatal(err)
	}
	const n = 2000
	var wg sync.WaitGroup
	for _, s := range []string{Stdout, Stderr} {
		pr, pw := io.Pipe()
		wg.Add(2)
		go func() { defer wg.Done(); w.Copy(s, pr) }()
		go func() {
			defer wg.Done()
			for i := range n {
				fmt.Fprintf(pw, "%s line %d %s\n", s, i, strings.Repeat("-", i%300))
			}
			pw.Close()
		}()
	}
	wg.Wait()
	w.Close()
	next := map[string]int{}
	for _, r := range readLog(t, path) {
		want := fmt.Sprintf("%s line %d %s", r.stream, next[r.stream], strings.Repeat("-", next[r.stream]%300))
		if r.tag != "F" || r.content != want {
			t.Fatalf("record %v, want %q", r, want)
		}
		next[r.stream]++
	}
	if next[Stdout] != n || next[Stderr] != n {
		t.Fatalf("counts %v", next)
	}
}

func TestReopen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "log")
	w, err := Open(path, "")
	if err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() { w.Copy(Stdout, pr); close(done) }()
	fmt.Fprintln(pw, "before")
	// The pipe write returns when Copy has read it, not written it.
	for deadline := time.Now().Add(5 * time.Second); ; {
		if fi, err := os.Stat(path); err == nil && fi.Size() > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("first record never written")
		}
		time.Sleep(time.Millisecond)
	}
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	if err := w.Reopen(); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(pw, "after")
	pw.Close()
	<-done
	w.Close()
	if got := readLog(t, path+".1"); len(got) != 1 || got[0].content != "before" {
		t.Fatalf("rotated file: %v", got)
	}
	if got := readLog(t, path); len(got) != 1 || got[0].content != "after" {
		t.Fatalf("new file: %v", got)
	}
	if err := w.Reopen(); err == nil {
		t.Fatal("Reopen after Close succeeded")
	}
}

func TestDiscard(t *testing.T) {
	w, err := Open("", "")
	if err != nil {
		t.Fatal(err)
	}
	w.Copy(Stdout, strings.NewReader("dropped\n"))
	if err := w.Reopen(); err != nil {
		t.Fatal(err)
	}
	w.Close()
}

// TestOpenRefusesWhatIsNotAFileBeneath: whoever can write the log folder
// cannot make the shim hang on a FIFO, write through a symlink (in the
// last component or a folder above it), or write into a folder or device;
// each refusal names the log. A rotation's Reopen is held to the same.
func TestOpenRefusesWhatIsNotAFileBeneath(t *testing.T) {
	dir := t.TempDir()
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("untouched"), 0o600); err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(syscall.Mkfifo(filepath.Join(dir, "fifo.log"), 0o600))
	must(os.Symlink(victim, filepath.Join(dir, "link.log")))
	must(os.Symlink(outside, filepath.Join(dir, "linkdir")))
	must(os.Mkdir(filepath.Join(dir, "dir.log"), 0o755))
	must(os.Mkdir(filepath.Join(dir, "ctr"), 0o755))
	must(os.Symlink(victim, filepath.Join(dir, "ctr", "0.log")))

	// A FIFO with a reader opens without ENXIO: the type check refuses it.
	readerFIFO := filepath.Join(dir, "read-fifo.log")
	must(syscall.Mkfifo(readerFIFO, 0o600))
	reader, err := os.OpenFile(readerFIFO, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	must(err)
	defer reader.Close()

	for _, c := range []struct{ path, dir, why string }{
		{filepath.Join(dir, "fifo.log"), dir, "FIFO"},
		{readerFIFO, dir, "FIFO"},
		{filepath.Join(dir, "link.log"), dir, "symlink"},
		{filepath.Join(dir, "linkdir", "victim"), dir, "symlink"},
		{filepath.Join(dir, "ctr", "0.log"), dir, "symlink"},
		{filepath.Join(dir, "ctr", "0.log"), "", "symlink"},
		{filepath.Join(dir, "dir.log"), dir, "directory"},
		{"/dev/null", dir, "beneath"},
		{"/dev/null", "", "character device"},
	} {
		done := make(chan error, 1)
		go func() {
			w, err := Open(c.path, c.dir)
			if err == nil {
				w.Close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), c.path) || !strings.Contains(err.Error(), c.why) {
				t.Errorf("Open(%s, %q) = %v; want an error naming the log and %q", c.path, c.dir, err, c.why)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("Open(%s, %q) hangs", c.path, c.dir)
		}
	}
	if b, _ := os.ReadFile(victim); string(b) != "untouched" {
		t.Errorf("the symlinks' target now holds %q", b)
	}

	// Rotation: a symlink put where the renamed log was is refused too.
	path := filepath.Join(dir, "rotated.log")
	w, err := Open(path, dir)
	must(err)
	defer w.Close()
	must(os.Rename(path, path+".1"))
	must(os.Symlink(victim, path))
	if err := w.Reopen(); err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Errorf("Reopen onto a symlink = %v, want refused", err)
	}
	w.Copy(Stdout, strings.NewReader("still to the old file\n"))
	if got := readLog(t, path+".1"); len(got) != 1 {
		t.Errorf("after a refused Reopen the records went astray: %v", got)
	}
	if b, _ := os.ReadFile(victim); string(b) != "untouched" {
		t.Errorf("the symlink's target now holds %q", b)
	}
}

// TestOpenBeneathNested: the kubelet's NAME/RESTART.log opens below the
// pod's folder, created 0640, and appends.
func TestOpenBeneathNested(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "ctr"), 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "ctr", "0.log")
	if got := copyString(t, path, Stdout, "one\n"); len(got) != 1 {
		t.Fatalf("records %v", got)
	}
	w, err := Open(path, dir)
	if err != nil {
		t.Fatal(err)
	}
	w.Copy(Stderr, strings.NewReader("two\n"))
	w.Close()
	if got := readLog(t, path); len(got) != 2 || got[1].content != "two" {
		t.Errorf("records %v, want the first kept and the second appended", got)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("log mode %v (%v), want 0640", fi.Mode(), err)
	}
}
