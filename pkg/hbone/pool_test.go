package hbone

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/pkg/trust"
)

// serverConnStreams returns the number of open streams on each of the
// server's connections.
func serverConnStreams(s *Server) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int
	for c := range s.conns {
		c.mu.Lock()
		out = append(out, len(c.streams))
		c.mu.Unlock()
	}
	return out
}

// countingDialer counts TCP connections the pool opens.
func countingDialer(n *atomic.Int64) func(ctx context.Context, local netip.Addr, remote netip.AddrPort) (net.Conn, error) {
	return func(ctx context.Context, local netip.Addr, remote netip.AddrPort) (net.Conn, error) {
		n.Add(1)
		return DialFrom(ctx, local, remote)
	}
}

// 1,000 concurrent tunnels to one peer spread over at least 10 connections
// (at most 100 streams each) and all complete.
func TestThousandConcurrentTunnels(t *testing.T) {
	const tunnels = 1000
	m := newMesh(t)
	up := upstream(t, echo)
	srv, addr := startServer(t, m, &dialHandler{}, nil)
	var dials atomic.Int64
	p := newPool(t, m, func(o *PoolOptions) { o.Dial = countingDialer(&dials) })
	tg := m.target(addr, up.String())

	var (
		opened, finished sync.WaitGroup
		release          = make(chan struct{})
		failures         atomic.Int64
		firstErr         sync.Once
		errMsg           atomic.Value
	)
	fail := func(err error) {
		failures.Add(1)
		firstErr.Do(func() { errMsg.Store(err.Error()) })
	}
	opened.Add(tunnels)
	finished.Add(tunnels)
	for i := 0; i < tunnels; i++ {
		go func() {
			defer finished.Done()
			c, err := p.Dial(ctxTimeout(t, 60*time.Second), tg)
			opened.Done()
			if err != nil {
				fail(err)
				return
			}
			defer c.Close()
			<-release // keep every tunnel open at once
			msg := fmt.Sprintf("tunnel %d", i)
			c.SetDeadline(time.Now().Add(60 * time.Second))
			if _, err := c.Write([]byte(msg)); err != nil {
				fail(err)
				return
			}
			c.(halfCloser).CloseWrite()
			got, err := io.ReadAll(c)
			if err != nil || string(got) != msg {
				fail(fmt.Errorf("tunnel %d: got %q, %v", i, got, err))
			}
		}()
	}
	opened.Wait()
	if n := failures.Load(); n > 0 {
		close(release)
		finished.Wait()
		t.Fatalf("%d dials failed; first: %v", n, errMsg.Load())
	}
	stats := p.Stats()
	perConn := serverConnStreams(srv)
	close(release)
	finished.Wait()
	if n := failures.Load(); n > 0 {
		t.Fatalf("%d tunnels failed; first: %v", n, errMsg.Load())
	}
	if stats.Tunnels != tunnels || stats.Connections < 10 {
		t.Fatalf("pool with all tunnels open: %+v, want %d tunnels on >= 10 connections", stats, tunnels)
	}
	total := 0
	for _, n := range perConn {
		if n > DefaultMaxStreamsPerConn {
			t.Errorf("a connection carried %d streams, limit %d", n, DefaultMaxStreamsPerConn)
		}
		total += n
	}
	if total != tunnels || len(perConn) < 10 {
		t.Fatalf("server saw %d streams on %d connections", total, len(perConn))
	}
	if d := dials.Load(); d != int64(len(perConn)) {
		t.Errorf("pool dialed %d connections for %d in use", d, len(perConn))
	}
}

