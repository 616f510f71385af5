//go:build cgo && !noisal

package gunzip

/*
#include <dlfcn.h>
#include <stdlib.h>
#include <isa-l/igzip_lib.h>

// The library is opened by its soname, as the dynamic linker would have:
// a node without it keeps the builtin decoder instead of failing to start.
static int (*berth_isal_inflate)(struct inflate_state *);
static void (*berth_isal_inflate_init)(struct inflate_state *);
static void (*berth_isal_inflate_reset)(struct inflate_state *);

// ISA-L's AVX2 and AVX-512 code returns with the upper halves of the vector
// registers dirty. On some Intel CPUs every legacy-SSE instruction that runs
// on the thread afterwards pays for that until something clears them:
// SHA-NI is such code, and Go's sha256 of the layer (its diff ID, its blob
// digest) ran at 16 MB/s instead of 900 (#33). Every call into ISA-L is
// therefore followed by vzeroupper, which only CPUs with AVX (as the OS
// enabled it) have; it costs a cycle or so where nothing was dirty.
static int berth_has_avx;

static inline void berth_clean_vector_state(void) {
	if (berth_has_avx)
		__asm__ volatile("vzeroupper" ::: "memory");
}

static const char *berth_isal_open(void) {
	__builtin_cpu_init();
	berth_has_avx = __builtin_cpu_supports("avx");
	void *h = dlopen("libisal.so.2", RTLD_NOW | RTLD_LOCAL);
	if (h == NULL)
		return dlerror();
	berth_isal_inflate = dlsym(h, "isal_inflate");
	berth_isal_inflate_init = dlsym(h, "isal_inflate_init");
	berth_isal_inflate_reset = dlsym(h, "isal_inflate_reset");
	if (!berth_isal_inflate || !berth_isal_inflate_init || !berth_isal_inflate_reset)
		return "libisal.so.2 lacks isal_inflate, isal_inflate_init or isal_inflate_reset";
	return NULL;
}

static struct inflate_state *berth_isal_new(void) {
	struct inflate_state *s = malloc(sizeof(*s));
	if (s == NULL)
		return NULL;
	berth_isal_inflate_init(s);
	berth_clean_vector_state();
	s->crc_flag = ISAL_GZIP;
	return s;
}

// berth_isal_member readies s for the next gzip member of a stream.
static void berth_isal_member(struct inflate_state *s) {
	berth_isal_inflate_reset(s);
	berth_clean_vector_state();
	s->crc_flag = ISAL_GZIP;
}

// berth_isal_step inflates from in to out; the buffers are Go's, so the
// state keeps no pointer to them once it returns.
static int berth_isal_step(struct inflate_state *s, uint8_t *in, uint32_t in_len,
			   uint8_t *out, uint32_t out_len, uint32_t *consumed,
			   uint32_t *produced, int *finished) {
	s->next_in = in;
	s->avail_in = in_len;
	s->next_out = out;
	s->avail_out = out_len;
	int ret = berth_isal_inflate(s);
	berth_clean_vector_state();
	*consumed = in_len - s->avail_in;
	*produced = out_len - s->avail_out;
	*finished = s->block_state == ISAL_BLOCK_FINISH;
	s->next_in = NULL;
	s->next_out = NULL;
	return ret;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"unsafe"

	"github.com/klauspost/compress/gzip"
)

func openISAL() error {
	if msg := C.berth_isal_open(); msg != nil {
		return errors.New(C.GoString(msg))
	}
	return nil
}

const (
	// inSize and outSize are the reader's buffers: one call into ISA-L
	// inflates up to outSize bytes, so the tar reader's small reads (a
	// 512-byte header) cost a copy, not a call.
	inSize  = 128 << 10
	outSize = 256 << 10
)

// isalReader inflates a gzip stream of one or more members with ISA-L.
type isalReader struct {
	src      io.Reader
	state    *C.struct_inflate_state // C memory, freed by Close
	cleanup  runtime.Cleanup         // frees it if Close is never called
	in       []byte                  // compressed bytes read from src
	inPos    int                     // in[inPos:inEnd] not yet given to ISA-L
	inEnd    int
	srcErr   error // what src returned last, io.EOF at its end
	inMember bool  // ISA-L has been given bytes of the current member
	buf      []byte
	out      []byte // buf's inflated bytes not yet read
	err      error  // sticky: io.EOF at the end of the last member
}

func newISALReader(src io.Reader) *isalReader {
	r := &isalReader{src: src, in: make([]byte, inSize), buf: make([]byte, outSize)}
	r.state = C.berth_isal_new()
	if r.state == nil {
		r.err = errors.New("gunzip: no memory for ISA-L's inflate state")
		return r
	}
	r.cleanup = runtime.AddCleanup(r, func(s *C.struct_inflate_state) { C.free(unsafe.Pointer(s)) }, r.state)
	return r
}

func (r *isalReader) Read(p []byte) (int, error) {
	for len(r.out) == 0 && r.err == nil {
		r.err = r.fill()
	}
	if len(r.out) == 0 {
		return 0, r.err
	}
	n := copy(p, r.out)
	r.out = r.out[n:]
	return n, nil
}

// fill inflates into buf what the input gives, reading src when ISA-L has
// used all of it. It returns io.EOF once the last member ended where src
// did.
func (r *isalReader) fill() error {
	if r.state == nil {
		return errors.New("gunzip: read after close")
	}
	if !r.inMember {
		if err := r.memberStart(); err != nil {
			return err
		}
	}
	if r.inPos == r.inEnd {
		if r.srcErr != nil {
			return r.endOfInput()
		}
		n, err := r.src.Read(r.in)
		r.inPos, r.inEnd, r.srcErr = 0, n, err
		if n == 0 {
			return nil // the next fill acts on err
		}
	}
	var consumed, produced C.uint32_t
	var finished C.int
	in := r.in[r.inPos:r.inEnd]
	ret := C.berth_isal_step(r.state, (*C.uint8_t)(unsafe.Pointer(&in[0])), C.uint32_t(len(in)),
		(*C.uint8_t)(unsafe.Pointer(&r.buf[0])), C.uint32_t(len(r.buf)), &consumed, &produced, &finished)
	r.inMember = true
	r.inPos += int(consumed)
	r.out = r.buf[:produced]
	if ret < 0 {
		return isalError(ret)
	}
	if finished != 0 {
		// As Go's gzip reader, the next bytes are another member's header,
		// or nothing.
		C.berth_isal_member(r.state)
		r.inMember = false
	}
	return nil
}

// memberStart reads the fixed part of the next member's header and refuses
// what Go's gzip reader refuses and ISA-L lets through: reserved flag bits
// set (RFC 1952, 2.3.1). At the end of the stream it returns io.EOF; as
// Go's reader, a stream that ends inside those ten bytes was cut.
func (r *isalReader) memberStart() error {
	const fixedHeader = 10
	for r.inEnd-r.inPos < fixedHeader && r.srcErr == nil {
		r.inEnd = copy(r.in, r.in[r.inPos:r.inEnd])
		r.inPos = 0
		n, err := r.src.Read(r.in[r.inEnd:])
		r.inEnd += n
		r.srcErr = err
	}
	switch avail := r.inEnd - r.inPos; {
	case avail == 0:
		return r.endOfInput()
	case avail < fixedHeader && r.srcErr == io.EOF:
		return io.ErrUnexpectedEOF
	case avail < fixedHeader:
		return r.srcErr
	case r.in[r.inPos+3]&0xe0 != 0:
		return gzip.ErrHeader
	}
	return nil
}

// endOfInput is what src's end (or error) means where the stream stands.
func (r *isalReader) endOfInput() error {
	switch {
	case r.srcErr != io.EOF:
		return r.srcErr
	case r.inMember:
		return io.ErrUnexpectedEOF
	default:
		return io.EOF
	}
}

// isalError turns an isal_inflate failure into the error Go's gzip
// reader gives for the same fault.
func isalError(ret C.int) error {
	switch ret {
	case C.ISAL_INVALID_WRAPPER, C.ISAL_UNSUPPORTED_METHOD:
		return gzip.ErrHeader
	case C.ISAL_INCORRECT_CHECKSUM:
		return gzip.ErrChecksum
	case C.ISAL_INVALID_BLOCK, C.ISAL_INVALID_SYMBOL, C.ISAL_INVALID_LOOKBACK:
		return fmt.Errorf("gzip: corrupt deflate data (isa-l error %d)", int(ret))
	default:
		return fmt.Errorf("gzip: isa-l inflate failed with %d", int(ret))
	}
}

// Close frees the decoder's state; the source stays open.
func (r *isalReader) Close() error {
	if r.state != nil {
		r.cleanup.Stop()
		C.free(unsafe.Pointer(r.state))
		r.state = nil
	}
	return nil
}
