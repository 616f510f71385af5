package cni

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func writeFile(t *testing.T, path, body string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), mode); err != nil {
		t.Fatal(err)
	}
}

// fakeBins makes a bin folder with (empty, executable) plugins of the
// given names.
func fakeBins(t *testing.T, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, n := range names {
		writeFile(t, filepath.Join(dir, n), "#!/bin/sh\n", 0o755)
	}
	return dir
}

const (
	bridgeList = `{"cniVersion":"1.0.0","name":"lst","plugins":[{"type":"bridge","bridge":"b0"},{"type":"portmap","capabilities":{"portMappings":true}}]}`
	bridgeConf = `{"cniVersion":"0.4.0","name":"one","type":"bridge","bridge":"b1"}`
)

func TestConfFilesOrderAndFilter(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"20-b.conf", "10-a.conflist", "99-c.json", "05-notes.txt", ".01-hidden.conf", "30-d.conf.bak"} {
		writeFile(t, filepath.Join(dir, name), "{}", 0o644)
	}
	if err := os.Mkdir(filepath.Join(dir, "00-dir.conf"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "99-c.json"), filepath.Join(dir, "15-link.conflist")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "absent"), filepath.Join(dir, "16-dangling.conf")); err != nil {
		t.Fatal(err)
	}
	got, err := confFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range got {
		names = append(names, filepath.Base(p))
	}
	want := []string{"10-a.conflist", "15-link.conflist", "20-b.conf", "99-c.json"}
	if !reflect.DeepEqual(names, want) {
		t.Errorf("confFiles = %v, want %v", names, want)
	}
	if got, err := confFiles(filepath.Join(dir, "absent")); err != nil || len(got) != 0 {
		t.Errorf("missing folder: %v, %v", got, err)
	}
}

func TestLoadConfFirstInLexicalOrder(t *testing.T) {
	bins := fakeBins(t, "bridge", "portmap")
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "20-list.conflist"), bridgeList, 0o644)
	writeFile(t, filepath.Join(dir, "10-one.conf"), bridgeConf, 0o644)
	c, err := loadConf(dir, []string{bins})
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(c.file) != "10-one.conf" || c.list.Name != "one" || c.list.CNIVersion != "0.4.0" || len(c.list.Plugins) != 1 {
		t.Fatalf("loaded %s: %+v", c.file, c.list)
	}
	// A .conf becomes a list that carries its plugin inline.
	var top struct {
		Name       string
		CNIVersion string
		Plugins    []map[string]any
	}
	if err := json.Unmarshal(c.list.Bytes, &top); err != nil {
		t.Fatal(err)
	}
	if top.Name != "one" || top.CNIVersion != "0.4.0" || len(top.Plugins) != 1 || top.Plugins[0]["bridge"] != "b1" {
		t.Errorf("inline bytes: %s", c.list.Bytes)
	}

	os.Remove(filepath.Join(dir, "10-one.conf"))
	c, err = loadConf(dir, []string{bins})
	if err != nil {
		t.Fatal(err)
	}
	if c.list.Name != "lst" || len(c.list.Plugins) != 2 || c.list.Plugins[1].Network.Type != "portmap" {
		t.Errorf("conflist: %+v", c.list)
	}
}

func TestLoadConfPluginFolder(t *testing.T) {
	// CNI 1.1: a conflist's plugins may also come from DIR/<name>/*.conf;
	// the loaded list must carry them inline for DEL.
	bins := fakeBins(t, "bridge", "portmap", "bandwidth")
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "10-lst.conflist"), bridgeList, 0o644)
	writeFile(t, filepath.Join(dir, "lst", "50-bw.conf"), `{"type":"bandwidth","capabilities":{"bandwidth":true}}`, 0o644)
	c, err := loadConf(dir, []string{bins})
	if err != nil {
		t.Fatal(err)
	}
	if got := pluginTypes(c.list); got != "bridge,portmap,bandwidth" {
		t.Fatalf("plugins %s", got)
	}
	again, err := parseBytes(c.list.Bytes)
	if err != nil || pluginTypes(again) != "bridge,portmap,bandwidth" {
		t.Errorf("bytes do not carry every plugin: %s (%v)", c.list.Bytes, err)
	}
}

func TestLoadConfCNIVersions(t *testing.T) {
	bins := fakeBins(t, "bridge")
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "10.conflist"), `{"cniVersions":["0.4.0","1.0.0","9.9.9"],"name":"v","plugins":[{"type":"bridge"}]}`, 0o644)
	c, err := loadConf(dir, []string{bins})
	if err != nil {
		t.Fatal(err)
	}
	if c.list.CNIVersion != "1.0.0" {
		t.Errorf("cniVersion %q, want the newest supported, 1.0.0", c.list.CNIVersion)
	}
}

func TestLoadConfErrors(t *testing.T) {
	bins := fakeBins(t, "bridge", "portmap")
	tests := []struct {
		name  string
		files map[string]string
		want  []string
	}{
		{"empty folder", nil, []string{"no network configuration in", ".conflist, .conf, .json"}},
		{"only other files", map[string]string{"README": "x", "10.conf.old": bridgeConf}, []string{"no network configuration"}},
		{"bad JSON", map[string]string{"10-bad.conflist": `{"name":`}, []string{"10-bad.conflist", "JSON"}},
		{"no fallback past a broken first file", map[string]string{"10-bad.conf": `nope`, "20-good.conflist": bridgeList},
			[]string{"10-bad.conf"}},
		{"missing plugin", map[string]string{"10.conflist": `{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"},{"type":"flannel"}]}`},
			[]string{`plugin "flannel" not found in ` + bins}},
		{"no name", map[string]string{"10.conflist": `{"cniVersion":"1.0.0","plugins":[{"type":"bridge"}]}`}, []string{"name"}},
		{"no version", map[string]string{"10.conflist": `{"name":"n","plugins":[{"type":"bridge"}]}`}, []string{"cniVersion"}},
		{"bad version", map[string]string{"10.conflist": `{"cniVersion":"one","name":"n","plugins":[{"type":"bridge"}]}`}, []string{"cniVersion"}},
		{"too new", map[string]string{"10.conflist": `{"cniVersion":"9.0.0","name":"n","plugins":[{"type":"bridge"}]}`}, []string{"9.0.0", "newer"}},
		{"no plugins", map[string]string{"10.conflist": `{"cniVersion":"1.0.0","name":"n","plugins":[]}`}, []string{"no plugins"}},
		{"plugin without type", map[string]string{"10.conflist": `{"cniVersion":"1.0.0","name":"n","plugins":[{"bridge":"x"}]}`}, []string{"type"}},
		{"conf without type", map[string]string{"10.conf": `{"cniVersion":"1.0.0","name":"n"}`}, []string{"10.conf", "type"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, body := range tt.files {
				writeFile(t, filepath.Join(dir, name), body, 0o644)
			}
			_, err := loadConf(dir, []string{bins})
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestLoadConfListUnderConfName(t *testing.T) {
	// A list saved as .conf or .json is still read as a list.
	bins := fakeBins(t, "bridge", "portmap")
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "10.json"), bridgeList, 0o644)
	c, err := loadConf(dir, []string{bins})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.list.Plugins) != 2 {
		t.Errorf("plugins: %s", pluginTypes(c.list))
	}
}
