package trust

import (
	"crypto/tls"
	"errors"
	"fmt"
)

// Peer is the party at the other end of a connection. It is either
// authenticated, with the identity its verified certificate carries, or
// unauthenticated, with no identity at all. The only way to obtain an
// authenticated Peer is PeerFromTLS on a connection whose client certificate
// the TLS stack verified; nothing else (headers, addresses) can make one.
type Peer struct {
	id Identity
}

// Unauthenticated is the peer of a connection that presented no certificate.
func Unauthenticated() Peer { return Peer{} }

// Identity returns the peer's identity and true, or false when the peer is unauthenticated.
func (p Peer) Identity() (Identity, bool) { return p.id, !p.id.IsZero() }

// Authenticated reports whether the peer proved an identity.
func (p Peer) Authenticated() bool { return !p.id.IsZero() }

// String returns the identity, or "unauthenticated".
func (p Peer) String() string {
	if p.id.IsZero() {
		return "unauthenticated"
	}
	return p.id.String()
}

// PeerFromTLS derives the peer of a completed handshake on a connection
// served with ServerConfig. A client that presented no certificate is
// unauthenticated; a presented certificate must have been verified by the
// handshake (VerifiedChains), or this is an error.
func PeerFromTLS(cs tls.ConnectionState) (Peer, error) {
	if !cs.HandshakeComplete {
		return Peer{}, errors.New("peer: TLS handshake not complete")
	}
	if len(cs.PeerCertificates) == 0 {
		return Unauthenticated(), nil
	}
	if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return Peer{}, errors.New("peer: client certificate was not verified")
	}
	id, err := leafIdentity(cs.VerifiedChains[0][0].URIs)
	if err != nil {
		return Peer{}, fmt.Errorf("peer: %w", err)
	}
	return Peer{id: id}, nil
}
