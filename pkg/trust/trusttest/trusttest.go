// Package trusttest gives tests in other packages a real mesh CA, real
// workload certificates and authenticated peers obtained through a real TLS
// handshake.
package trusttest

import (
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/pkg/trust"
)

// CA is a test certificate authority for one trust domain.
type CA struct {
	Authority *trust.Authority
	Bundle    *trust.Bundle
}

// NewCA creates a CA with a fresh self-signed root and intermediate.
func NewCA(t testing.TB, trustDomain string) *CA {
	t.Helper()
	m, err := trust.GenerateSelfSigned(trustDomain, 48*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	a, err := trust.NewAuthority(m.Key, m.Chain, m.Roots, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	b, err := trust.NewBundle(trustDomain, m.Roots)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{Authority: a, Bundle: b}
}

// Identity parses id or fails the test.
func Identity(t testing.TB, id string) trust.Identity {
	t.Helper()
	i, err := trust.ParseIdentity(id)
	if err != nil {
		t.Fatal(err)
	}
	return i
}

// Certificate issues a certificate for id valid for ttl (0: the CA maximum).
func (c *CA) Certificate(t testing.TB, id trust.Identity, ttl time.Duration) *tls.Certificate {
	t.Helper()
	key, csrPEM, err := trust.NewKeyAndCSR(id)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := trust.ParseCSR(csrPEM)
	if err != nil {
		t.Fatal(err)
	}
	chain, err := c.Authority.Sign(csr, id, ttl)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := trust.TLSCertificate(chain, key)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// Peer returns the peer a server sees when a client presents cert (nil:
// no certificate), obtained through a real TLS handshake over a pipe.
func (c *CA) Peer(t testing.TB, cert *tls.Certificate) trust.Peer {
	t.Helper()
	serverCert := c.Certificate(t, Identity(t, "spiffe://"+c.Bundle.TrustDomain().Name()+"/ns/test/sa/server"), 0)
	serverID, _ := trust.ParseIdentity(serverCert.Leaf.URIs[0].String())
	var getCert func() (*tls.Certificate, error)
	if cert != nil {
		getCert = func() (*tls.Certificate, error) { return cert, nil }
	}
	cc, sc := net.Pipe()
	defer cc.Close()
	defer sc.Close()
	client := tls.Client(cc, trust.ClientConfig(c.Bundle, getCert, []trust.Identity{serverID}))
	server := tls.Server(sc, trust.ServerConfig(c.Bundle, func(net.Addr) (*tls.Certificate, error) { return serverCert, nil }, trust.VerifyIfGiven))
	errc := make(chan error, 1)
	go func() { errc <- client.Handshake() }()
	if err := server.Handshake(); err != nil {
		t.Fatalf("server handshake: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("client handshake: %v", err)
	}
	p, err := trust.PeerFromTLS(server.ConnectionState())
	if err != nil {
		t.Fatal(err)
	}
	return p
}
