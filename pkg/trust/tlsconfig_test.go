package trust_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
)

type handshakeResult struct {
	serverErr, clientErr error
	serverState          tls.ConnectionState
	clientState          tls.ConnectionState
}

// handshake runs one TLS handshake over a real TCP connection on 127.0.0.1.
func handshake(t *testing.T, server, client *tls.Config) handshakeResult {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	type srvOut struct {
		err   error
		state tls.ConnectionState
	}
	srvc := make(chan srvOut, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			srvc <- srvOut{err: err}
			return
		}
		defer c.Close()
		tc := tls.Server(c, server)
		err = tc.HandshakeContext(ctx)
		if err == nil {
			// TLS 1.3 servers finish before reading the client's
			// certificate verification outcome; a read surfaces it.
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, _ = tc.Read(make([]byte, 1))
		}
		srvc <- srvOut{err: err, state: tc.ConnectionState()}
	}()

	raw, err := (&net.Dialer{}).DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(raw, client)
	cerr := tc.HandshakeContext(ctx)
	if cerr == nil {
		// Give the server's verdict on our certificate a chance to arrive.
		_ = raw.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		if _, err := tc.Read(make([]byte, 1)); err != nil && !isTimeout(err) && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "EOF") {
			cerr = err
		}
	}
	cstate := tc.ConnectionState()
	tc.Close()
	out := <-srvc
	return handshakeResult{serverErr: out.err, clientErr: cerr, serverState: out.state, clientState: cstate}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func fixed(c *tls.Certificate) trust.ServerCertFunc {
	return func(net.Addr) (*tls.Certificate, error) { return c, nil }
}

func clientCert(c *tls.Certificate) func() (*tls.Certificate, error) {
	return func() (*tls.Certificate, error) { return c, nil }
}

func wantErr(t *testing.T, what string, err error, substr string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error, want one containing %q", what, substr)
	}
	if !strings.Contains(err.Error(), substr) {
		t.Fatalf("%s: error %q does not contain %q", what, err, substr)
	}
}

