package caserver_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	securityapi "istio.io/api/security/v1alpha1"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/authn"
	"github.com/causeway-mesh/causeway/pkg/trust/caserver"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
)

const (
	tokNodeA    = "node-a-token-0123456789"
	tokNodeB    = "node-b-token-0123456789"
	tokWeb      = "shop-web-token-01234567" // a workload's own account, on node-a
	tokWaypoint = "waypoint-token-01234567" // no node
)

type env struct {
	ca   *trusttest.CA
	srv  *trusttest.CAServer
	logs *observer.ObservedLogs
	conn *grpc.ClientConn
}

func setup(t *testing.T) *env {
	t.Helper()
	return setupWith(t, trust.WorkloadList{
		{Node: "node-a", Identity: trusttest.Identity(t, "spiffe://cluster.local/ns/shop/sa/web")},
		{Node: "node-a", Identity: trusttest.Identity(t, "spiffe://cluster.local/ns/shop/sa/api")},
		{Node: "node-b", Identity: trusttest.Identity(t, "spiffe://cluster.local/ns/shop/sa/db")},
		// A waypoint's identity that the index also places on node-a
		// (a configuration that slipped through): never for a node proxy.
		{Node: "node-a", Identity: trusttest.Identity(t, waypointID)},
		{Identity: trusttest.Identity(t, waypointID), Waypoint: true},
	}, 0)
}

