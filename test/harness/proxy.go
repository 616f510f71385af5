package harness

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Proxy is a plain HTTP server on 127.0.0.1 that berthd takes for a
// registry host: it forwards every request to a test Registry and counts,
// for each blob GET, what berthd asked for (its Range header) and the body
// bytes it was sent; it can cut, stall or slow those bodies. Closed by
// t.Cleanup.
type Proxy struct {
	srv      *httptest.Server
	upstream string
	stop     chan struct{}

	mu       sync.Mutex
	sent     map[string]int64 // body bytes sent, by digest
	gets     []*BlobGet       // in order
	inFlight int              // blob GETs whose body is being sent
	maxIn    int
	cut      map[string]int64 // next GET of the digest: drop the connection after n bytes
	stall    map[string]int64 // GETs of the digest: stop sending after byte n until the client hangs up
	rate     int64            // bytes per second of each blob body; 0: as fast as it goes
	link     int64            // bytes per second of all blob bodies together; 0: as fast as they go
	linkFree time.Time        // when the link has sent what was given it so far
	fail     map[string]int   // next GET of the digest: answer this status instead
}

// BlobGet is one GET of a blob through the proxy.
type BlobGet struct {
	Digest string
	Range  string // the request's Range header, "" for the whole blob
	Status int
	Header http.Header // the request's
	Start  time.Time   // when the proxy got the request
	End    time.Time   // when it sent the last byte of the answer; zero while it sends
}

// NewProxy starts a proxy in front of reg.
func NewProxy(t testing.TB, reg *Registry) *Proxy {
	t.Helper()
	p := &Proxy{upstream: reg.URL(), stop: make(chan struct{}),
		sent: map[string]int64{}, cut: map[string]int64{}, stall: map[string]int64{}, fail: map[string]int{}}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(func() {
		close(p.stop)
		p.srv.CloseClientConnections()
		p.srv.Close()
	})
	return p
}

// Host is "127.0.0.1:PORT": the registry host to pull through the proxy.
func (p *Proxy) Host() string { return strings.TrimPrefix(p.srv.URL, "http://") }

// CutOnce makes the next GET of blob d send its first n body bytes and then
// drop the connection.
func (p *Proxy) CutOnce(d v1.Hash, n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut[d.String()] = n
}

// FailOnce makes the next GET of blob d answer status (a 503, say) without
// asking the registry.
func (p *Proxy) FailOnce(d v1.Hash, status int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fail[d.String()] = status
}

// Stall makes GETs of blob d that start before offset n send up to byte n
// and then nothing, until berthd hangs up.
func (p *Proxy) Stall(d v1.Hash, n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stall[d.String()] = n
}

// LimitRate slows every blob body to bytesPerSecond (per connection); 0
// lifts the limit, for bodies starting from then on.
func (p *Proxy) LimitRate(bytesPerSecond int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rate = bytesPerSecond
}

// LimitLink slows all blob bodies together to bytesPerSecond, as a link
// of that bandwidth between berthd and the registry would; 0 lifts the
// limit.
func (p *Proxy) LimitLink(bytesPerSecond int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.link = bytesPerSecond
	p.linkFree = time.Time{}
}

// linkSlot books n bytes on the link and returns when they have passed it:
// now if the link is not limited. A body that woke late may catch up
// within linkBurst, so that timer slack does not lower the bandwidth.
func (p *Proxy) linkSlot(n int) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if p.link == 0 {
		return now
	}
	p.linkFree = later(p.linkFree, now.Add(-linkBurst)).Add(time.Duration(float64(n) / float64(p.link) * float64(time.Second)))
	return p.linkFree
}

// linkBurst is how far a limited link may fall behind its schedule and
// catch up.
const linkBurst = 20 * time.Millisecond

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Heal lifts the cut and stall of d.
func (p *Proxy) Heal(d v1.Hash) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.cut, d.String())
	delete(p.stall, d.String())
}

// Sent is how many body bytes of blob d the proxy has sent.
func (p *Proxy) Sent(d v1.Hash) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sent[d.String()]
}

// Gets lists the GETs of blob d so far.
func (p *Proxy) Gets(d v1.Hash) []BlobGet {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []BlobGet
	for _, g := range p.gets {
		if g.Digest == d.String() {
			out = append(out, *g)
		}
	}
	return out
}

// MaxInFlight is the most blob bodies the proxy was sending at once since
// it started or since Reset.
func (p *Proxy) MaxInFlight() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.maxIn
}

