package l7

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/net/http2"

	"github.com/causeway-mesh/causeway/pkg/internal/testnet"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// echo is what a test backend answers: what it received.
type echo struct {
	Backend string      `json:"backend"`
	Method  string      `json:"method"`
	Path    string      `json:"path"`
	Query   string      `json:"query"`
	Host    string      `json:"host"`
	Proto   string      `json:"proto"`
	Header  http.Header `json:"header"`
	Body    string      `json:"body"`
	Trailer http.Header `json:"trailer"`
}

// testBackend is a real HTTP server on 127.0.0.1 standing for a workload.
type testBackend struct {
	name  string
	srv   *httptest.Server
	addr  netip.AddrPort
	count atomic.Int64
	// behave, when set, may answer request n (1-based) itself.
	mu     sync.Mutex
	behave func(n int64, w http.ResponseWriter, r *http.Request) bool
	got    chan echo // every request, when non-nil (buffered)
}

func (b *testBackend) setBehave(f func(n int64, w http.ResponseWriter, r *http.Request) bool) {
	b.mu.Lock()
	b.behave = f
	b.mu.Unlock()
}

func (b *testBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := b.count.Add(1)
	body, _ := io.ReadAll(r.Body)
	e := echo{Backend: b.name, Method: r.Method, Path: r.URL.EscapedPath(), Query: r.URL.RawQuery, Host: r.Host, Proto: r.Proto, Header: r.Header, Body: string(body), Trailer: r.Trailer}
	if b.got != nil {
		select {
		case b.got <- e:
		default:
		}
	}
	b.mu.Lock()
	f := b.behave
	b.mu.Unlock()
	if f != nil && f(n, w, r) {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Backend", b.name)
	_ = json.NewEncoder(w).Encode(e)
}

// stall blocks until the request is abandoned (or a long time passes).
func stall(w http.ResponseWriter, r *http.Request) {
	select {
	case <-r.Context().Done():
	case <-time.After(20 * time.Second):
	}
}

// testDialer dials endpoints directly (standing in for HBONE) and counts.
type testDialer struct {
	mu    sync.Mutex
	dials map[netip.AddrPort]int
	seen  []Target
	// slow, when set, makes a dial take that long, as a tunnel handshake
	// to a busy node can; cancelled, it fails as a handshake would.
	slow time.Duration
}

func (d *testDialer) DialEndpoint(ctx context.Context, t Target) (net.Conn, error) {
	d.mu.Lock()
	if d.dials == nil {
		d.dials = map[netip.AddrPort]int{}
	}
	d.dials[t.Address]++
	d.seen = append(d.seen, t)
	slow := d.slow
	d.mu.Unlock()
	if slow > 0 {
		select {
		case <-time.After(slow):
		case <-ctx.Done():
			return nil, errors.New("tunnel handshake: connection closed")
		}
	}
	var nd net.Dialer
	return nd.DialContext(ctx, "tcp", t.Address.String())
}

func (d *testDialer) count(a netip.AddrPort) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dials[a]
}

type harness struct {
	t        testing.TB
	engine   *Engine
	dialer   *testDialer
	reg      *prometheus.Registry
	logs     *observer.ObservedLogs
	backends map[string]*testBackend
	services map[string]*meshv1.Service
	works    []*meshv1.Workload
	authz    atomic.Pointer[Authorizer]
	ctx      context.Context
}

type harnessOpt func(*Options)

