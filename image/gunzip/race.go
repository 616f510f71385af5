package gunzip

import (
	"bytes"
	"crypto/sha256"
	"io"
	"math/rand/v2"
	"runtime"
	"strings"
	"time"

	"github.com/klauspost/compress/gzip"
)

const (
	// sampleSize is what the measurement inflates: a few milliseconds of
	// work for either decoder, enough to dwarf a call's fixed cost.
	sampleSize = 1 << 20
	// raceRounds: each decoder's best of this many, taken in turns, so
	// that a moment of load on the node does not decide.
	raceRounds = 3
)

// race times both decoders on a sample shaped like a layer's files, used as
// a pull uses them: the compressed bytes hashed (the blob's digest), inflated,
// and the inflated bytes hashed (the diff ID), on one thread as one unpack
// does, so that what a decoder leaves behind for the code after it on that
// thread counts (#33: ISA-L left SHA-NI 100 times slower on some CPUs). A
// decoder that fails on the sample takes forever.
func race() (isal, builtin time.Duration) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	src := sample()
	isal, builtin = forever, forever
	for range raceRounds {
		isal = min(isal, timeInflateAndHash(Decoder{isal: true}, src))
		builtin = min(builtin, timeInflateAndHash(Decoder{}, src))
	}
	return isal, builtin
}

const forever = time.Duration(1<<63 - 1)

func timeInflateAndHash(d Decoder, src []byte) time.Duration {
	start := time.Now()
	blob, diff := sha256.New(), sha256.New()
	r, err := d.NewReader(io.TeeReader(bytes.NewReader(src), blob))
	if err != nil {
		return forever
	}
	defer r.Close()
	// Plain reads, as the unpacker's: klauspost's reader would otherwise
	// write to the hash from its own buffers.
	if _, err := io.CopyBuffer(diff, struct{ io.Reader }{r}, make([]byte, 32<<10)); err != nil {
		return forever
	}
	return time.Since(start)
}

// sample is sampleSize bytes like a layer's files (words, paths, numbers,
// runs of one byte, some binary), gzipped at the fastest level, which costs
// the least of berthd's start; the same every time.
func sample() []byte {
	rng := rand.New(rand.NewPCG(33, 1))
	words := strings.Fields("usr lib share locale doc the of and to ELF x86_64 0x7f45 config main init error return struct const static int")
	var raw bytes.Buffer
	for raw.Len() < sampleSize {
		switch rng.IntN(40) {
		case 0:
			raw.Write(bytes.Repeat([]byte{byte(rng.IntN(256))}, rng.IntN(200)))
		case 1:
			for range rng.IntN(64) {
				raw.WriteByte(byte(rng.IntN(256)))
			}
		}
		raw.WriteString(words[rng.IntN(len(words))])
		raw.WriteByte(" \n\t/"[rng.IntN(4)])
	}
	var gz bytes.Buffer
	w, _ := gzip.NewWriterLevel(&gz, gzip.BestSpeed) // a valid level
	// Writes to a bytes.Buffer do not fail.
	_, _ = w.Write(raw.Bytes()[:sampleSize])
	_ = w.Close()
	return gz.Bytes()
}