// The server's SETTINGS_MAX_CONCURRENT_STREAMS caps a connection below the
// pool's own limit.
func TestPeerStreamLimit(t *testing.T) {
	m := newMesh(t)
	up := upstream(t, echo)
	srv, addr := startServer(t, m, &dialHandler{}, func(o *ServerOptions) { o.MaxConcurrentStreams = 5 })
	p := newPool(t, m, nil)
	tg := m.target(addr, up.String())
	var conns []net.Conn
	for i := 0; i < 12; i++ {
		c, err := p.Dial(ctxTimeout(t, 30*time.Second), tg)
		if err != nil {
			t.Fatalf("Dial %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	for _, n := range serverConnStreams(srv) {
		if n > 5 {
			t.Fatalf("connection carries %d streams, server allows 5", n)
		}
	}
	if got := len(serverConnStreams(srv)); got < 3 {
		t.Fatalf("12 tunnels on %d connections with a limit of 5", got)
	}
	for _, c := range conns {
		c.Close()
	}
}

// Concurrent dials for one key share a single connection attempt.
func TestOneDialPerKey(t *testing.T) {
	m := newMesh(t)
	up := upstream(t, echo)
	_, addr := startServer(t, m, &dialHandler{}, nil)
	var dials atomic.Int64
	p := newPool(t, m, func(o *PoolOptions) { o.Dial = countingDialer(&dials) })
	tg := m.target(addr, up.String())
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := p.Dial(ctxTimeout(t, 30*time.Second), tg)
			if err != nil {
				t.Error(err)
				return
			}
			c.Close()
		}()
	}
	wg.Wait()
	if d := dials.Load(); d != 1 {
		t.Fatalf("50 concurrent dials opened %d connections, want 1", d)
	}
}

// A failing dial fails everyone waiting for it, with the address in the error.
func TestDialErrorNamesAddress(t *testing.T) {
	m := newMesh(t)
	ln := listenLocal(t)
	addr := addrOf(ln)
	ln.Close() // nothing listens there now
	p := newPool(t, m, nil)
	_, err := p.Dial(ctxTimeout(t, 30*time.Second), m.target(addr, "127.0.0.1:80"))
	if err == nil || !strings.Contains(err.Error(), "dial "+addr.String()) {
		t.Fatalf("error %v does not name the dial to %s", err, addr)
	}
}

// Idle connections leave the pool after IdleTimeout; the next tunnel dials anew.
func TestIdleTimeoutEvicts(t *testing.T) {
	m := newMesh(t)
	up := upstream(t, echo)
	_, addr := startServer(t, m, &dialHandler{}, nil)
	var dials atomic.Int64
	p := newPool(t, m, func(o *PoolOptions) {
		o.IdleTimeout = 200 * time.Millisecond
		o.Dial = countingDialer(&dials)
	})
	tg := m.target(addr, up.String())
	c, err := p.Dial(ctxTimeout(t, 30*time.Second), tg)
	if err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.Connections != 1 {
		t.Fatalf("stats %+v", s)
	}
	// An open tunnel keeps the connection, however long it is quiet.
	time.Sleep(500 * time.Millisecond)
	if s := p.Stats(); s.Connections != 1 {
		t.Fatalf("connection with an open tunnel was evicted: %+v", s)
	}
	c.Close()
	eventually(t, 30*time.Second, "idle connection eviction", func() bool { return p.Stats().Connections == 0 })
	c, err = p.Dial(ctxTimeout(t, 30*time.Second), tg)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if d := dials.Load(); d != 2 {
		t.Fatalf("dials = %d, want 2 (the evicted connection must not be reused)", d)
	}
}

// A GOAWAY takes the connection out of the pool at once; tunnels on it
// finish, new ones go to a new connection.
func TestGoAwayEvicts(t *testing.T) {
	m := newMesh(t)
	up := upstream(t, echo)
	srv, addr := startServer(t, m, &dialHandler{}, nil)
	var dials atomic.Int64
	p := newPool(t, m, func(o *PoolOptions) { o.Dial = countingDialer(&dials) })
	tg := m.target(addr, up.String())
	old := dialTunnel(t, p, tg)

	srv.mu.Lock()
	for c := range srv.conns {
		c.shutdown() // GOAWAY without stopping the server
	}
	srv.mu.Unlock()
	eventually(t, 30*time.Second, "GOAWAY eviction", func() bool { return p.Stats().Connections == 0 })

	fresh := dialTunnel(t, p, tg)
	if d := dials.Load(); d != 2 {
		t.Fatalf("dials = %d, want 2", d)
	}
	for _, c := range []halfCloser{old, fresh} {
		c.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		c.CloseWrite()
		if got, err := io.ReadAll(c); err != nil || string(got) != "ping" {
			t.Fatalf("tunnel after GOAWAY: %q, %v", got, err)
		}
	}
}

// freezable forwards TCP between the pool and the server until frozen,
// then swallows everything (a peer that vanished without a FIN).
type freezable struct {
	ln     net.Listener
	target string
	frozen atomic.Bool
}

