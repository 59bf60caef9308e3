package backendtls

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// systemCA stands in for the machine's roots: TestMain points
// SSL_CERT_FILE at it before anything reads the system pool (Go reads it
// once per process).
var systemCA, otherCA *issuer

func TestMain(m *testing.M) {
	os.Exit(func() int {
		systemCA, otherCA = newIssuer("system CA"), newIssuer("another CA")
		dir, err := os.MkdirTemp("", "backendtls")
		if err != nil {
			panic(err)
		}
		defer os.RemoveAll(dir)
		file := filepath.Join(dir, "roots.pem")
		if err := os.WriteFile(file, systemCA.pem, 0o600); err != nil {
			panic(err)
		}
		os.Setenv("SSL_CERT_FILE", file)
		os.Setenv("SSL_CERT_DIR", dir)
		return m.Run()
	}())
}

type issuer struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newIssuer(name string) *issuer {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		panic(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &issuer{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

func (i *issuer) leaf(t *testing.T, dns string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "backend"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), DNSNames: []string{dns}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, i.cert, &key.PublicKey, i.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// handshake runs the policy's client against a TLS server on loopback
// presenting cert.
func handshake(t *testing.T, p *Policy, cert tls.Certificate) error {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := p.Client(ctx, raw, "")
	if err == nil {
		c.Close()
	}
	return err
}

// wellKnownCACertificates: System verifies against the system roots, and
// only them.
func TestSystemRoots(t *testing.T) {
	p := Compile(&meshv1.BackendTLS{Policy: &meshv1.Ref{Namespace: "ns", Name: "sys"}, Hostname: "api.example.com", SystemRoots: true})
	if p.Invalid() != "" {
		t.Fatal(p.Invalid())
	}
	if err := handshake(t, p, systemCA.leaf(t, "api.example.com")); err != nil {
		t.Errorf("a certificate from the system roots: %v", err)
	}
	err := handshake(t, p, otherCA.leaf(t, "api.example.com"))
	if err == nil || !strings.Contains(err.Error(), "BackendTLSPolicy ns/sys: certificate not trusted") {
		t.Errorf("a certificate from another CA: %v", err)
	}
}

// CA certificates that do not parse make a policy that refuses every
// connection, saying why.
func TestBadCACertificates(t *testing.T) {
	for _, data := range []string{"", "not PEM", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"} {
		p := Compile(&meshv1.BackendTLS{Policy: &meshv1.Ref{Namespace: "ns", Name: "bad"}, Hostname: "a.example", CaCertificates: []byte(data)})
		if !strings.HasPrefix(p.Invalid(), "ca.crt: ") {
			t.Errorf("%q: invalid %q", data, p.Invalid())
		}
		a, b := net.Pipe() // nothing answers: a handshake would time out
		defer b.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if _, err := p.Client(ctx, a, ""); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("BackendTLSPolicy ns/bad: the policy cannot be carried out: %s", p.Invalid())) {
			t.Errorf("%q: %v", data, err)
		}
	}
}
