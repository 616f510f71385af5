package config

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestCheckNamesEveryProblemWithItsLine(t *testing.T) {
	file := `# berthd
log_level = "loud"

[image]
pull_progress_timeout = "0s"
bogus = 1

[registry.'docker.io']
mirrors = ["ok.example",
  "ftp://m.example"]

[metrics]
address = "localhost:1"
`
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	probs, err := Check(path)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]string{6: `unknown key "image.bogus"`, 2: "log_level", 5: "image.pull_progress_timeout",
		9: `registry."docker.io".mirrors[1]`, 13: "metrics.address"}
	var got []int
	for _, p := range probs {
		got = append(got, p.Line)
		if w, ok := want[p.Line]; !ok || !strings.Contains(p.Msg, w) {
			t.Errorf("problem %v: want line %d to say %q", p, p.Line, want[p.Line])
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, []int{2, 5, 6, 9, 13}) {
		t.Errorf("lines %v, want 2 5 6 9 13: %v", got, probs)
	}

	if err := os.WriteFile(path, []byte("root = \"/x\"\nsocket = 5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	probs, err = Check(path)
	if err != nil || len(probs) != 1 || probs[0].Line != 2 {
		t.Errorf("wrong type: %v, %v; want one problem at line 2", probs, err)
	}
	if err := os.WriteFile(path, []byte("[network]\nmode = \"bridge\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if probs, err = Check(path); err != nil || len(probs) != 0 {
		t.Errorf("good file: %v, %v", probs, err)
	}
}
