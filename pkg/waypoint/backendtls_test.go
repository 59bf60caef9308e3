package waypoint

import (
	"context"
	"crypto/tls"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/causeway-mesh/causeway/pkg/backendtls/backendtlstest"
	"github.com/causeway-mesh/causeway/pkg/internal/testnet"
	"github.com/causeway-mesh/causeway/pkg/xds"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// testCA issues server certificates for the backends outside the mesh.
type testCA struct{ *backendtlstest.CA }

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	ca, err := backendtlstest.NewCA(name)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{ca}
}

// leaf issues a server certificate for the DNS names and URIs, valid
// until notAfter (zero: an hour from now).
func (ca *testCA) leaf(t *testing.T, dns []string, uris []string, notAfter time.Time) *tls.Certificate {
	t.Helper()
	c, err := ca.Leaf(dns, uris, notAfter)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// tlsBackend is an HTTPS server outside the mesh (HTTP/1.1 and h2 by
// ALPN) presenting whatever certificate presents holds; unless keepAlive,
// it closes each connection after one response, so every request is a new
// handshake.
type tlsBackend struct {
	addr     netip.AddrPort
	presents atomic.Pointer[tls.Certificate]
	sni      atomic.Value // string: the last handshake's server name
	alpn     atomic.Value // string: the last handshake's negotiated protocol
	served   atomic.Int32 // requests that reached the handler
	accepted atomic.Int32 // TCP connections accepted
}

func (b *tlsBackend) config() *tls.Config {
	return &tls.Config{NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			b.sni.Store(hello.ServerName)
			return b.presents.Load(), nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error { b.alpn.Store(cs.NegotiatedProtocol); return nil }}
}

type countingListener struct {
	net.Listener
	n *atomic.Int32
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

func startTLSBackend(t *testing.T, addr string, keepAlive bool) *tlsBackend {
	t.Helper()
	b := &tlsBackend{}
	ln := testnet.Listen(t, addr)
	b.addr = netip.MustParseAddrPort(ln.Addr().String())
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.served.Add(1)
		w.Write([]byte("tls backend over " + r.Proto))
	}), TLSConfig: b.config(), ErrorLog: log.New(io.Discard, "", 0)}
	srv.SetKeepAlivesEnabled(keepAlive)
	go srv.ServeTLS(countingListener{ln, &b.accepted}, "", "")
	t.Cleanup(func() { srv.Close() })
	return b
}

// withTLS serves Service shop/ext (VIP 127.0.74.20, port 443 with
// appProtocol proto) with one endpoint outside the mesh, at backend (no
// pod), under BackendTLS bt.
func withTLS(f *fixture, backend netip.AddrPort, proto string, bt *meshv1.BackendTLS) {
	wp := &meshv1.Ref{Namespace: "shop", Name: "wp"}
	f.w.Update(&xds.State{Set: meshv1.Set{Services: map[string]*meshv1.Service{
		"shop/ext": {Name: "ext", Namespace: "shop", Vips: []string{"127.0.74.20"}, Waypoint: wp,
			Ports:     []*meshv1.ServicePort{{Port: 443, AppProtocol: proto, BackendTls: bt}},
			Endpoints: []*meshv1.Endpoint{{Address: backend.Addr().String(), Ports: map[uint32]uint32{443: uint32(backend.Port())}}}},
	}}})
}

func policyTLS(ca *testCA, hostname string, sans ...*meshv1.SubjectAltName) *meshv1.BackendTLS {
	return &meshv1.BackendTLS{Policy: &meshv1.Ref{Namespace: "shop", Name: "ext-tls"}, Hostname: hostname, SubjectAltNames: sans, CaCertificates: ca.PEM}
}

func dnsSAN(v string) *meshv1.SubjectAltName {
	return &meshv1.SubjectAltName{Type: meshv1.SubjectAltName_HOSTNAME, Value: v}
}

func uriSAN(v string) *meshv1.SubjectAltName {
	return &meshv1.SubjectAltName{Type: meshv1.SubjectAltName_URI, Value: v}
}

