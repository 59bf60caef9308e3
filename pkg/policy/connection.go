package policy

import (
	"context"
	"net/netip"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/causeway-mesh/causeway/pkg/trust"
)

// ConnectionRequest is a TCP connection authorized as a whole, as Envoy's
// network ext_authz filter asks: there is no HTTP request, only who
// connects to what.
type ConnectionRequest struct {
	// Source is the peer of the HBONE tunnel; only it gives a principal.
	Source               trust.Peer
	SourceAddr, DestAddr netip.AddrPort
	// Destination is the destination workload's identity (zero: unknown).
	Destination trust.Identity
}

// BuildConnectionInput builds the input OPA-Envoy gets for a network
// check: attributes.source and attributes.destination (with principals as
// in BuildInput) and no attributes.request, so HTTP rules stay undefined.
func BuildConnectionInput(req *ConnectionRequest) ast.Value {
	var srcPrincipal, dstPrincipal string
	if id, ok := req.Source.Identity(); ok {
		srcPrincipal = id.String()
	}
	if !req.Destination.IsZero() {
		dstPrincipal = req.Destination.String()
	}
	attributes := ast.NewObject(
		[2]*ast.Term{kSource, peerTerms.get(peerKey{addr: req.SourceAddr, principal: srcPrincipal})},
		[2]*ast.Term{kDestination, peerTerms.get(peerKey{addr: req.DestAddr, principal: dstPrincipal})},
		[2]*ast.Term{kMetadataContext, emptyObjectTerm},
	)
	input := ast.NewObject(
		[2]*ast.Term{kAttributes, ast.NewTerm(attributes)},
		[2]*ast.Term{kVersion, versionTerm},
	)
	if srcPrincipal != "" {
		input.Insert(kSourcePrincipal, principalTerms.get(srcPrincipal))
	}
	if dstPrincipal != "" {
		input.Insert(kDestinationPrincipl, principalTerms.get(dstPrincipal))
	}
	return input
}

// DecideConnection evaluates the active policy for a TCP connection. As
// with Decide, anything but an explicit allow denies.
func (e *Engine) DecideConnection(ctx context.Context, req *ConnectionRequest) Decision {
	return e.decide(ctx, e.active.Load(), astInput{BuildConnectionInput(req)}, time.Now())
}
