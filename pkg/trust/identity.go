// Package trust holds the mesh's identities and everything that proves them:
// SPIFFE IDs, trust bundles, TLS configurations for HBONE, the CA and the
// per-identity certificate manager.
package trust

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// DefaultTrustDomain is the trust domain used when none is configured.
const DefaultTrustDomain = "cluster.local"

// Identity is a workload identity, spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>.
// The zero value is no identity; every other value went through strict parsing.
type Identity struct {
	id spiffeid.ID
	ns string
	sa string
}

// NewIdentity builds the identity of a service account.
func NewIdentity(trustDomain, namespace, serviceAccount string) (Identity, error) {
	td, err := spiffeid.TrustDomainFromString(trustDomain)
	if err != nil {
		return Identity{}, fmt.Errorf("trust domain %q: %w", trustDomain, err)
	}
	id, err := spiffeid.FromSegments(td, "ns", namespace, "sa", serviceAccount)
	if err != nil {
		return Identity{}, fmt.Errorf("identity for %s/%s: %w", namespace, serviceAccount, err)
	}
	return fromID(id)
}

// ParseIdentity parses a SPIFFE ID strictly: it must be a valid SPIFFE ID whose
// path is exactly /ns/<namespace>/sa/<service-account>.
func ParseIdentity(s string) (Identity, error) {
	id, err := spiffeid.FromString(s)
	if err != nil {
		return Identity{}, fmt.Errorf("identity %q: %w", s, err)
	}
	return fromID(id)
}

// IdentityFromURL is ParseIdentity for a certificate's URI SAN.
func IdentityFromURL(u *url.URL) (Identity, error) {
	if u == nil {
		return Identity{}, fmt.Errorf("identity: nil URI")
	}
	return ParseIdentity(u.String())
}

func fromID(id spiffeid.ID) (Identity, error) {
	segs := strings.Split(strings.TrimPrefix(id.Path(), "/"), "/")
	if len(segs) != 4 || segs[0] != "ns" || segs[2] != "sa" || segs[1] == "" || segs[3] == "" {
		return Identity{}, fmt.Errorf("identity %q: path must be /ns/<namespace>/sa/<service-account>", id)
	}
	return Identity{id: id, ns: segs[1], sa: segs[3]}, nil
}

// IsZero reports whether i is no identity.
func (i Identity) IsZero() bool { return i.id.IsZero() }

// String returns the SPIFFE ID, or "" for the zero identity.
func (i Identity) String() string {
	if i.IsZero() {
		return ""
	}
	return i.id.String()
}

// SPIFFEID returns the underlying SPIFFE ID.
func (i Identity) SPIFFEID() spiffeid.ID { return i.id }

// URL returns the identity as a URI SAN.
func (i Identity) URL() *url.URL { return i.id.URL() }

// TrustDomain returns the identity's trust domain.
func (i Identity) TrustDomain() spiffeid.TrustDomain { return i.id.TrustDomain() }

// Namespace returns the Kubernetes namespace of the identity.
func (i Identity) Namespace() string { return i.ns }

// ServiceAccount returns the Kubernetes service account of the identity.
func (i Identity) ServiceAccount() string { return i.sa }

// The control plane's account: the CA and xDS server present this identity.
const (
	SystemNamespace            = "causeway-system"
	ControlPlaneServiceAccount = "controlplane"
)

// ControlPlaneIdentity is the identity the control plane serves xDS and the
// CA with: spiffe://<trust-domain>/ns/causeway-system/sa/controlplane.
func ControlPlaneIdentity(trustDomain string) (Identity, error) {
	return NewIdentity(trustDomain, SystemNamespace, ControlPlaneServiceAccount)
}
