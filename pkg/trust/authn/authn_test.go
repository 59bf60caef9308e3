package authn_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/authn"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
)

const (
	tokA = "token-node-a-0123456789"
	tokB = "token-node-b-0123456789"
	tokW = "token-waypoint-0123456"
)

func writeTokens(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestParseTokens(t *testing.T) {
	entries, err := authn.ParseTokens([]byte(`
# node proxies
`+tokA+` causeway-system/nodeproxy node-a
  `+tokB+`	causeway-system/nodeproxy   node-b
`+tokW+` shop/waypoint
`), "cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 3 {
		t.Fatalf("%d entries", len(entries))
	}
	if got := entries[1].Caller.String(); got != "spiffe://cluster.local/ns/causeway-system/sa/nodeproxy on node node-b" {
		t.Fatalf("entry 2 = %s", got)
	}
	if got := entries[2].Caller; got.Node != "" || got.Account.String() != "spiffe://cluster.local/ns/shop/sa/waypoint" {
		t.Fatalf("entry 3 = %s", got)
	}

	for _, tc := range []struct{ in, want string }{
		{"short ns/sa node", "line 1: token shorter than 16 characters"},
		{tokA + " nsonly node", `line 1: account "nsonly" is not <namespace>/<serviceaccount>`},
		{tokA + " ns/sa node extra", "line 1: want <token> <namespace>/<serviceaccount> [<node>], found 4 fields"},
		{tokA, "found 1 fields"},
		{"# c\n" + tokA + " ns/sa n\n" + tokA + " ns/other n", "line 3: same token as line 2"},
		{tokA + " n$s/sa node", "line 1: identity for n$s/sa"},
	} {
		_, err := authn.ParseTokens([]byte(tc.in), "cluster.local")
		trusttest.WantError(t, err, nil, tc.want)
	}
}

func TestTokenFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, path, tokA+" causeway-system/nodeproxy node-a\n")
	tf, err := authn.NewTokenFile(path, "cluster.local", nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := tf.Authenticate(trusttest.Bearer(tokA))
	if err != nil {
		t.Fatal(err)
	}
	if c.Account.String() != "spiffe://cluster.local/ns/causeway-system/sa/nodeproxy" || c.Node != "node-a" {
		t.Fatalf("caller %s", c)
	}
	lower := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "bearer "+tokA))
	if _, err := tf.Authenticate(lower); err != nil {
		t.Fatalf("lower-case scheme: %v", err)
	}

	_, err = tf.Authenticate(trusttest.Bearer(tokB))
	trusttest.WantError(t, err, authn.ErrInvalidCredentials, "bearer token not recognised")
	_, err = tf.Authenticate(trusttest.Bearer(tokA[:len(tokA)-1]))
	trusttest.WantError(t, err, authn.ErrInvalidCredentials, "bearer token not recognised")
	_, err = tf.Authenticate(context.Background())
	trusttest.WantError(t, err, authn.ErrNoCredentials, "no authorization header")
	_, err = tf.Authenticate(metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Basic abc")))
	trusttest.WantError(t, err, authn.ErrNoCredentials, "not a bearer token")
	_, err = tf.Authenticate(metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+tokA, "authorization", "Bearer "+tokA)))
	trusttest.WantError(t, err, authn.ErrInvalidCredentials, "2 authorization headers")
	_, err = tf.Authenticate(trusttest.Bearer(""))
	trusttest.WantError(t, err, authn.ErrInvalidCredentials, "empty bearer token")
	_, err = tf.Authenticate(trusttest.Bearer(strings.Repeat("x", 9000)))
	trusttest.WantError(t, err, authn.ErrInvalidCredentials, "longer than")

	// Replaced: the new token works at once, the old one no longer does.
	writeTokens(t, path, "# rotated\n"+tokB+" causeway-system/nodeproxy node-a\n")
	if _, err := tf.Authenticate(trusttest.Bearer(tokB)); err != nil {
		t.Fatalf("after reload: %v", err)
	}
	_, err = tf.Authenticate(trusttest.Bearer(tokA))
	trusttest.WantError(t, err, authn.ErrInvalidCredentials, "not recognised")

	// A broken version is ignored; the last good tokens stay in force.
	writeTokens(t, path, "broken\n")
	if _, err := tf.Authenticate(trusttest.Bearer(tokB)); err != nil {
		t.Fatalf("after a broken update: %v", err)
	}
	// A missing file also keeps the last good tokens.
	os.Remove(path)
	if _, err := tf.Authenticate(trusttest.Bearer(tokB)); err != nil {
		t.Fatalf("after removal: %v", err)
	}

	if _, err := authn.NewTokenFile(path, "cluster.local", nil); err == nil {
		t.Fatal("authn.NewTokenFile accepted a missing file")
	}
	writeTokens(t, path, "short ns/sa\n")
	_, err = authn.NewTokenFile(path, "cluster.local", nil)
	trusttest.WantError(t, err, nil, "token shorter than 16")
}

