// Package gunzip decompresses gzip layers with Intel's ISA-L (libisal.so.2,
// loaded at run time) where the node has it and it is the faster on the
// node's CPU, and with klauspost's pure-Go decoder otherwise. Inflating is
// half of berthd's CPU in a pull of compressed files; ISA-L's inflate takes
// about 0.4 of klauspost's CPU for the same stream, in process, on the CPUs
// measured so far. Both read concatenated gzip members as one stream and
// fail with the same errors on a bad header, checksum or length and on a
// stream that ends inside a member; ISA-L accepts nothing the builtin
// decoder refuses (FuzzISAL), and also refuses a stream that ends inside a
// later member's name or comment, which Go's reader takes for its end.
package gunzip

import (
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/klauspost/compress/gzip"
)

// The values of [image] gzip_decoder.
const (
	// Auto uses ISA-L where it loads and, inflating and hashing a sample
	// as a pull does, beats the builtin decoder on this CPU.
	Auto = "auto"
	// ISAL uses ISA-L, and fails where it cannot be loaded.
	ISAL = "isa-l"
	// Builtin uses the pure-Go decoder.
	Builtin = "builtin"
)

// Modes lists the values Choose takes.
var Modes = []string{Auto, ISAL, Builtin}

// Decoder inflates gzip streams with the implementation chosen for this
// node. The zero value is the builtin decoder.
type Decoder struct {
	isal bool
	// Why says how the decoder was chosen: as configured, measured (with
	// the figures), or why ISA-L cannot be used.
	Why string
}

// Name is "isa-l" or "builtin".
func (d Decoder) Name() string {
	if d.isal {
		return ISAL
	}
	return Builtin
}

// NewReader returns a reader of the decompressed content of the gzip stream
// r. Close releases its decoder's memory (ISA-L's is not Go's); it does not
// close r.
func (d Decoder) NewReader(r io.Reader) (io.ReadCloser, error) {
	if d.isal {
		return newISALReader(r), nil
	}
	return gzip.NewReader(r)
}

// Choose returns the decoder for mode, one of Modes. Auto measures both
// decoders once per process (well under a second) the first time it is
// asked.
func Choose(mode string) (Decoder, error) {
	switch mode {
	case Builtin:
		return Decoder{Why: "configured"}, nil
	case ISAL:
		if err := loadISAL(); err != nil {
			return Decoder{}, fmt.Errorf("gzip_decoder is %q, but ISA-L cannot be loaded: %w (install libisal2, or set auto)", ISAL, err)
		}
		return Decoder{isal: true, Why: "configured"}, nil
	case Auto, "":
		if err := loadISAL(); err != nil {
			return Decoder{Why: "ISA-L cannot be loaded: " + err.Error()}, nil
		}
		return measured(), nil
	}
	return Decoder{}, fmt.Errorf("gzip_decoder %q is none of %v", mode, Modes)
}

// loadISAL loads libisal.so.2 once; nil means ISA-L can be used.
var loadISAL = sync.OnceValue(openISAL)

// measured is Auto's choice on this CPU, made once.
var measured = sync.OnceValue(func() Decoder {
	isal, builtin := race()
	if isal == forever {
		return Decoder{Why: "ISA-L failed to inflate a good sample"}
	}
	return Decoder{isal: isal < builtin, Why: fmt.Sprintf(
		"measured on this CPU: inflating and hashing a %d KiB sample took %s with ISA-L, %s with the builtin decoder",
		sampleSize>>10, isal.Round(10*time.Microsecond), builtin.Round(10*time.Microsecond))}
})
