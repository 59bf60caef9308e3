package trust

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Bundle is the set of root certificates trusted for one trust domain. Roots
// can be replaced while connections are being made (rotation without restart);
// each handshake uses the roots current when it starts.
type Bundle struct {
	td    spiffeid.TrustDomain
	roots atomic.Pointer[bundleRoots]
	clock atomic.Pointer[func() time.Time]
}

type bundleRoots struct {
	certs []*x509.Certificate
	pool  *x509.CertPool
}

// NewBundle returns a bundle for the trust domain with the given roots.
func NewBundle(trustDomain string, roots []*x509.Certificate) (*Bundle, error) {
	td, err := spiffeid.TrustDomainFromString(trustDomain)
	if err != nil {
		return nil, fmt.Errorf("trust domain %q: %w", trustDomain, err)
	}
	b := &Bundle{td: td}
	if err := b.SetRoots(roots); err != nil {
		return nil, err
	}
	return b, nil
}

// TrustDomain returns the bundle's trust domain.
func (b *Bundle) TrustDomain() spiffeid.TrustDomain { return b.td }

// SetRoots atomically replaces the trusted roots.
func (b *Bundle) SetRoots(roots []*x509.Certificate) error {
	if len(roots) == 0 {
		return errors.New("trust bundle: no root certificates")
	}
	pool := x509.NewCertPool()
	for _, r := range roots {
		if !r.IsCA {
			return fmt.Errorf("trust bundle: certificate %q is not a CA", r.Subject)
		}
		pool.AddCert(r)
	}
	b.roots.Store(&bundleRoots{certs: append([]*x509.Certificate(nil), roots...), pool: pool})
	return nil
}

// Roots returns the current roots.
func (b *Bundle) Roots() []*x509.Certificate { return b.roots.Load().certs }

// SetClock makes the bundle judge certificates' validity periods by now
// instead of the system clock (fault tests of clock skew); nil restores
// the system clock.
func (b *Bundle) SetClock(now func() time.Time) {
	if now == nil {
		b.clock.Store(nil)
		return
	}
	b.clock.Store(&now)
}

// Now is the time certificates are judged at.
func (b *Bundle) Now() time.Time {
	if now := b.clock.Load(); now != nil {
		return (*now)()
	}
	return time.Now()
}

// verify checks a presented chain (leaf first) against the current roots for
// the given usage and returns the leaf's identity, which must belong to the
// bundle's trust domain.
func (b *Bundle) verify(rawChain [][]byte, usage x509.ExtKeyUsage) (Identity, [][]*x509.Certificate, error) {
	if len(rawChain) == 0 {
		return Identity{}, nil, errors.New("no certificate presented")
	}
	certs := make([]*x509.Certificate, 0, len(rawChain))
	for i, raw := range rawChain {
		c, err := x509.ParseCertificate(raw)
		if err != nil {
			return Identity{}, nil, fmt.Errorf("certificate %d: %w", i, err)
		}
		certs = append(certs, c)
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	now := b.Now()
	chains, err := certs[0].Verify(x509.VerifyOptions{
		Roots:         b.roots.Load().pool,
		Intermediates: inter,
		KeyUsages:     []x509.ExtKeyUsage{usage},
		CurrentTime:   now,
	})
	if err != nil {
		if te := ExplainValidity(err, now); te != err {
			return Identity{}, nil, te // names the certificate itself
		}
		return Identity{}, nil, fmt.Errorf("certificate of %s: %w", describeSANs(certs[0].URIs), err)
	}
	id, err := leafIdentity(certs[0].URIs)
	if err != nil {
		return Identity{}, nil, err
	}
	if id.TrustDomain() != b.td {
		return Identity{}, nil, fmt.Errorf("identity %s is not in trust domain %s", id, b.td)
	}
	return id, chains, nil
}

// leafIdentity returns the identity of a leaf certificate, which must carry
// exactly one URI SAN.
func leafIdentity(uris []*url.URL) (Identity, error) {
	if len(uris) != 1 {
		return Identity{}, fmt.Errorf("certificate must have exactly one URI SAN, has %d", len(uris))
	}
	return IdentityFromURL(uris[0])
}

func describeSANs(uris []*url.URL) string {
	if len(uris) == 0 {
		return "<no URI SAN>"
	}
	s := uris[0].String()
	for _, u := range uris[1:] {
		s += "," + u.String()
	}
	return s
}

// ParseCertificatesPEM parses every CERTIFICATE block of a PEM document.
func ParseCertificatesPEM(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for len(data) > 0 {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parse certificate: %w", err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, errors.New("no PEM certificate found")
	}
	return certs, nil
}

// LoadBundleFile reads a PEM file of root certificates (such as the CA
// directory's root-cert.pem) into a bundle for the trust domain.
func LoadBundleFile(trustDomain, path string) (*Bundle, error) {
	data, err := readBounded(path)
	if err != nil {
		return nil, fmt.Errorf("trust bundle: %w", err)
	}
	roots, err := ParseCertificatesPEM(data)
	if err != nil {
		return nil, fmt.Errorf("trust bundle %s: %w", path, err)
	}
	return NewBundle(trustDomain, roots)
}
