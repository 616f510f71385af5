package unpack

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
)

// headerOnly is a tar stream that declares a file of size bytes and ends
// right after its header: a bound must refuse it before reading the body.
func headerOnly(t testing.TB, name string, size int64) []byte {
	t.Helper()
	var b bytes.Buffer
	h := hdr(tar.TypeReg, name, 0o644)
	h.Size = size
	if err := tar.NewWriter(&b).WriteHeader(&h); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// sparseLayer is a PAX 0.1 sparse file: a 512-byte data block, declared as a
// file of realSize bytes whose rest is a hole. A few hundred bytes of stream
// that unpack as realSize bytes of file.
func sparseLayer(t testing.TB, realSize int64) []byte {
	t.Helper()
	var recs strings.Builder
	for _, kv := range [][2]string{
		{"GNU.sparse.map", "0,512"},
		{"GNU.sparse.numblocks", "1"},
		{"GNU.sparse.size", strconv.FormatInt(realSize, 10)},
	} {
		rec := " " + kv[0] + "=" + kv[1] + "\n"
		n := len(rec) + 1
		for len(strconv.Itoa(n))+len(rec) != n {
			n++
		}
		recs.WriteString(strconv.Itoa(n) + rec)
	}
	var b bytes.Buffer
	w := tar.NewWriter(&b)
	x := hdr(tar.TypeReg, "PaxHeaders/sparse", 0o644)
	x.Size = int64(recs.Len())
	x.Format = tar.FormatUSTAR
	if err := w.WriteHeader(&x); err != nil {
		t.Fatal(err)
	}
	io.WriteString(w, recs.String())
	f := hdr(tar.TypeReg, "sparse", 0o644)
	f.Size = 512
	f.Format = tar.FormatUSTAR
	if err := w.WriteHeader(&f); err != nil {
		t.Fatal(err)
	}
	w.Write(bytes.Repeat([]byte{'d'}, 512))
	w.Close()
	raw := b.Bytes()
	raw[156] = tar.TypeXHeader // the first header becomes the PAX header of the second
	sum := 0
	copy(raw[148:156], "        ")
	for _, c := range raw[:512] {
		sum += int(c)
	}
	copy(raw[148:156], fmt.Sprintf("%06o\x00 ", sum))
	return raw
}

func TestMaxBytes(t *testing.T) {
	cases := []struct {
		name   string
		stream []byte
	}{
		{"one huge file", headerOnly(t, "huge", 1<<40)},
		{"files adding up", layer(t, reg("a", strings.Repeat("a", 600)), reg("b", strings.Repeat("b", 600)))},
		{"sparse file", sparseLayer(t, 1<<40)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root, _ := dirs(t)
			_, err := Unpack(context.Background(), bytes.NewReader(c.stream), root, Options{MaxBytes: 1000})
			if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "more than 1000 bytes") {
				t.Errorf("Unpack = %v, want ErrTooLarge naming the bound", err)
			}
		})
	}
	t.Run("sparse file within the bound", func(t *testing.T) {
		root, _ := dirs(t)
		st, err := Unpack(context.Background(), bytes.NewReader(sparseLayer(t, 4096)), root, Options{MaxBytes: 4096})
		if err != nil || st.Bytes != 4096 {
			t.Fatalf("Unpack = %+v, %v; want 4096 bytes", st, err)
		}
		if fi, err := os.Stat(root + "/sparse"); err != nil || fi.Size() != 4096 {
			t.Errorf("sparse file: %v, %v", fi, err)
		}
	})
}

func TestMaxEntries(t *testing.T) {
	var ents []ent
	for i := range 11 {
		ents = append(ents, reg(fmt.Sprintf("f%d", i), "x"))
	}
	root, _ := dirs(t)
	if _, err := unpack(t, root, Options{MaxEntries: 11}, ents...); err != nil {
		t.Fatalf("11 entries with a bound of 11: %v", err)
	}
	root, _ = dirs(t)
	_, err := unpack(t, root, Options{MaxEntries: 10}, ents...)
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "more than 10 entries") {
		t.Errorf("Unpack = %v, want ErrTooLarge naming the bound", err)
	}
}

func TestBound(t *testing.T) {
	data := strings.Repeat("z", 100)
	if b, err := io.ReadAll(Bound(strings.NewReader(data), 100)); err != nil || len(b) != 100 {
		t.Errorf("a stream of exactly the bound: %d bytes, %v", len(b), err)
	}
	if _, err := io.ReadAll(Bound(strings.NewReader(data), 99)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("a stream over the bound: %v, want ErrTooLarge", err)
	}
}

// cancelAfter cancels its context once n bytes were read through it.
type cancelAfter struct {
	r      io.Reader
	n      int
	cancel context.CancelFunc
	read   int
}

func (c *cancelAfter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p[:min(len(p), 64<<10)])
	if c.read += n; c.read >= c.n {
		c.cancel()
	}
	return n, err
}

func TestCanceledInsideFile(t *testing.T) {
	root, _ := dirs(t)
	stream := layer(t, reg("big", strings.Repeat("b", 16<<20)))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := &cancelAfter{r: bytes.NewReader(stream), n: 1 << 20, cancel: cancel}
	_, err := Unpack(ctx, r, root, Options{})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Unpack = %v, want context.Canceled", err)
	}
	if r.read > 4<<20 {
		t.Errorf("the copy read %d bytes after the cancel at 1 MiB", r.read)
	}
}
