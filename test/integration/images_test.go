package integration

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/test/harness"
)

func TestImageStatusLookups(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	reg, d := start(t, "")
	// A second berthd config: short names resolve to docker.io through reg.
	d2 := harness.StartDaemon(t, harness.Options{ConfigTOML: harness.PlainHTTP(reg.Host()) + hubMirror(reg)})
	img := harness.BusyboxImage(t, harness.ImageSpec{Config: v1.Config{
		Env: []string{harness.DefaultPath, "BERTH_MARKER=status-test"}, Entrypoint: []string{"/bin/sh", "-c"},
		Cmd: []string{"sleep 1"}, WorkingDir: "/tmp", StopSignal: "SIGUSR1"}})
	p := reg.Push(t, "berth/status:a", img)
	reg.Push(t, "library/busybox:latest", img)
	mustPull(t, d, p.Name, p.ID)
	mustPull(t, d2, "busybox", p.ID)

	hub := "docker.io/library/busybox"
	cases := []struct {
		name  string
		d     *harness.Daemon
		ref   string
		found bool
	}{
		{"by-id", d, p.ID, true},
		{"by-tag", d, p.Name, true},
		{"by-digest", d, p.DigestRef(), true},
		{"short-name", d2, "busybox", true},
		{"short-name-with-tag", d2, "busybox:latest", true},
		{"library-repo", d2, "library/busybox", true},
		{"docker.io-full", d2, hub + ":latest", true},
		{"docker.io-digest", d2, hub + "@" + p.Digest, true},
		{"missing-tag", d, reg.Host() + "/berth/status:b", false},
		{"missing-repo", d, reg.Host() + "/berth/nothere:a", false},
		{"missing-id", d, "sha256:" + strings.Repeat("0", 64), false},
		{"missing-short-name", d2, "alpine", false},
		{"other-daemon's-image", d, "busybox", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := imageStatus(t, c.d, c.ref)
			switch {
			case c.found && got == nil:
				t.Fatalf("ImageStatus(%s): no image", c.ref)
			case !c.found && got != nil:
				t.Fatalf("ImageStatus(%s) = %s, want none (OK with no image)", c.ref, got.Id)
			case c.found && got.Id != p.ID:
				t.Errorf("ImageStatus(%s).Id = %s, want %s", c.ref, got.Id, p.ID)
			}
		})
	}

	t.Run("verbose-has-config", func(t *testing.T) {
		resp, err := d.Images.ImageStatus(ctx(t), &runtimeapi.ImageStatusRequest{
			Image: &runtimeapi.ImageSpec{Image: p.Name}, Verbose: true})
		if err != nil {
			t.Fatal(err)
		}
		var all strings.Builder
		for k, v := range resp.Info {
			fmt.Fprintf(&all, "%s=%s\n", k, v)
		}
		for _, want := range []string{"BERTH_MARKER=status-test", "SIGUSR1", "sleep 1"} {
			if !strings.Contains(all.String(), want) {
				t.Errorf("verbose info lacks the image config (%q):\n%s", want, all.String())
			}
		}
		resp, err = d.Images.ImageStatus(ctx(t), &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: p.Name}})
		if err != nil || len(resp.Info) != 0 {
			t.Errorf("non-verbose status has info %v (%v)", resp.GetInfo(), err)
		}
	})
	harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
	harness.AssertNoLeaks(t, d2.Root, harness.WantImages(t, img))
}