// setupWith is setup with the workload index and the server's
// WorkloadWait.
func setupWith(t *testing.T, workloads trust.WorkloadIndex, wait time.Duration) *env {
	t.Helper()
	ca := trusttest.NewCA(t, "cluster.local")
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte(strings.Join([]string{
		"# node proxies",
		tokNodeA + " causeway-system/nodeproxy node-a",
		tokNodeB + " causeway-system/nodeproxy node-b",
		tokWeb + " shop/web node-a",
		tokWaypoint + " shop/waypoint",
	}, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens, err := authn.NewTokenFile(path, "cluster.local", nil)
	if err != nil {
		t.Fatal(err)
	}
	certs, err := authn.NewPeerCertificate("cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.InfoLevel)
	srv := ca.StartCAServer(t, caserver.Options{
		Authenticator:       authn.Chain{tokens, certs},
		TrustedNodeAccounts: []trust.Identity{trusttest.Identity(t, "spiffe://cluster.local/ns/causeway-system/sa/nodeproxy")},
		Workloads:           workloads,
		WorkloadWait:        wait,
		Logger:              zap.New(core),
	})
	return &env{ca: ca, srv: srv, logs: logs, conn: dial(t, ca, srv, nil)}
}

// dial connects to the CA over TLS, verifying its identity; cert, if not
// nil, is presented as a client certificate.
func dial(t *testing.T, ca *trusttest.CA, srv *trusttest.CAServer, cert *tls.Certificate) *grpc.ClientConn {
	t.Helper()
	var getCert func() (*tls.Certificate, error)
	if cert != nil {
		getCert = func() (*tls.Certificate, error) { return cert, nil }
	}
	conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(credentials.NewTLS(
		trust.ClientConfig(ca.Bundle, getCert, []trust.Identity{srv.Identity}))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

type request struct {
	token       string
	impersonate string
	csr         []byte
	validity    int64
	metadata    *structpb.Struct
}

func (e *env) call(t *testing.T, conn *grpc.ClientConn, r request) (*securityapi.IstioCertificateResponse, error) {
	t.Helper()
	if conn == nil {
		conn = e.conn
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if r.token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+r.token)
	}
	md := r.metadata
	if md == nil && r.impersonate != "" {
		md = &structpb.Struct{Fields: map[string]*structpb.Value{"ImpersonatedIdentity": structpb.NewStringValue(r.impersonate)}}
	}
	return securityapi.NewIstioCertificateServiceClient(conn).CreateCertificate(ctx,
		&securityapi.IstioCertificateRequest{Csr: string(r.csr), ValidityDuration: r.validity, Metadata: md})
}

func csrPEM(t testing.TB, uris ...string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.CertificateRequest{}
	for _, u := range uris {
		p, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, p)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

func wantStatus(t *testing.T, err error, code codes.Code, msg string) {
	t.Helper()
	if err == nil {
		t.Fatalf("request succeeded, want %v %q", code, msg)
	}
	st := status.Convert(err)
	if st.Code() != code || !strings.Contains(st.Message(), msg) {
		t.Fatalf("got %v %q, want %v containing %q", st.Code(), st.Message(), code, msg)
	}
}

// leafOf checks a successful answer and returns its leaf.
func leafOf(t *testing.T, e *env, resp *securityapi.IstioCertificateResponse, err error, want string) *x509.Certificate {
	t.Helper()
	if err != nil {
		t.Fatalf("request failed: %v", err)
	}
	chain := resp.GetCertChain()
	if len(chain) != 3 {
		t.Fatalf("chain has %d elements, want leaf, intermediate, root", len(chain))
	}
	certs, err := trust.ParseCertificatesPEM([]byte(strings.Join(chain, "")))
	if err != nil {
		t.Fatal(err)
	}
	if !certs[2].Equal(e.ca.Bundle.Roots()[0]) {
		t.Fatal("last chain element is not the root")
	}
	leaf := certs[0]
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != want {
		t.Fatalf("leaf names %v, want %s", leaf.URIs, want)
	}
	return leaf
}

const (
	web = "spiffe://cluster.local/ns/shop/sa/web"
	api = "spiffe://cluster.local/ns/shop/sa/api"
	db  = "spiffe://cluster.local/ns/shop/sa/db"

	waypointID = "spiffe://cluster.local/ns/shop/sa/waypoint"
)

func TestNodeProxyImpersonatesWorkloadOnItsNode(t *testing.T) {
	e := setup(t)
	resp, err := e.call(t, nil, request{token: tokNodeA, impersonate: web, csr: csrPEM(t, web)})
	leafOf(t, e, resp, err, web)
	resp, err = e.call(t, nil, request{token: tokNodeB, impersonate: db, csr: csrPEM(t, db)})
	leafOf(t, e, resp, err, db)

	var issued []observer.LoggedEntry
	for _, l := range e.logs.FilterMessage("certificate issued").All() {
		issued = append(issued, l)
	}
	if len(issued) != 2 {
		t.Fatalf("%d issuances logged, want 2", len(issued))
	}
	f := issued[0].ContextMap()
	if f["identity"] != web || f["node"] != "node-a" || f["impersonated"] != true || f["serial"] == "" {
		t.Fatalf("issuance log fields %v", f)
	}
}

func TestOwnIdentityWithoutImpersonation(t *testing.T) {
	e := setup(t)
	const waypoint = "spiffe://cluster.local/ns/shop/sa/waypoint"
	resp, err := e.call(t, nil, request{token: tokWaypoint, csr: csrPEM(t, waypoint)})
	leafOf(t, e, resp, err, waypoint)
	// Naming its own identity as the impersonated one is not impersonation.
	resp, err = e.call(t, nil, request{token: tokWaypoint, impersonate: waypoint, csr: csrPEM(t, waypoint)})
	leafOf(t, e, resp, err, waypoint)
}

func TestRefusals(t *testing.T) {
	e := setup(t)
	for _, tc := range []struct {
		name string
		req  request
		code codes.Code
		msg  string
	}{
		{"impersonation by an untrusted account",
			request{token: tokWeb, impersonate: api, csr: csrPEM(t, api)}, codes.PermissionDenied,
			"account spiffe://cluster.local/ns/shop/sa/web is not a trusted node account and may not impersonate spiffe://cluster.local/ns/shop/sa/api"},
		{"identity not on the caller's node",
			request{token: tokNodeA, impersonate: db, csr: csrPEM(t, db)}, codes.PermissionDenied,
			"no workload with identity spiffe://cluster.local/ns/shop/sa/db on node node-a"},
		{"a waypoint's identity for a node proxy",
			request{token: tokNodeA, impersonate: waypointID, csr: csrPEM(t, waypointID)}, codes.PermissionDenied,
			"identity spiffe://cluster.local/ns/shop/sa/waypoint belongs to a waypoint; only the waypoint's own pods may hold it, never a node proxy"},
		{"impersonation of a foreign trust domain",
			request{token: tokNodeA, impersonate: "spiffe://evil.example/ns/shop/sa/web", csr: csrPEM(t, web)}, codes.PermissionDenied,
			"identity spiffe://evil.example/ns/shop/sa/web is not in trust domain cluster.local"},
		{"CSR SAN differs from the granted identity",
			request{token: tokNodeA, impersonate: web, csr: csrPEM(t, api)}, codes.InvalidArgument,
			"CSR asks for spiffe://cluster.local/ns/shop/sa/api, but the caller may only get spiffe://cluster.local/ns/shop/sa/web"},
		{"CSR SAN differs without impersonation",
			request{token: tokWeb, csr: csrPEM(t, api)}, codes.InvalidArgument,
			"CSR asks for spiffe://cluster.local/ns/shop/sa/api, but the caller may only get spiffe://cluster.local/ns/shop/sa/web"},
		{"CSR with several SANs",
			request{token: tokNodeA, impersonate: web, csr: csrPEM(t, web, api)}, codes.InvalidArgument,
			"CSR must contain exactly one URI SAN, has 2"},
		{"CSR for a foreign trust domain",
			request{token: tokNodeA, impersonate: web, csr: csrPEM(t, "spiffe://evil.example/ns/shop/sa/web")}, codes.InvalidArgument,
			"CSR asks for spiffe://evil.example/ns/shop/sa/web in trust domain evil.example, but the CA issues only for trust domain cluster.local"},
		{"invalid token",
			request{token: "not-a-valid-token-at-all", impersonate: web, csr: csrPEM(t, web)}, codes.Unauthenticated,
			"authentication failed: invalid credentials: bearer token not recognised"},
		{"no credentials",
			request{impersonate: web, csr: csrPEM(t, web)}, codes.Unauthenticated,
			"authentication failed: no credentials: present a bearer token or a mesh client certificate"},
		{"CSR that is not PEM",
			request{token: tokNodeA, impersonate: web, csr: []byte("hello")}, codes.InvalidArgument,
			"CSR: no PEM CERTIFICATE REQUEST block"},
		{"CSR too large",
			request{token: tokNodeA, impersonate: web, csr: make([]byte, 70<<10)}, codes.InvalidArgument,
			"CSR larger than 65536 bytes"},
		{"negative validity",
			request{token: tokNodeA, impersonate: web, csr: csrPEM(t, web), validity: -5}, codes.InvalidArgument,
			"validity_duration -5 is negative"},
		{"malformed impersonated identity",
			request{token: tokNodeA, impersonate: "spiffe://cluster.local/shop/web", csr: csrPEM(t, web)}, codes.InvalidArgument,
			"metadata ImpersonatedIdentity: identity \"spiffe://cluster.local/shop/web\": path must be /ns/<namespace>/sa/<service-account>"},
		{"impersonated identity not a string",
			request{token: tokNodeA, csr: csrPEM(t, web), metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
				"ImpersonatedIdentity": structpb.NewNumberValue(1)}}}, codes.InvalidArgument,
			"metadata ImpersonatedIdentity must be a string"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.call(t, nil, tc.req)
			wantStatus(t, err, tc.code, tc.msg)
		})
	}
	refused := e.logs.FilterMessage("certificate refused").All()
	if len(refused) < 14 {
		t.Fatalf("%d refusals logged, want one per refusal", len(refused))
	}
	found := false
	for _, l := range refused {
		if l.ContextMap()["reason"] == "no workload with identity spiffe://cluster.local/ns/shop/sa/db on node node-a" {
			found = l.ContextMap()["node"] == "node-a" && l.ContextMap()["caller"] == "spiffe://cluster.local/ns/causeway-system/sa/nodeproxy"
		}
	}
	if !found {
		t.Fatal("the node refusal was not logged with caller, node and reason")
	}
}

func TestValidity(t *testing.T) {
	e := setup(t)
	start := time.Now()
	resp, err := e.call(t, nil, request{token: tokNodeA, impersonate: web, csr: csrPEM(t, web), validity: 120})
	leaf := leafOf(t, e, resp, err, web)
	if got := leaf.NotAfter.Sub(start); got < 110*time.Second || got > 130*time.Second+time.Minute {
		t.Fatalf("lifetime %s, want about 120s", got)
	}
	resp, err = e.call(t, nil, request{token: tokNodeA, impersonate: web, csr: csrPEM(t, web), validity: 1 << 62})
	leaf = leafOf(t, e, resp, err, web)
	if max := e.ca.Authority.MaxTTL(); leaf.NotAfter.After(time.Now().Add(max)) {
		t.Fatalf("lifetime not capped at %s: expires %s", max, leaf.NotAfter)
	}
}

func TestMeshCertificateCaller(t *testing.T) {
	e := setup(t)
	api := trusttest.Identity(t, api)
	conn := dial(t, e.ca, e.srv, e.ca.Certificate(t, api, 0))
	// Renewing its own identity with the certificate it holds.
	resp, err := e.call(t, conn, request{csr: csrPEM(t, api.String())})
	leafOf(t, e, resp, err, api.String())
	// A certificate names no node: no impersonation, even of a local workload.
	_, err = e.call(t, conn, request{impersonate: web, csr: csrPEM(t, web)})
	wantStatus(t, err, codes.PermissionDenied,
		"account spiffe://cluster.local/ns/shop/sa/api is not a trusted node account and may not impersonate spiffe://cluster.local/ns/shop/sa/web")

	node := trusttest.Identity(t, "spiffe://cluster.local/ns/causeway-system/sa/nodeproxy")
	conn = dial(t, e.ca, e.srv, e.ca.Certificate(t, node, 0))
	_, err = e.call(t, conn, request{impersonate: web, csr: csrPEM(t, web)})
	wantStatus(t, err, codes.PermissionDenied,
		"account spiffe://cluster.local/ns/causeway-system/sa/nodeproxy authenticated without a node name and may not impersonate spiffe://cluster.local/ns/shop/sa/web")

	// A certificate from another CA does not get through the handshake.
	foreign := trusttest.NewCA(t, "cluster.local")
	conn = dial(t, e.ca, e.srv, foreign.Certificate(t, api, 0))
	_, err = e.call(t, conn, request{csr: csrPEM(t, api.String())})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("foreign client certificate: %v, want the connection refused", err)
	}
}

func TestNewValidatesOptions(t *testing.T) {
	ca := trusttest.NewCA(t, "cluster.local")
	pc, err := authn.NewPeerCertificate("cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	node := trusttest.Identity(t, "spiffe://cluster.local/ns/causeway-system/sa/nodeproxy")
	for _, tc := range []struct {
		o    caserver.Options
		want string
	}{
		{caserver.Options{TrustDomain: "cluster.local", Authenticator: pc}, "no authority"},
		{caserver.Options{Authority: ca.Authority, TrustDomain: "cluster.local"}, "no authenticator"},
		{caserver.Options{Authority: ca.Authority, TrustDomain: "Bad TD", Authenticator: pc}, "trust domain"},
		{caserver.Options{Authority: ca.Authority, TrustDomain: "cluster.local", Authenticator: pc,
			TrustedNodeAccounts: []trust.Identity{node}}, "trusted node accounts need a workload index"},
		{caserver.Options{Authority: ca.Authority, TrustDomain: "other.example", Authenticator: pc,
			TrustedNodeAccounts: []trust.Identity{node}, Workloads: trust.WorkloadList{}}, "is not in trust domain other.example"},
	} {
		if _, err := caserver.New(tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New: %v, want an error containing %q", err, tc.want)
		}
	}
}

// A node proxy's request for a pod the configuration does not hold yet
// waits for it (a pod's first request, before the snapshot that serves
// it), across changes that do not bring it, and is refused, saying how
// long it waited, when it does not come within WorkloadWait.
func TestWaitsForAWorkloadToAppear(t *testing.T) {
	idx := trusttest.NewWorkloadIndex()
	e := setupWith(t, idx, 3*time.Second)
	go func() {
		time.Sleep(100 * time.Millisecond)
		idx.Add(trust.Workload{Node: "node-b", Identity: trusttest.Identity(t, db)}) // not it
		time.Sleep(200 * time.Millisecond)
		idx.Add(trust.Workload{Node: "node-a", Identity: trusttest.Identity(t, api)})
	}()
	start := time.Now()
	resp, err := e.call(t, nil, request{token: tokNodeA, impersonate: api, csr: csrPEM(t, api)})
	leafOf(t, e, resp, err, api)
	if waited := time.Since(start); waited < 250*time.Millisecond {
		t.Fatalf("issued after %s, before the workload appeared", waited)
	}

	// Never on node-a: refused once the wait is over.
	e = setupWith(t, trusttest.NewWorkloadIndex(), 300*time.Millisecond)
	start = time.Now()
	_, err = e.call(t, nil, request{token: tokNodeA, impersonate: db, csr: csrPEM(t, db)})
	wantStatus(t, err, codes.PermissionDenied, "no workload with identity "+db+" on node node-a (none appeared in ")
	if waited := time.Since(start); waited < 300*time.Millisecond || waited > 10*time.Second {
		t.Fatalf("refused after %s, want the wait of 300ms", waited)
	}
}
