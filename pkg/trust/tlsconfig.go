package trust

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
)

// ALPN is the only application protocol HBONE speaks.
const ALPN = "h2"

// ClientAuth says what a server demands of its clients.
type ClientAuth int

const (
	// VerifyIfGiven accepts clients without a certificate as unauthenticated
	// peers (TLS-only HBONE, the hairpin case); a certificate that is
	// presented must verify against the bundle and be in the trust domain.
	VerifyIfGiven ClientAuth = iota
	// RequireClientCert refuses clients without a verified mesh certificate.
	RequireClientCert
)

// ErrNoServerCertificate is wrapped by the handshake error of a server
// that had no certificate to present for the address dialed.
var ErrNoServerCertificate = errors.New("no certificate")

// ClientIdentityError is the handshake error of a server refusing a client
// certificate that chains to the roots but names no identity of the trust
// domain.
type ClientIdentityError struct{ Err error }

func (e *ClientIdentityError) Error() string { return e.Err.Error() }
func (e *ClientIdentityError) Unwrap() error { return e.Err }

// ServerCertFunc returns the certificate to present on a connection accepted
// at the given local address: a node proxy answers for the pod whose IP the
// client dialed.
type ServerCertFunc func(local net.Addr) (*tls.Certificate, error)

// ServerConfig is the TLS configuration of an HBONE server: TLS 1.3 only,
// ALPN h2, certificate chosen by local address, client certificates verified
// against the bundle's roots current at handshake time and its clock
// (Bundle.Now, also the config's Time). Derive the peer of an accepted
// connection with PeerFromTLS; explain a failed handshake with
// ExplainValidity(err, config.Time()).
func ServerConfig(b *Bundle, certFor ServerCertFunc, auth ClientAuth) *tls.Config {
	clientAuth := tls.VerifyClientCertIfGiven
	if auth == RequireClientCert {
		clientAuth = tls.RequireAndVerifyClientCert
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: []string{ALPN},
		Time:       b.Now,
		// No resumption: a resumed session would skip both the choice of
		// certificate by local address and the verification of the client
		// against the roots current now (after a rotation).
		SessionTicketsDisabled: true,
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			local := hello.Conn.LocalAddr()
			cert, err := certFor(local)
			if err != nil {
				return nil, fmt.Errorf("%w for %s: %w", ErrNoServerCertificate, local, err)
			}
			if cert == nil {
				return nil, fmt.Errorf("%w for %s", ErrNoServerCertificate, local)
			}
			return &tls.Config{
				MinVersion:             tls.VersionTLS13,
				NextProtos:             []string{ALPN},
				Time:                   b.Now, // client certificates are judged by the bundle's clock
				SessionTicketsDisabled: true,
				Certificates:           []tls.Certificate{*cert},
				ClientCAs:              b.roots.Load().pool,
				ClientAuth:             clientAuth,
				// The handshake verified the chain (VerifiedChains); here the
				// leaf must also name exactly one identity of our trust domain.
				VerifyConnection: func(cs tls.ConnectionState) error {
					if len(cs.PeerCertificates) == 0 {
						return nil
					}
					id, err := leafIdentity(cs.PeerCertificates[0].URIs)
					if err != nil {
						return &ClientIdentityError{fmt.Errorf("client certificate: %w", err)}
					}
					if id.TrustDomain() != b.td {
						return &ClientIdentityError{fmt.Errorf("client identity %s is not in trust domain %s", id, b.td)}
					}
					return nil
				},
			}, nil
		},
	}
}

// ClientConfig is the TLS configuration of an HBONE client. It presents the
// certificate cert returns (nil cert: a TLS-only client that presents none),
// sends no SNI, and accepts the server only if its chain verifies against the
// bundle and its identity is one of expected.
func ClientConfig(b *Bundle, cert func() (*tls.Certificate, error), expected []Identity) *tls.Config {
	want := make([]Identity, len(expected))
	copy(want, expected)
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: []string{ALPN},
		// Verification is by SPIFFE URI SAN, not hostname: done below, in
		// VerifyConnection, which (unlike VerifyPeerCertificate) also runs
		// on resumed sessions should a session cache ever be added.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			raw := make([][]byte, len(cs.PeerCertificates))
			for i, c := range cs.PeerCertificates {
				raw[i] = c.Raw
			}
			id, _, err := b.verify(raw, x509.ExtKeyUsageServerAuth)
			if err != nil {
				return fmt.Errorf("server certificate: %w", err)
			}
			for _, w := range want {
				if w == id {
					return nil
				}
			}
			return fmt.Errorf("server identity %s does not match expected %s", id, identityList(want))
		},
	}
	if cert == nil {
		// TLS-only: answer a certificate request with no certificate.
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &tls.Certificate{}, nil
		}
	} else {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert() }
	}
	return cfg
}

func identityList(ids []Identity) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = id.String()
	}
	return "[" + strings.Join(s, " ") + "]"
}
