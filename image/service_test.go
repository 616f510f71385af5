package image

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	bolt "go.etcd.io/bbolt"

	"github.com/berth-runtime/berth/cri/errkind"
)

func newTestService(t *testing.T) (*Service, string) {
	t.Helper()
	return newTestServiceWith(t, func(*Options) {})
}

// newTestServiceWith is newTestService with the options edit makes.
func newTestServiceWith(t *testing.T, edit func(*Options)) (*Service, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("unpacking layers with their owners needs root")
	}
	root := t.TempDir()
	db, err := bolt.Open(filepath.Join(root, "meta.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	opts := Options{Root: root, DB: db, ProgressTimeout: 5 * time.Second}
	edit(&opts)
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close) // runs before db.Close
	return s, root
}

// waitCollected waits for the background collector to leave n snapshots and
// blobs blobs.
func waitCollected(t *testing.T, s *Service, root string, n, blobs int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		entries, _ := os.ReadDir(filepath.Join(root, "snapshots"))
		got, _ := s.content.List()
		if len(entries) == n && len(got) == blobs {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s: snapshots %v, blobs %v; want %d and %d", entries, got, n, blobs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func pushRandom(t *testing.T, host, repo string, layers int64) string {
	t.Helper()
	img, err := random.Image(1024, layers)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(host + "/" + repo)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	cfg, _ := img.ConfigName()
	return cfg.String()
}

func TestPullStoreRemove(t *testing.T) {
	s, root := newTestService(t)
	reg := httptest.NewServer(ggcrregistry.New())
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	id := pushRandom(t, host, "app:v1", 3)

	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			img, err := s.Pull(context.Background(), host+"/app:v1", nil)
			if err != nil || img.ID != id {
				t.Errorf("Pull = %v, %v; want ID %s", img, err, id)
			}
		}()
	}
	wg.Wait()
	img, err := s.Get(host + "/app:v1")
	if err != nil {
		t.Fatal(err)
	}
	if len(img.RepoTags) != 1 || len(img.RepoDigests) != 1 || len(img.ChainIDs) != 3 || img.Size == 0 {
		t.Errorf("stored image %+v", img)
	}
	if got, err := s.Get(img.RepoDigests[0]); err != nil || got.ID != id {
		t.Errorf("Get by digest: %v %v", got, err)
	}
	if u, err := s.FsInfo(); err != nil || u.UsedBytes < 3*1024 {
		t.Errorf("FsInfo = %+v, %v", u, err)
	}
	dirs, err := s.Lease("ctr1", img)
	if err != nil || len(dirs) != 3 {
		t.Fatalf("Lease = %v, %v", dirs, err)
	}
	if err := s.Remove(id); err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("a leased layer was collected with its image: %v", err)
		}
	}
	if err := s.Release("ctr1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(id); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get after Remove: %v", err)
	}
	waitCollected(t, s, root, 0, 0)
	// A container created from the image as looked up before its removal:
	// its layers are gone, which is NotFound (pull again), not a fault.
	if _, err := s.Lease("ctr2", img); !errors.Is(err, ErrNotFound) || !errors.Is(err, errkind.NotFound) {
		t.Errorf("Lease of a removed image's layers: %v, want ErrNotFound", err)
	}
}

func TestPullErrors(t *testing.T) {
	s, _ := newTestService(t)
	reg := httptest.NewServer(ggcrregistry.New())
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	if _, err := s.Pull(context.Background(), host+"/missing:v1", nil); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing image: %v", err)
	}
	if _, err := s.Pull(context.Background(), "Bad Ref", nil); !errors.Is(err, ErrInvalidReference) {
		t.Errorf("bad reference: %v", err)
	}
}

func TestHeldSnapshotSurvivesCollection(t *testing.T) {
	s, root := newTestService(t)
	dir, err := s.snaps.Prepare()
	if err != nil {
		t.Fatal(err)
	}
	const chainID = "sha256:0000000000000000000000000000000000000000000000000000000000000001"
	if _, err := s.snaps.Commit(chainID, dir, 0, 1); err != nil {
		t.Fatal(err)
	}
	release := s.hold(chainID)
	if err := s.collectGarbage(); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.snaps.Get(chainID); !ok {
		t.Fatal("a held snapshot was collected")
	}
	release()
	s.requestGC()
	waitCollected(t, s, root, 0, 0)
}

// slowBlobs delays every blob GET by delay and counts those whose client
// went away before the response.
type slowBlobs struct {
	next      http.Handler
	delay     time.Duration
	abandoned atomic.Int32
}

