package shim

import (
	"slices"
	"testing"
)

func TestWithGODEBUG(t *testing.T) {
	for _, c := range []struct {
		name      string
		env, want []string
	}{
		{"unset", []string{"PATH=/bin"}, []string{"PATH=/bin", "GODEBUG=disablethp=1"}},
		{"empty", []string{"GODEBUG="}, []string{"GODEBUG=disablethp=1"}},
		{"operator's settings kept", []string{"GODEBUG=gctrace=1", "HOME=/"}, []string{"GODEBUG=gctrace=1,disablethp=1", "HOME=/"}},
		{"operator's own disablethp wins", []string{"GODEBUG=disablethp=0,gctrace=1"}, []string{"GODEBUG=disablethp=0,gctrace=1"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := slices.Clone(c.env)
			if got := withGODEBUG(c.env, "disablethp", "1"); !slices.Equal(got, c.want) {
				t.Errorf("withGODEBUG(%q) = %q, want %q", c.env, got, c.want)
			}
			if !slices.Equal(c.env, before) {
				t.Errorf("the caller's environment changed to %q", c.env)
			}
		})
	}
}