func newFreezable(t *testing.T, target string) *freezable {
	f := &freezable{ln: listenLocal(t), target: target}
	t.Cleanup(func() { f.ln.Close() })
	go func() {
		for {
			c, err := f.ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			go f.pipe(c, s)
			go f.pipe(s, c)
		}
	}()
	return f
}

func (f *freezable) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !f.frozen.Load() {
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// A connection whose PING goes unanswered is closed and never reused.
func TestFailedPingEvicts(t *testing.T) {
	m := newMesh(t)
	up := upstream(t, echo)
	_, addr := startServer(t, m, &dialHandler{}, func(o *ServerOptions) { o.ReadIdleTimeout = -1 })
	proxy := newFreezable(t, addr.String())
	var dials atomic.Int64
	p := newPool(t, m, func(o *PoolOptions) {
		o.ReadIdleTimeout = 100 * time.Millisecond
		o.PingTimeout = 200 * time.Millisecond
		o.Dial = countingDialer(&dials)
	})
	tg := m.target(addrOf(proxy.ln), up.String())
	c := dialTunnel(t, p, tg)
	proxy.frozen.Store(true)
	eventually(t, 30*time.Second, "eviction after unanswered PING", func() bool { return p.Stats().Connections == 0 })
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("tunnel on a dead connection read %v, want an error", err)
	}
	proxy.frozen.Store(false)
	fresh := dialTunnel(t, p, tg)
	fresh.Close()
	if d := dials.Load(); d != 2 {
		t.Fatalf("dials = %d, want 2", d)
	}
}

// Keys separate source identities, expected identities and next hops.
func TestPoolKeys(t *testing.T) {
	m := newMesh(t)
	up := upstream(t, echo)
	_, addr := startServer(t, m, &dialHandler{}, nil)
	var dials atomic.Int64
	p := newPool(t, m, func(o *PoolOptions) { o.Dial = countingDialer(&dials) })

	base := m.target(addr, up.String())
	tlsOnly := base
	tlsOnly.Source, tlsOnly.Cert = trust.Identity{}, nil
	twoExpected := base
	twoExpected.Expected = []trust.Identity{m.clientID, m.serverID}
	reordered := base
	reordered.Expected = []trust.Identity{m.serverID, m.clientID}

	for _, tg := range []Target{base, base, tlsOnly, tlsOnly, twoExpected, reordered} {
		c, err := p.Dial(ctxTimeout(t, 30*time.Second), tg)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	// base, tlsOnly, {client,server}: three keys.
	if d := dials.Load(); d != 3 {
		t.Fatalf("dials = %d, want 3", d)
	}
}

// A tunnel with a local address leaves from it (the server sees it as the
// remote address) and is pooled apart from tunnels without one.
func TestLocalAddress(t *testing.T) {
	m := newMesh(t)
	up := upstream(t, echo)
	h := &dialHandler{}
	_, addr := startServer(t, m, h, nil)
	var dials atomic.Int64
	p := newPool(t, m, func(o *PoolOptions) { o.Dial = countingDialer(&dials) })
	for _, local := range []string{"127.0.77.1", "127.0.77.2", "127.0.77.1"} {
		tg := m.target(addr, up.String())
		tg.LocalAddr = netip.MustParseAddr(local)
		c, err := p.Dial(ctxTimeout(t, 30*time.Second), tg)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if got := h.lastRequest().Remote.Addr().String(); got != local {
			t.Fatalf("the server saw the tunnel from %s, want %s", got, local)
		}
	}
	if d := dials.Load(); d != 2 {
		t.Fatalf("dials = %d, want one connection per local address", d)
	}
}

// A certificate that does not match Source is refused before connecting.
func TestSourceCertMismatch(t *testing.T) {
	m := newMesh(t)
	_, addr := startServer(t, m, &dialHandler{}, nil)
	p := newPool(t, m, nil)
	tg := m.target(addr, "127.0.0.1:80")
	tg.Cert = func() (*tls.Certificate, error) { return m.serverCert, nil }
	_, err := p.Dial(ctxTimeout(t, 30*time.Second), tg)
	if err == nil || !strings.Contains(err.Error(), "names "+m.serverID.String()) {
		t.Fatalf("Dial with another identity's certificate: %v", err)
	}
}

func TestTargetValidation(t *testing.T) {
	m := newMesh(t)
	p := newPool(t, m, nil)
	addr := addrOf(listenLocal(t))
	good := m.target(addr, "10.0.0.1:80")
	cases := map[string]func(*Target){
		"no address":    func(tg *Target) { tg.Address = netip.AddrPort{} },
		"bad authority": func(tg *Target) { tg.Authority = "10.0.0.1" },
		"no expected":   func(tg *Target) { tg.Expected = nil },
		"cert only":     func(tg *Target) { tg.Source = trust.Identity{} },
		"source only":   func(tg *Target) { tg.Cert = nil },
		"bad baggage":   func(tg *Target) { tg.Baggage = "a\r\nb" },
	}
	for name, mutate := range cases {
		tg := good
		mutate(&tg)
		if _, err := p.Dial(ctxTimeout(t, 30*time.Second), tg); err == nil {
			t.Errorf("%s: Dial succeeded", name)
		}
	}
}

// Pool.Close resets open tunnels and fails later dials.
// CloseFrom ends the connections from one local address and no other.
func TestPoolCloseFrom(t *testing.T) {
	m := newMesh(t)
	up := upstream(t, echo)
	_, addr := startServer(t, m, &dialHandler{}, nil)
	var dials atomic.Int64
	p := newPool(t, m, func(o *PoolOptions) { o.Dial = countingDialer(&dials) })
	tunnels := map[string]net.Conn{}
	for _, local := range []string{"127.0.77.1", "127.0.77.2"} {
		tg := m.target(addr, up.String())
		tg.LocalAddr = netip.MustParseAddr(local)
		tunnels[local] = dialTunnel(t, p, tg)
	}
	p.CloseFrom(netip.MustParseAddr("127.0.77.1"))
	gone := tunnels["127.0.77.1"]
	gone.SetReadDeadline(time.Now().Add(10 * time.Second))
	var ne net.Error
	if _, err := gone.Read(make([]byte, 1)); err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("a tunnel from the closed address is still open: %v", err)
	}
	kept := tunnels["127.0.77.2"]
	kept.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := kept.Write([]byte("x")); err != nil {
		t.Fatalf("a tunnel from another address: %v", err)
	}
	if _, err := kept.Read(make([]byte, 1)); err != nil {
		t.Fatalf("a tunnel from another address: %v", err)
	}
	eventually(t, 5*time.Second, "the closed connection to leave the pool", func() bool { return p.Stats().Connections == 1 })
	tg := m.target(addr, up.String())
	tg.LocalAddr = netip.MustParseAddr("127.0.77.1")
	dialTunnel(t, p, tg)
	if d := dials.Load(); d != 3 {
		t.Errorf("dials = %d, want a new connection from the closed address", d)
	}
}