func TestImageStatusUserAndSize(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	reg, d := start(t, "")
	cases := []struct {
		user     string
		uid      *int64
		username string
	}{
		{"1002", ptr(1002), ""},
		{"0", ptr(0), ""},
		{"www-data", nil, "www-data"},
		{"1003:1004", ptr(1003), ""},
		{"www-data:1004", nil, "www-data"},
	}
	var imgs []v1.Image
	for i, c := range cases {
		t.Run(c.user, func(t *testing.T) {
			img := harness.BusyboxImage(t, harness.ImageSpec{Config: v1.Config{User: c.user}})
			imgs = append(imgs, img)
			p := reg.Push(t, fmt.Sprintf("berth/user:%d", i), img)
			mustPull(t, d, p.Name, p.ID)
			st := mustStatus(t, d, p.Name)
			switch {
			case c.uid == nil && st.Uid != nil:
				t.Errorf("User %q: uid %d, want none", c.user, st.Uid.Value)
			case c.uid != nil && (st.Uid == nil || st.Uid.Value != *c.uid):
				t.Errorf("User %q: uid %v, want %d", c.user, st.Uid, *c.uid)
			}
			if st.Username != c.username {
				t.Errorf("User %q: username %q, want %q", c.user, st.Username, c.username)
			}
			if st.Size == 0 {
				t.Errorf("User %q: size 0", c.user)
			}
			assertNames(t, st, []string{p.Name}, []string{p.DigestRef()})
		})
	}
	harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, imgs...))
}

func ptr(v int64) *int64 { return &v }

// TestRepoTagsAndDigestsExact pulls one image under several names, each step
// twice, and checks the exact tags and digests after each.
func TestRepoTagsAndDigestsExact(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	reg, d := start(t, "")
	img := harness.BusyboxImage(t, harness.ImageSpec{})
	a := reg.Push(t, "berth/names:a", img)
	b := reg.Push(t, "berth/names:b", img)
	other := reg.Push(t, "berth/other:x", img)
	steps := []struct {
		ref           string
		tags, digests []string
	}{
		{a.Name, []string{a.Name}, []string{a.DigestRef()}},
		{a.DigestRef(), []string{a.Name}, []string{a.DigestRef()}},
		{b.Name, []string{a.Name, b.Name}, []string{a.DigestRef()}},
		{other.Name, []string{a.Name, b.Name, other.Name}, []string{a.DigestRef(), other.DigestRef()}},
	}
	for _, s := range steps {
		for range 2 {
			mustPull(t, d, s.ref, a.ID)
			assertNames(t, mustStatus(t, d, a.ID), s.tags, s.digests)
		}
	}
	if imgs := listImages(t, d, ""); len(imgs) != 1 {
		t.Errorf("ListImages: %d images, want 1", len(imgs))
	} else {
		assertNames(t, imgs[0], steps[len(steps)-1].tags, steps[len(steps)-1].digests)
	}
	harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
}

