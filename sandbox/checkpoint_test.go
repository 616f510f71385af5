package sandbox

import (
	"bytes"
	"strings"
	"testing"
)

// copySized writes exactly the size a tar header said of a file the
// container changed after the header was taken: a grown file cut, a shrunk
// one padded with zeros; io.Copy would fail the archive with "write too
// long" or a short entry.
func TestCopySized(t *testing.T) {
	for _, c := range []struct {
		src  string
		size int64
		want string
	}{
		{"100\n", 3, "100"},
		{"9\n", 4, "9\n\x00\x00"},
		{"", 2, "\x00\x00"},
		{"42\n", 3, "42\n"},
	} {
		var out bytes.Buffer
		if err := copySized(&out, strings.NewReader(c.src), c.size); err != nil || out.String() != c.want {
			t.Errorf("copySized(%q, %d) = %q, %v; want %q", c.src, c.size, out.String(), err, c.want)
		}
	}
}