func (h *slowBlobs) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") {
		select {
		case <-time.After(h.delay):
		case <-r.Context().Done():
			h.abandoned.Add(1)
			return
		}
	}
	h.next.ServeHTTP(w, r)
}

func TestSharedPullSurvivesACancelledCaller(t *testing.T) {
	s, _ := newTestService(t)
	slow := &slowBlobs{next: ggcrregistry.New(), delay: time.Second}
	reg := httptest.NewServer(slow)
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	id := pushRandom(t, host, "app:v1", 2)

	quitter, quit := context.WithCancel(context.Background())
	quitErr := make(chan error, 1)
	go func() {
		_, err := s.Pull(quitter, host+"/app:v1", nil)
		quitErr <- err
	}()
	time.Sleep(200 * time.Millisecond) // both callers share the transfer
	stayErr := make(chan error, 1)
	go func() {
		img, err := s.Pull(context.Background(), host+"/app:v1", nil)
		if err == nil && img.ID != id {
			err = errors.New("wrong image " + img.ID)
		}
		stayErr <- err
	}()
	time.Sleep(200 * time.Millisecond)
	quit()
	if err := <-quitErr; !errors.Is(err, context.Canceled) {
		t.Errorf("the cancelled caller got %v, want context.Canceled", err)
	}
	if err := <-stayErr; err != nil {
		t.Errorf("the caller that stayed got %v", err)
	}
}

func TestSharedPullStopsWhenAllCallersLeft(t *testing.T) {
	s, root := newTestService(t)
	slow := &slowBlobs{next: ggcrregistry.New(), delay: time.Minute}
	reg := httptest.NewServer(slow)
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	pushRandom(t, host, "app:v1", 1)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { s.Pull(ctx, host+"/app:v1", nil) })
	}
	time.Sleep(300 * time.Millisecond)
	cancel()
	wg.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for slow.abandoned.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if slow.abandoned.Load() == 0 {
		t.Fatal("the transfer went on after every caller left")
	}
	waitCollected(t, s, root, 0, 0)
}

// TestPullAuthorizesOnce: a pull makes the registry handshake (the /v2/
// ping and, where asked, the token request) once for the manifest, the
// config and the layers, so a registry that fails it fails the endpoint
// before anything is fetched, and the pull goes on to the next one.
func TestPullAuthorizesOnce(t *testing.T) {
	s, _ := newTestService(t)
	var pings atomic.Int32
	inner := ggcrregistry.New()
	reg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v2/" {
			pings.Add(1)
		}
		inner.ServeHTTP(w, r)
	}))
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	id := pushRandom(t, host, "app:v1", 3)
	pings.Store(0)
	img, err := s.Pull(context.Background(), host+"/app:v1", nil)
	if err != nil || img.ID != id {
		t.Fatalf("Pull = %v, %v; want ID %s", img, err, id)
	}
	if n := pings.Load(); n != 1 {
		t.Errorf("the pull pinged the registry %d times, want once", n)
	}
}

// TestRebootForgetsUnsyncedLayers: layers that were not yet synced when the
// machine went down are dropped at the next start, and with them their
// images, which the kubelet then pulls again (within one boot they stay:
// TestOpenSettlesUnsyncedSnapshots).
func TestRebootForgetsUnsyncedLayers(t *testing.T) {
	s, root := newTestService(t)
	reg := httptest.NewServer(ggcrregistry.New())
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	pushRandom(t, host, "app:v1", 2)
	if _, err := s.Pull(context.Background(), host+"/app:v1", nil); err != nil {
		t.Fatal(err)
	}
	db := s.opts.DB
	s.Close()
	// What a power cut before the flush leaves: the records of the layers
	// still carry the boot they were unpacked in, now an earlier one.
	err := db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("snapshots"))
		return b.ForEach(func(k, v []byte) error {
			var rec map[string]any
			if err := json.Unmarshal(v, &rec); err != nil {
				return err
			}
			rec["unsyncedBoot"] = "an earlier boot"
			v, err := json.Marshal(rec)
			if err != nil {
				return err
			}
			return b.Put(k, v)
		})
	})
	if err != nil {
		t.Fatal(err)
	}

	s, err = New(Options{Root: root, DB: db, ProgressTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if img, err := s.Get(host + "/app:v1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("after the reboot: Get = %v, %v; want NotFound, so that it is pulled again", img, err)
	}
	if snaps, err := s.snaps.List(); len(snaps) != 0 || err != nil {
		t.Errorf("snapshots after the reboot: %v %v, want none", snaps, err)
	}
	if _, err := s.Pull(context.Background(), host+"/app:v1", nil); err != nil {
		t.Errorf("pull again: %v", err)
	}
}
