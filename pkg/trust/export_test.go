package trust

import (
	"crypto/rand"
	"crypto/x509"
	"fmt"
	"net/url"
	"time"
)

// SignWithValidity issues a certificate for csr's key with an arbitrary
// validity window, so tests can make expired or not-yet-valid certificates.
func (a *Authority) SignWithValidity(csr *x509.CertificateRequest, id Identity, notBefore, notAfter time.Time) ([]string, error) {
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber:          serial,
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		URIs:                  []*url.URL{id.URL()},
	}, a.cert, csr.PublicKey, a.signer)
	if err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	out := []string{encodeCert(der)}
	for _, c := range a.chain {
		out = append(out, encodeCert(c.Raw))
	}
	return out, nil
}
