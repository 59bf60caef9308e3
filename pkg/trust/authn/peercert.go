package authn

import (
	"context"
	"fmt"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/causeway-mesh/causeway/pkg/trust"
)

// PeerCertificate authenticates a caller by the mesh client certificate it
// presented on the call's TLS connection. The server's TLS configuration
// must verify client certificates (trust.ServerConfig with VerifyIfGiven or
// RequireClientCert); an unverified certificate is refused. A certificate
// names no node, so such callers only ever get their own identity.
type PeerCertificate struct {
	td spiffeid.TrustDomain
}

// NewPeerCertificate returns an authenticator accepting mesh certificates of
// the trust domain.
func NewPeerCertificate(trustDomain string) (*PeerCertificate, error) {
	td, err := spiffeid.TrustDomainFromString(trustDomain)
	if err != nil {
		return nil, fmt.Errorf("trust domain %q: %w", trustDomain, err)
	}
	return &PeerCertificate{td: td}, nil
}

// Authenticate implements Authenticator.
func (p *PeerCertificate) Authenticate(ctx context.Context) (Caller, error) {
	pr, ok := peer.FromContext(ctx)
	if !ok || pr.AuthInfo == nil {
		return Caller{}, fmt.Errorf("%w: no TLS connection", ErrNoCredentials)
	}
	info, ok := pr.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return Caller{}, fmt.Errorf("%w: connection is not TLS (%s)", ErrNoCredentials, pr.AuthInfo.AuthType())
	}
	if len(info.State.PeerCertificates) == 0 {
		return Caller{}, fmt.Errorf("%w: no client certificate", ErrNoCredentials)
	}
	tp, err := trust.PeerFromTLS(info.State)
	if err != nil {
		return Caller{}, fmt.Errorf("%w: %v", ErrInvalidCredentials, err)
	}
	id, ok := tp.Identity()
	if !ok {
		return Caller{}, fmt.Errorf("%w: client certificate carries no identity", ErrInvalidCredentials)
	}
	if id.TrustDomain() != p.td {
		return Caller{}, fmt.Errorf("%w: client identity %s is not in trust domain %s", ErrInvalidCredentials, id, p.td)
	}
	return Caller{Account: id}, nil
}
