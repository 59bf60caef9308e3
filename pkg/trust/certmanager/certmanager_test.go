package certmanager

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/authn"
	"github.com/causeway-mesh/causeway/pkg/trust/caclient"
	"github.com/causeway-mesh/causeway/pkg/trust/caserver"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
)

const nodeToken = "node-a-token-0123456789"

// mesh is a CA served over gRPC on 127.0.0.1 and a client for it that
// authenticates as the node proxy of node-a, on which the given workload
// identities run.
type mesh struct {
	ca     *trusttest.CA
	srv    *trusttest.CAServer
	client *caclient.Client
}

func newMesh(t *testing.T, ids ...trust.Identity) *mesh {
	t.Helper()
	ca := trusttest.NewCA(t, "cluster.local")
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte(nodeToken+" causeway-system/nodeproxy node-a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens, err := authn.NewTokenFile(path, "cluster.local", nil)
	if err != nil {
		t.Fatal(err)
	}
	var wl trust.WorkloadList
	for _, id := range ids {
		wl = append(wl, trust.Workload{Node: "node-a", Identity: id})
	}
	srv := ca.StartCAServer(t, caserver.Options{
		Authenticator:       tokens,
		TrustedNodeAccounts: []trust.Identity{trusttest.Identity(t, "spiffe://cluster.local/ns/causeway-system/sa/nodeproxy")},
		Workloads:           wl,
	})
	client, err := caclient.New(caclient.Options{Address: srv.Addr, Bundle: ca.Bundle, ServerIdentity: srv.Identity, Token: caclient.StaticToken(nodeToken)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return &mesh{ca: ca, srv: srv, client: client}
}

// start runs a manager until the test ends.
func start(t *testing.T, o Options) *Manager {
	t.Helper()
	m, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return m
}

// probe wraps a fetcher to observe and steer fetches.
type probe struct {
	inner CertificateFetcher
	// gate, if set, holds every fetch until a value is received from it
	// or it is closed.
	gate chan struct{}

	mu          sync.Mutex
	inFlight    int
	maxInFlight int
	started     []trust.Identity
	startedCh   chan trust.Identity
}

func newProbe(inner CertificateFetcher, gate chan struct{}) *probe {
	return &probe{inner: inner, gate: gate, startedCh: make(chan trust.Identity, 1000)}
}

func (p *probe) Fetch(ctx context.Context, id trust.Identity, csr []byte, ttl time.Duration) ([]string, error) {
	p.mu.Lock()
	p.inFlight++
	p.maxInFlight = max(p.maxInFlight, p.inFlight)
	p.started = append(p.started, id)
	p.mu.Unlock()
	p.startedCh <- id
	defer func() {
		p.mu.Lock()
		p.inFlight--
		p.mu.Unlock()
	}()
	if p.gate != nil {
		select {
		case <-p.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return p.inner.Fetch(ctx, id, csr, ttl)
}

func (p *probe) stats() (inFlight, maxInFlight int, started []trust.Identity) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inFlight, p.maxInFlight, slices.Clone(p.started)
}

func ident(t *testing.T, sa string) trust.Identity {
	return trusttest.Identity(t, "spiffe://cluster.local/ns/shop/sa/"+sa)
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls cond until it holds or a generous deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func stateOf(m *Manager, id trust.Identity) (CertificateStatus, bool) {
	for _, s := range m.Snapshot() {
		if s.Identity == id.String() {
			return s, true
		}
	}
	return CertificateStatus{}, false
}

// TestRotationUnderConcurrentHandshakes: certificates live 2 seconds and
// are replaced while clients keep handshaking with a server, both sides
// taking their certificates from the manager; no handshake may fail.
func TestRotationUnderConcurrentHandshakes(t *testing.T) {
	serverID, clientID := ident(t, "server"), ident(t, "client")
	ms := newMesh(t, serverID, clientID)
	m := start(t, Options{Fetcher: ms.client, TTL: 2 * time.Second})
	ctx := testCtx(t)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu                         sync.Mutex
		failures                   []string
		handshakes                 int
		clientSerials, srvSerials  = map[string]bool{}, map[string]bool{}
		clientKeys                 = map[string]bool{}
		serverWG, acceptWG, client sync.WaitGroup
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		failures = append(failures, fmt.Sprintf(format, args...))
	}
	serverConf := trust.ServerConfig(ms.ca.Bundle, func(net.Addr) (*tls.Certificate, error) {
		return m.Get(ctx, serverID)
	}, trust.RequireClientCert)
	acceptWG.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			serverWG.Go(func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(30 * time.Second))
				tc := tls.Server(c, serverConf)
				if err := tc.Handshake(); err != nil {
					fail("server handshake: %v", err)
					return
				}
				p, err := trust.PeerFromTLS(tc.ConnectionState())
				if id, ok := p.Identity(); err != nil || !ok || id != clientID {
					fail("server sees peer %v (%v)", p, err)
					return
				}
				leaf := tc.ConnectionState().PeerCertificates[0]
				mu.Lock()
				clientSerials[leaf.SerialNumber.Text(16)] = true
				clientKeys[fmt.Sprint(leaf.PublicKey)] = true
				mu.Unlock()
			})
		}
	})

	clientConf := trust.ClientConfig(ms.ca.Bundle, func() (*tls.Certificate, error) {
		return m.Get(ctx, clientID)
	}, []trust.Identity{serverID})
	stop := time.Now().Add(6 * time.Second)
	for range 4 {
		client.Go(func() {
			for time.Now().Before(stop) {
				c, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					fail("dial: %v", err)
					return
				}
				_ = c.SetDeadline(time.Now().Add(30 * time.Second))
				tc := tls.Client(c, clientConf)
				if err := tc.Handshake(); err != nil {
					fail("client handshake: %v", err)
					c.Close()
					continue
				}
				// The server closes after its side; anything but EOF is
				// its refusal of our certificate.
				if _, err := tc.Read(make([]byte, 1)); err != nil && !errors.Is(err, io.EOF) {
					fail("after handshake: %v", err)
				}
				mu.Lock()
				handshakes++
				srvSerials[tc.ConnectionState().PeerCertificates[0].SerialNumber.Text(16)] = true
				mu.Unlock()
				c.Close()
			}
		})
	}
	client.Wait()
	ln.Close()
	acceptWG.Wait()
	serverWG.Wait()

	mu.Lock()
	defer mu.Unlock()
	if len(failures) > 0 {
		t.Fatalf("%d of %d handshakes failed, first: %s", len(failures), handshakes+len(failures), failures[0])
	}
	t.Logf("%d handshakes, %d client and %d server certificates", handshakes, len(clientSerials), len(srvSerials))
	if len(clientSerials) < 3 || len(srvSerials) < 3 {
		t.Fatalf("certificates were not rotated: %d client and %d server serials over 6 s of 2 s certificates",
			len(clientSerials), len(srvSerials))
	}
	if len(clientKeys) != len(clientSerials) {
		t.Fatalf("%d keys for %d certificates: each certificate must have a fresh key", len(clientKeys), len(clientSerials))
	}
}

