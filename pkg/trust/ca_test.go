package trust_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
)

// csrFor builds a CSR with arbitrary URI SANs, signed by key.
func csrFor(t testing.TB, key any, uris ...string) *x509.CertificateRequest {
	t.Helper()
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
	csr, err := trust.ParseCSR(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
	if err != nil {
		t.Fatal(err)
	}
	return csr
}

func p256(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestCheckCSRRefusals(t *testing.T) {
	id := trusttest.Identity(t, "spiffe://cluster.local/ns/a/sa/b")
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		csr  *x509.CertificateRequest
		want string
	}{
		{"other identity", csrFor(t, p256(t), "spiffe://cluster.local/ns/a/sa/c"),
			"CSR asks for spiffe://cluster.local/ns/a/sa/c, but the caller may only get spiffe://cluster.local/ns/a/sa/b"},
		{"several SANs", csrFor(t, p256(t), "spiffe://cluster.local/ns/a/sa/b", "spiffe://cluster.local/ns/a/sa/c"),
			"CSR must contain exactly one URI SAN, has 2"},
		{"no SAN", csrFor(t, p256(t)), "CSR must contain exactly one URI SAN, has 0"},
		{"foreign trust domain", csrFor(t, p256(t), "spiffe://evil.example/ns/a/sa/b"),
			"CSR asks for spiffe://evil.example/ns/a/sa/b in trust domain evil.example, but the CA issues only for trust domain cluster.local"},
		{"not an identity", csrFor(t, p256(t), "spiffe://cluster.local/foo"), "path must be /ns/<namespace>/sa/<service-account>"},
		{"RSA key", csrFor(t, rsaKey, "spiffe://cluster.local/ns/a/sa/b"), "CSR public key must be ECDSA P-256, is RSA 2048"},
		{"P-384 key", csrFor(t, p384, "spiffe://cluster.local/ns/a/sa/b"), "CSR public key must be ECDSA P-256, is ECDSA P-384"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantErr(t, "CheckCSR", trust.CheckCSR(tc.csr, id), tc.want)
		})
	}

	// A CSR with a DNS SAN next to the right URI SAN.
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		URIs: []*url.URL{id.URL()}, DNSNames: []string{"example.com"},
	}, p256(t))
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		t.Fatal(err)
	}
	wantErr(t, "DNS SAN", trust.CheckCSR(csr, id), "CSR may only contain a URI SAN")

	// A tampered signature.
	good := csrFor(t, p256(t), id.String())
	raw := append([]byte(nil), good.Raw...)
	raw[len(raw)-5] ^= 0xff
	if bad, err := x509.ParseCertificateRequest(raw); err == nil {
		wantErr(t, "tampered", trust.CheckCSR(bad, id), "CSR signature")
	}
}

