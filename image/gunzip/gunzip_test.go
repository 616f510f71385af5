package gunzip

import (
	"bytes"
	stdgzip "compress/gzip"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/klauspost/compress/gzip"
)

// requireISAL fails the test where ISA-L cannot be loaded: test/deps.sh
// installs it, and the tests compare it with the builtin decoder.
func requireISAL(t testing.TB) {
	t.Helper()
	if _, err := Choose(ISAL); err != nil {
		t.Fatalf("%v (test/deps.sh installs libisal2)", err)
	}
}

// text is compressible content shaped like a layer's files: words and
// numbers, some repeated far apart.
func text(n int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, 1))
	words := strings.Fields("lib usr share locale the of and ELF x86_64 0x7f45 config main init error return struct")
	var b bytes.Buffer
	for b.Len() < n {
		if rng.IntN(50) == 0 {
			b.Write(bytes.Repeat([]byte{byte(rng.IntN(256))}, rng.IntN(300)))
		}
		b.WriteString(words[rng.IntN(len(words))])
		b.WriteByte(" \n\t/"[rng.IntN(4)])
	}
	return b.Bytes()[:n]
}

func gz(t testing.TB, data []byte, level int, hdr stdgzip.Header) []byte {
	t.Helper()
	var b bytes.Buffer
	w, err := stdgzip.NewWriterLevel(&b, level)
	if err != nil {
		t.Fatal(err)
	}
	w.Header = hdr
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// decode reads the whole stream with the decoder and returns what it gave
// before its error.
func decode(r io.ReadCloser, err error) ([]byte, error) {
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(r)
}

func builtin(src []byte) ([]byte, error) { return decode(gzip.NewReader(bytes.NewReader(src))) }
func isal(src io.Reader) ([]byte, error) { return decode(newISALReader(src), nil) }

func TestISALMatchesBuiltin(t *testing.T) {
	requireISAL(t)
	big := text(3<<20, 1)
	random := make([]byte, 1<<20)
	rand.NewChaCha8([32]byte{2}).Read(random)
	cases := map[string][]byte{
		"empty":                 gz(t, nil, 6, stdgzip.Header{}),
		"one byte":              gz(t, []byte{'x'}, 6, stdgzip.Header{}),
		"3 MiB level 1":         gz(t, big, stdgzip.BestSpeed, stdgzip.Header{}),
		"3 MiB level 9":         gz(t, big, stdgzip.BestCompression, stdgzip.Header{}),
		"stored blocks":         gz(t, big[:1<<20], stdgzip.NoCompression, stdgzip.Header{}),
		"incompressible":        gz(t, random, stdgzip.DefaultCompression, stdgzip.Header{}),
		"name, comment, extra":  gz(t, big[:9000], 6, stdgzip.Header{Name: "layer.tar", Comment: "c", Extra: []byte("xx12")}),
		"three members":         append(append(gz(t, big[:70000], 1, stdgzip.Header{}), gz(t, nil, 1, stdgzip.Header{})...), gz(t, big[70000:900000], 6, stdgzip.Header{})...),
		"member per 1 MiB, 3x ": bytes.Join([][]byte{gz(t, big[:1<<20], 6, stdgzip.Header{}), gz(t, big[1<<20:2<<20], 6, stdgzip.Header{}), gz(t, big[2<<20:], 6, stdgzip.Header{})}, nil),
	}
	for name, src := range cases {
		t.Run(name, func(t *testing.T) {
			want, err := builtin(src)
			if err != nil {
				t.Fatalf("builtin: %v", err)
			}
			// Whole reads, and a source that gives one byte at a time
			// (ISA-L then stops inside headers, blocks and trailers).
			for _, r := range []io.Reader{bytes.NewReader(src), iotest.OneByteReader(bytes.NewReader(src))} {
				got, err := isal(r)
				if err != nil {
					t.Fatalf("isa-l: %v", err)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("isa-l gave %d bytes, builtin %d; they differ", len(got), len(want))
				}
			}
		})
	}
}

// TestISALLeavesHashingFast: ISA-L's AVX code left the upper halves of the
// vector registers dirty, and on some Intel CPUs every SHA-NI instruction
// after it on that thread paid for it: Go's sha256 fell from 948 to 6 MB/s
// after one call into isal_inflate (#33), and so did a pull's digests. On
// one locked thread, hashing right after an inflate call must stay within
// 4 times its speed before one; best of five of each, in one run, so the
// machine's load cannot decide (the fault is 100 times). CPUs that never
// pay for dirty registers (this test's machine, an AMD EPYC, is one) pass
// either way; the test guards those that do.
func TestISALLeavesHashingFast(t *testing.T) {
	requireISAL(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	data := text(8<<20, 9)
	src := gz(t, text(1<<20, 10), 6, stdgzip.Header{})
	hash := func() time.Duration {
		start := time.Now()
		sha256.Sum256(data)
		return time.Since(start)
	}
	before, after := forever, forever
	for range 5 {
		before = min(before, hash())
		r := newISALReader(bytes.NewReader(src))
		// One byte asked: one call into isal_inflate (it fills the
		// reader's buffer) and a copy too short for Go's AVX memmove,
		// whose vzeroupper would hide the fault.
		if _, err := r.Read(make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		after = min(after, hash())
		r.Close()
	}
	t.Logf("sha256 of 8 MiB: %s before an inflate call, %s right after one", before, after)
	if after > 4*before {
		t.Fatalf("hashing after an inflate call took %s, %.0f times the %s before: ISA-L left the vector state dirty",
			after, float64(after)/float64(before), before)
	}
}

// TestChooseAuto: where ISA-L loads, auto measures both decoders on this CPU
// and says so; a mode that is not one of Modes is refused.
func TestChooseAuto(t *testing.T) {
	requireISAL(t)
	d, err := Choose(Auto)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(d.Why, "measured on this CPU") || !strings.Contains(d.Why, "with ISA-L") {
		t.Fatalf("auto chose %s because %q; want the measurement", d.Name(), d.Why)
	}
	if again, _ := Choose(Auto); again != d {
		t.Fatalf("a second Choose(auto) gave %+v, the first %+v: it must measure once", again, d)
	}
	if _, err := Choose("igzip"); err == nil || !strings.Contains(err.Error(), `"igzip"`) {
		t.Fatalf("Choose(igzip) = %v; want an error naming the value", err)
	}
	for _, m := range []string{ISAL, Builtin} {
		if d, err := Choose(m); err != nil || d.Name() != m || d.Why != "configured" {
			t.Fatalf("Choose(%s) = %s (%q), %v", m, d.Name(), d.Why, err)
		}
	}
}

// TestRaceSample: the measurement's sample is a good gzip stream of
// sampleSize bytes that compresses as a layer of files does, and a decoder
// that fails on its stream takes forever, so it never wins.
func TestRaceSample(t *testing.T) {
	src := sample()
	got, err := builtin(src)
	if err != nil || len(got) != sampleSize {
		t.Fatalf("the sample inflates to %d bytes (%v), want %d", len(got), err, sampleSize)
	}
	if ratio := float64(len(src)) / sampleSize; ratio < 0.1 || ratio > 0.6 {
		t.Fatalf("the sample compresses to %.2f of its size; a layer of files is 0.25 to 0.5", ratio)
	}
	if d := timeInflateAndHash(Decoder{}, src[:len(src)/2]); d != forever {
		t.Fatalf("a cut sample took %s; want forever (a failing decoder never wins)", d)
	}
}

func TestISALSmallReads(t *testing.T) {
	requireISAL(t)
	data := text(200000, 3)
	r := newISALReader(bytes.NewReader(gz(t, data, 6, stdgzip.Header{})))
	defer r.Close()
	got, err := io.ReadAll(iotest.OneByteReader(r))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("one byte at a time: %d bytes, %v; want %d bytes", len(got), err, len(data))
	}
}

// TestISALFailsAsBuiltin: a broken stream fails with the error Go's gzip
// reader gives, after no more content than it.
func TestISALFailsAsBuiltin(t *testing.T) {
	requireISAL(t)
	good := gz(t, text(300000, 4), 6, stdgzip.Header{})
	n := len(good)
	flip := func(at int) []byte {
		b := bytes.Clone(good)
		b[at] ^= 0x55
		return b
	}
	cases := []struct {
		name string
		src  []byte
		want error // nil: any error
	}{
		{"trailing garbage", append(bytes.Clone(good), "not a gzip member"...), gzip.ErrHeader},
		{"trailing garbage shorter than a header", append(bytes.Clone(good), "not gzip"...), io.ErrUnexpectedEOF},
		{"trailing zeros", append(bytes.Clone(good), make([]byte, 512)...), gzip.ErrHeader},
		{"cut in the header", good[:6], io.ErrUnexpectedEOF},
		{"cut in the data", good[:n/2], io.ErrUnexpectedEOF},
		{"cut in the trailer", good[:n-3], io.ErrUnexpectedEOF},
		{"cut in a second member's header", append(bytes.Clone(good), good[:5]...), io.ErrUnexpectedEOF},
		{"wrong crc", flip(n - 6), gzip.ErrChecksum},
		{"wrong length", flip(n - 2), gzip.ErrChecksum},
		{"not deflate", flip(2), gzip.ErrHeader},
		{"reserved flag bit", func() []byte { b := bytes.Clone(good); b[3] |= 0x80; return b }(), gzip.ErrHeader},
		{"reserved flag bit in a second member", append(bytes.Clone(good), append([]byte{0x1f, 0x8b, 8, 0x20}, good[4:]...)...), gzip.ErrHeader},
		{"corrupt data", flip(40), nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want, wantErr := builtin(c.src)
			got, err := isal(bytes.NewReader(c.src))
			if err == nil || wantErr == nil {
				t.Fatalf("isa-l: %v, builtin: %v; want both to fail", err, wantErr)
			}
			if c.want != nil && (!errors.Is(err, c.want) || !errors.Is(wantErr, c.want)) {
				t.Fatalf("isa-l: %v, builtin: %v; want %v from both", err, wantErr, c.want)
			}
			if !bytes.HasPrefix(want, got) && !bytes.HasPrefix(got, want) {
				t.Fatalf("before failing, isa-l gave content the builtin decoder did not")
			}
		})
	}
}

func TestISALSourceError(t *testing.T) {
	requireISAL(t)
	src := gz(t, text(500000, 5), 6, stdgzip.Header{})
	cut := errors.New("connection reset")
	r := io.MultiReader(bytes.NewReader(src[:len(src)/2]), iotest.ErrReader(cut))
	if _, err := isal(r); !errors.Is(err, cut) {
		t.Fatalf("got %v, want the source's error", err)
	}
}

func TestISALReadAfterClose(t *testing.T) {
	requireISAL(t)
	r := newISALReader(bytes.NewReader(gz(t, text(1000, 6), 6, stdgzip.Header{})))
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if n, err := r.Read(make([]byte, 10)); n != 0 || err == nil {
		t.Fatalf("read after close: %d, %v; want an error", n, err)
	}
}

// FuzzISAL: on any input, ISA-L accepts only what the builtin decoder
// accepts, with the same content, and what it gives before failing agrees
// with the builtin decoder's (either may have given more before its
// error). It may refuse more: a stream that ends inside
// a later member's name or comment, which Go's reader takes for the end of
// the stream, is cut for ISA-L.
func FuzzISAL(f *testing.F) {
	requireISAL(f)
	data := text(5000, 7)
	for _, level := range []int{0, 1, 6, 9} {
		f.Add(gz(f, data, level, stdgzip.Header{}))
	}
	f.Add(gz(f, data[:100], 6, stdgzip.Header{Name: "n", Comment: "c", Extra: []byte{1, 2, 3, 4}}))
	f.Add(append(gz(f, data[:10], 1, stdgzip.Header{}), gz(f, data[10:30], 1, stdgzip.Header{})...))
	f.Fuzz(func(t *testing.T, src []byte) {
		if len(src) < 2 || src[0] != 0x1f || src[1] != 0x8b {
			return // berth only hands gzip streams to the decoder
		}
		want, wantErr := builtin(src)
		got, err := isal(bytes.NewReader(src))
		switch {
		case err == nil && wantErr != nil:
			t.Fatalf("isa-l accepted a stream the builtin decoder refuses (%v)", wantErr)
		case err == nil && !bytes.Equal(got, want):
			t.Fatalf("isa-l gave %d bytes, builtin %d; they differ", len(got), len(want))
		case err != nil && !bytes.HasPrefix(want, got) && !bytes.HasPrefix(got, want):
			t.Fatalf("before failing (%v), isa-l gave content the builtin decoder does not", err)
		}
	})
}

// BenchmarkInflate compares the decoders' CPU on text, per MiB inflated.
func BenchmarkInflate(b *testing.B) {
	requireISAL(b)
	data := text(16<<20, 8)
	if f := os.Getenv("GUNZIP_BENCH_FILE"); f != "" {
		data, _ = os.ReadFile(f)
	}
	src := gz(b, data, stdgzip.BestSpeed, stdgzip.Header{})
	for _, d := range []struct {
		name string
		open func() (io.ReadCloser, error)
	}{
		{"builtin", func() (io.ReadCloser, error) { return gzip.NewReader(bytes.NewReader(src)) }},
		{"isa-l", func() (io.ReadCloser, error) { return newISALReader(bytes.NewReader(src)), nil }},
	} {
		b.Run(d.name, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				r, err := d.open()
				if err == nil {
					_, err = io.Copy(io.Discard, r)
					r.Close()
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestChooseWithoutISAL: where libisal.so.2 cannot be loaded, isa-l is an
// error naming the cause (berthd does not start), auto falls back to the
// builtin decoder and says why.
func TestChooseWithoutISAL(t *testing.T) {
	load := loadISAL
	t.Cleanup(func() { loadISAL = load })
	loadISAL = func() error { return errors.New("libisal.so.2: cannot open shared object file") }
	if _, err := Choose(ISAL); err == nil || !strings.Contains(err.Error(), "cannot open shared object file") {
		t.Fatalf("Choose(isa-l) without the library = %v; want an error naming the cause", err)
	}
	d, err := Choose(Auto)
	if err != nil || d.Name() != Builtin || !strings.Contains(d.Why, "cannot open shared object file") {
		t.Fatalf("Choose(auto) without the library = %s (%q), %v; want builtin with the cause", d.Name(), d.Why, err)
	}
}