// TestCAStopped: with the CA gone the manager keeps serving the still-valid
// certificate and reports the error; once that expires Get fails with the
// CA's error; when the CA is back the identity recovers.
func TestCAStopped(t *testing.T) {
	id := ident(t, "web")
	ms := newMesh(t, id)
	m := start(t, Options{Fetcher: ms.client, TTL: 6 * time.Second, InitialBackoff: 200 * time.Millisecond, MaxBackoff: time.Second})
	ctx := testCtx(t)

	first, err := m.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	serial := first.Leaf.SerialNumber.Text(16)
	if s, _ := stateOf(m, id); s.State != StateAvailable {
		t.Fatalf("state %q", s.State)
	}

	ms.srv.Stop()
	// While the certificate is valid the identity stays Available (the
	// proxy stays ready) and the refresh failure shows beside it.
	eventually(t, "the refresh failure to show", func() bool {
		s, _ := stateOf(m, id)
		return s.RefreshError != ""
	})
	s, _ := stateOf(m, id)
	if time.Now().Before(first.Leaf.NotAfter) && s.State != StateAvailable {
		t.Fatalf("state %q while the certificate is valid", s.State)
	}
	if !strings.Contains(s.RefreshError, "code = Unavailable") {
		t.Fatalf("refresh error %q does not carry the CA error", s.RefreshError)
	}
	if len(s.CertChain) == 0 || s.CertChain[0].SerialNumber != serial {
		t.Fatalf("snapshot no longer shows the certificate in use: %+v", s.CertChain)
	}
	if time.Now().Before(first.Leaf.NotAfter) {
		got, err := m.Get(ctx, id)
		if err != nil {
			t.Fatalf("Get while the old certificate is valid: %v", err)
		}
		if got.Leaf.SerialNumber.Text(16) != serial {
			t.Fatal("Get returned another certificate while the CA is down")
		}
	}

	time.Sleep(time.Until(first.Leaf.NotAfter) + 100*time.Millisecond)
	if s, _ := stateOf(m, id); !strings.HasPrefix(s.State, StateUnavailable+": ") || !strings.Contains(s.State, "code = Unavailable") {
		t.Fatalf("state %q after expiry with the CA down", s.State)
	}
	_, err = m.Get(ctx, id)
	if err == nil || !strings.Contains(err.Error(), "code = Unavailable") {
		t.Fatalf("Get after expiry with the CA down: %v", err)
	}

	ms.srv.Restart(t)
	var got *tls.Certificate
	eventually(t, "recovery after the CA restarted", func() bool {
		got, err = m.Get(ctx, id)
		return err == nil
	})
	if got.Leaf.SerialNumber.Text(16) == serial {
		t.Fatal("recovered with the expired certificate")
	}
	if s, _ := stateOf(m, id); s.State != StateAvailable {
		t.Fatalf("state after recovery %q", s.State)
	}
}

