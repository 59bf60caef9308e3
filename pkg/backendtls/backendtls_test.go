package backendtls

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/pkg/backendtls/backendtlstest"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// systemCA stands in for the machine's roots: TestMain points
// SSL_CERT_FILE at it before anything reads the system pool (Go reads it
// once per process).
var systemCA, otherCA *backendtlstest.CA

func TestMain(m *testing.M) {
	os.Exit(func() int {
		systemCA, otherCA = newIssuer("system CA"), newIssuer("another CA")
		dir, err := os.MkdirTemp("", "backendtls")
		if err != nil {
			panic(err)
		}
		defer os.RemoveAll(dir)
		file := filepath.Join(dir, "roots.pem")
		if err := os.WriteFile(file, systemCA.PEM, 0o600); err != nil {
			panic(err)
		}
		os.Setenv("SSL_CERT_FILE", file)
		os.Setenv("SSL_CERT_DIR", dir)
		return m.Run()
	}())
}

func newIssuer(name string) *backendtlstest.CA {
	ca, err := backendtlstest.NewCA(name)
	if err != nil {
		panic(err)
	}
	return ca
}

func leaf(t *testing.T, ca *backendtlstest.CA, dns string) tls.Certificate {
	t.Helper()
	c, err := ca.Leaf([]string{dns}, nil, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	return *c
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
	if err := handshake(t, p, leaf(t, systemCA, "api.example.com")); err != nil {
		t.Errorf("a certificate from the system roots: %v", err)
	}
	err := handshake(t, p, leaf(t, otherCA, "api.example.com"))
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