// Reset zeroes the counts.
func (p *Proxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	clear(p.sent)
	p.gets = nil
	p.maxIn = p.inFlight
}

func (p *Proxy) serve(w http.ResponseWriter, req *http.Request) {
	began := time.Now()
	if dg, ok := digestInPath(req.URL.Path); ok && req.Method == http.MethodGet {
		p.mu.Lock()
		status, failing := p.fail[dg]
		delete(p.fail, dg)
		if failing {
			p.gets = append(p.gets, &BlobGet{Digest: dg, Range: req.Header.Get("Range"), Status: status, Header: req.Header.Clone(), Start: began, End: time.Now()})
		}
		p.mu.Unlock()
		if failing {
			writeRegistryError(w, status, "UNAVAILABLE", "injected by the proxy")
			return
		}
	}
	out, err := http.NewRequestWithContext(req.Context(), req.Method, p.upstream+req.URL.RequestURI(), req.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	out.Header = req.Header.Clone()
	resp, err := http.DefaultTransport.RoundTrip(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	// The token endpoint too is reached through the proxy: a client
	// refuses a realm on another private address than the registry's.
	for i, c := range w.Header().Values("Www-Authenticate") {
		w.Header()["Www-Authenticate"][i] = strings.ReplaceAll(c, p.upstream, p.srv.URL)
	}
	w.WriteHeader(resp.StatusCode)
	dg, isBlob := digestInPath(req.URL.Path)
	if !isBlob || !strings.Contains(req.URL.Path, "/blobs/") || req.Method != http.MethodGet {
		_, _ = io.Copy(w, resp.Body)
		return
	}
	p.mu.Lock()
	get := &BlobGet{Digest: dg, Range: req.Header.Get("Range"), Status: resp.StatusCode, Header: req.Header.Clone(), Start: began}
	p.gets = append(p.gets, get)
	p.inFlight++
	p.maxIn = max(p.maxIn, p.inFlight)
	cut, cutting := p.cut[dg]
	delete(p.cut, dg)
	stall, stalling := p.stall[dg]
	rate := p.rate
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.inFlight--
		get.End = time.Now()
		p.mu.Unlock()
	}()
	var start int64
	if resp.StatusCode == http.StatusPartialContent {
		start = contentRangeStart(resp.Header.Get("Content-Range"))
	}
	p.sendBody(w, req, resp.Body, dg, start, rate, cutting, cut, stalling, stall)
}

// sendBody copies a blob body that starts at offset start, applying the
// rate, the cut (bytes of this body) and the stall (offset in the blob).
func (p *Proxy) sendBody(w http.ResponseWriter, req *http.Request, body io.Reader, dg string, start, rate int64, cutting bool, cut int64, stalling bool, stall int64) {
	chunk := int64(32 << 10)
	tick := time.Duration(0)
	if rate > 0 {
		chunk = max(rate/20, 1)
		tick = 50 * time.Millisecond
	}
	buf := make([]byte, chunk)
	var sent int64
	for {
		want := chunk
		if cutting {
			want = min(want, cut-sent)
		}
		if stalling && start < stall {
			want = min(want, stall-start-sent)
		}
		if want <= 0 {
			_ = http.NewResponseController(w).Flush()
			if !cutting { // stalled: until berthd gives up
				select {
				case <-req.Context().Done():
				case <-p.stop:
				}
			}
			panic(http.ErrAbortHandler) // net/http drops the connection quietly
		}
		n, err := body.Read(buf[:want])
		if n > 0 {
			m, werr := w.Write(buf[:n])
			sent += int64(m)
			p.mu.Lock()
			p.sent[dg] += int64(m)
			p.mu.Unlock()
			if werr != nil {
				return
			}
			_ = http.NewResponseController(w).Flush()
			if !p.waitUntil(req, p.linkSlot(m)) {
				return
			}
		}
		if err != nil {
			return
		}
		if tick > 0 && !p.waitUntil(req, time.Now().Add(tick)) {
			return
		}
	}
}

// waitUntil waits until then, and says false if the client or the proxy
// gave up meanwhile.
func (p *Proxy) waitUntil(req *http.Request, then time.Time) bool {
	d := time.Until(then)
	if d <= 0 {
		return true
	}
	select {
	case <-time.After(d):
		return true
	case <-req.Context().Done():
	case <-p.stop:
	}
	return false
}

func contentRangeStart(h string) int64 {
	var start int64
	_, _ = fmt.Sscanf(h, "bytes %d-", &start)
	return start
}