// TestBurstRespectsConcurrencyLimit: 100 identities at once, half
// prefetched and half needed by traffic, never more than 4 fetches in flight.
func TestBurstRespectsConcurrencyLimit(t *testing.T) {
	const n, limit = 100, 4
	var ids []trust.Identity
	for i := range n {
		ids = append(ids, ident(t, fmt.Sprintf("w%03d", i)))
	}
	ms := newMesh(t, ids...)
	release := make(chan struct{})
	p := newProbe(ms.client, release)
	m := start(t, Options{Fetcher: p, MaxConcurrentFetches: limit})
	ctx := testCtx(t)

	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i, id := range ids {
		if i%2 == 0 {
			m.Prefetch(id)
			continue
		}
		wg.Go(func() {
			if _, err := m.Get(ctx, id); err != nil {
				errs <- err
			}
		})
	}
	eventually(t, "the limit to be reached", func() bool { in, _, _ := p.stats(); return in >= limit })
	time.Sleep(300 * time.Millisecond) // room for a wrongful extra fetch to start
	if _, mx, _ := p.stats(); mx != limit {
		t.Fatalf("%d fetches in flight, limit %d", mx, limit)
	}
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	eventually(t, "all identities available", func() bool {
		snap := m.Snapshot()
		for _, s := range snap {
			if s.State != StateAvailable {
				return false
			}
		}
		return len(snap) == n
	})
	if _, mx, started := p.stats(); mx > limit || len(started) < n {
		t.Fatalf("max in flight %d (limit %d), %d fetches for %d identities", mx, limit, len(started), n)
	}
}

// waiters reads how many Get calls wait for id.
func (m *Manager) waiters(id trust.Identity) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.entries[id]; ok {
		return e.waiters
	}
	return 0
}

