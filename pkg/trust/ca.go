package trust

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"strings"
	"time"
)

// Authority signs workload certificates with an intermediate CA key. Its
// chain is leaf -> intermediates -> root.
type Authority struct {
	signer crypto.Signer
	cert   *x509.Certificate   // the signing (intermediate) certificate
	chain  []*x509.Certificate // signing cert first, then up to (excluding) the root
	roots  []*x509.Certificate
	maxTTL time.Duration
}

// DefaultCertTTL is the lifetime of a workload certificate unless asked otherwise.
const DefaultCertTTL = 24 * time.Hour

// NewAuthority builds an authority from its signing key and certificate, the
// chain from that certificate up to the root (excluding roots), the roots, and
// the longest lifetime it will grant.
func NewAuthority(signer crypto.Signer, chain []*x509.Certificate, roots []*x509.Certificate, maxTTL time.Duration) (*Authority, error) {
	if signer == nil {
		return nil, errors.New("authority: no signing key")
	}
	if len(chain) == 0 || len(roots) == 0 {
		return nil, errors.New("authority: need a signing certificate and at least one root")
	}
	if !chain[0].IsCA || chain[0].KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("authority: certificate %q cannot sign certificates", chain[0].Subject)
	}
	if !publicKeysEqual(signer.Public(), chain[0].PublicKey) {
		return nil, errors.New("authority: signing key does not match the signing certificate")
	}
	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return nil, fmt.Errorf("authority: signing certificate does not chain to the roots: %w", err)
	}
	if maxTTL <= 0 {
		maxTTL = DefaultCertTTL
	}
	return &Authority{signer: signer, cert: chain[0], chain: chain, roots: roots, maxTTL: maxTTL}, nil
}

// Roots returns the authority's root certificates (the trust bundle).
func (a *Authority) Roots() []*x509.Certificate { return a.roots }

// MaxTTL is the longest lifetime the authority grants.
func (a *Authority) MaxTTL() time.Duration { return a.maxTTL }

// Sign issues a certificate for id to the public key of csr, which must ask
// for exactly id (one URI SAN, no DNS/IP/email SANs) and carry a valid
// signature. ttl is bounded by the authority's maximum and by the signing
// certificate's own expiry. It returns the PEM chain, leaf first, roots last.
func (a *Authority) Sign(csr *x509.CertificateRequest, id Identity, ttl time.Duration) ([]string, error) {
	return a.sign(csr, id, ttl, ServerNames{})
}

// ServerNames are the host names and addresses a server is dialled by.
type ServerNames struct {
	DNS []string
	IPs []net.IP
}

// SignServer issues a serving certificate: id as its URI SAN, as Sign
// does, plus names as DNS and IP SANs, so that clients verifying the host
// they dial (standard gRPC clients, Istio's CA clients) accept it. It is
// for the control plane's own certificate and never reachable from a
// caller's CSR: workloads get their identity and nothing else.
func (a *Authority) SignServer(csr *x509.CertificateRequest, id Identity, ttl time.Duration, names ServerNames) ([]string, error) {
	for _, n := range names.DNS {
		if err := checkDNSName(n); err != nil {
			return nil, err
		}
	}
	return a.sign(csr, id, ttl, names)
}

// IssueServer makes a key and a serving certificate (SignServer, the
// longest lifetime) for id and names, ready to serve: how the control
// plane issues its own certificates.
func (a *Authority) IssueServer(id Identity, names ServerNames) (*tls.Certificate, error) {
	key, csrPEM, err := NewKeyAndCSR(id)
	if err != nil {
		return nil, err
	}
	csr, err := ParseCSR(csrPEM)
	if err != nil {
		return nil, err
	}
	chain, err := a.SignServer(csr, id, 0, names)
	if err != nil {
		return nil, err
	}
	return TLSCertificate(chain, key)
}