// A BackendTLSPolicy makes the waypoint's connection to a backend outside
// the mesh TLS, verified as the policy says; a certificate that does not
// verify gets 503, a log line naming the policy and what was presented,
// and a count, and the request never reaches the backend.
func TestBackendTLSVerifies(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	f := start(t, func(o *Options) { o.Logger = zap.New(core) })
	b := startTLSBackend(t, "127.0.175.1:0", false)
	ca, otherCA := newTestCA(t, "backend CA"), newTestCA(t, "another CA")
	const host = "api.example.com"
	spiffe := "spiffe://external.example/ns/payments/sa/api"

	get := func() (int, string) {
		t.Helper()
		c, err := f.tunnel(t, frontend, "127.0.74.20:443")
		if err != nil {
			t.Fatal(err)
		}
		return get(t, c, "")
	}
	cases := []struct {
		name     string
		policy   *meshv1.BackendTLS
		presents *tls.Certificate
		ok       bool
		reason   string // in the refusal's log line
	}{
		{"exact SAN", policyTLS(ca, host, dnsSAN(host)), ca.leaf(t, []string{host}, nil, time.Time{}), true, ""},
		{"SAN match is case-insensitive for DNS", policyTLS(ca, host, dnsSAN(host)), ca.leaf(t, []string{"API.example.com"}, nil, time.Time{}), true, ""},
		{"different SAN", policyTLS(ca, host, dnsSAN(host)), ca.leaf(t, []string{"other.example.com"}, nil, time.Time{}), false,
			"none of the subjectAltNames [Hostname api.example.com]; the backend presented subject \"CN=backend\", DNS SANs [other.example.com]"},
		{"wildcard certificate is no exact SAN", policyTLS(ca, host, dnsSAN(host)), ca.leaf(t, []string{"*.example.com"}, nil, time.Time{}), false,
			"DNS SANs [*.example.com]"},
		{"another CA", policyTLS(ca, host, dnsSAN(host)), otherCA.leaf(t, []string{host}, nil, time.Time{}), false,
			"certificate not trusted: x509: certificate signed by unknown authority"},
		{"expired", policyTLS(ca, host, dnsSAN(host)), ca.leaf(t, []string{host}, nil, time.Now().Add(-time.Minute)), false,
			"certificate not trusted: x509: certificate has expired"},
		{"hostname alone does not authenticate when SANs are set", policyTLS(ca, host, dnsSAN("billing.example.com")), ca.leaf(t, []string{host}, nil, time.Time{}), false,
			"none of the subjectAltNames [Hostname billing.example.com]"},
		{"URI SAN", policyTLS(ca, host, uriSAN(spiffe)), ca.leaf(t, nil, []string{spiffe}, time.Time{}), true, ""},
		{"another URI SAN", policyTLS(ca, host, uriSAN(spiffe)), ca.leaf(t, []string{host}, []string{"spiffe://external.example/ns/payments/sa/other"}, time.Time{}), false,
			"URI SANs [spiffe://external.example/ns/payments/sa/other]"},
		{"hostname verified without SANs", policyTLS(ca, host), ca.leaf(t, []string{"*.example.com"}, nil, time.Time{}), true, ""},
		{"hostname mismatch without SANs", policyTLS(ca, host), ca.leaf(t, []string{"other.example.com"}, nil, time.Time{}), false,
			"certificate not valid for hostname api.example.com"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			withTLS(f, b.addr, "http", c.policy)
			b.presents.Store(c.presents)
			logs.TakeAll()
			served := b.served.Load()
			metric := "verify_failed"
			if c.ok {
				metric = "ok"
			}
			before := testutil.ToFloat64(f.w.backendTLS.WithLabelValues("shop/ext-tls", metric))
			code, body := get()
			if sni, _ := b.sni.Load().(string); sni != host {
				t.Errorf("SNI %q, want the policy's hostname %q", sni, host)
			}
			if after := testutil.ToFloat64(f.w.backendTLS.WithLabelValues("shop/ext-tls", metric)); after <= before {
				t.Errorf("backend_tls_handshakes_total{result=%q} did not grow", metric)
			}
			if c.ok {
				if code != 200 || body != "tls backend over HTTP/1.1" {
					t.Fatalf("got %d %q, want 200 from the backend", code, body)
				}
				if alpn, _ := b.alpn.Load().(string); alpn != "http/1.1" {
					t.Errorf("ALPN %q for an http port, want http/1.1", alpn)
				}
				return
			}
			if code != 503 {
				t.Errorf("got %d %q, want 503", code, body)
			}
			if b.served.Load() != served {
				t.Error("the request reached a backend whose certificate did not verify")
			}
			var found bool
			for _, e := range logs.FilterMessage("backend TLS refused").All() {
				msg := e.ContextMap()["error"].(string)
				if e.ContextMap()["policy"] == "shop/ext-tls" && strings.Contains(msg, "BackendTLSPolicy shop/ext-tls") && strings.Contains(msg, c.reason) {
					found = true
				} else {
					t.Logf("log: %v", e.ContextMap())
				}
			}
			if !found {
				t.Errorf("no refusal logged naming the policy and %q", c.reason)
			}
		})
	}
}

