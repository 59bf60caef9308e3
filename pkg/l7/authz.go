package l7

import (
	"context"
	"net/http"
	"net/netip"

	"github.com/causeway-mesh/causeway/pkg/trust"
)

// Authorizer decides whether a request may proceed. The engine calls it once
// per request, after the route, backend and endpoint are chosen and before
// anything else is answered: redirects, CORS preflights and local errors
// (no route, no endpoint, invalid rule or backend) wait for an allow, so a
// denied caller learns nothing of routes or endpoint health. Only errors
// in the request itself (a bad path, an unreadable body) come first, and
// CORS preflights with Options.PreflightBeforePolicy.
//
// Implementations must be safe for concurrent use, must not keep or modify
// the request, and must fail closed: anything but a clear allow is a deny.
type Authorizer interface {
	Authorize(ctx context.Context, r *AuthzRequest) Decision
}

// AuthzRequest is what a decision is made on.
type AuthzRequest struct {
	// Request is the request as the caller sent it, with identity headers
	// from the caller removed and its path in normal form (the form routed
	// and forwarded). Route filters are not applied to it. Read only.
	Request *http.Request
	// Body holds the request body, or its first bytes when BodyTruncated.
	// gRPC bodies (streams) and bodies beyond the buffer limit are not waited
	// for: then Body holds what was buffered (possibly nothing) and
	// BodyTruncated is set.
	Body          []byte
	BodyTruncated bool
	// Peer is the tunnel's peer: authenticated with an identity, or not.
	Peer trust.Peer
	// Source is the caller's address.
	Source netip.AddrPort
	// Destination is the chosen endpoint's address, DestinationIdentity the
	// identity of its workload (zero when unknown). Without an endpoint
	// (no route, no usable backend or endpoint) Destination is the address
	// the caller asked for.
	Destination         netip.AddrPort
	DestinationIdentity trust.Identity
	// Service is the destination service (zero for a workload-addressed
	// destination), Port the service port the caller addressed.
	Service ServiceRef
	Port    uint32
	// Route is the matched route's "{namespace}/{name}" ("" for a service's
	// implicit route), Rule the matched rule's name if it has one.
	Route string
	Rule  string
}

// Decision is an authorization result, shaped after OPA-Envoy's. The
// engine only reads its maps and lists, so an Authorizer may share them
// between decisions (pkg/policy's decision cache does).
type Decision struct {
	Allowed bool
	// Status and Body answer a denied request; Status defaults to 403, and
	// must be 3xx-5xx (anything else becomes 403).
	Status int
	Body   []byte
	// Headers are set on the upstream request when allowed, and on the
	// response when denied.
	Headers http.Header
	// ResponseHeadersToAdd are added to the response of an allowed request.
	ResponseHeadersToAdd http.Header
	// RequestHeadersToRemove are removed from an allowed request.
	RequestHeadersToRemove []string
	// Reason and ID go to the access log.
	Reason string
	ID     string
}

// AuthorizerFunc adapts a function to Authorizer.
type AuthorizerFunc func(ctx context.Context, r *AuthzRequest) Decision

// Authorize calls f.
func (f AuthorizerFunc) Authorize(ctx context.Context, r *AuthzRequest) Decision { return f(ctx, r) }

// AllowAll authorizes every request. A waypoint without a policy must say so
// explicitly by using it: the engine has no default.
func AllowAll() Authorizer {
	return AuthorizerFunc(func(context.Context, *AuthzRequest) Decision {
		return Decision{Allowed: true, Reason: "allow-all"}
	})
}
