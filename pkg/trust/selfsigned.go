package trust

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"time"
)

// SigningMaterial is what an Authority is built from: the signing key, the
// chain from the signing certificate up to (excluding) the root, and the roots.
type SigningMaterial struct {
	Key   *ecdsa.PrivateKey
	Chain []*x509.Certificate
	Roots []*x509.Certificate
}

// GenerateSelfSigned creates a self-signed root (valid rootTTL) and an
// intermediate signed by it (valid half as long) for the trust domain.
func GenerateSelfSigned(trustDomain string, rootTTL time.Duration) (*SigningMaterial, error) {
	if rootTTL < 2*time.Minute {
		return nil, fmt.Errorf("self-signed CA: root lifetime %s is too short", rootTTL)
	}
	now := time.Now().Add(-time.Minute)
	rootKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("root key: %w", err)
	}
	root, err := caCertificate(pkix.Name{Organization: []string{trustDomain}, CommonName: "Causeway root CA"},
		now, now.Add(rootTTL), &rootKey.PublicKey, nil, rootKey)
	if err != nil {
		return nil, fmt.Errorf("root certificate: %w", err)
	}
	interKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("intermediate key: %w", err)
	}
	inter, err := caCertificate(pkix.Name{Organization: []string{trustDomain}, CommonName: "Causeway intermediate CA"},
		now, now.Add(rootTTL/2), &interKey.PublicKey, root, rootKey)
	if err != nil {
		return nil, fmt.Errorf("intermediate certificate: %w", err)
	}
	return &SigningMaterial{Key: interKey, Chain: []*x509.Certificate{inter}, Roots: []*x509.Certificate{root}}, nil
}

// caCertificate makes a CA certificate for pub signed by parentKey (parent nil: self-signed).
func caCertificate(subject pkix.Name, notBefore, notAfter time.Time, pub *ecdsa.PublicKey, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, error) {
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               subject,
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	if parent == nil {
		parent = tmpl
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, parentKey)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}