func TestPoolClose(t *testing.T) {
	m := newMesh(t)
	up := upstream(t, echo)
	_, addr := startServer(t, m, &dialHandler{}, nil)
	p := newPool(t, m, nil)
	tg := m.target(addr, up.String())
	c := dialTunnel(t, p, tg)
	p.Close()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("read on a closed pool's tunnel: %v", err)
	}
	if _, err := p.Dial(ctxTimeout(t, 30*time.Second), tg); !errors.Is(err, errPoolClosed) {
		t.Fatalf("Dial after Close: %v", err)
	}
}

// A connection the server closes abruptly leaves the pool; the next tunnel
// dials anew (here to a new server on the same address).
func TestClosedConnEvicted(t *testing.T) {
	m := newMesh(t)
	up := upstream(t, echo)
	ln := listenLocal(t)
	addr := addrOf(ln)
	srv := startServerOn(t, m, ln, &dialHandler{}, nil)
	var dials atomic.Int64
	p := newPool(t, m, func(o *PoolOptions) { o.Dial = countingDialer(&dials) })
	tg := m.target(addr, up.String())
	dialTunnel(t, p, tg).Close()
	srv.Close()
	eventually(t, 30*time.Second, "closed connection eviction", func() bool { return p.Stats().Connections == 0 })
	ln2, err := net.Listen("tcp", addr.String())
	if err != nil {
		t.Fatalf("relisten on %s: %v", addr, err)
	}
	startServerOn(t, m, ln2, &dialHandler{}, nil)
	dialTunnel(t, p, tg).Close()
	if d := dials.Load(); d != 2 {
		t.Fatalf("dials = %d, want 2", d)
	}
}