// TestPriorities: with one fetch at a time, identities that traffic waits
// for go before queued prefetches (including a prefetch a caller starts
// waiting for), and prefetches go in the order they were asked for.
func TestPriorities(t *testing.T) {
	var pre []trust.Identity
	for i := range 10 {
		pre = append(pre, ident(t, fmt.Sprintf("pre%d", i)))
	}
	urgent := ident(t, "urgent")
	ms := newMesh(t, append(slices.Clone(pre), urgent)...)
	gate := make(chan struct{})
	p := newProbe(ms.client, gate)
	m := start(t, Options{Fetcher: p, MaxConcurrentFetches: 1})
	ctx := testCtx(t)

	for _, id := range pre {
		m.Prefetch(id)
	}
	if got := <-p.startedCh; got != pre[0] {
		t.Fatalf("first fetch for %s, want %s", got, pre[0])
	}
	var wg sync.WaitGroup
	for _, id := range []trust.Identity{pre[7], urgent} {
		wg.Go(func() {
			if _, err := m.Get(ctx, id); err != nil {
				t.Error(err)
			}
		})
		eventually(t, "Get to wait", func() bool { return m.waiters(id) == 1 })
	}
	want := []trust.Identity{pre[0], pre[7], urgent, pre[1], pre[2], pre[3], pre[4], pre[5], pre[6], pre[8], pre[9]}
	for range want {
		gate <- struct{}{}
	}
	wg.Wait()
	eventually(t, "all fetches", func() bool { _, _, s := p.stats(); return len(s) == len(want) })
	if _, _, started := p.stats(); !slices.Equal(started, want) {
		t.Fatalf("fetch order\n got %v\nwant %v", started, want)
	}
}

type failing struct {
	mu    sync.Mutex
	times []time.Time
}

func (f *failing) Fetch(context.Context, trust.Identity, []byte, time.Duration) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.times = append(f.times, time.Now())
	return nil, errors.New("CA says no")
}

func TestBackoff(t *testing.T) {
	f := &failing{}
	initial, maxB := 100*time.Millisecond, 400*time.Millisecond
	m := start(t, Options{Fetcher: f, InitialBackoff: initial, MaxBackoff: maxB})
	id := ident(t, "web")
	m.Prefetch(id)
	eventually(t, "several attempts", func() bool { f.mu.Lock(); defer f.mu.Unlock(); return len(f.times) >= 5 })
	if s, _ := stateOf(m, id); s.State != "Unavailable: CA says no" || len(s.CertChain) != 0 {
		t.Fatalf("state %q, chain %d", s.State, len(s.CertChain))
	}
	// Backing off: Get reports the failure instead of waiting.
	if _, err := m.Get(testCtx(t), id); err == nil || !strings.Contains(err.Error(), "unavailable: CA says no") {
		t.Fatalf("Get: %v", err)
	}
	f.mu.Lock()
	times := slices.Clone(f.times)
	f.mu.Unlock()
	// Waits only get longer than the backoff (a loaded machine adds
	// delay, never removes it): 100, 200, 400, 400 ms less 20% jitter.
	for i := 1; i < 5; i++ {
		b := min(initial<<(i-1), maxB)
		if gap := times[i].Sub(times[i-1]); gap < b*8/10 {
			t.Fatalf("attempt %d came %s after the previous one, backoff is %s", i+1, gap, b)
		}
	}
}

func TestForget(t *testing.T) {
	a, b := ident(t, "a"), ident(t, "b")
	ms := newMesh(t, a, b)
	gate := make(chan struct{})
	p := newProbe(ms.client, gate)
	m := start(t, Options{Fetcher: p, MaxConcurrentFetches: 1})
	ctx := testCtx(t)

	m.Prefetch(a)
	<-p.startedCh
	errc := make(chan error, 1)
	go func() { _, err := m.Get(ctx, a); errc <- err }()
	eventually(t, "Get to wait", func() bool { return m.waiters(a) == 1 })
	m.Forget(a)
	if err := <-errc; err == nil || !strings.Contains(err.Error(), "identity forgotten") {
		t.Fatalf("Get of a forgotten identity: %v", err)
	}
	close(gate) // the fetch in flight completes and is discarded
	if _, err := m.Get(ctx, b); err != nil {
		t.Fatal(err)
	}
	snap := m.Snapshot()
	if len(snap) != 1 || snap[0].Identity != b.String() {
		t.Fatalf("snapshot after Forget: %+v", snap)
	}
	m.Forget(b)
	if len(m.Snapshot()) != 0 {
		t.Fatal("Forget left the identity in the snapshot")
	}
}

