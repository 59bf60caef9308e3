package hbone

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/causeway-mesh/causeway/pkg/trust"
)

// A server whose identity is not the expected one is refused during the
// TLS handshake: the handler never runs and no byte reaches the upstream.
func TestSANMismatchRefusedBeforeData(t *testing.T) {
	m := newMesh(t)
	var upstreamConns atomic.Int64
	up := upstream(t, func(c *net.TCPConn) { upstreamConns.Add(1) })
	h := &dialHandler{}
	_, addr := startServer(t, m, h, nil)
	p := newPool(t, m, nil)
	tg := m.target(addr, up.String())
	want := trustID(t, "spiffe://"+td+"/ns/dst/sa/someone-else")
	tg.Expected = []trust.Identity{want}

	_, err := p.Dial(ctxTimeout(t, 30*time.Second), tg)
	if err == nil {
		t.Fatal("Dial to a server with the wrong identity succeeded")
	}
	for _, s := range []string{"TLS handshake", want.String(), m.serverID.String(), addr.String()} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
	time.Sleep(100 * time.Millisecond) // let anything in flight land
	if n := h.opened.Load(); n != 0 {
		t.Fatalf("handler called %d times", n)
	}
	if n := upstreamConns.Load(); n != 0 {
		t.Fatalf("upstream saw %d connections", n)
	}
	if s := p.Stats(); s.Connections != 0 {
		t.Fatalf("failed connection stayed in the pool: %+v", s)
	}
}

