// Package backendtls originates TLS to the backends a Gateway API
// BackendTLSPolicy covers (GEP-1897) and verifies them as the policy says:
// the certificate chains to the policy's CA certificates (or the system
// roots), and presents one of the policy's subjectAltNames exactly, or,
// when it lists none, is valid for its hostname (which is always the SNI).
// A certificate that does not verify ends the connection: nothing is sent
// to a backend that did not prove who it is.
package backendtls

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"net"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// Key identifies a port's TLS settings: connections verified under one
// set are never reused under another. "" for a port without TLS.
func Key(b *meshv1.BackendTLS) string {
	if b == nil {
		return ""
	}
	raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(b)
	if err != nil {
		return "unmarshalable" // never reused with anything that marshals
	}
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:12])
}

// Policy is a compiled BackendTLS. Build it with Compile.
type Policy struct {
	name     string // "<namespace>/<name>" of the BackendTLSPolicy
	invalid  string
	hostname string
	dnsSANs  []string // lower case
	uriSANs  []string
	roots    *x509.CertPool
	now      func() time.Time
}

// Compile reads b once: its CA certificates are parsed here, not per
// connection. A policy that cannot be carried out (b's invalid_reason, CA
// certificates that do not parse, system roots that cannot be read)
// compiles to one that refuses every connection with the reason.
func Compile(b *meshv1.BackendTLS) *Policy {
	p := &Policy{name: b.GetPolicy().GetNamespace() + "/" + b.GetPolicy().GetName(), hostname: b.GetHostname(), now: time.Now}
	if p.invalid = b.GetInvalidReason(); p.invalid != "" {
		return p
	}
	for _, san := range b.GetSubjectAltNames() {
		switch san.GetType() {
		case meshv1.SubjectAltName_HOSTNAME:
			p.dnsSANs = append(p.dnsSANs, strings.ToLower(san.GetValue()))
		case meshv1.SubjectAltName_URI:
			p.uriSANs = append(p.uriSANs, san.GetValue())
		}
	}
	var err error
	if b.GetSystemRoots() {
		if p.roots, err = x509.SystemCertPool(); err != nil {
			p.invalid = fmt.Sprintf("system CA certificates: %v", err)
		}
		return p
	}
	if p.roots, err = ParseCACertificates(b.GetCaCertificates()); err != nil {
		p.invalid = err.Error()
	}
	return p
}

// ParseCACertificates parses a PEM bundle of CA certificates (a ConfigMap's
// ca.crt): at least one, and nothing that is not a certificate.
func ParseCACertificates(pemData []byte) (*x509.CertPool, error) {
	certs, err := trust.ParseCertificatesPEM(pemData)
	if err != nil {
		return nil, fmt.Errorf("ca.crt: %w", err)
	}
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	return pool, nil
}

// Name is the policy's "<namespace>/<name>".
func (p *Policy) Name() string { return p.name }

// Invalid is why the policy refuses every connection, or "".
func (p *Policy) Invalid() string { return p.invalid }

// Error is a connection the policy refused: the handshake failed or the
// certificate did not verify. Presented describes the certificate, when
// there was one.
type Error struct {
	Policy    string
	Reason    string
	Presented string
	// Verify is set when a certificate was presented and did not verify
	// (as opposed to a handshake that failed or a policy that is invalid).
	Verify bool
	Err    error
}

func (e *Error) Error() string {
	s := fmt.Sprintf("BackendTLSPolicy %s: %s", e.Policy, e.Reason)
	if e.Presented != "" {
		s += "; the backend presented " + e.Presented
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

// Client runs a TLS handshake over conn as the policy says and returns the
// verified connection; alpn is offered when not empty ("h2", "http/1.1").
// On any failure conn is closed and the error is an *Error.
func (p *Policy) Client(ctx context.Context, conn net.Conn, alpn string) (net.Conn, error) {
	if p.invalid != "" {
		conn.Close()
		return nil, &Error{Policy: p.name, Reason: "the policy cannot be carried out: " + p.invalid}
	}
	var verr *Error
	cfg := &tls.Config{
		ServerName: p.hostname,
		MinVersion: tls.VersionTLS12,
		// Verified below, as the policy says rather than as Go's default
		// would: with subjectAltNames the hostname must not authenticate.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if verr = p.verify(cs.PeerCertificates); verr != nil {
				return verr
			}
			return nil
		},
	}
	if alpn != "" {
		cfg.NextProtos = []string{alpn}
	}
	tc := tls.Client(conn, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		tc.Close()
		if verr != nil {
			return nil, verr
		}
		return nil, &Error{Policy: p.name, Reason: "TLS handshake: " + err.Error(), Err: err}
	}
	return tc, nil
}

// verify checks the presented chain: trusted, current, for server
// authentication, and naming what the policy asks for.
func (p *Policy) verify(chain []*x509.Certificate) *Error {
	if len(chain) == 0 {
		return &Error{Policy: p.name, Reason: "no certificate presented", Verify: true}
	}
	leaf := chain[0]
	fail := func(reason string, err error) *Error {
		return &Error{Policy: p.name, Reason: reason, Presented: Describe(leaf), Verify: true, Err: err}
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: p.roots, Intermediates: inter, CurrentTime: p.now(),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return fail("certificate not trusted: "+err.Error(), err)
	}
	if len(p.dnsSANs) == 0 && len(p.uriSANs) == 0 {
		if err := leaf.VerifyHostname(p.hostname); err != nil {
			return fail(fmt.Sprintf("certificate not valid for hostname %s", p.hostname), err)
		}
		return nil
	}
	for _, d := range leaf.DNSNames {
		for _, want := range p.dnsSANs {
			if strings.ToLower(d) == want {
				return nil
			}
		}
	}
	for _, u := range leaf.URIs {
		for _, want := range p.uriSANs {
			if u.String() == want {
				return nil
			}
		}
	}
	return fail("certificate presents none of the subjectAltNames "+p.wanted(), nil)
}

func (p *Policy) wanted() string {
	var names []string
	for _, d := range p.dnsSANs {
		names = append(names, "Hostname "+d)
	}
	for _, u := range p.uriSANs {
		names = append(names, "URI "+u)
	}
	return "[" + strings.Join(names, ", ") + "]"
}

// Describe says what a certificate claims, for a log line: subject, SANs,
// issuer and validity.
func Describe(c *x509.Certificate) string {
	var uris []string
	for _, u := range c.URIs {
		uris = append(uris, u.String())
	}
	return fmt.Sprintf("subject %q, DNS SANs [%s], URI SANs [%s], issuer %q, valid %s to %s",
		c.Subject.String(), strings.Join(c.DNSNames, " "), strings.Join(uris, " "), c.Issuer.String(),
		c.NotBefore.UTC().Format(time.RFC3339), c.NotAfter.UTC().Format(time.RFC3339))
}