func newHarness(t testing.TB, opts ...harnessOpt) *harness {
	t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	h := &harness{t: t, dialer: &testDialer{}, reg: prometheus.NewRegistry(), logs: logs,
		backends: map[string]*testBackend{}, services: map[string]*meshv1.Service{}}
	allow := AllowAll()
	h.authz.Store(&allow)
	o := Options{
		Dialer: h.dialer,
		Authorizer: AuthorizerFunc(func(ctx context.Context, r *AuthzRequest) Decision {
			return (*h.authz.Load()).Authorize(ctx, r)
		}),
		Logger:     zap.New(core),
		Registerer: h.reg,
	}
	for _, f := range opts {
		f(&o)
	}
	e, err := NewEngine(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.ctx = ctx
	t.Cleanup(func() {
		cancel()
		_ = e.Close()
	})
	h.engine = e
	return h
}

func (h *harness) setAuthz(a Authorizer) { h.authz.Store(&a) }

// backend starts a backend serving HTTP/1.1 (and h2c when h2 is set) and a
// service of the same name with port 80 of the given appProtocol.
func (h *harness) backend(name, appProtocol string, h2 bool) *testBackend {
	h.t.Helper()
	b := &testBackend{name: name}
	b.srv = httptest.NewUnstartedServer(b)
	if h2 {
		b.srv.Config.Protocols = new(http.Protocols)
		b.srv.Config.Protocols.SetHTTP1(true)
		b.srv.Config.Protocols.SetUnencryptedHTTP2(true)
	}
	b.srv.Start()
	h.t.Cleanup(b.srv.Close)
	b.addr = netip.MustParseAddrPort(b.srv.Listener.Addr().String())
	h.backends[name] = b
	h.addService(name, appProtocol, b.addr)
	return b
}

// addService adds (or extends) a service with one endpoint per address.
func (h *harness) addService(name, appProtocol string, addrs ...netip.AddrPort) *meshv1.Service {
	s := h.services[name]
	if s == nil {
		s = service(name, svcPort(80, appProtocol))
		s.Ports[0].TargetPort = 0 // per-endpoint ports below
		h.services[name] = s
	}
	for _, a := range addrs {
		uid := fmt.Sprintf("%s-%d", name, len(h.works))
		h.works = append(h.works, &meshv1.Workload{Uid: uid, Name: uid, Namespace: testNS, ServiceAccount: name,
			Identity: "spiffe://cluster.local/ns/" + testNS + "/sa/" + name, Addresses: []string{a.Addr().String()}})
		s.Endpoints = append(s.Endpoints, &meshv1.Endpoint{WorkloadUid: uid, Address: a.Addr().String(), Ports: map[uint32]uint32{80: uint32(a.Port())}})
	}
	return s
}

// deadAddr is a loopback address where nothing listens.
func deadAddr(t testing.TB) netip.AddrPort {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddrPort(ln.Addr().String())
	ln.Close()
	return a
}

func (h *harness) update(routes []*meshv1.HTTPRoute, grpcRoutes []*meshv1.GRPCRoute) *Config {
	var svcs []*meshv1.Service
	for _, s := range h.services {
		svcs = append(svcs, s)
	}
	c := Compile(routes, grpcRoutes, svcs, h.works)
	h.engine.Update(c)
	return c
}

// front starts a listener standing for the waypoint's tunnel termination:
// every accepted connection is served with info.
func (h *harness) front(info ConnInfo) string {
	h.t.Helper()
	ln := testnet.Listen(h.t, "127.0.0.1:0")
	ctx, cancel := context.WithCancel(h.ctx)
	testnet.Serve(h.t, ln, func(c net.Conn) { _ = h.engine.ServeConn(ctx, c, info) })
	h.t.Cleanup(cancel) // runs first: ends the tunnels being served
	return ln.Addr().String()
}

var callerAddr = netip.MustParseAddrPort("10.1.2.3:45678")

func webInfo(peer trust.Peer) ConnInfo {
	return ConnInfo{Peer: peer, Source: callerAddr, Destination: netip.MustParseAddrPort("127.0.20.1:80"),
		Service: ServiceRef{testNS, "web"}, Port: 80, Protocol: ProtocolHTTP}
}

// dialFront opens a raw connection to a front for hand-written requests;
// it is closed when the test ends, and nothing on it waits past 20 s.
func dialFront(t *testing.T, addr string) net.Conn {
	t.Helper()
	return testnet.Dial(t, addr)
}

func h1Client(addr string) *http.Client {
	return &http.Client{
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       30 * time.Second,
	}
}

func h2cClient(addr string) *http.Client {
	return &http.Client{
		Transport: &http2.Transport{AllowHTTP: true, DialTLSContext: func(ctx context.Context, _, _ string, _ *tls.Config) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		}},
		Timeout: 30 * time.Second,
	}
}

type result struct {
	status int
	header http.Header
	body   []byte
	echo   echo
}

func do(t *testing.T, c *http.Client, method, target string, body []byte, hdr map[string]string) result {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, "http://web"+target, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Add(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	return readResult(t, resp)
}

// readResult reads resp whole, with what the backend echoed when it did.
func readResult(t *testing.T, resp *http.Response) result {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the body: %v", err)
	}
	res := result{status: resp.StatusCode, header: resp.Header, body: b}
	if resp.Header.Get("Content-Type") == "application/json" {
		if err := json.Unmarshal(b, &res.echo); err != nil {
			t.Fatalf("bad echo %q: %v", b, err)
		}
	}
	return res
}

func get(t *testing.T, c *http.Client, target string, hdr map[string]string) result {
	t.Helper()
	return do(t, c, http.MethodGet, target, nil, hdr)
}

// counter reads requests_total for a label set.
func (h *harness) counter(labels map[string]string) float64 {
	mfs, err := h.reg.Gather()
	if err != nil {
		h.t.Fatal(err)
	}
	var total float64
	for _, mf := range mfs {
		if mf.GetName() != "requests_total" {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
					continue next
				}
			}
			total += m.GetCounter().GetValue()
		}
	}
	return total
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