func TestListImages(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	reg, d := start(t, "")
	one := harness.BusyboxImage(t, harness.ImageSpec{Layers: [][]harness.File{{harness.Reg("one", "1", 0o644)}}})
	two := harness.BusyboxImage(t, harness.ImageSpec{Layers: [][]harness.File{{harness.Reg("two", "2", 0o644)}}})
	p1, p2 := reg.Push(t, "berth/one:1", one), reg.Push(t, "berth/two:1", two)
	if imgs := listImages(t, d, ""); len(imgs) != 0 {
		t.Errorf("a fresh berthd lists %d images", len(imgs))
	}
	mustPull(t, d, p1.Name, p1.ID)
	mustPull(t, d, p2.Name, p2.ID)
	cases := []struct {
		name, filter string
		want         []harness.Pushed
	}{
		{"no-filter", "", []harness.Pushed{p1, p2}},
		{"by-tag", p1.Name, []harness.Pushed{p1}},
		{"by-id", p2.ID, []harness.Pushed{p2}},
		{"by-digest", p1.DigestRef(), []harness.Pushed{p1}},
		{"by-repository", strings.TrimSuffix(p1.Name, ":1"), []harness.Pushed{p1}},
		{"by-id-prefix", p2.ID[:len("sha256:")+12], []harness.Pushed{p2}},
		{"by-bare-id-prefix", strings.TrimPrefix(p2.ID, "sha256:")[:12], []harness.Pushed{p2}},
		{"no-match", reg.Host() + "/berth/three:1", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := listImages(t, d, c.filter)
			var f *runtimeapi.ImageFilter
			if c.filter != "" {
				f = &runtimeapi.ImageFilter{Image: &runtimeapi.ImageSpec{Image: c.filter}}
			}
			stream, err := d.Images.StreamImages(t.Context(), &runtimeapi.StreamImagesRequest{Filter: f})
			streamed := streamAll(t, stream, err, func(r *runtimeapi.StreamImagesResponse) (ids []string) {
				for _, img := range r.Images {
					ids = append(ids, img.Id)
				}
				return ids
			})
			var listed []string
			for _, img := range got {
				listed = append(listed, img.Id)
			}
			if !sameSet(streamed, listed) {
				t.Errorf("StreamImages(%q) = %v, ListImages = %v", c.filter, streamed, listed)
			}
			byID := map[string]*runtimeapi.Image{}
			for _, img := range got {
				byID[img.Id] = img
			}
			if len(got) != len(c.want) || len(byID) != len(c.want) {
				t.Fatalf("ListImages(%q): %d images, want %d", c.filter, len(got), len(c.want))
			}
			for _, w := range c.want {
				img := byID[w.ID]
				if img == nil {
					t.Errorf("ListImages(%q) lacks %s", c.filter, w.Name)
					continue
				}
				assertNames(t, img, []string{w.Name}, []string{w.DigestRef()})
				if img.Size == 0 {
					t.Errorf("%s: size 0", w.Name)
				}
			}
		})
	}
	harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, one, two))
}

func TestRemoveImage(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	reg := harness.NewRegistry(t)
	img := harness.BusyboxImage(t, harness.ImageSpec{Layers: [][]harness.File{{harness.Reg("rm", "rm", 0o644)}}})
	p := reg.Push(t, "berth/rm:1", img)
	cases := []struct{ name, ref string }{
		{"by-id", p.ID},
		{"by-tag", p.Name},
		{"by-digest", p.DigestRef()},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			d := harness.StartDaemon(t, harness.Options{ConfigTOML: harness.PlainHTTP(reg.Host())})
			mustPull(t, d, p.Name, p.ID)
			harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
			for i := range 2 { // the second removal finds nothing: still OK
				removeImage(t, d, c.ref)
				assertAbsent(t, d, p.ID, p.Name, p.DigestRef())
				if imgs := listImages(t, d, ""); len(imgs) != 0 {
					t.Errorf("removal %d: ListImages still has %d images", i+1, len(imgs))
				}
				harness.AssertNoLeaks(t, d.Root, harness.WantSnapshots(0))
			}
			removeImage(t, d, reg.Host()+"/berth/never:1")
			// The layers come back on the next pull.
			mustPull(t, d, p.Name, p.ID)
			harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
		})
	}
}

func TestRemoveOneOfTwoTags(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	reg, d := start(t, "")
	img := harness.BusyboxImage(t, harness.ImageSpec{})
	a, b := reg.Push(t, "berth/tags:a", img), reg.Push(t, "berth/tags:b", img)
	mustPull(t, d, a.Name, a.ID)
	mustPull(t, d, b.Name, b.ID)

	removeImage(t, d, a.Name)
	assertAbsent(t, d, a.Name)
	st := mustStatus(t, d, b.Name)
	assertNames(t, st, []string{b.Name}, []string{b.DigestRef()})
	if got := mustStatus(t, d, b.ID); got.Id != b.ID {
		t.Errorf("by ID after untagging: %s", got.Id)
	}
	harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))

	removeImage(t, d, b.Name)
	assertAbsent(t, d, b.Name, b.ID)
	harness.AssertNoLeaks(t, d.Root, harness.WantSnapshots(0))
}