func trustID(t *testing.T, s string) trust.Identity {
	id, err := trust.ParseIdentity(s)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// rawClient is x/net's HTTP/2 transport dialing the test server, for
// requests the pool never sends (other methods, odd authorities, any
// headers).
func rawClient(t *testing.T, m *mesh, addr netip.AddrPort, cert *tls.Certificate) *http2.Transport {
	var getCert func() (*tls.Certificate, error)
	if cert != nil {
		getCert = func() (*tls.Certificate, error) { return cert, nil }
	}
	cfg := trust.ClientConfig(m.ca.Bundle, getCert, []trust.Identity{m.serverID})
	tr := &http2.Transport{
		DialTLSContext: func(ctx context.Context, _, _ string, _ *tls.Config) (net.Conn, error) {
			var d tls.Dialer
			d.Config = cfg
			return d.DialContext(ctx, "tcp", addr.String())
		},
	}
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

func connectRequest(ctx context.Context, authority string, h http.Header) *http.Request {
	pr, _ := io.Pipe()
	req := (&http.Request{
		Method: http.MethodConnect,
		Host:   authority,
		URL:    &url.URL{Scheme: "https", Host: authority},
		Header: h,
		Body:   pr,
	}).WithContext(ctx)
	return req
}

// A TLS-only client is unauthenticated, whatever headers it sends.
func TestUnauthenticatedPeerIgnoresHeaders(t *testing.T) {
	m := newMesh(t)
	up := upstream(t, echo)
	h := &dialHandler{}
	_, addr := startServer(t, m, h, nil)

	// Through the pool, TLS-only with Forwarded and baggage.
	p := newPool(t, m, nil)
	tg := m.target(addr, up.String())
	tg.Source, tg.Cert = trust.Identity{}, nil
	tg.Forwarded = netip.MustParseAddrPort("10.1.2.3:4567")
	tg.Baggage = "k8s.namespace.name=src,k8s.serviceaccount.name=client"
	c := dialTunnel(t, p, tg)
	c.Close()
	r := h.lastRequest()
	if r.Peer.Authenticated() {
		t.Fatalf("TLS-only client seen as %v", r.Peer)
	}
	if r.Forwarded != tg.Forwarded || r.Baggage != tg.Baggage {
		t.Fatalf("metadata not passed through: %+v", r)
	}

	// Through a raw client that claims an identity in every header it can.
	tr := rawClient(t, m, addr, nil)
	hdr := http.Header{
		"Forwarded":                {`for="10.9.9.9:1";by="spiffe://cluster.local/ns/src/sa/client"`},
		"X-Forwarded-Client-Cert":  {`By=spiffe://cluster.local/ns/dst/sa/server;URI=spiffe://cluster.local/ns/src/sa/client`},
		"Baggage":                  {"principal=spiffe://cluster.local/ns/src/sa/client"},
		"X-Forwarded-For":          {"10.9.9.9"},
		"X-Causeway-Peer-Identity": {m.clientID.String()},
	}
	resp, err := tr.RoundTrip(connectRequest(ctxTimeout(t, 30*time.Second), up.String(), hdr))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if r := h.lastRequest(); r.Peer.Authenticated() {
		t.Fatalf("headers made the peer %v", r.Peer)
	} else if r.Forwarded != netip.MustParseAddrPort("10.9.9.9:1") {
		t.Fatalf("Forwarded parsed as %v", r.Forwarded)
	}

	// The control: an mTLS client is its certificate's identity.
	c = dialTunnel(t, p, m.target(addr, up.String()))
	c.Close()
	if id, ok := h.lastRequest().Peer.Identity(); !ok || id != m.clientID {
		t.Fatalf("mTLS client seen as %v", h.lastRequest().Peer)
	}
	if r := h.lastRequest(); r.Local != addr || !r.Remote.Addr().IsLoopback() || r.Authority != up {
		t.Fatalf("addresses: %+v", r)
	}
}

// A server that requires client certificates refuses TLS-only clients
// during the handshake.
func TestRequireClientCert(t *testing.T) {
	m := newMesh(t)
	h := &dialHandler{}
	_, addr := startServer(t, m, h, func(o *ServerOptions) { o.TLS = m.serverTLS(trust.RequireClientCert) })
	p := newPool(t, m, nil)
	tg := m.target(addr, "127.0.0.1:9")
	tg.Source, tg.Cert = trust.Identity{}, nil
	if _, err := p.Dial(ctxTimeout(t, 30*time.Second), tg); err == nil {
		t.Fatal("TLS-only client accepted by a server requiring certificates")
	}
	if h.opened.Load() != 0 {
		t.Fatal("handler called")
	}
}

// Handler errors map to statuses; the reason reaches the client, internal
// error text does not.
func TestStatusMapping(t *testing.T) {
	m := newMesh(t)
	h := HandlerFunc(func(ctx context.Context, r *Request) (Stream, error) {
		switch r.Authority.Port() {
		case 1:
			return nil, Deny("policy says no")
		case 2:
			return nil, Unavailable("no endpoint for 10.0.0.2:2")
		case 3:
			return nil, BadRequest("port 3 is not a service")
		case 4:
			return nil, errors.New("internal: dial tcp 10.244.1.7:4: secret detail")
		case 5:
			return nil, fmtWrap(Deny("wrapped denial"))
		}
		return nil, errors.New("unexpected")
	})
	_, addr := startServer(t, m, h, nil)
	p := newPool(t, m, nil)
	cases := []struct {
		port   int
		code   int
		reason string
	}{
		{1, 401, "policy says no"},
		{2, 503, "no endpoint for 10.0.0.2:2"},
		{3, 400, "port 3 is not a service"},
		{4, 503, "upstream unavailable"},
		{5, 401, "wrapped denial"},
	}
	for _, tc := range cases {
		authority := netip.AddrPortFrom(netip.MustParseAddr("10.0.0.2"), uint16(tc.port)).String()
		_, err := p.Dial(ctxTimeout(t, 30*time.Second), m.target(addr, authority))
		var se *StatusError
		if !errors.As(err, &se) || se.Code != tc.code || se.Reason != tc.reason {
			t.Errorf("port %d: got %v, want %d %q", tc.port, err, tc.code, tc.reason)
			continue
		}
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("internal error text leaked: %v", err)
		}
	}
}

func fmtWrap(err error) error { return &wrapped{err} }

type wrapped struct{ err error }

func (w *wrapped) Error() string { return "wrapped: " + w.err.Error() }
func (w *wrapped) Unwrap() error { return w.err }

// Requests other than CONNECT get 405; bad authorities 400; hostnames only
// when allowed.
func TestRequestValidation(t *testing.T) {
	m := newMesh(t)
	h := &dialHandler{}
	_, addr := startServer(t, m, h, nil)
	tr := rawClient(t, m, addr, m.clientCert)

	get, _ := http.NewRequest(http.MethodGet, "https://"+addr.String()+"/", nil)
	resp, err := tr.RoundTrip(get.WithContext(ctxTimeout(t, 30*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("GET: status %d", resp.StatusCode)
	}
	for _, authority := range []string{
		"example.com:80", "10.0.0.1", "010.0.0.1:80", "10.0.0.1:0", "10.0.0.1:080",
		"10.0.0.1:65536", "[::ffff:10.0.0.1]:80", "::1:80", "[fe80::1%25eth0]:80",
	} {
		resp, err := tr.RoundTrip(connectRequest(ctxTimeout(t, 30*time.Second), authority, nil))
		if err != nil {
			t.Errorf("%s: %v", authority, err)
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || resp.Header.Get(ReasonHeader) == "" {
			t.Errorf("%s: status %d reason %q, want 400 with a reason", authority, resp.StatusCode, resp.Header.Get(ReasonHeader))
		}
	}
	if n := h.opened.Load(); n != 0 {
		t.Fatalf("handler called %d times for invalid requests", n)
	}

	// With AllowHostnames, a name reaches the handler as Host.
	var host atomic.Value
	_, addr2 := startServer(t, m, HandlerFunc(func(ctx context.Context, r *Request) (Stream, error) {
		host.Store(r.Host)
		return nil, Deny("just looking")
	}), func(o *ServerOptions) { o.AllowHostnames = true })
	tr2 := rawClient(t, m, addr2, m.clientCert)
	resp, err = tr2.RoundTrip(connectRequest(ctxTimeout(t, 30*time.Second), "echo.ns.svc.cluster.local:80", nil))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 || host.Load() != "echo.ns.svc.cluster.local:80" {
		t.Fatalf("hostname authority: status %d host %v", resp.StatusCode, host.Load())
	}
}

// Shutdown sends GOAWAY: the pool moves new tunnels to a new connection
// (here a new server on the same address) while the in-flight tunnel
// finishes, and Shutdown returns once it has.
func TestShutdownDrains(t *testing.T) {
	m := newMesh(t)
	up := upstream(t, echo)
	ln := listenLocal(t)
	addr := addrOf(ln)
	h1 := &dialHandler{}
	srv1 := startServerOn(t, m, ln, h1, nil)
	p := newPool(t, m, nil)
	tg := m.target(addr, up.String())
	inflight := dialTunnel(t, p, tg)

	shutdownErr := make(chan error, 1)
	go func() { shutdownErr <- srv1.Shutdown(ctxTimeout(t, 30*time.Second)) }()
	eventually(t, 30*time.Second, "GOAWAY to reach the pool", func() bool { return p.Stats().Connections == 0 })

	ln2, err := net.Listen("tcp", addr.String())
	if err != nil {
		t.Fatalf("relisten on %s: %v", addr, err)
	}
	h2 := &dialHandler{}
	startServerOn(t, m, ln2, h2, nil)
	fresh := dialTunnel(t, p, tg)
	if h2.opened.Load() != 1 || h1.opened.Load() != 1 {
		t.Fatalf("new tunnel went to the draining server (old %d, new %d)", h1.opened.Load(), h2.opened.Load())
	}

	select {
	case err := <-shutdownErr:
		t.Fatalf("Shutdown returned %v with a tunnel in flight", err)
	case <-time.After(100 * time.Millisecond):
	}
	for _, c := range []halfCloser{inflight, fresh} {
		c.SetDeadline(time.Now().Add(30 * time.Second))
		c.Write([]byte("drain"))
		c.CloseWrite()
		if got, err := io.ReadAll(c); err != nil || string(got) != "drain" {
			t.Fatalf("tunnel during drain: %q, %v", got, err)
		}
		c.Close()
	}
	select {
	case err := <-shutdownErr:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Shutdown did not return after the last tunnel")
	}
}

// When the deadline passes first, Shutdown closes what is left.
func TestShutdownDeadline(t *testing.T) {
	m := newMesh(t)
	up := upstream(t, echo)
	srv, addr := startServer(t, m, &dialHandler{}, nil)
	p := newPool(t, m, nil)
	c := dialTunnel(t, p, m.target(addr, up.String()))
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := srv.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown = %v, want deadline exceeded", err)
	}
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("tunnel survived a forced shutdown: %v", err)
	}
}

// A stream reset by the client cancels the handler's context.
func TestResetCancelsHandler(t *testing.T) {
	m := newMesh(t)
	cancelled := make(chan struct{})
	h := HandlerFunc(func(ctx context.Context, r *Request) (Stream, error) {
		return StreamFunc(func(ctx context.Context, tunnel net.Conn) {
			<-ctx.Done()
			close(cancelled)
		}), nil
	})
	_, addr := startServer(t, m, h, nil)
	p := newPool(t, m, nil)
	c := dialTunnel(t, p, m.target(addr, "10.0.0.1:80"))
	c.Close()
	select {
	case <-cancelled:
	case <-time.After(30 * time.Second):
		t.Fatal("handler context not cancelled by the client's reset")
	}
}
