// Package backendtlstest issues the certificates of backends outside the
// mesh for tests: a CA of their own and ECDSA P-256 server certificates
// with the DNS and URI SANs, and validity, a test asks for.
package backendtlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/url"
	"strings"
	"testing"
	"time"
)

// CA issues server certificates.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// PEM is the CA certificate, as a ConfigMap's ca.crt holds it.
	PEM []byte
}

// NewCA makes a CA named name, valid for an hour either side of now.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// Leaf issues a server certificate for the DNS names and URIs, valid for
// the two hours before notAfter (zero: an hour from now).
func (ca *CA) Leaf(dns, uris []string, notAfter time.Time) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	if notAfter.IsZero() {
		notAfter = time.Now().Add(time.Hour)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "backend"},
		NotBefore: notAfter.Add(-2 * time.Hour), NotAfter: notAfter, DNSNames: dns,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for _, u := range uris {
		pu, err := url.Parse(u)
		if err != nil {
			return nil, err
		}
		tmpl.URIs = append(tmpl.URIs, pu)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// TLSSecretData makes a CA and a server certificate for the DNS names,
// valid for the next hour, and returns the CA and the certificate and key
// as a kubernetes.io/tls Secret's data (tls.crt, tls.key: PEM).
func TLSSecretData(t testing.TB, dns ...string) (*CA, map[string][]byte) {
	t.Helper()
	ca, err := NewCA("test CA of " + strings.Join(dns, ","))
	if err != nil {
		t.Fatal(err)
	}
	return ca, ca.SecretData(t, dns...)
}

// SecretData issues a server certificate for the DNS names, valid for the
// next hour, as a kubernetes.io/tls Secret's data (tls.crt, tls.key: PEM).
func (ca *CA) SecretData(t testing.TB, dns ...string) map[string][]byte {
	t.Helper()
	data, err := ca.TLSData(dns...)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TLSData is SecretData for programs without a testing.TB (benchmarks).
func (ca *CA) TLSData(dns ...string) (map[string][]byte, error) {
	leaf, err := ca.Leaf(dns, nil, time.Time{})
	if err != nil {
		return nil, err
	}
	key, err := x509.MarshalPKCS8PrivateKey(leaf.PrivateKey)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{
		"tls.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Certificate[0]}),
		"tls.key": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}),
	}, nil
}

// SecretYAML is a kubernetes.io/tls Secret with data (TLSData) as a YAML
// document, base64 as the API serves it: what a local mesh's configuration
// directory holds.
func SecretYAML(ns, name string, data map[string][]byte) string {
	enc := base64.StdEncoding.EncodeToString
	return fmt.Sprintf("apiVersion: v1\nkind: Secret\nmetadata: {namespace: %s, name: %s}\ntype: kubernetes.io/tls\ndata:\n  tls.crt: %s\n  tls.key: %s\n",
		ns, name, enc(data["tls.crt"]), enc(data["tls.key"]))
}