// A policy the control plane could not resolve (here a missing CA
// ConfigMap) refuses every connection to its port before anything is
// dialled: 503, never plaintext, never unverified TLS.
func TestBackendTLSInvalidPolicyFailsClosed(t *testing.T) {
	f := start(t)
	b := startTLSBackend(t, "127.0.175.2:0", false)
	ca := newTestCA(t, "backend CA")
	b.presents.Store(ca.leaf(t, []string{"api.example.com"}, nil, time.Time{}))
	for _, bt := range []*meshv1.BackendTLS{
		{Policy: &meshv1.Ref{Namespace: "shop", Name: "ext-tls"}, InvalidReason: "caCertificateRefs[0]: ConfigMap shop/ca does not exist"},
		{Policy: &meshv1.Ref{Namespace: "shop", Name: "ext-tls"}, Hostname: "api.example.com", CaCertificates: []byte("not PEM")},
	} {
		withTLS(f, b.addr, "http", bt)
		before := testutil.ToFloat64(f.w.backendTLS.WithLabelValues("shop/ext-tls", "invalid_policy"))
		c, err := f.tunnel(t, frontend, "127.0.74.20:443")
		if err != nil {
			t.Fatal(err)
		}
		if code, body := get(t, c, ""); code != 503 {
			t.Errorf("%v: got %d %q, want 503", bt, code, body)
		}
		if n := b.accepted.Load(); n != 0 {
			t.Errorf("%v: %d connections reached the backend", bt, n)
		}
		if testutil.ToFloat64(f.w.backendTLS.WithLabelValues("shop/ext-tls", "invalid_policy")) <= before {
			t.Error("invalid_policy not counted")
		}
	}
}

// An endpoint that is no pod is reached only under a BackendTLSPolicy:
// without one there is nothing to authenticate it.
func TestEndpointOutsideTheClusterNeedsBackendTLS(t *testing.T) {
	f := start(t)
	b := startTLSBackend(t, "127.0.175.3:0", false)
	withTLS(f, b.addr, "http", nil)
	c, err := f.tunnel(t, frontend, "127.0.74.20:443")
	if err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, c, ""); code != 503 {
		t.Errorf("got %d %q, want 503", code, body)
	}
	if n := b.accepted.Load(); n != 0 {
		t.Errorf("%d connections reached an endpoint nobody authenticates", n)
	}
}

// gRPC to a backend outside the mesh over verified TLS, ALPN h2 (the gRPC
// server refuses a handshake without it).
func TestBackendTLSGRPC(t *testing.T) {
	f := start(t, func(o *Options) { o.Policy = policyEngine(t, "package envoy.authz\n\nallow := true\n") })
	ca := newTestCA(t, "backend CA")
	const host = "grpc.example.com"
	ln := testnet.Listen(t, "127.0.175.4:0")
	cert := ca.leaf(t, []string{host}, nil, time.Time{})
	var alpn atomic.Value
	creds := credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{*cert},
		VerifyConnection: func(cs tls.ConnectionState) error { alpn.Store(cs.NegotiatedProtocol); return nil }})
	srv := grpc.NewServer(grpc.Creds(creds))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	withTLS(f, netip.MustParseAddrPort(ln.Addr().String()), "grpc", policyTLS(ca, host, dnsSAN(host)))

	conn, err := grpc.NewClient("passthrough:///ext", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return f.tunnel(t, frontend, "127.0.74.20:443") }))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health check over verified TLS: %v %v", resp, err)
	}
	if got, _ := alpn.Load().(string); got != "h2" {
		t.Errorf("ALPN %q, want h2", got)
	}

	// The same backend under a policy it does not satisfy: UNAVAILABLE.
	withTLS(f, netip.MustParseAddrPort(ln.Addr().String()), "grpc", policyTLS(ca, host, dnsSAN("other.example.com")))
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err == nil || !strings.Contains(err.Error(), "Unavailable") {
		t.Errorf("health check to a backend failing verification: %v, want Unavailable", err)
	}
}