// checkDNSName accepts a host name of letters, digits and hyphens in
// dot-separated labels (RFC 1123), as a DNS SAN must be.
func checkDNSName(n string) error {
	if n == "" || len(n) > 253 {
		return fmt.Errorf("DNS name %q: want 1 to 253 characters", n)
	}
	for _, label := range strings.Split(n, ".") {
		ok := len(label) > 0 && len(label) <= 63 && label[0] != '-' && label[len(label)-1] != '-'
		for _, c := range label {
			ok = ok && (c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-')
		}
		if !ok {
			return fmt.Errorf("DNS name %q: label %q is not a host name label", n, label)
		}
	}
	return nil
}

func (a *Authority) sign(csr *x509.CertificateRequest, id Identity, ttl time.Duration, names ServerNames) ([]string, error) {
	if err := CheckCSR(csr, id); err != nil {
		return nil, err
	}
	if ttl <= 0 || ttl > a.maxTTL {
		ttl = a.maxTTL
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	if now.Before(a.cert.NotBefore) || !now.Before(a.cert.NotAfter) {
		return nil, fmt.Errorf("sign certificate for %s: signing certificate %q is valid only from %s to %s",
			id, a.cert.Subject, a.cert.NotBefore.UTC().Format(time.RFC3339), a.cert.NotAfter.UTC().Format(time.RFC3339))
	}
	notAfter := now.Add(ttl)
	if notAfter.After(a.cert.NotAfter) {
		notAfter = a.cert.NotAfter
	}
	// Backdate a little to tolerate clock skew between peers, but never
	// before the signing certificate itself became valid.
	notBefore := now.Add(-Backdate)
	if notBefore.Before(a.cert.NotBefore) {
		notBefore = a.cert.NotBefore
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		URIs:                  []*url.URL{id.URL()},
		DNSNames:              names.DNS,
		IPAddresses:           names.IPs,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, csr.PublicKey, a.signer)
	if err != nil {
		return nil, fmt.Errorf("sign certificate for %s: %w", id, err)
	}
	out := []string{encodeCert(der)}
	for _, c := range a.chain {
		out = append(out, encodeCert(c.Raw))
	}
	for _, r := range a.roots {
		out = append(out, encodeCert(r.Raw))
	}
	return out, nil
}

// CheckCSR verifies that csr is well signed, carries an ECDSA P-256 public
// key (the mesh's leaf key type) and asks for exactly id.
func CheckCSR(csr *x509.CertificateRequest, id Identity) error {
	if csr == nil {
		return errors.New("no CSR")
	}
	if err := csr.CheckSignature(); err != nil {
		return fmt.Errorf("CSR signature: %w", err)
	}
	pub, ok := csr.PublicKey.(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P256() {
		return fmt.Errorf("CSR public key must be ECDSA P-256, is %s", describeKey(csr.PublicKey))
	}
	if len(csr.DNSNames)+len(csr.IPAddresses)+len(csr.EmailAddresses) > 0 {
		return errors.New("CSR may only contain a URI SAN")
	}
	if len(csr.URIs) != 1 {
		return fmt.Errorf("CSR must contain exactly one URI SAN, has %d", len(csr.URIs))
	}
	got, err := IdentityFromURL(csr.URIs[0])
	if err != nil {
		return fmt.Errorf("CSR SAN: %w", err)
	}
	if got.TrustDomain() != id.TrustDomain() {
		return fmt.Errorf("CSR asks for %s in trust domain %s, but the CA issues only for trust domain %s",
			got, got.TrustDomain(), id.TrustDomain())
	}
	if got != id {
		return fmt.Errorf("CSR asks for %s, but the caller may only get %s", got, id)
	}
	return nil
}

func describeKey(k crypto.PublicKey) string {
	switch k := k.(type) {
	case *ecdsa.PublicKey:
		return "ECDSA " + k.Curve.Params().Name
	case *rsa.PublicKey:
		return fmt.Sprintf("RSA %d", k.N.BitLen())
	case ed25519.PublicKey:
		return "Ed25519"
	default:
		return fmt.Sprintf("%T", k)
	}
}

// ParseCSR decodes a PEM certificate request.
func ParseCSR(pemData []byte) (*x509.CertificateRequest, error) {
	block, _ := pem.Decode(pemData)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, errors.New("CSR: no PEM CERTIFICATE REQUEST block")
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("CSR: %w", err)
	}
	return csr, nil
}

// NewKeyAndCSR generates an ECDSA P-256 key and a CSR for id. The key stays
// with the caller.
func NewKeyAndCSR(id Identity) (*ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate key: %w", err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{},
		URIs:    []*url.URL{id.URL()},
	}, key)
	if err != nil {
		return nil, nil, fmt.Errorf("create CSR for %s: %w", id, err)
	}
	return key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}

func randomSerial() (*big.Int, error) {
	// 128 random bits; never zero.
	for {
		s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
		if err != nil {
			return nil, fmt.Errorf("serial: %w", err)
		}
		if s.Sign() > 0 {
			return s, nil
		}
	}
}

func encodeCert(der []byte) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	ak, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ak.Equal(b)
}
