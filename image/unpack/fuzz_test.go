package unpack

import (
	"bytes"
	"context"
	"io/fs"
	"path/filepath"
	"testing"
)

// FuzzUnpack feeds arbitrary tar streams to Unpack with tight bounds: it
// must never panic, write outside its folder or past its bounds. The seeds
// in testdata/fuzz/FuzzUnpack are escape attempts and bombs.
func FuzzUnpack(f *testing.F) {
	f.Add(layer(f, reg("f", "x"), dir("d/"), sym("d/l", "../f"), hard("h", "f")))
	f.Add(layer(f, sym("a", "../outside"), reg("a/pwned", "x")))
	f.Add(layer(f, reg("../outside/pwned", "x")))
	f.Add(layer(f, dir("d/"), sym("d/up", ".."), sym("b", "d/up/d/up/.."), reg("b/outside/pwned", "x")))
	f.Add(layer(f, reg(".wh..wh..opq", ""), reg(".wh.gone", "")))
	f.Add(headerOnly(f, "huge", 1<<40))
	f.Add(sparseLayer(f, 1<<40))
	const maxBytes, maxEntries = 1 << 20, 64
	f.Fuzz(func(t *testing.T, stream []byte) {
		root, outside := dirs(t)
		st, err := Unpack(context.Background(), bytes.NewReader(stream), root, Options{MaxBytes: maxBytes, MaxEntries: maxEntries})
		checkOutside(t, outside)
		var written int64
		walkErr := filepath.WalkDir(root, func(_ string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return err
			}
			info, err := d.Info()
			if err == nil {
				written += info.Size()
			}
			return err
		})
		if walkErr != nil {
			t.Fatalf("walk %s: %v", root, walkErr)
		}
		if written > maxBytes {
			t.Errorf("Unpack (err %v) wrote %d bytes of files, bound %d", err, written, maxBytes)
		}
		if err == nil && st.Bytes > maxBytes {
			t.Errorf("Unpack reported %d bytes, bound %d", st.Bytes, maxBytes)
		}
	})
}