// A mesh workload behind a BackendTLSPolicy keeps its HBONE tunnel (mTLS,
// its SPIFFE identity verified) and gets the policy's TLS inside it, to the
// application, verified as the policy says: the mesh's transport security
// and the application's TLS are separate layers (GEP-1897).
func TestBackendTLSInsideHBONE(t *testing.T) {
	const pod, podID = "127.0.176.1", "spiffe://cluster.local/ns/shop/sa/pay"
	ln := testnet.Listen(t, pod+":0")
	hbonePort := netip.MustParseAddrPort(ln.Addr().String()).Port()
	f := start(t, func(o *Options) { o.HBONEPort = hbonePort })
	b := startTLSBackend(t, "127.0.175.5:0", false)
	np := startNodeProxy(t, f.ca, ln, b.addr)
	np.present(t, f.ca, podID)
	ca := newTestCA(t, "backend CA")
	const host = "pay.example.com"
	b.presents.Store(ca.leaf(t, []string{host}, nil, time.Time{}))
	update := func(bt *meshv1.BackendTLS) {
		f.w.Update(&xds.State{Set: meshv1.Set{
			Workloads: map[string]*meshv1.Workload{"shop/pay": {Uid: "shop/pay", Name: "pay", Namespace: "shop", Identity: podID, Addresses: []string{pod}, Hbone: true}},
			Services: map[string]*meshv1.Service{"shop/pay": {Name: "pay", Namespace: "shop", Vips: []string{"127.0.74.21"}, Waypoint: &meshv1.Ref{Namespace: "shop", Name: "wp"},
				Ports:     []*meshv1.ServicePort{{Port: 443, TargetPort: 8443, AppProtocol: "http", BackendTls: bt}},
				Endpoints: []*meshv1.Endpoint{{WorkloadUid: "shop/pay", Address: pod}}}},
		}})
	}
	get := func() (int, string) {
		t.Helper()
		c, err := f.tunnel(t, frontend, "127.0.74.21:443")
		if err != nil {
			t.Fatal(err)
		}
		return get(t, c, "")
	}

	update(policyTLS(ca, host, dnsSAN(host)))
	if code, body := get(); code != 200 || body != "tls backend over HTTP/1.1" {
		t.Fatalf("got %d %q, want the backend's answer over TLS inside the tunnel", code, body)
	}
	if np.tunnels.Load() == 0 {
		t.Error("no HBONE tunnel to the mesh workload")
	}
	if sni, _ := b.sni.Load().(string); sni != host {
		t.Errorf("SNI %q inside the tunnel, want %q", sni, host)
	}
	// The tunnel's identity is right, the application's certificate is not
	// what the policy asks for: refused all the same.
	update(policyTLS(ca, host, dnsSAN("billing.example.com")))
	served := b.served.Load()
	if code, _ := get(); code != 503 || b.served.Load() != served {
		t.Errorf("got %d, want 503 and nothing served, for a certificate the policy refuses", code)
	}
}

// A TCP port behind a BackendTLSPolicy: the waypoint relays the caller's
// bytes over verified TLS (no ALPN), and refuses the tunnel when the
// certificate does not verify.
func TestBackendTLSForTCP(t *testing.T) {
	f := start(t)
	ca := newTestCA(t, "backend CA")
	const host = "db.example.com"
	ln := testnet.Listen(t, "127.0.175.6:0")
	cert := ca.leaf(t, []string{host}, nil, time.Time{})
	tlsLn := tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{*cert}})
	testnet.Serve(t, tlsLn, func(c net.Conn) { io.WriteString(c, "tls tcp backend\n"); io.Copy(io.Discard, c) })
	greet := func() (string, error) {
		t.Helper()
		c, err := f.tunnel(t, frontend, "127.0.74.20:443")
		if err != nil {
			return "", err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		c.(interface{ CloseWrite() error }).CloseWrite()
		out, err := io.ReadAll(c)
		return string(out), err
	}
	withTLS(f, netip.MustParseAddrPort(ln.Addr().String()), "tcp", policyTLS(ca, host, dnsSAN(host)))
	if out, err := greet(); out != "tls tcp backend\n" {
		t.Errorf("TCP over verified TLS: %q %v", out, err)
	}
	withTLS(f, netip.MustParseAddrPort(ln.Addr().String()), "tcp", policyTLS(ca, host, dnsSAN("other.example.com")))
	if out, err := greet(); err == nil || !strings.Contains(err.Error(), "503") {
		t.Errorf("TCP to a certificate the policy refuses: %q %v, want the tunnel refused with 503", out, err)
	}
}

// Verified connections are pooled: two requests, one handshake.
func TestBackendTLSConnectionsReused(t *testing.T) {
	f := start(t)
	b := startTLSBackend(t, "127.0.175.7:0", true)
	ca := newTestCA(t, "backend CA")
	b.presents.Store(ca.leaf(t, []string{"api.example.com"}, nil, time.Time{}))
	withTLS(f, b.addr, "http", policyTLS(ca, "api.example.com"))
	for i := range 3 {
		c, err := f.tunnel(t, frontend, "127.0.74.20:443")
		if err != nil {
			t.Fatal(err)
		}
		if code, body := get(t, c, ""); code != 200 {
			t.Fatalf("request %d: %d %q", i, code, body)
		}
	}
	if n := b.accepted.Load(); n != 1 {
		t.Errorf("%d connections for 3 requests, want 1 reused", n)
	}
}