func TestSign(t *testing.T) {
	ca := trusttest.NewCA(t, "cluster.local")
	id := trusttest.Identity(t, "spiffe://cluster.local/ns/a/sa/b")
	key, csrPEM, err := trust.NewKeyAndCSR(id)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := trust.ParseCSR(csrPEM)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	chain, err := ca.Authority.Sign(csr, id, 1000*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if len(chain) != 3 {
		t.Fatalf("chain has %d elements, want leaf, intermediate, root", len(chain))
	}
	certs, err := trust.ParseCertificatesPEM([]byte(chain[0] + chain[1] + chain[2]))
	if err != nil {
		t.Fatal(err)
	}
	leaf := certs[0]
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != id.String() {
		t.Fatalf("leaf SANs %v", leaf.URIs)
	}
	if len(leaf.DNSNames)+len(leaf.IPAddresses)+len(leaf.EmailAddresses) != 0 || leaf.IsCA {
		t.Fatal("leaf has extra SANs or is a CA")
	}
	if leaf.SerialNumber.BitLen() < 64 || leaf.SerialNumber.BitLen() > 128 {
		t.Fatalf("serial %x is not a 128-bit random number", leaf.SerialNumber)
	}
	if got := leaf.NotAfter.Sub(start); got > ca.Authority.MaxTTL()+time.Minute {
		t.Fatalf("lifetime %s exceeds the maximum %s", got, ca.Authority.MaxTTL())
	}
	hasUsage := map[x509.ExtKeyUsage]bool{}
	for _, u := range leaf.ExtKeyUsage {
		hasUsage[u] = true
	}
	if !hasUsage[x509.ExtKeyUsageServerAuth] || !hasUsage[x509.ExtKeyUsageClientAuth] || leaf.KeyUsage&x509.KeyUsageDigitalSignature == 0 {
		t.Fatalf("leaf usages %v / %v", leaf.ExtKeyUsage, leaf.KeyUsage)
	}
	if pub, ok := leaf.PublicKey.(*ecdsa.PublicKey); !ok || !pub.Equal(&key.PublicKey) {
		t.Fatal("leaf does not carry the CSR's key")
	}
	roots := x509.NewCertPool()
	roots.AddCert(certs[2])
	inter := x509.NewCertPool()
	inter.AddCert(certs[1])
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("chain does not verify: %v", err)
	}
	if leaf.NotBefore.Before(certs[1].NotBefore) {
		t.Fatal("leaf valid before its issuer")
	}
	// Backdated for peers whose clocks run behind the CA's (the issuer is
	// older than that here).
	if latest := time.Now().Add(-trust.Backdate); leaf.NotBefore.After(latest) || trust.Backdate < time.Minute {
		t.Fatalf("leaf valid from %s, want backdated by at least a minute (by %s: before %s)", leaf.NotBefore, trust.Backdate, latest)
	}
	if _, err := trust.TLSCertificate(chain, key); err != nil {
		t.Fatal(err)
	}
	if _, err := trust.TLSCertificate(chain, nil); err == nil {
		t.Fatal("TLSCertificate accepted a nil key")
	}
	if _, err := trust.TLSCertificate(chain, p256(t)); err == nil {
		t.Fatal("TLSCertificate accepted a key that does not match")
	}
}

func TestSignServer(t *testing.T) {
	ca := trusttest.NewCA(t, "cluster.local")
	id := trusttest.Identity(t, "spiffe://cluster.local/ns/causeway-system/sa/controlplane")
	_, csrPEM, err := trust.NewKeyAndCSR(id)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := trust.ParseCSR(csrPEM)
	if err != nil {
		t.Fatal(err)
	}
	chain, err := ca.Authority.SignServer(csr, id, time.Hour, trust.ServerNames{DNS: []string{"cp.causeway-system.svc"}, IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	certs, err := trust.ParseCertificatesPEM([]byte(chain[0]))
	if err != nil {
		t.Fatal(err)
	}
	leaf := certs[0]
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != id.String() || fmt.Sprint(leaf.DNSNames) != "[cp.causeway-system.svc]" || fmt.Sprint(leaf.IPAddresses) != "[127.0.0.1]" {
		t.Fatalf("SANs %v %v %v", leaf.URIs, leaf.DNSNames, leaf.IPAddresses)
	}
	for _, bad := range []string{"", "a..b", "-a.b", "a_b.svc", "a b", strings.Repeat("a", 64) + ".svc"} {
		if _, err := ca.Authority.SignServer(csr, id, time.Hour, trust.ServerNames{DNS: []string{bad}}); err == nil {
			t.Errorf("DNS name %q accepted", bad)
		}
	}
}

// IssueServer's certificate is the key's and carries the identity and the
// names, as SignServer's.
func TestIssueServer(t *testing.T) {
	ca := trusttest.NewCA(t, "cluster.local")
	id := trusttest.Identity(t, "spiffe://cluster.local/ns/causeway-system/sa/controlplane")
	cert, err := ca.Authority.IssueServer(id, trust.ServerNames{DNS: []string{"cp.causeway-system.svc"}, IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	leaf := cert.Leaf
	if leaf == nil || len(leaf.URIs) != 1 || leaf.URIs[0].String() != id.String() || fmt.Sprint(leaf.DNSNames) != "[cp.causeway-system.svc]" || fmt.Sprint(leaf.IPAddresses) != "[127.0.0.1]" {
		t.Fatalf("leaf %v", leaf)
	}
	if _, err := ca.Authority.IssueServer(id, trust.ServerNames{DNS: []string{"a_b.svc"}}); err == nil {
		t.Error("a DNS name that is not a host name was accepted")
	}
}
