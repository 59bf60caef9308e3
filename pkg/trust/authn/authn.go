// Package authn authenticates the callers of the control plane's gRPC
// services (the CA and xDS): who is calling, as which service account, from
// which node. Each kind of credential is an Authenticator; a Chain combines
// them. Authorization (what a caller may have) is the services' business.
package authn

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/causeway-mesh/causeway/pkg/trust"
)

// Caller is an authenticated caller.
type Caller struct {
	// Account is the caller's own identity: its namespace and service
	// account in the mesh's trust domain. Never zero for an authenticated caller.
	Account trust.Identity
	// Node is the node the caller runs on, or "" when its credential does
	// not say (a mesh certificate names no node).
	Node string
	// Pod is "<namespace>/<name>" of the pod the credential is bound to
	// (a Kubernetes bound token), or "".
	Pod string
}

func (c Caller) String() string {
	s := c.Account.String()
	if c.Pod != "" {
		s += " (pod " + c.Pod + ")"
	}
	if c.Node != "" {
		s += " on node " + c.Node
	}
	return s
}

// Authenticator establishes who is calling from the request context of a
// gRPC call (metadata, peer). It returns an error wrapping
// ErrNoCredentials when the kind of credential it checks is absent, one
// wrapping ErrInvalidCredentials when it is present but wrong, and any
// other error when it could not decide (for example, a token review API
// that is down).
type Authenticator interface {
	Authenticate(ctx context.Context) (Caller, error)
}

var (
	// ErrNoCredentials: the request carries no credential of this kind.
	ErrNoCredentials = errors.New("no credentials")
	// ErrInvalidCredentials: a credential is present but is not valid.
	ErrInvalidCredentials = errors.New("invalid credentials")
)

// Chain tries its authenticators in order and returns the result of the
// first one whose kind of credential the request carries. A present but
// invalid credential ends the search: it is never skipped in favour of a
// later authenticator.
type Chain []Authenticator

// Authenticate implements Authenticator.
func (c Chain) Authenticate(ctx context.Context) (Caller, error) {
	for _, a := range c {
		caller, err := a.Authenticate(ctx)
		if errors.Is(err, ErrNoCredentials) {
			continue
		}
		return caller, err
	}
	return Caller{}, fmt.Errorf("%w: present a bearer token or a mesh client certificate", ErrNoCredentials)
}

// StatusError turns an authentication error into the gRPC status a service
// returns: Unauthenticated for missing or invalid credentials, Unavailable
// when the authenticator could not decide (the client may retry).
func StatusError(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, ErrNoCredentials) || errors.Is(err, ErrInvalidCredentials) {
		return status.Error(codes.Unauthenticated, "authentication failed: "+err.Error())
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return status.FromContextError(err).Err()
	}
	return status.Error(codes.Unavailable, "authentication unavailable: "+err.Error())
}