func TestSnapshotFormat(t *testing.T) {
	id, other := ident(t, "web"), ident(t, "api")
	ms := newMesh(t, id, other)
	gate := make(chan struct{})
	m := start(t, Options{Fetcher: newProbe(ms.client, gate)})
	go func() { gate <- struct{}{} }()
	cert, err := m.Get(testCtx(t), id)
	if err != nil {
		t.Fatal(err)
	}
	m.Prefetch(other) // stays Initializing: the gate holds its fetch

	data, err := json.Marshal(m.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	var got []map[string]json.RawMessage
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("%s", data)
	}
	keys := func(m map[string]json.RawMessage) []string {
		var k []string
		for x := range m {
			k = append(k, x)
		}
		slices.Sort(k)
		return k
	}
	if k := keys(got[0]); !slices.Equal(k, []string{"cert_chain", "identity", "state"}) {
		t.Fatalf("keys %v", k)
	}
	// Sorted by identity: api (initializing) first.
	if string(got[0]["identity"]) != `"`+other.String()+`"` || string(got[0]["state"]) != `"Initializing"` || string(got[0]["cert_chain"]) != "[]" {
		t.Fatalf("initializing entry %s", data)
	}
	var chain []map[string]string
	if err := json.Unmarshal(got[1]["cert_chain"], &chain); err != nil {
		t.Fatal(err)
	}
	if len(chain) != 3 {
		t.Fatalf("chain of %d elements, want leaf, intermediate, root", len(chain))
	}
	var ck []string
	for k := range chain[0] {
		ck = append(ck, k)
	}
	slices.Sort(ck)
	if !slices.Equal(ck, []string{"expiration_time", "pem", "serial_number", "valid_from"}) {
		t.Fatalf("chain element keys %v", ck)
	}
	if chain[0]["serial_number"] != cert.Leaf.SerialNumber.Text(16) {
		t.Fatalf("serial %s, want %x", chain[0]["serial_number"], cert.Leaf.SerialNumber)
	}
	if exp, err := time.Parse(time.RFC3339, chain[0]["expiration_time"]); err != nil || !exp.Equal(cert.Leaf.NotAfter.Truncate(time.Second)) {
		t.Fatalf("expiration_time %q: %v", chain[0]["expiration_time"], err)
	}
	if _, err := time.Parse(time.RFC3339, chain[0]["valid_from"]); err != nil {
		t.Fatal(err)
	}
	if certs, err := trust.ParseCertificatesPEM([]byte(chain[2]["pem"])); err != nil || !certs[0].Equal(ms.ca.Bundle.Roots()[0]) {
		t.Fatalf("last element is not the root PEM: %v", err)
	}
	close(gate)
}

func TestBundleFollowsTheCA(t *testing.T) {
	id := ident(t, "web")
	ms := newMesh(t, id)
	stale := trusttest.NewCA(t, "cluster.local")
	bundle, err := trust.NewBundle("cluster.local", stale.Bundle.Roots())
	if err != nil {
		t.Fatal(err)
	}
	m := start(t, Options{Fetcher: ms.client, Bundle: bundle})
	if _, err := m.Get(testCtx(t), id); err != nil {
		t.Fatal(err)
	}
	if r := bundle.Roots(); len(r) != 1 || !r[0].Equal(ms.ca.Bundle.Roots()[0]) {
		t.Fatal("bundle did not take the CA's root")
	}
}

