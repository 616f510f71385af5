// Package integration holds berth's privileged integration tests: each starts a
// real berthd on temp folders, serves images from a registry on 127.0.0.1, and
// drives berthd through the CRI gRPC API. They run only with BERTH_INTEGRATION=1
// as root (make test sets it).
package integration

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/test/harness"
)

func TestMain(m *testing.M) { harness.Main(m, "BERTH_INTEGRATION") }

// callTimeout bounds every CRI call of the tests.
const callTimeout = 2 * time.Minute

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), callTimeout)
	t.Cleanup(cancel)
	return c
}

// start is the usual opening of a test: the guard, a registry (with opts) and
// a berthd that talks plain HTTP to it, with extraTOML appended to its config.
func start(t *testing.T, extraTOML string, opts ...harness.RegistryOption) (*harness.Registry, *harness.Daemon) {
	t.Helper()
	harness.RequireIntegration(t)
	reg := harness.NewRegistry(t, opts...)
	d := harness.StartDaemon(t, harness.Options{ConfigTOML: harness.PlainHTTP(reg.Host()) + extraTOML})
	return reg, d
}

func pull(t *testing.T, d *harness.Daemon, ref string, auth *runtimeapi.AuthConfig) (string, error) {
	t.Helper()
	return pullWithin(t, d, ref, auth, callTimeout)
}

// pullWithin is pull with the client giving up after timeout.
func pullWithin(t *testing.T, d *harness.Daemon, ref string, auth *runtimeapi.AuthConfig, timeout time.Duration) (string, error) {
	t.Helper()
	c, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	resp, err := d.Images.PullImage(c, &runtimeapi.PullImageRequest{
		Image: &runtimeapi.ImageSpec{Image: ref}, Auth: auth})
	return resp.GetImageRef(), err
}

// mustPull pulls ref and checks that image_ref is wantID (the config digest).
func mustPull(t *testing.T, d *harness.Daemon, ref, wantID string) {
	t.Helper()
	id, err := pull(t, d, ref, nil)
	if err != nil {
		t.Fatalf("PullImage(%s): %v", ref, err)
	}
	if id != wantID {
		t.Fatalf("PullImage(%s) image_ref = %s, want the config digest %s", ref, id, wantID)
	}
}

// imageStatus returns the CRI image for ref, nil when berthd has none.
func imageStatus(t *testing.T, d *harness.Daemon, ref string) *runtimeapi.Image {
	t.Helper()
	resp, err := d.Images.ImageStatus(ctx(t), &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
	if err != nil {
		t.Fatalf("ImageStatus(%s): %v", ref, err)
	}
	return resp.GetImage()
}

func mustStatus(t *testing.T, d *harness.Daemon, ref string) *runtimeapi.Image {
	t.Helper()
	img := imageStatus(t, d, ref)
	if img == nil {
		t.Fatalf("ImageStatus(%s): no image", ref)
	}
	return img
}

func assertAbsent(t *testing.T, d *harness.Daemon, refs ...string) {
	t.Helper()
	for _, ref := range refs {
		if img := imageStatus(t, d, ref); img != nil {
			t.Errorf("ImageStatus(%s) = %s %v, want no image", ref, img.Id, img.RepoTags)
		}
	}
}

func listImages(t *testing.T, d *harness.Daemon, filter string) []*runtimeapi.Image {
	t.Helper()
	req := &runtimeapi.ListImagesRequest{}
	if filter != "" {
		req.Filter = &runtimeapi.ImageFilter{Image: &runtimeapi.ImageSpec{Image: filter}}
	}
	resp, err := d.Images.ListImages(ctx(t), req)
	if err != nil {
		t.Fatalf("ListImages(%q): %v", filter, err)
	}
	return resp.Images
}

func removeImage(t *testing.T, d *harness.Daemon, ref string) {
	t.Helper()
	if _, err := d.Images.RemoveImage(ctx(t), &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}}); err != nil {
		t.Fatalf("RemoveImage(%s): %v", ref, err)
	}
}

// assertNames checks RepoTags and RepoDigests exactly (order aside).
func assertNames(t *testing.T, img *runtimeapi.Image, tags, digests []string) {
	t.Helper()
	if !sameSet(img.RepoTags, tags) {
		t.Errorf("image %s RepoTags = %q, want %q", img.Id, img.RepoTags, tags)
	}
	if !sameSet(img.RepoDigests, digests) {
		t.Errorf("image %s RepoDigests = %q, want %q", img.Id, img.RepoDigests, digests)
	}
}

// sameSet compares two lists as sorted lists, so duplicates count.
func sameSet(got, want []string) bool {
	g, w := slices.Clone(got), slices.Clone(want)
	slices.Sort(g)
	slices.Sort(w)
	return slices.Equal(g, w)
}

// assertNoMention fails when any tag or digest of img names one of hosts (a mirror).
func assertNoMention(t *testing.T, img *runtimeapi.Image, hosts ...string) {
	t.Helper()
	for _, n := range append(slices.Clone(img.RepoTags), img.RepoDigests...) {
		for _, h := range hosts {
			if strings.Contains(n, h) {
				t.Errorf("image name %q mentions the mirror %s", n, h)
			}
		}
	}
}

// assertCode checks a gRPC error's code (one of want) and that its message
// contains every string of mention, case-insensitively.
func assertCode(t *testing.T, err error, want []codes.Code, mention ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %v", want)
	}
	st := status.Convert(err)
	if !slices.Contains(want, st.Code()) {
		t.Errorf("code %s (%q), want one of %v", st.Code(), st.Message(), want)
	}
	for _, m := range mention {
		if !strings.Contains(strings.ToLower(st.Message()), strings.ToLower(m)) {
			t.Errorf("message %q does not mention %q", st.Message(), m)
		}
	}
}

func one(c codes.Code) []codes.Code { return []codes.Code{c} }
