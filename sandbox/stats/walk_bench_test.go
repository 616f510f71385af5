package stats

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkDiskUsage walks a layer like an ordinary one: 100 folders of 100
// small files, and writeTree's folder of 2000 long names (several reads of
// names), nested folders and hard-linked files.
func BenchmarkDiskUsage(b *testing.B) {
	dir := b.TempDir()
	for d := range 100 {
		sub := filepath.Join(dir, "usr", fmt.Sprintf("pkg-%03d", d))
		if err := os.MkdirAll(sub, 0o755); err != nil {
			b.Fatal(err)
		}
		for f := range 100 {
			if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("file-%03d.so", f)), []byte("x"), 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
	writeTree(b, dir, 3)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := diskUsage(dir, layerWalkLimits); err != nil {
			b.Fatal(err)
		}
	}
}