// tlsState runs a real handshake over TCP on 127.0.0.1 in which the client
// presents cert, and returns the server's view of it.
func tlsState(t *testing.T, ca *trusttest.CA, cert *tls.Certificate) tls.ConnectionState {
	t.Helper()
	serverID := trusttest.Identity(t, "spiffe://cluster.local/ns/causeway-system/sa/controlplane")
	serverCert := ca.Certificate(t, serverID, 0)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	errc := make(chan error, 1)
	go func() {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			errc <- err
			return
		}
		defer c.Close()
		tc := tls.Client(c, trust.ClientConfig(ca.Bundle, func() (*tls.Certificate, error) { return cert, nil }, []trust.Identity{serverID}))
		err = tc.Handshake()
		if err == nil {
			_, _ = tc.Read(make([]byte, 1)) // until the server closes
		}
		errc <- err
	}()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	sc := tls.Server(c, trust.ServerConfig(ca.Bundle, func(net.Addr) (*tls.Certificate, error) { return serverCert, nil }, trust.VerifyIfGiven))
	if err := sc.Handshake(); err != nil {
		t.Fatal(err)
	}
	st := sc.ConnectionState()
	sc.Close()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	return st
}

func withTLS(st tls.ConnectionState) context.Context {
	return peer.NewContext(context.Background(), &peer.Peer{AuthInfo: credentials.TLSInfo{State: st}})
}

func TestPeerCertificate(t *testing.T) {
	ca := trusttest.NewCA(t, "cluster.local")
	pc, err := authn.NewPeerCertificate("cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	id := trusttest.Identity(t, "spiffe://cluster.local/ns/shop/sa/waypoint")
	st := tlsState(t, ca, ca.Certificate(t, id, 0))
	c, err := pc.Authenticate(withTLS(st))
	if err != nil {
		t.Fatal(err)
	}
	if c.Account != id || c.Node != "" {
		t.Fatalf("caller %s", c)
	}

	// A certificate the handshake did not verify is not a credential.
	unverified := st
	unverified.VerifiedChains = nil
	_, err = pc.Authenticate(withTLS(unverified))
	trusttest.WantError(t, err, authn.ErrInvalidCredentials, "client certificate was not verified")

	// A verified certificate of another trust domain.
	other, err := authn.NewPeerCertificate("other.example")
	if err != nil {
		t.Fatal(err)
	}
	_, err = other.Authenticate(withTLS(st))
	trusttest.WantError(t, err, authn.ErrInvalidCredentials, "client identity spiffe://cluster.local/ns/shop/sa/waypoint is not in trust domain other.example")

	_, err = pc.Authenticate(context.Background())
	trusttest.WantError(t, err, authn.ErrNoCredentials, "no TLS connection")
	_, err = pc.Authenticate(withTLS(tlsState(t, ca, &tls.Certificate{})))
	trusttest.WantError(t, err, authn.ErrNoCredentials, "no client certificate")
}

func TestChain(t *testing.T) {
	ca := trusttest.NewCA(t, "cluster.local")
	path := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, path, tokA+" causeway-system/nodeproxy node-a\n")
	tf, err := authn.NewTokenFile(path, "cluster.local", nil)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := authn.NewPeerCertificate("cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	chain := authn.Chain{tf, pc}
	id := trusttest.Identity(t, "spiffe://cluster.local/ns/shop/sa/waypoint")
	st := tlsState(t, ca, ca.Certificate(t, id, 0))

	both := metadata.NewIncomingContext(withTLS(st), metadata.Pairs("authorization", "Bearer "+tokA))
	if c, err := chain.Authenticate(both); err != nil || c.Node != "node-a" {
		t.Fatalf("token first: %v %v", c, err)
	}
	if c, err := chain.Authenticate(withTLS(st)); err != nil || c.Account != id {
		t.Fatalf("certificate: %v %v", c, err)
	}
	// An invalid token is refused even though a valid certificate follows.
	badToken := metadata.NewIncomingContext(withTLS(st), metadata.Pairs("authorization", "Bearer "+tokB))
	_, err = chain.Authenticate(badToken)
	trusttest.WantError(t, err, authn.ErrInvalidCredentials, "bearer token not recognised")

	_, err = chain.Authenticate(context.Background())
	trusttest.WantError(t, err, authn.ErrNoCredentials, "present a bearer token or a mesh client certificate")
}

func TestStatusError(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code codes.Code
	}{
		{authn.ErrNoCredentials, codes.Unauthenticated},
		{errors.Join(errors.New("x"), authn.ErrInvalidCredentials), codes.Unauthenticated},
		{errors.New("token review API down"), codes.Unavailable},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
	} {
		if got := status.Code(authn.StatusError(tc.err)); got != tc.code {
			t.Errorf("authn.StatusError(%v) = %v, want %v", tc.err, got, tc.code)
		}
	}
	if authn.StatusError(nil) != nil {
		t.Fatal("authn.StatusError(nil) != nil")
	}
}

func FuzzParseTokens(f *testing.F) {
	f.Add([]byte("# comment\n" + tokA + " ns/sa node-a\n" + tokW + " shop/waypoint\n"))
	f.Add([]byte(tokA + " ns/sa node-a\n" + tokA + " ns/sa node-b\n"))
	f.Add([]byte("\x00\xff /\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		entries, err := authn.ParseTokens(data, "cluster.local")
		if err != nil {
			return
		}
		for _, e := range entries {
			if e.Caller.Account.IsZero() || e.Caller.Account.TrustDomain().Name() != "cluster.local" {
				t.Fatalf("entry with account %q", e.Caller.Account)
			}
			if strings.ContainsAny(e.Caller.Node, " \t\n") {
				t.Fatalf("node %q contains blanks", e.Caller.Node)
			}
		}
	})
}