func TestStop(t *testing.T) {
	id := ident(t, "web")
	ms := newMesh(t, id)
	m, err := New(Options{Fetcher: newProbe(ms.client, make(chan struct{}))}) // fetches never finish by themselves
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	errc := make(chan error, 1)
	go func() { _, err := m.Get(testCtx(t), id); errc <- err }()
	eventually(t, "Get to wait", func() bool { return m.waiters(id) == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run returned %v", err)
	}
	if err := <-errc; !errors.Is(err, ErrStopped) {
		t.Fatalf("waiting Get: %v", err)
	}
	if _, err := m.Get(testCtx(t), ident(t, "other")); !errors.Is(err, ErrStopped) {
		t.Fatalf("Get after stop: %v", err)
	}
	if err := m.Run(context.Background()); err == nil {
		t.Fatal("a stopped manager ran again")
	}
}

func TestAuthorityFetcher(t *testing.T) {
	ca := trusttest.NewCA(t, "cluster.local")
	cp, err := trust.ControlPlaneIdentity("cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	m := start(t, Options{Fetcher: AuthorityFetcher{Authority: ca.Authority}, TTL: time.Hour})
	cert, err := m.Get(testCtx(t), cp)
	if err != nil {
		t.Fatal(err)
	}
	if cert.Leaf.URIs[0].String() != "spiffe://cluster.local/ns/causeway-system/sa/controlplane" {
		t.Fatalf("leaf %v", cert.Leaf.URIs)
	}
}

// switchable signs in process (AuthorityFetcher) unless it is down, and
// counts its calls.
type switchable struct {
	inner CertificateFetcher
	// failAt, if set, says whether call n (from 1) fails.
	failAt func(n int) bool
	mu     sync.Mutex
	calls  int
	down   bool
}

func (f *switchable) Fetch(ctx context.Context, id trust.Identity, csr []byte, ttl time.Duration) ([]string, error) {
	f.mu.Lock()
	f.calls++
	fail := f.down || f.failAt != nil && f.failAt(f.calls)
	f.mu.Unlock()
	if fail {
		return nil, errors.New("CA unreachable")
	}
	return f.inner.Fetch(ctx, id, csr, ttl)
}

func (f *switchable) setDown(down bool) {
	f.mu.Lock()
	f.down = down
	f.mu.Unlock()
}

// offsetClock is a wall clock an offset away from the system's.
type offsetClock struct{ offset atomic.Int64 }

func (c *offsetClock) now() time.Time      { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *offsetClock) set(d time.Duration) { c.offset.Store(int64(d)) }
func (c *offsetClock) at(t time.Time)      { c.set(time.Until(t)) }

// TestClockSkew: certificates are judged by the manager's clock. Ahead by
// more than their life, the fresh one from the CA is refused as expired
// (with the skew) and the one held is not handed out; behind, the CA's
// is used (peers judge it by their clocks). With the clock right again
// the held certificate serves at once.
func TestClockSkew(t *testing.T) {
	id := ident(t, "web")
	ca := trusttest.NewCA(t, "cluster.local")
	clock := &offsetClock{}
	m := start(t, Options{Fetcher: AuthorityFetcher{ca.Authority}, TTL: time.Hour, Clock: clock.now, InitialBackoff: 50 * time.Millisecond})
	ctx := testCtx(t)
	held, err := m.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}

	clock.set(2 * time.Hour)
	_, err = m.Get(ctx, id)
	var te *trust.CertificateTimeError
	if !errors.As(err, &te) || te.Reason() != trust.ReasonExpired || te.Skew() < 59*time.Minute {
		t.Fatalf("Get with the clock 2h ahead: %v, want the CA's certificate refused as expired by about an hour", err)
	}
	if s, _ := stateOf(m, id); !strings.HasPrefix(s.State, "Unavailable: ") || !strings.Contains(s.State, "certificate expired: ") {
		t.Fatalf("state with the clock ahead: %q", s.State)
	}

	clock.set(0)
	if got, err := m.Get(ctx, id); err != nil || got != held {
		t.Fatalf("Get with the clock right again: %v (the held certificate: %v)", err, got == held)
	}
	if s, _ := stateOf(m, id); s.State != StateAvailable {
		t.Fatalf("state with the clock right again: %q", s.State)
	}

	other := ident(t, "api")
	clock.set(-2 * time.Hour)
	got, err := m.Get(ctx, other)
	if err != nil {
		t.Fatalf("Get with the clock 2h behind: %v", err)
	}
	if err := trust.CheckValidity(got.Leaf, clock.now()); !errors.As(err, &te) || !te.NotYetValid() {
		t.Fatalf("the certificate handed out is %v by the skewed clock, want not yet valid", err)
	}
}

// TestExpiryMargin: a certificate within a tenth of its life (at most
// 10 s) of expiry is not handed out (it could expire during the
// handshake); Get fetches a new one instead.
func TestExpiryMargin(t *testing.T) {
	id := ident(t, "web")
	ca := trusttest.NewCA(t, "cluster.local")
	clock := &offsetClock{}
	m := start(t, Options{Fetcher: AuthorityFetcher{ca.Authority}, TTL: 10 * time.Minute, Clock: clock.now})
	ctx := testCtx(t)
	first, err := m.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	clock.at(first.Leaf.NotAfter.Add(-20 * time.Second)) // outside the margin
	if again, err := m.Get(ctx, id); err != nil || again != first {
		t.Fatalf("Get 20 s before expiry: %v (the same certificate: %v)", err, again == first)
	}
	// Within it: Get asks the CA, whose answer (10 minutes from the
	// system's time) is no better by this clock, and says so.
	clock.at(first.Leaf.NotAfter.Add(-5 * time.Second))
	if got, err := m.Get(ctx, id); err == nil || !strings.Contains(err.Error(), "within 10s of this clock's") {
		t.Fatalf("Get 5 s before expiry: %v (the same certificate: %v)", err, got == first)
	}
	if s, _ := stateOf(m, id); !strings.HasPrefix(s.State, "Unavailable: ") {
		t.Fatalf("state 5 s before expiry: %q", s.State)
	}
}

// TestBackoffBoundedByValidity: a refresh failing with a backoff longer
// than the certificate's remaining life is retried before expiry, so the
// CA being back by then means no gap (2 s certificates, a 1.5 s backoff).
func TestBackoffBoundedByValidity(t *testing.T) {
	id := ident(t, "web")
	ca := trusttest.NewCA(t, "cluster.local")
	f := &switchable{inner: AuthorityFetcher{ca.Authority}, failAt: func(n int) bool { return n == 2 }}
	m := start(t, Options{Fetcher: f, TTL: 2 * time.Second, InitialBackoff: 1500 * time.Millisecond, MaxBackoff: 1500 * time.Millisecond})
	ctx := testCtx(t)
	if _, err := m.Get(ctx, id); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if _, err := m.Get(ctx, id); err != nil {
			f.mu.Lock()
			calls := f.calls
			f.mu.Unlock()
			t.Fatalf("after %d fetches: %v", calls, err)
		}
	}
}

// TestRetryWhenTheCAIsBack: one identity's fetch succeeding again brings
// forward the retries of the others, which would otherwise wait out their
// backoff (5 s here).
func TestRetryWhenTheCAIsBack(t *testing.T) {
	a, b := ident(t, "a"), ident(t, "b")
	ca := trusttest.NewCA(t, "cluster.local")
	f := &switchable{inner: AuthorityFetcher{ca.Authority}, down: true}
	m := start(t, Options{Fetcher: f, InitialBackoff: 5 * time.Second, MaxBackoff: 5 * time.Second})
	ctx := testCtx(t)
	if _, err := m.Get(ctx, a); err == nil {
		t.Fatal("Get succeeded with the CA down")
	}
	f.setDown(false)
	if _, err := m.Get(ctx, b); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	for {
		if s, _ := stateOf(m, a); s.State == StateAvailable {
			break
		}
		if time.Since(back) > 3*time.Second {
			t.Fatalf("%s still not refreshed %v after the CA answered %s", a, time.Since(back).Round(time.Millisecond), b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
