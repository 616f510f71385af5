package registry

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Span is the bytes [Start, End) of a blob.
type Span struct{ Start, End int64 }

// Len is the number of bytes in the span.
func (s Span) Len() int64 { return s.End - s.Start }

// RangeHeader is the HTTP Range header asking for s. It names both ends:
// every registry understands the closed form, and the blob's size is known
// from its descriptor.
func (s Span) RangeHeader() string { return fmt.Sprintf("bytes=%d-%d", s.Start, s.End-1) }

// ParseContentRange reads a 206 answer's "bytes FIRST-LAST/TOTAL" (TOTAL
// may be "*") into the span it covers and the total, -1 when unknown.
func ParseContentRange(h string) (Span, int64, error) {
	bad := fmt.Errorf("Content-Range %q: want \"bytes FIRST-LAST/TOTAL\"", h)
	rest, ok := strings.CutPrefix(h, "bytes ")
	if !ok {
		return Span{}, 0, bad
	}
	rng, tot, ok := strings.Cut(rest, "/")
	if !ok {
		return Span{}, 0, bad
	}
	first, last, ok := strings.Cut(rng, "-")
	if !ok {
		return Span{}, 0, bad
	}
	a, err1 := strconv.ParseInt(first, 10, 64)
	b, err2 := strconv.ParseInt(last, 10, 64)
	if err := errors.Join(err1, err2); err != nil || a < 0 || b < a {
		return Span{}, 0, bad
	}
	total := int64(-1)
	if tot != "*" {
		t, err := strconv.ParseInt(tot, 10, 64)
		if err != nil || t <= b {
			return Span{}, 0, bad
		}
		total = t
	}
	return Span{Start: a, End: b + 1}, total, nil
}

// PlanParts splits what is left of a blob, from its first missing byte to
// its end, into at most n parts of at least minPart bytes each (the last
// may be shorter when what is left is), in order. Nothing left: no parts.
func PlanParts(left Span, n int, minPart int64) []Span {
	if left.Len() <= 0 {
		return nil
	}
	n = int(max(1, min(int64(n), left.Len()/max(minPart, 1))))
	each := (left.Len() + int64(n) - 1) / int64(n)
	var parts []Span
	for at := left.Start; at < left.End; at += each {
		parts = append(parts, Span{Start: at, End: min(at+each, left.End)})
	}
	return parts
}
