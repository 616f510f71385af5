package registry

import (
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
)

func TestParseContentRange(t *testing.T) {
	good := []struct {
		in    string
		span  Span
		total int64
	}{
		{"bytes 0-99/100", Span{0, 100}, 100},
		{"bytes 50-99/100", Span{50, 100}, 100},
		{"bytes 7-7/8", Span{7, 8}, 8},
		{"bytes 10-19/*", Span{10, 20}, -1},
	}
	for _, c := range good {
		span, total, err := ParseContentRange(c.in)
		if err != nil || span != c.span || total != c.total {
			t.Errorf("ParseContentRange(%q) = %v, %d, %v; want %v, %d", c.in, span, total, err, c.span, c.total)
		}
	}
	for _, in := range []string{"", "bytes", "bytes 0-99", "bytes */100", "items 0-9/10", "bytes 9-0/10",
		"bytes -1-5/10", "bytes 0-99/99", "bytes 0-x/100", "bytes 0-99/abc", "bytes=0-99/100"} {
		if span, total, err := ParseContentRange(in); err == nil {
			t.Errorf("ParseContentRange(%q) = %v, %d; want an error", in, span, total)
		}
	}
}

func TestRangeHeaderNamesBothEnds(t *testing.T) {
	if got := (Span{100, 200}).RangeHeader(); got != "bytes=100-199" {
		t.Errorf("RangeHeader = %q", got)
	}
}

func TestPlanParts(t *testing.T) {
	const mib = 1 << 20
	cases := []struct {
		name    string
		left    Span
		n       int
		minPart int64
		want    []Span
	}{
		{"nothing-left", Span{10, 10}, 4, mib, nil},
		{"even-split", Span{0, 64 * mib}, 4, 16 * mib,
			[]Span{{0, 16 * mib}, {16 * mib, 32 * mib}, {32 * mib, 48 * mib}, {48 * mib, 64 * mib}}},
		{"too-small-for-n-parts", Span{0, 40 * mib}, 4, 16 * mib, []Span{{0, 20 * mib}, {20 * mib, 40 * mib}}},
		{"smaller-than-a-part", Span{5, 1000}, 4, mib, []Span{{5, 1000}}},
		{"resumed-with-rest-rounded-up", Span{1, 11}, 3, 1, []Span{{1, 5}, {5, 9}, {9, 11}}},
		{"one-connection", Span{0, 100 * mib}, 1, mib, []Span{{0, 100 * mib}}},
	}
	for _, c := range cases {
		got := PlanParts(c.left, c.n, c.minPart)
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: PlanParts(%v, %d, %d) = %v, want %v", c.name, c.left, c.n, c.minPart, got, c.want)
		}
		// Whatever the split, the parts tile what is left, in order.
		at := c.left.Start
		for _, p := range got {
			if p.Start != at || p.Len() <= 0 {
				t.Errorf("%s: parts %v do not tile %v", c.name, got, c.left)
			}
			at = p.End
		}
		if len(got) > 0 && at != c.left.End {
			t.Errorf("%s: parts %v end at %d, not %d", c.name, got, at, c.left.End)
		}
	}
}

func TestCheckBlobResponse(t *testing.T) {
	const size = 100
	want := Span{40, 100}
	resp := func(status int, header ...string) *http.Response {
		r := &http.Response{StatusCode: status, Status: http.StatusText(status), Header: http.Header{},
			ContentLength: -1, Body: io.NopCloser(strings.NewReader(""))}
		for i := 0; i+1 < len(header); i += 2 {
			r.Header.Set(header[i], header[i+1])
		}
		return r
	}
	cases := []struct {
		name    string
		resp    *http.Response
		ranged  bool
		span    Span
		refused bool // ErrRangeRefused: discard what was kept and start over
		err     string
	}{
		{"range-answered", resp(206, "Content-Range", "bytes 40-99/100"), true, want, false, ""},
		{"range-answered-total-unknown", resp(206, "Content-Range", "bytes 40-99/*"), true, want, false, ""},
		{"whole-blob-for-a-range", resp(200), true, Span{0, size}, false, ""},
		{"whole-blob", resp(200), false, Span{0, size}, false, ""},
		{"416", resp(416), true, Span{}, true, ""},
		{"other-bytes", resp(206, "Content-Range", "bytes 0-59/100"), true, Span{}, true, ""},
		{"other-blob-size", resp(206, "Content-Range", "bytes 40-99/200"), true, Span{}, true, ""},
		{"bad-content-range", resp(206, "Content-Range", "40-99"), true, Span{}, true, ""},
		{"206-unasked", resp(206, "Content-Range", "bytes 40-99/100"), false, Span{}, false, "206"},
		{"5xx", resp(503), true, Span{}, false, "503"},
	}
	for _, c := range cases {
		body, err := checkBlobResponse(c.resp, size, want, c.ranged)
		switch {
		case c.refused:
			if !errors.Is(err, ErrRangeRefused) {
				t.Errorf("%s: err %v, want ErrRangeRefused", c.name, err)
			}
		case c.err != "":
			if err == nil || errors.Is(err, ErrRangeRefused) || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: err %v, want one mentioning %q", c.name, err, c.err)
			}
		case err != nil || body.Span != c.span || body.Ranged != (c.resp.StatusCode == 206):
			t.Errorf("%s: body %+v, err %v; want span %v", c.name, body, err, c.span)
		}
	}
	long := resp(200)
	long.ContentLength = size + 1
	if _, err := checkBlobResponse(long, size, want, true); err == nil || !strings.Contains(err.Error(), "Content-Length") {
		t.Errorf("a body longer than the blob: err %v, want a Content-Length error", err)
	}
}