func TestRemoveKeepsLayersOtherImagesUse(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	reg, d := start(t, "")
	a := harness.BusyboxImage(t, harness.ImageSpec{Layers: [][]harness.File{{harness.Reg("a", "a", 0o644)}}})
	b := harness.BusyboxImage(t, harness.ImageSpec{Layers: [][]harness.File{{harness.Reg("b", "b", 0o644)}}})
	pa, pb := reg.Push(t, "berth/a:1", a), reg.Push(t, "berth/b:1", b)
	mustPull(t, d, pa.Name, pa.ID)
	mustPull(t, d, pb.Name, pb.ID)
	harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, a, b)) // 3 snapshots

	removeImage(t, d, pa.ID)
	harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, b)) // busybox stays for b
	if hits := harness.FindInSnapshots(t, d.Root, "a"); len(hits) != 0 {
		t.Errorf("a's own layer is still on disk: %v", hits)
	}
	if hits := harness.FindInSnapshots(t, d.Root, "bin/busybox"); len(hits) != 1 {
		t.Errorf("the shared layer is in %d snapshots, want 1", len(hits))
	}
	mustStatus(t, d, pb.Name)

	removeImage(t, d, pb.ID)
	harness.AssertNoLeaks(t, d.Root, harness.WantSnapshots(0))
}

func TestImageFsInfo(t *testing.T) {
	harness.RequireIntegration(t)
	t.Parallel()
	reg, d := start(t, "")
	usage := func(pulled bool) *runtimeapi.FilesystemUsage {
		t.Helper()
		resp, err := d.Images.ImageFsInfo(ctx(t), &runtimeapi.ImageFsInfoRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.ImageFilesystems) != 1 || len(resp.ContainerFilesystems) != 1 {
			t.Fatalf("ImageFsInfo: %d image and %d container filesystems, want 1 each",
				len(resp.ImageFilesystems), len(resp.ContainerFilesystems))
		}
		u := resp.ImageFilesystems[0]
		// The mount point of the root's filesystem: the root or a folder
		// above it. The writable layers share it by default, so the
		// container filesystem has the same (the kubelet: not split).
		mp := u.GetFsId().GetMountpoint()
		if rel, err := filepath.Rel(mp, d.Root); !filepath.IsAbs(mp) || err != nil || strings.HasPrefix(rel, "..") {
			t.Errorf("mount point %q is not the root %s or above it", mp, d.Root)
		}
		if ctrMp := resp.ContainerFilesystems[0].GetFsId().GetMountpoint(); ctrMp != mp {
			t.Errorf("container filesystem mount point %q, want the image filesystem's %q (one filesystem)", ctrMp, mp)
		}
		if u.Timestamp == 0 || u.UsedBytes == nil || u.InodesUsed == nil {
			t.Errorf("ImageFsInfo lacks timestamp, used bytes or inodes: %v", u)
		}
		if pulled && (u.UsedBytes.GetValue() == 0 || u.InodesUsed.GetValue() == 0) {
			t.Errorf("ImageFsInfo with an image: used bytes %d, inodes %d; want > 0",
				u.UsedBytes.GetValue(), u.InodesUsed.GetValue())
		}
		return u
	}
	before := usage(false)
	img := harness.BusyboxImage(t, harness.ImageSpec{})
	p := reg.Push(t, "berth/fs:1", img)
	mustPull(t, d, p.Name, p.ID)
	after := usage(true)
	grewBytes := int64(after.UsedBytes.GetValue()) - int64(before.UsedBytes.GetValue())
	grewInodes := int64(after.InodesUsed.GetValue()) - int64(before.InodesUsed.GetValue())
	if grewBytes < int64(len(harness.BusyboxBinary(t))) {
		t.Errorf("used bytes grew by %d after pulling busybox (%d bytes)", grewBytes, len(harness.BusyboxBinary(t)))
	}
	if grewInodes < int64(len(harness.BusyboxApplets)) {
		t.Errorf("inodes grew by %d after unpacking %d+ entries", grewInodes, len(harness.BusyboxApplets))
	}
	harness.AssertNoLeaks(t, d.Root, harness.WantImages(t, img))
}
