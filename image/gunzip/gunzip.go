// Package gunzip decompresses gzip layers with Intel's ISA-L (libisal.so.2,
// loaded at run time) where the node has it, and with klauspost's pure-Go
// decoder where it has not. Inflating is half of berthd's CPU in a pull of
// compressed files; ISA-L's inflate takes about 0.4 of klauspost's CPU for
// the same stream, in process. Both read concatenated gzip members as one
// stream and fail with the same errors on a bad header, checksum or length
// and on a stream that ends inside a member; ISA-L accepts nothing the
// builtin decoder refuses (FuzzISAL), and also refuses a stream that ends
// inside a later member's name or comment, which Go's reader takes for its
// end.
package gunzip

import (
	"io"
	"sync"

	"github.com/klauspost/compress/gzip"
)

// NewReader returns a reader of the decompressed content of the gzip stream
// r. Close releases its decoder's memory (ISA-L's is not Go's); it does not
// close r.
func NewReader(r io.Reader) (io.ReadCloser, error) {
	if loadISAL() != nil {
		return gzip.NewReader(r)
	}
	return newISALReader(r), nil
}

// Decoder names the decoder NewReader uses on this node and, for the
// builtin one, why ISA-L is not used: berthd logs it at start.
func Decoder() (name string, why error) {
	if err := loadISAL(); err != nil {
		return "builtin", err
	}
	return "isa-l", nil
}

// loadISAL loads libisal.so.2 once; nil means NewReader uses it.
var loadISAL = sync.OnceValue(openISAL)
