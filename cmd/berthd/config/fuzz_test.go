package config

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzLoad feeds arbitrary files to Load: it must not panic or hang, and a
// config it accepts passes its own validation with every bound positive.
func FuzzLoad(f *testing.F) {
	f.Add([]byte("root = \"/srv/berth\"\n[image]\npull_progress_timeout = \"90s\"\nmax_layer_bytes = 1024\n"))
	f.Add([]byte("[network]\nmode = \"cni\"\nsubnet = \"10.0.0.0/8\"\nmtu = 9000\n"))
	f.Add([]byte("[registry.\"docker.io\"]\nmirrors = [\"http://127.0.0.1:5000\", \"https://m.example/v2\"]\nusername = \"u\"\n"))
	f.Add([]byte("[registry.\"r.example\"]\nca_file = \"/dev/zero\"\n"))
	f.Add([]byte("[registry.\"r.example\"]\nplain_http = true\nusername = \"u\"\npassword = \"p\"\n"))
	f.Add([]byte("socket = \"/\u0000\"\nlog_level = 5\n[image]\npull_progress_timeout = \"-1ns\"\n"))
	f.Fuzz(func(t *testing.T, file []byte) {
		p := filepath.Join(t.TempDir(), "config.toml")
		if err := os.WriteFile(p, file, 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := Load(p, true)
		if err != nil {
			return
		}
		if err := c.validate(); err != nil {
			t.Fatalf("Load accepted a config its validation refuses: %v", err)
		}
		if c.Image.PullProgressTimeout.Duration <= 0 || c.Image.MaxLayerBytes <= 0 || c.Image.MaxLayerEntries <= 0 {
			t.Fatalf("Load accepted non-positive image bounds: %+v", c.Image)
		}
	})
}
