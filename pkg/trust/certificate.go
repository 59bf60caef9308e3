package trust

import (
	"crypto"
	"crypto/tls"
	"errors"
	"fmt"
)

// TLSCertificate assembles a tls.Certificate from a PEM chain as the CA
// returns it (leaf first; trailing self-signed roots are not sent on the
// wire) and the private key that belongs to the leaf.
func TLSCertificate(pemChain []string, key crypto.Signer) (*tls.Certificate, error) {
	if len(pemChain) == 0 {
		return nil, errors.New("empty certificate chain")
	}
	if key == nil {
		return nil, errors.New("no private key for the certificate chain")
	}
	cert := &tls.Certificate{PrivateKey: key}
	for i, p := range pemChain {
		certs, err := ParseCertificatesPEM([]byte(p))
		if err != nil {
			return nil, fmt.Errorf("chain element %d: %w", i, err)
		}
		for _, c := range certs {
			if i > 0 && c.IsCA && c.CheckSignatureFrom(c) == nil {
				continue // a root: peers have it in their bundle
			}
			if cert.Leaf == nil {
				cert.Leaf = c
			}
			cert.Certificate = append(cert.Certificate, c.Raw)
		}
	}
	if !publicKeysEqual(key.Public(), cert.Leaf.PublicKey) {
		return nil, errors.New("private key does not match the leaf certificate")
	}
	return cert, nil
}
