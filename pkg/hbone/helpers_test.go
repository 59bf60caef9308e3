package hbone

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/causeway-mesh/causeway/pkg/internal/testnet"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
)

const td = "cluster.local"

// mesh is a CA with a server and a client identity.
type mesh struct {
	ca         *trusttest.CA
	serverID   trust.Identity
	clientID   trust.Identity
	serverCert *tls.Certificate
	clientCert *tls.Certificate
}

func newMesh(t testing.TB) *mesh {
	t.Helper()
	ca := trusttest.NewCA(t, td)
	m := &mesh{
		ca:       ca,
		serverID: trusttest.Identity(t, "spiffe://"+td+"/ns/dst/sa/server"),
		clientID: trusttest.Identity(t, "spiffe://"+td+"/ns/src/sa/client"),
	}
	m.serverCert = ca.Certificate(t, m.serverID, 0)
	m.clientCert = ca.Certificate(t, m.clientID, 0)
	return m
}

func (m *mesh) serverTLS(auth trust.ClientAuth) *tls.Config {
	return trust.ServerConfig(m.ca.Bundle, func(net.Addr) (*tls.Certificate, error) { return m.serverCert, nil }, auth)
}

// testLogger logs at info level, debug with HBONE_TEST_DEBUG=1.
func testLogger(t testing.TB) *zap.Logger {
	level := zap.InfoLevel
	if os.Getenv("HBONE_TEST_DEBUG") != "" {
		level = zap.DebugLevel
	}
	return zaptest.NewLogger(t, zaptest.Level(level))
}

func listenLocal(t testing.TB) net.Listener {
	t.Helper()
	return testnet.Listen(t, "127.0.0.1:0")
}

func addrOf(ln net.Listener) netip.AddrPort {
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// startServer serves h on a fresh listener; the server is shut down at the end.
func startServer(t testing.TB, m *mesh, h Handler, mutate func(*ServerOptions)) (*Server, netip.AddrPort) {
	t.Helper()
	ln := listenLocal(t)
	return startServerOn(t, m, ln, h, mutate), addrOf(ln)
}

func startServerOn(t testing.TB, m *mesh, ln net.Listener, h Handler, mutate func(*ServerOptions)) *Server {
	t.Helper()
	opts := ServerOptions{TLS: m.serverTLS(trust.VerifyIfGiven), Handler: h, Logger: testLogger(t)}
	if mutate != nil {
		mutate(&opts)
	}
	srv, err := NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-errc; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve returned %v", err)
		}
	})
	return srv
}

func newPool(t testing.TB, m *mesh, mutate func(*PoolOptions)) *Pool {
	t.Helper()
	opts := PoolOptions{Bundle: m.ca.Bundle, Logger: testLogger(t)}
	if mutate != nil {
		mutate(&opts)
	}
	p, err := NewPool(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// target is an mTLS tunnel as the client identity to authority via addr.
func (m *mesh) target(addr netip.AddrPort, authority string) Target {
	return Target{
		Address:   addr,
		Authority: authority,
		Source:    m.clientID,
		Cert:      func() (*tls.Certificate, error) { return m.clientCert, nil },
		Expected:  []trust.Identity{m.serverID},
	}
}

// dialHandler connects to the request's authority and splices.
type dialHandler struct {
	opened atomic.Int64
	mu     sync.Mutex
	last   *Request
}

func (h *dialHandler) Open(ctx context.Context, r *Request) (Stream, error) {
	h.opened.Add(1)
	h.mu.Lock()
	cp := *r
	h.last = &cp
	h.mu.Unlock()
	var d net.Dialer
	up, err := d.DialContext(ctx, "tcp", r.Authority.String())
	if err != nil {
		return nil, Unavailable("cannot reach " + r.Authority.String())
	}
	return Splice(up), nil
}

func (h *dialHandler) lastRequest() *Request {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last
}

// upstream runs fn for every connection accepted on a local listener.
func upstream(t testing.TB, fn func(c *net.TCPConn)) netip.AddrPort {
	t.Helper()
	ln := listenLocal(t)
	testnet.Serve(t, ln, func(c net.Conn) { fn(c.(*net.TCPConn)) })
	return addrOf(ln)
}

// echo copies everything back and half-closes at EOF.
func echo(c *net.TCPConn) {
	io.Copy(c, c)
	c.CloseWrite()
}

func ctxTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls cond until it holds or the generous timeout expires.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