// expiredCertificate issues a certificate for id that expired an hour ago.
func expiredCertificate(t *testing.T, ca *trusttest.CA, id trust.Identity) *tls.Certificate {
	t.Helper()
	key, csrPEM, err := trust.NewKeyAndCSR(id)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := trust.ParseCSR(csrPEM)
	if err != nil {
		t.Fatal(err)
	}
	chain, err := ca.Authority.SignWithValidity(csr, id, time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	c, err := trust.TLSCertificate(chain, key)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestHandshakeMatchingSANs(t *testing.T) {
	ca := trusttest.NewCA(t, "cluster.local")
	serverID := trusttest.Identity(t, "spiffe://cluster.local/ns/a/sa/server")
	clientID := trusttest.Identity(t, "spiffe://cluster.local/ns/b/sa/client")
	other := trusttest.Identity(t, "spiffe://cluster.local/ns/a/sa/other")
	r := handshake(t,
		trust.ServerConfig(ca.Bundle, fixed(ca.Certificate(t, serverID, 0)), trust.RequireClientCert),
		trust.ClientConfig(ca.Bundle, clientCert(ca.Certificate(t, clientID, 0)), []trust.Identity{other, serverID}))
	if r.serverErr != nil || r.clientErr != nil {
		t.Fatalf("handshake failed: server %v, client %v", r.serverErr, r.clientErr)
	}
	if r.clientState.NegotiatedProtocol != trust.ALPN || r.clientState.Version != tls.VersionTLS13 {
		t.Fatalf("negotiated %q version %x, want h2 over TLS 1.3", r.clientState.NegotiatedProtocol, r.clientState.Version)
	}
	if r.clientState.ServerName != "" {
		t.Fatalf("client sent SNI %q", r.clientState.ServerName)
	}
	p, err := trust.PeerFromTLS(r.serverState)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := p.Identity(); !ok || got != clientID {
		t.Fatalf("server sees peer %v, want %v", p, clientID)
	}
}

func TestHandshakeTLSOnlyClient(t *testing.T) {
	ca := trusttest.NewCA(t, "cluster.local")
	serverID := trusttest.Identity(t, "spiffe://cluster.local/ns/a/sa/server")
	serverCert := ca.Certificate(t, serverID, 0)

	r := handshake(t, trust.ServerConfig(ca.Bundle, fixed(serverCert), trust.VerifyIfGiven),
		trust.ClientConfig(ca.Bundle, nil, []trust.Identity{serverID}))
	if r.serverErr != nil || r.clientErr != nil {
		t.Fatalf("handshake failed: server %v, client %v", r.serverErr, r.clientErr)
	}
	p, err := trust.PeerFromTLS(r.serverState)
	if err != nil {
		t.Fatal(err)
	}
	if p.Authenticated() {
		t.Fatalf("TLS-only client became %v", p)
	}

	r = handshake(t, trust.ServerConfig(ca.Bundle, fixed(serverCert), trust.RequireClientCert),
		trust.ClientConfig(ca.Bundle, nil, []trust.Identity{serverID}))
	wantErr(t, "server requiring a client certificate", r.serverErr, "client didn't provide a certificate")
}

func TestHandshakeSANMismatch(t *testing.T) {
	ca := trusttest.NewCA(t, "cluster.local")
	serverID := trusttest.Identity(t, "spiffe://cluster.local/ns/a/sa/server")
	want := trusttest.Identity(t, "spiffe://cluster.local/ns/a/sa/expected")
	r := handshake(t, trust.ServerConfig(ca.Bundle, fixed(ca.Certificate(t, serverID, 0)), trust.VerifyIfGiven),
		trust.ClientConfig(ca.Bundle, nil, []trust.Identity{want}))
	wantErr(t, "client", r.clientErr,
		"server identity spiffe://cluster.local/ns/a/sa/server does not match expected [spiffe://cluster.local/ns/a/sa/expected]")
	if r.serverErr == nil {
		t.Fatal("server completed a handshake the client rejected")
	}
}

func TestHandshakeExpired(t *testing.T) {
	ca := trusttest.NewCA(t, "cluster.local")
	serverID := trusttest.Identity(t, "spiffe://cluster.local/ns/a/sa/server")
	clientID := trusttest.Identity(t, "spiffe://cluster.local/ns/b/sa/client")

	r := handshake(t, trust.ServerConfig(ca.Bundle, fixed(expiredCertificate(t, ca, serverID)), trust.VerifyIfGiven),
		trust.ClientConfig(ca.Bundle, nil, []trust.Identity{serverID}))
	wantErr(t, "client facing an expired server certificate", r.clientErr,
		"server certificate: certificate expired: spiffe://cluster.local/ns/a/sa/server expired at ")

	r = handshake(t, trust.ServerConfig(ca.Bundle, fixed(ca.Certificate(t, serverID, 0)), trust.VerifyIfGiven),
		trust.ClientConfig(ca.Bundle, clientCert(expiredCertificate(t, ca, clientID)), []trust.Identity{serverID}))
	wantErr(t, "server facing an expired client certificate", r.serverErr, "x509: certificate has expired")
}

// TestHandshakeClockSkew: a side whose clock is off by an hour refuses
// the other's current certificate as expired (clock ahead) or not yet
// valid (behind), saying which and by how much, the server through its
// config's Time; with the clock right again the same certificates pass.
func TestHandshakeClockSkew(t *testing.T) {
	ca := trusttest.NewCA(t, "cluster.local")
	serverID := trusttest.Identity(t, "spiffe://cluster.local/ns/a/sa/server")
	clientID := trusttest.Identity(t, "spiffe://cluster.local/ns/b/sa/client")
	serverCert, clientCert := ca.Certificate(t, serverID, 10*time.Minute), ca.Certificate(t, clientID, 10*time.Minute)
	bundle := func() *trust.Bundle {
		b, err := trust.NewBundle("cluster.local", ca.Bundle.Roots())
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	serverBundle, clientBundle := bundle(), bundle()
	server := trust.ServerConfig(serverBundle, fixed(serverCert), trust.RequireClientCert)
	client := trust.ClientConfig(clientBundle, func() (*tls.Certificate, error) { return clientCert, nil }, []trust.Identity{serverID})
	skewed := func(d time.Duration) func() time.Time { return func() time.Time { return time.Now().Add(d) } }
	check := func(what string, err error, reason string, skew time.Duration, text string) {
		t.Helper()
		var te *trust.CertificateTimeError
		if !errors.As(err, &te) {
			t.Fatalf("%s: error %v is not a certificate time error", what, err)
		}
		if te.Reason() != reason || te.Skew() < skew-time.Minute || te.Skew() > skew+time.Minute {
			t.Fatalf("%s: reason %s, skew %v; want %s, about %v", what, te.Reason(), te.Skew(), reason, skew)
		}
		wantErr(t, what, err, text)
	}
	for _, c := range []struct {
		name       string
		offset     time.Duration
		reason     string
		skew       time.Duration // the leaf is valid from 1 minute ago for 10 minutes
		clientText string
	}{
		{"ahead", time.Hour, trust.ReasonExpired, 51 * time.Minute,
			"server certificate: certificate expired: spiffe://cluster.local/ns/a/sa/server expired at "},
		{"behind", -time.Hour, trust.ReasonNotYetValid, 59 * time.Minute,
			"server certificate: certificate not yet valid: spiffe://cluster.local/ns/a/sa/server is valid from "},
	} {
		clientBundle.SetClock(skewed(c.offset))
		r := handshake(t, server, client)
		check("client clock "+c.name, r.clientErr, c.reason, c.skew, c.clientText)
		clientBundle.SetClock(nil)

		serverBundle.SetClock(skewed(c.offset))
		r = handshake(t, server, client)
		check("server clock "+c.name, trust.ExplainValidity(r.serverErr, server.Time()), c.reason, c.skew, "spiffe://cluster.local/ns/b/sa/client")
		serverBundle.SetClock(nil)

		if r := handshake(t, server, client); r.serverErr != nil || r.clientErr != nil {
			t.Fatalf("clocks right again after %s: server %v, client %v", c.name, r.serverErr, r.clientErr)
		}
	}
}

func TestHandshakeOtherRoot(t *testing.T) {
	ca := trusttest.NewCA(t, "cluster.local")
	foreign := trusttest.NewCA(t, "cluster.local") // same trust domain, different root
	serverID := trusttest.Identity(t, "spiffe://cluster.local/ns/a/sa/server")
	clientID := trusttest.Identity(t, "spiffe://cluster.local/ns/b/sa/client")

	r := handshake(t, trust.ServerConfig(ca.Bundle, fixed(foreign.Certificate(t, serverID, 0)), trust.VerifyIfGiven),
		trust.ClientConfig(ca.Bundle, nil, []trust.Identity{serverID}))
	wantErr(t, "client facing a server certificate from another root", r.clientErr,
		"server certificate: certificate of spiffe://cluster.local/ns/a/sa/server: x509: certificate signed by unknown authority")

	r = handshake(t, trust.ServerConfig(ca.Bundle, fixed(ca.Certificate(t, serverID, 0)), trust.VerifyIfGiven),
		trust.ClientConfig(ca.Bundle, clientCert(foreign.Certificate(t, clientID, 0)), []trust.Identity{serverID}))
	wantErr(t, "server facing a client certificate from another root", r.serverErr,
		"x509: certificate signed by unknown authority")
}

func TestHandshakeForeignTrustDomainClient(t *testing.T) {
	// One root shared by two trust domains: the chain verifies, the trust
	// domain check must still refuse the client.
	ca := trusttest.NewCA(t, "cluster.local")
	serverID := trusttest.Identity(t, "spiffe://cluster.local/ns/a/sa/server")
	foreignID := trusttest.Identity(t, "spiffe://other.example/ns/b/sa/client")
	r := handshake(t, trust.ServerConfig(ca.Bundle, fixed(ca.Certificate(t, serverID, 0)), trust.VerifyIfGiven),
		trust.ClientConfig(ca.Bundle, clientCert(ca.Certificate(t, foreignID, 0)), []trust.Identity{serverID}))
	wantErr(t, "server", r.serverErr, "client identity spiffe://other.example/ns/b/sa/client is not in trust domain cluster.local")
}

func TestBundleRotation(t *testing.T) {
	oldCA := trusttest.NewCA(t, "cluster.local")
	newCA := trusttest.NewCA(t, "cluster.local")
	serverID := trusttest.Identity(t, "spiffe://cluster.local/ns/a/sa/server")
	clientID := trusttest.Identity(t, "spiffe://cluster.local/ns/b/sa/client")
	bundle, err := trust.NewBundle("cluster.local", oldCA.Bundle.Roots())
	if err != nil {
		t.Fatal(err)
	}
	server := trust.ServerConfig(bundle, fixed(oldCA.Certificate(t, serverID, 0)), trust.RequireClientCert)
	newClient := trust.ClientConfig(oldCA.Bundle, clientCert(newCA.Certificate(t, clientID, 0)), []trust.Identity{serverID})

	r := handshake(t, server, newClient)
	wantErr(t, "before rotation", r.serverErr, "unknown authority")

	if err := bundle.SetRoots(append(oldCA.Bundle.Roots(), newCA.Bundle.Roots()...)); err != nil {
		t.Fatal(err)
	}
	r = handshake(t, server, newClient)
	if r.serverErr != nil || r.clientErr != nil {
		t.Fatalf("after rotation: server %v, client %v", r.serverErr, r.clientErr)
	}
}

func TestServerCertFuncError(t *testing.T) {
	ca := trusttest.NewCA(t, "cluster.local")
	serverID := trusttest.Identity(t, "spiffe://cluster.local/ns/a/sa/server")
	r := handshake(t, trust.ServerConfig(ca.Bundle, func(a net.Addr) (*tls.Certificate, error) {
		return nil, errors.New("no workload at this address")
	}, trust.VerifyIfGiven), trust.ClientConfig(ca.Bundle, nil, []trust.Identity{serverID}))
	wantErr(t, "server", r.serverErr, "no certificate for 127.0.0.1:")
	wantErr(t, "server", r.serverErr, "no workload at this address")
}
