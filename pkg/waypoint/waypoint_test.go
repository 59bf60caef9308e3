package waypoint

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/causeway-mesh/causeway/pkg/hbone"
	"github.com/causeway-mesh/causeway/pkg/internal/testnet"
	"github.com/causeway-mesh/causeway/pkg/policy"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/certmanager"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
	"github.com/causeway-mesh/causeway/pkg/xds"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

const testPolicy = `package envoy.authz

default allow := false

# HTTP: the frontend may GET.
allow if {
	input.attributes.source.principal == "spiffe://cluster.local/ns/web/sa/frontend"
	input.attributes.request.http.method == "GET"
}

# TCP (no request attributes): the frontend may connect.
allow if {
	input.attributes.source.principal == "spiffe://cluster.local/ns/web/sa/frontend"
	not input.attributes.request
}
`

type fixture struct {
	w    *Waypoint
	ca   *trusttest.CA
	addr netip.AddrPort
	pool *hbone.Pool
	// stalls receives "arrived PATH" for each backend request under
	// /stall, then "cancelled PATH" once its caller went away.
	stalls chan string
	// release lets the backend answer /held.
	release chan struct{}
}

// start runs a waypoint shop/wp on 127.0.73.2 in front of plain backends
// (pods outside the mesh, so no node proxy is needed behind it).
func start(t *testing.T, options ...func(*Options)) *fixture {
	t.Helper()
	ca := trusttest.NewCA(t, "cluster.local")
	stalls, release := make(chan string, 4), make(chan struct{})
	httpBackend := serveHTTP(t, "127.0.173.1:0", stalls, release)
	tcpBackend := serveTCP(t, "127.0.173.1:0")

	engine := policyEngine(t, testPolicy)
	certs, err := certmanager.New(certmanager.Options{Fetcher: certmanager.AuthorityFetcher{Authority: ca.Authority}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { certs.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	self := trusttest.Identity(t, "spiffe://cluster.local/ns/shop/sa/wp")
	o := Options{Namespace: "shop", Name: "wp", Identity: self, Bundle: ca.Bundle, Certificates: certs, Policy: engine}
	for _, set := range options {
		set(&o)
	}
	w, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	wp := &meshv1.Ref{Namespace: "shop", Name: "wp"}
	other := &meshv1.Ref{Namespace: "shop", Name: "other"}
	backendWorkload := &meshv1.Workload{Uid: "shop/backend", Name: "backend", Namespace: "shop", Identity: "spiffe://cluster.local/ns/shop/sa/backend",
		Addresses: []string{"127.0.173.1"}}
	ep := func(port uint16) *meshv1.Endpoint {
		return &meshv1.Endpoint{WorkloadUid: "shop/backend", Address: "127.0.173.1", Ports: map[uint32]uint32{80: uint32(port)}}
	}
	w.Update(&xds.State{Set: meshv1.Set{
		Workloads: map[string]*meshv1.Workload{
			"shop/backend": backendWorkload,
			"shop/elsewhere": {Uid: "shop/elsewhere", Name: "elsewhere", Namespace: "shop", Identity: "spiffe://cluster.local/ns/shop/sa/x",
				Addresses: []string{"127.0.173.9"}, Waypoint: other},
		},
		Services: map[string]*meshv1.Service{
			"shop/web": {Name: "web", Namespace: "shop", Vips: []string{"127.0.74.1"}, Waypoint: wp,
				Ports: []*meshv1.ServicePort{{Port: 80, AppProtocol: "http"}}, Endpoints: []*meshv1.Endpoint{ep(httpBackend.Port())}},
			"shop/db": {Name: "db", Namespace: "shop", Vips: []string{"127.0.74.2"}, Waypoint: wp,
				Ports: []*meshv1.ServicePort{{Port: 80, AppProtocol: "tcp"}}, Endpoints: []*meshv1.Endpoint{ep(tcpBackend.Port())}},
			"shop/nodb": {Name: "nodb", Namespace: "shop", Vips: []string{"127.0.74.6"}, Waypoint: wp,
				Ports: []*meshv1.ServicePort{{Port: 80, AppProtocol: "tcp"}}},
			"shop/unbound": {Name: "unbound", Namespace: "shop", Vips: []string{"127.0.74.3"},
				Ports: []*meshv1.ServicePort{{Port: 80, AppProtocol: "http"}}, Endpoints: []*meshv1.Endpoint{ep(httpBackend.Port())}},
		},
	}})
	ln, err := net.Listen("tcp", "127.0.73.2:0")
	if err != nil {
		t.Fatal(err)
	}
	go w.Serve(ln)
	t.Cleanup(func() {
		sctx, c := context.WithTimeout(context.Background(), 5*time.Second)
		defer c()
		w.Shutdown(sctx)
	})
	pool, err := hbone.NewPool(hbone.PoolOptions{Bundle: ca.Bundle})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	f := &fixture{w: w, ca: ca, addr: netip.MustParseAddrPort(ln.Addr().String()), pool: pool, stalls: stalls, release: release}
	waitReady(t, w)
	return f
}

func policyEngine(t *testing.T, rego string) *policy.Engine {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "authz.rego"), []byte(rego), 0o600); err != nil {
		t.Fatal(err)
	}
	engine, err := policy.NewEngine(policy.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := engine.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	return engine
}

func waitReady(t *testing.T, w *Waypoint) {
	deadline := time.Now().Add(10 * time.Second)
	for w.Ready() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("waypoint not ready: %v", w.Ready())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// heldBody is what /held answers, once release is closed.
var heldBody = strings.Repeat("0123456789abcdef", 16<<10) // 256 KiB

func serveHTTP(t *testing.T, addr string, stalls chan<- string, release <-chan struct{}) netip.AddrPort {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/stall") {
			stalls <- "arrived " + r.URL.Path
			select {
			case <-r.Context().Done():
				stalls <- "cancelled " + r.URL.Path
			case <-time.After(20 * time.Second):
			}
			return
		}
		if r.URL.Path == "/held" {
			stalls <- "arrived /held"
			<-release
			io.WriteString(w, heldBody)
			return
		}
		if r.URL.Path == "/slow" {
			time.Sleep(100 * time.Millisecond)
		}
		fmt.Fprintf(w, "backend saw principal=%q xfcc=%q", r.Header.Get("X-Causeway-Source-Principal"), r.Header.Get("X-Forwarded-Client-Cert"))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return netip.MustParseAddrPort(ln.Addr().String())
}

func serveTCP(t *testing.T, addr string) netip.AddrPort {
	ln := testnet.Listen(t, addr)
	// Greets, then holds the connection until the client's EOF.
	testnet.Serve(t, ln, func(c net.Conn) { io.WriteString(c, "tcp backend\n"); io.Copy(io.Discard, c) })
	return netip.MustParseAddrPort(ln.Addr().String())
}

// tunnel opens a tunnel as source (zero: TLS-only) to authority.
func (f *fixture) tunnel(t *testing.T, source string, authority string) (net.Conn, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return f.pool.Dial(ctx, f.target(t, source, authority))
}

// target is the waypoint as a tunnel's target, the tunnel opened as
// source (zero: TLS-only) to authority.
func (f *fixture) target(t *testing.T, source string, authority string) hbone.Target {
	t.Helper()
	target := hbone.Target{Address: f.addr, Authority: authority, Expected: []trust.Identity{trusttest.Identity(t, "spiffe://cluster.local/ns/shop/sa/wp")}}
	if source != "" {
		id := trusttest.Identity(t, source)
		cert := f.ca.Certificate(t, id, 0)
		target.Source, target.Cert = id, func() (*tls.Certificate, error) { return cert, nil }
	}
	return target
}

// webTunnel is a tunnel as the frontend to web.shop, closed at the end of
// the test; nothing on it waits past 10 s.
func (f *fixture) webTunnel(t *testing.T) net.Conn {
	t.Helper()
	c, err := f.tunnel(t, frontend, "127.0.74.1:80")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

func get(t *testing.T, c net.Conn, hdr string) (int, string) {
	t.Helper()
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: web.shop\r\n%sConnection: close\r\n\r\n", hdr)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

const frontend = "spiffe://cluster.local/ns/web/sa/frontend"

func TestAuthenticatedRequestRoutedAndAuthorized(t *testing.T) {
	f := start(t)
	c, err := f.tunnel(t, frontend, "127.0.74.1:80")
	if err != nil {
		t.Fatal(err)
	}
	code, body := get(t, c, "X-Forwarded-Client-Cert: URI=spiffe://cluster.local/ns/web/sa/admin\r\n")
	if code != 200 || !strings.Contains(body, `principal="`+frontend+`"`) || !strings.Contains(body, `xfcc=""`) {
		t.Fatalf("%d %s", code, body)
	}
}

func TestTLSOnlyTunnelHasNoIdentity(t *testing.T) {
	f := start(t)
	c, err := f.tunnel(t, "", "127.0.74.1:80")
	if err != nil {
		t.Fatal(err)
	}
	claims := "X-Forwarded-Client-Cert: URI=" + frontend + "\r\nForwarded: for=\"127.0.0.1:1\"\r\nX-Causeway-Source-Principal: " + frontend + "\r\n"
	if code, body := get(t, c, claims); code != 403 {
		t.Fatalf("TLS-only tunnel claiming the frontend: %d %s", code, body)
	}
}

func TestConnectRefusals(t *testing.T) {
	f := start(t)
	for _, tc := range []struct {
		name, authority, want string
	}{
		{"service not bound to this waypoint", "127.0.74.3:80", "401"},
		{"workload of another waypoint", "127.0.173.9:8080", "401"},
		{"unknown destination", "127.0.74.99:80", "503"},
		{"service port missing", "127.0.74.1:81", "503"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := f.tunnel(t, frontend, tc.authority)
			if err == nil {
				c.Close()
				t.Fatal("tunnel accepted")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %s", err, tc.want)
			}
		})
	}
}

func TestTCPPortConnectionPolicy(t *testing.T) {
	f := start(t)
	c, err := f.tunnel(t, frontend, "127.0.74.2:80")
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	c.(interface{ CloseWrite() error }).CloseWrite()
	out, _ := io.ReadAll(c)
	c.Close()
	if string(out) != "tcp backend\n" {
		t.Fatalf("TCP through the waypoint: %q", out)
	}
	if c, err := f.tunnel(t, "", "127.0.74.2:80"); err == nil {
		c.Close()
		t.Fatal("unauthenticated TCP connection allowed")
	} else if !strings.Contains(err.Error(), "401") {
		t.Fatalf("unauthenticated TCP: %v, want 401", err)
	}
	// A service without endpoints: the policy decides first, so a refused
	// caller cannot tell it from one with endpoints.
	for _, tc := range []struct{ source, want string }{{"", "401"}, {frontend, "503"}} {
		if c, err := f.tunnel(t, tc.source, "127.0.74.6:80"); err == nil {
			c.Close()
			t.Fatalf("caller %q: a tunnel to a service without endpoints", tc.source)
		} else if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("caller %q to a service without endpoints: %v, want %s", tc.source, err, tc.want)
		}
	}
}

func TestTCPTunnelIdleTimeout(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	f := start(t, func(o *Options) { o.TCPIdleTimeout = 300 * time.Millisecond; o.AccessLog = zap.New(core) })
	c, err := f.tunnel(t, frontend, "127.0.74.2:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	out, err := io.ReadAll(c)
	if string(out) != "tcp backend\n" || err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("idle tunnel: read %q, %v after %v; want the greeting, then an abort after the idle timeout", out, err, time.Since(start))
	}
	// The access log line is written after the tunnel is reset.
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, e := range logs.FilterMessage("connection").All() {
			if strings.Contains(fmt.Sprint(e.ContextMap()["result"]), "idle timeout") {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no access log line with an idle timeout: %v", logs.All())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A caller that goes away while its request waits upstream (it resets its
// tunnel) cancels the upstream request: the HBONE stream tells the
// waypoint without a read kept pending.
func TestCallerGoneCancelsUpstream(t *testing.T) {
	f := start(t)
	c, err := f.tunnel(t, frontend, "127.0.74.1:80")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(c, "GET /stall/reset HTTP/1.1\r\nHost: web.shop\r\n\r\n")
	expect := func(want string) {
		t.Helper()
		select {
		case got := <-f.stalls:
			if got != want {
				t.Fatalf("backend: %s, want %s", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("backend: no %s", want)
		}
	}
	expect("arrived /stall/reset")
	c.Close() // resets the stream: the waypoint has not ended its direction
	expect("cancelled /stall/reset")
}

// A caller that sends a whole request and ends its direction of the tunnel
// (END_STREAM: `printf ... | nc -N` through a node proxy) is still
// reading: it gets the backend's own answer, not one the waypoint made up.
func TestHalfClosedCallerGetsTheBackendsAnswer(t *testing.T) {
	c := start(t).webTunnel(t)
	fmt.Fprint(c, "GET /slow HTTP/1.1\r\nHost: web.shop\r\n\r\n")
	c.(interface{ CloseWrite() error }).CloseWrite()
	out, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("after %q: %v", out, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(string(out))), nil)
	if err != nil {
		t.Fatalf("%q: %v", out, err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(body), "backend saw principal=") {
		t.Fatalf("half-closed caller got %q", out)
	}
}

// A request the waypoint refuses to read is answered before the tunnel
// closes: the client gets the 400 whole over HBONE.
func TestBadRequestAnsweredOverHBONE(t *testing.T) {
	c := start(t).webTunnel(t)
	fmt.Fprint(c, "GET / HTTP/1.1\r\nBad Name: x\r\nHost: web.shop\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadRequest || err != nil || !strings.Contains(string(body), "invalid header name") {
		t.Fatalf("%d %q %v", resp.StatusCode, body, err)
	}
}

// A consumer route (GEP-1294, conformance MeshConsumerRoute) applies to
// callers from its namespace only: the waypoint picks it by the namespace
// of the tunnel's authenticated identity, nothing the caller sends.
func TestConsumerRouteByCallerNamespace(t *testing.T) {
	f := start(t, func(o *Options) { o.Policy = policyEngine(t, "package envoy.authz\n\nallow := true\n") })
	backend := serveHTTP(t, "127.0.173.1:0", nil, nil)
	wp := &meshv1.Ref{Namespace: "shop", Name: "wp"}
	route := &meshv1.HTTPRoute{Namespace: "web", Name: "mesh-echo-add-header",
		Parents: []*meshv1.ParentRef{{Namespace: "shop", Name: "web"}},
		Rules: []*meshv1.HTTPRouteRule{{
			Matches: []*meshv1.HTTPRouteMatch{{Path: &meshv1.PathMatch{Type: meshv1.PathMatch_PATH_PREFIX, Value: "/"}}},
			Filters: []*meshv1.HTTPRouteFilter{{Filter: &meshv1.HTTPRouteFilter_ResponseHeaderModifier{
				ResponseHeaderModifier: &meshv1.HeaderModifier{Set: []*meshv1.Header{{Name: "x-header-set", Value: "set"}}}}}},
			Backends: []*meshv1.HTTPBackendRef{{Weight: 1, Backend: &meshv1.BackendRef{Namespace: "shop", Name: "web", Port: 80}}},
		}}}
	f.w.Update(&xds.State{Set: meshv1.Set{
		Workloads: map[string]*meshv1.Workload{"shop/backend": {Uid: "shop/backend", Name: "backend", Namespace: "shop",
			Identity: "spiffe://cluster.local/ns/shop/sa/backend", Addresses: []string{"127.0.173.1"}}},
		Services: map[string]*meshv1.Service{"shop/web": {Name: "web", Namespace: "shop", Vips: []string{"127.0.74.1"}, Waypoint: wp,
			Ports:     []*meshv1.ServicePort{{Port: 80, AppProtocol: "http"}},
			Endpoints: []*meshv1.Endpoint{{WorkloadUid: "shop/backend", Address: "127.0.173.1", Ports: map[uint32]uint32{80: uint32(backend.Port())}}}}},
		HTTPRoutes: map[string]*meshv1.HTTPRoute{"web/mesh-echo-add-header": route},
	}})
	for _, tc := range []struct{ caller, want string }{
		{frontend, "set"}, // namespace web: the consumer route's
		{"spiffe://cluster.local/ns/shop/sa/frontend", ""},
		{"spiffe://cluster.local/ns/other/sa/frontend", ""},
	} {
		c, err := f.tunnel(t, tc.caller, "127.0.74.1:80")
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: web.shop\r\nConnection: close\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		c.Close()
		if got := resp.Header.Get("X-Header-Set"); got != tc.want || resp.StatusCode != 200 {
			t.Errorf("caller %s: %d X-Header-Set %q, want %q", tc.caller, resp.StatusCode, got, tc.want)
		}
	}
}
