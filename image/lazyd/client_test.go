package lazyd

import (
	"slices"
	"testing"
)

func TestServeConfigRoundTrip(t *testing.T) {
	want := ServeConfig{Dir: "/run/berth/lazyd", Fetches: 7, GzipDecoder: "builtin"}
	got, err := ParseServeConfig(want.Args())
	if err != nil || got != want {
		t.Fatalf("ParseServeConfig(%q) = %+v, %v; want %+v", want.Args(), got, err, want)
	}
	if _, err := ParseServeConfig([]string{"--fetches", "2"}); err == nil {
		t.Error("a command line without --dir was accepted")
	}
}

// The server dies at its own crash point, never at berthd's; the log is
// shared.
func TestServerEnv(t *testing.T) {
	got := serverEnv([]string{"PATH=/bin", "BERTH_CRASHPOINT=pull: layer stored", CrashPointEnv + "=lazy fetch: layer verified", "BERTH_CRASHPOINT_LOG=/tmp/points"})
	want := []string{"PATH=/bin", "BERTH_CRASHPOINT=lazy fetch: layer verified", "BERTH_CRASHPOINT_LOG=/tmp/points"}
	if !slices.Equal(got, want) {
		t.Fatalf("serverEnv = %q, want %q", got, want)
	}
}
