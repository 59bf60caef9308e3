package caclient_test

import (
	"context"
	"crypto/tls"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	securityapi "istio.io/api/security/v1alpha1"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/authn"
	"github.com/causeway-mesh/causeway/pkg/trust/caclient"
	"github.com/causeway-mesh/causeway/pkg/trust/caserver"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
)

const tokNodeA = "node-a-token-0123456789"

func startCA(t *testing.T, ca *trusttest.CA) *trusttest.CAServer {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte(tokNodeA+" causeway-system/nodeproxy node-a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens, err := authn.NewTokenFile(path, "cluster.local", nil)
	if err != nil {
		t.Fatal(err)
	}
	return ca.StartCAServer(t, caserver.Options{
		Authenticator:       tokens,
		TrustedNodeAccounts: []trust.Identity{trusttest.Identity(t, "spiffe://cluster.local/ns/causeway-system/sa/nodeproxy")},
		Workloads:           trust.WorkloadList{{Node: "node-a", Identity: trusttest.Identity(t, "spiffe://cluster.local/ns/shop/sa/web")}},
	})
}

func newClient(t *testing.T, o caclient.Options) *caclient.Client {
	t.Helper()
	c, err := caclient.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestFetch(t *testing.T) {
	ca := trusttest.NewCA(t, "cluster.local")
	srv := startCA(t, ca)
	tokPath := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokPath, []byte(tokNodeA+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, caclient.Options{Address: srv.Addr, Bundle: ca.Bundle, ServerIdentity: srv.Identity, Token: caclient.TokenFromFile(tokPath)})
	web := trusttest.Identity(t, "spiffe://cluster.local/ns/shop/sa/web")
	key, csr, err := trust.NewKeyAndCSR(web)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	chain, err := c.Fetch(ctx(t), web, csr, 90*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := trust.TLSCertificate(chain, key)
	if err != nil {
		t.Fatal(err)
	}
	if cert.Leaf.URIs[0].String() != web.String() {
		t.Fatalf("leaf for %v", cert.Leaf.URIs)
	}
	if d := cert.Leaf.NotAfter.Sub(start); d > 100*time.Second {
		t.Fatalf("asked for 90s, got %s", d)
	}

	// A refusal keeps its gRPC status and says why.
	db := trusttest.Identity(t, "spiffe://cluster.local/ns/shop/sa/db")
	_, csr, err = trust.NewKeyAndCSR(db)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Fetch(ctx(t), db, csr, 0)
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "no workload with identity spiffe://cluster.local/ns/shop/sa/db on node node-a") {
		t.Fatalf("got %v", err)
	}

	// The token file is read per request: an emptied file fails locally.
	if err := os.WriteFile(tokPath, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, csr, _ = trust.NewKeyAndCSR(web)
	_, err = c.Fetch(ctx(t), web, csr, 0)
	if err == nil || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("empty token file: %v", err)
	}
}

// TestFetchReconnectsAtOnce: once the CA is back, the next fetch
// connects, rather than failing until gRPC's reconnect backoff (1 s
// after the first failed attempt, growing) runs out.
func TestFetchReconnectsAtOnce(t *testing.T) {
	ca := trusttest.NewCA(t, "cluster.local")
	srv := startCA(t, ca)
	c := newClient(t, caclient.Options{Address: srv.Addr, Bundle: ca.Bundle, ServerIdentity: srv.Identity, Token: caclient.StaticToken(tokNodeA)})
	web := trusttest.Identity(t, "spiffe://cluster.local/ns/shop/sa/web")
	fetch := func() error {
		_, csr, err := trust.NewKeyAndCSR(web)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Fetch(ctx(t), web, csr, 0)
		return err
	}
	if err := fetch(); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	if err := fetch(); err == nil {
		t.Fatal("fetched with the CA stopped")
	}
	srv.Restart(t)
	if err := fetch(); err != nil {
		t.Fatalf("first fetch with the CA back: %v", err)
	}
}

func TestFetchVerifiesTheCA(t *testing.T) {
	ca := trusttest.NewCA(t, "cluster.local")
	srv := startCA(t, ca)
	web := trusttest.Identity(t, "spiffe://cluster.local/ns/shop/sa/web")
	_, csr, err := trust.NewKeyAndCSR(web)
	if err != nil {
		t.Fatal(err)
	}

	// Expecting another identity than the one the CA presents.
	c := newClient(t, caclient.Options{Address: srv.Addr, Bundle: ca.Bundle, Token: caclient.StaticToken(tokNodeA),
		ServerIdentity: trusttest.Identity(t, "spiffe://cluster.local/ns/causeway-system/sa/impostor")})
	_, err = c.Fetch(ctx(t), web, csr, 0)
	if err == nil || !strings.Contains(err.Error(),
		"server identity spiffe://cluster.local/ns/causeway-system/sa/controlplane does not match expected [spiffe://cluster.local/ns/causeway-system/sa/impostor]") {
		t.Fatalf("wrong CA identity: %v", err)
	}

	// Trusting other roots than the CA's.
	other := trusttest.NewCA(t, "cluster.local")
	c = newClient(t, caclient.Options{Address: srv.Addr, Bundle: other.Bundle, ServerIdentity: srv.Identity, Token: caclient.StaticToken(tokNodeA)})
	_, err = c.Fetch(ctx(t), web, csr, 0)
	if err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Fatalf("CA from another root: %v", err)
	}
}

// lyingCA answers every request with a fixed chain.
type lyingCA struct {
	securityapi.UnimplementedIstioCertificateServiceServer
	chain []string
}

func (l *lyingCA) CreateCertificate(context.Context, *securityapi.IstioCertificateRequest) (*securityapi.IstioCertificateResponse, error) {
	return &securityapi.IstioCertificateResponse{CertChain: l.chain}, nil
}

func TestFetchChecksTheAnswer(t *testing.T) {
	ca := trusttest.NewCA(t, "cluster.local")
	cpID, err := trust.ControlPlaneIdentity("cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	cpCert := ca.Certificate(t, cpID, 0)
	liar := &lyingCA{}
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(trust.ServerConfig(ca.Bundle,
		func(net.Addr) (*tls.Certificate, error) { return cpCert, nil }, trust.VerifyIfGiven))))
	securityapi.RegisterIstioCertificateServiceServer(g, liar)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(ln)
	t.Cleanup(g.Stop)

	c := newClient(t, caclient.Options{Address: ln.Addr().String(), Bundle: ca.Bundle, ServerIdentity: cpID, Token: caclient.StaticToken(tokNodeA)})
	web := trusttest.Identity(t, "spiffe://cluster.local/ns/shop/sa/web")
	_, csr, err := trust.NewKeyAndCSR(web)
	if err != nil {
		t.Fatal(err)
	}
	toPEM := func(c *tls.Certificate) []string {
		var out []string
		for _, der := range c.Certificate {
			out = append(out, string(pemCert(der)))
		}
		return out
	}
	for _, tc := range []struct {
		chain []string
		want  string
	}{
		{nil, "CA answered with 0 chain elements"},
		{[]string{"garbage"}, "leaf: no PEM certificate found"},
		{toPEM(ca.Certificate(t, trusttest.Identity(t, "spiffe://cluster.local/ns/shop/sa/db"), 0)),
			"CA issued a certificate for [spiffe://cluster.local/ns/shop/sa/db]"},
		{toPEM(ca.Certificate(t, web, 0)), "CA issued a certificate for another key"},
	} {
		liar.chain = tc.chain
		_, err := c.Fetch(ctx(t), web, csr, 0)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("answer %d elements: %v, want %q", len(tc.chain), err, tc.want)
		}
	}
}

func TestNewValidates(t *testing.T) {
	ca := trusttest.NewCA(t, "cluster.local")
	id := trusttest.Identity(t, "spiffe://cluster.local/ns/causeway-system/sa/controlplane")
	for _, tc := range []struct {
		o    caclient.Options
		want string
	}{
		{caclient.Options{Bundle: ca.Bundle, ServerIdentity: id}, "no address"},
		{caclient.Options{Address: "127.0.0.1:1", ServerIdentity: id}, "no trust bundle"},
		{caclient.Options{Address: "127.0.0.1:1", Bundle: ca.Bundle}, "no expected CA identity"},
	} {
		if _, err := caclient.New(tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New: %v, want %q", err, tc.want)
		}
	}
}

func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
