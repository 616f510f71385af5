package config

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
)

// Problem is one thing wrong with a config file; Line is 0 when it is not
// tied to a line (a default that a flag would override).
type Problem struct {
	Line int
	Msg  string
}

func (p Problem) String() string {
	if p.Line == 0 {
		return p.Msg
	}
	return fmt.Sprintf("line %d: %s", p.Line, p.Msg)
}

// Check reads the file at path as berthd does (the same decoder, defaults
// and checks as Load) and returns every problem in it, each with the line
// of the key it names. The error is for a file that cannot be read.
func Check(path string) ([]Problem, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	c, md, err := decode(b)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return []Problem{{Line: pe.Position.Line, Msg: pe.Message}}, nil
		}
		// A value of the wrong type: the decoder names its line in the text only.
		if m := typeErrLine.FindStringSubmatch(err.Error()); m != nil {
			n, _ := strconv.Atoi(m[1])
			return []Problem{{Line: n, Msg: m[2] + ": " + m[3]}}, nil
		}
		return []Problem{{Msg: err.Error()}}, nil
	}
	lines := keyLines(b)
	var out []Problem
	for _, k := range md.Undecoded() {
		out = append(out, Problem{Line: lines.find(k), Msg: fmt.Sprintf("unknown key \"%s\"", k.String())})
	}
	err = c.validate()
	var joined interface{ Unwrap() []error }
	errs := []error{err}
	if errors.As(err, &joined) {
		errs = joined.Unwrap()
	}
	for _, e := range errs {
		if e == nil {
			continue
		}
		p := Problem{Msg: e.Error()}
		var ke *KeyError
		if errors.As(e, &ke) {
			p.Line = lines.find(splitKey(ke.Key))
		}
		out = append(out, p)
	}
	return out, nil
}

var typeErrLine = regexp.MustCompile(`^toml: line (\d+) \(last key "([^"]*)"\): (.*)$`)

// lineIndex maps each key written in a file (table path and key, unquoted)
// to its line; a table's own line stands for the table.
type lineIndex []struct {
	key  []string
	line int
}

// find is the line of key, else of its closest table.
func (l lineIndex) find(key []string) int {
	for n := len(key); n > 0; n-- {
		for _, e := range l {
			if slices.Equal(e.key, key[:n]) {
				return e.line
			}
		}
	}
	return 0
}

// keyLines indexes a file the decoder accepted: table headers and
// "key = value" lines (values are not parsed; multi-line strings and
// arrays only ever continue a line that is indexed already).
func keyLines(b []byte) lineIndex {
	var idx lineIndex
	var table []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "[["), line == "", strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			end := strings.LastIndex(line, "]")
			if end < 0 {
				continue
			}
			table = splitKey(line[1:end])
			idx = append(idx, struct {
				key  []string
				line int
			}{table, n})
		default:
			k, _, ok := strings.Cut(line, "=")
			if !ok {
				continue
			}
			idx = append(idx, struct {
				key  []string
				line int
			}{append(slices.Clone(table), splitKey(k)...), n})
		}
	}
	return idx
}

// splitKey splits a dotted TOML key (registry."docker.io".mirrors[0]) into
// its unquoted parts, dropping an index.
func splitKey(k string) []string {
	var parts []string
	k = strings.TrimSpace(k)
	for k != "" {
		k = strings.TrimLeft(k, " \t.")
		if k == "" {
			break
		}
		var part string
		switch k[0] {
		case '"', '\'':
			end := strings.IndexByte(k[1:], k[0])
			if end < 0 {
				return append(parts, k)
			}
			part = k[1 : end+1]
			if k[0] == '"' {
				if u, err := strconv.Unquote(k[:end+2]); err == nil {
					part = u
				}
			}
			k = k[end+2:]
		default:
			end := strings.IndexAny(k, ".[ \t")
			if end < 0 {
				end = len(k)
			}
			part, k = k[:end], k[end:]
		}
		parts = append(parts, part)
		if i := strings.IndexByte(k, '['); i >= 0 && strings.TrimSpace(k[:i]) == "" {
			k = k[strings.IndexByte(k, ']')+1:] // an index: the key's own line
		}
	}
	return parts
}
