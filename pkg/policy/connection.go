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
	// DestinationWorkload is the workload the connection reaches (nil:
	// not known, e.g. a Service addressed at a waypoint).
	DestinationWorkload *Workload
	// DestinationServices are the hostnames of the Services the
	// connection was addressed to, or that the destination workload
	// serves on the destination port.
	DestinationServices []string
	// FromWaypoint: the peer is an authenticated waypoint the destination
	// is bound to (never set for an unauthenticated peer).
	FromWaypoint bool
}

// Workload names the destination workload in a connection's input.
type Workload struct {
	Namespace, Name, UID, ServiceAccount string
	Labels                               map[string]string
}

// BuildConnectionInput builds the input OPA-Envoy gets for a network
// check: attributes.source and attributes.destination (with principals as
// in BuildInput, and the destination workload's labels as Envoy's
// Peer.labels) and no attributes.request, so HTTP rules stay undefined.
// Causeway adds, at the top level: destination_workload {namespace, name,
// uid, service_account} when known, destination_services, and
// from_waypoint, which only an authenticated waypoint of the destination
// makes true.
func BuildConnectionInput(req *ConnectionRequest) ast.Value {
	var srcPrincipal, dstPrincipal string
	if id, ok := req.Source.Identity(); ok {
		srcPrincipal = id.String()
	}
	if !req.Destination.IsZero() {
		dstPrincipal = req.Destination.String()
	}
	destination := peerTerms.get(peerKey{addr: req.DestAddr, principal: dstPrincipal})
	wl := req.DestinationWorkload
	if wl != nil && len(wl.Labels) > 0 {
		// The cached peer term is shared: labels go into a copy.
		obj := destination.Value.(ast.Object).Copy()
		labels := ast.NewObjectWithCapacity(len(wl.Labels))
		for k, v := range wl.Labels {
			labels.Insert(ast.StringTerm(k), ast.StringTerm(v))
		}
		obj.Insert(kLabels, ast.NewTerm(labels))
		destination = ast.NewTerm(obj)
	}
	attributes := ast.NewObject(
		[2]*ast.Term{kSource, peerTerms.get(peerKey{addr: req.SourceAddr, principal: srcPrincipal})},
		[2]*ast.Term{kDestination, destination},
		[2]*ast.Term{kMetadataContext, emptyObjectTerm},
	)
	fromWaypoint := req.FromWaypoint && srcPrincipal != ""
	input := ast.NewObject(
		[2]*ast.Term{kAttributes, ast.NewTerm(attributes)},
		[2]*ast.Term{kVersion, versionTerm},
		[2]*ast.Term{kFromWaypoint, ast.BooleanTerm(fromWaypoint)},
	)
	if wl != nil {
		input.Insert(kDestinationWorkload, ast.ObjectTerm(
			[2]*ast.Term{ast.StringTerm("namespace"), ast.StringTerm(wl.Namespace)},
			[2]*ast.Term{ast.StringTerm("name"), ast.StringTerm(wl.Name)},
			[2]*ast.Term{ast.StringTerm("uid"), ast.StringTerm(wl.UID)},
			[2]*ast.Term{ast.StringTerm("service_account"), ast.StringTerm(wl.ServiceAccount)},
		))
	}
	if len(req.DestinationServices) > 0 {
		input.Insert(kDestinationServices, stringArray(req.DestinationServices))
	}
	if srcPrincipal != "" {
		input.Insert(kSourcePrincipal, principalTerms.get(srcPrincipal))
	}
	if dstPrincipal != "" {
		input.Insert(kDestinationPrincipl, principalTerms.get(dstPrincipal))
	}
	return input
}

var (
	kLabels              = ast.StringTerm("labels")
	kFromWaypoint        = ast.StringTerm("from_waypoint")
	kDestinationWorkload = ast.StringTerm("destination_workload")
	kDestinationServices = ast.StringTerm("destination_services")
)

// DecideConnection evaluates the active policy for a TCP connection. As
// with Decide, anything but an explicit allow denies.
func (e *Engine) DecideConnection(ctx context.Context, req *ConnectionRequest) Decision {
	return e.decide(ctx, e.active.Load(), astInput{BuildConnectionInput(req)}, time.Now())
}
