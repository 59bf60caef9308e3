package nodeproxy

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"

	"github.com/causeway-mesh/causeway/pkg/capture"
	"github.com/causeway-mesh/causeway/pkg/locality"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// HopKind is how a connection reaches its next hop.
type HopKind int

const (
	// ViaWaypoint: HBONE to the destination's waypoint.
	ViaWaypoint HopKind = iota
	// Direct: HBONE to the destination pod's node proxy.
	Direct
	// PlainTCP: the destination is not in the mesh; plain TCP to it.
	PlainTCP
	// Passthrough: the destination is unknown to the mesh; plain TCP as addressed.
	Passthrough
)

func (k HopKind) String() string {
	return [...]string{"waypoint", "hbone", "tcp", "passthrough"}[k]
}

// Hop is one way to reach a destination.
type Hop struct {
	Kind HopKind
	// Address is the next hop: a pod or waypoint IP and the HBONE port, or
	// the TCP destination.
	Address netip.AddrPort
	// Authority is the HBONE :authority (HBONE kinds only).
	Authority netip.AddrPort
	// Expected is the identity the next hop must prove (HBONE kinds only).
	Expected trust.Identity
	// Workload is the destination workload when known.
	Workload *meshv1.Workload
	// Tier is how close the hop is to the client, as the service's (or
	// the waypoint's) trafficDistribution ranks it (locality.Rank):
	// closer tiers are tried first.
	Tier int
}

// Plan is the decision for one outbound connection: hops in order of
// preference (several for a service's endpoints: the next is tried when one
// fails to connect).
type Plan struct {
	Service  *meshv1.Service  // when addressed to a service
	Waypoint *meshv1.Waypoint // when the traffic must go through one
	Hops     []Hop
}

// Errors a plan can fail with; the capture answer depends on them.
var (
	errHostUnknown = errors.New("host unknown")
	errRefused     = errors.New("refused")
)

// reservedPorts are the proxy's own ports: never valid destinations.
var reservedPorts = map[uint16]bool{15001: true, 15006: true, 15008: true, 15080: true}

// planOutbound decides where a connection to dst goes (docs/design.md §5)
// for a client at from. hbonePort is the port HBONE listens on at pods.
func (r *Registry) planOutbound(dst capture.Destination, from locality.Place, hbonePort uint16, allowPassthrough bool) (Plan, error) {
	port := dst.Addr.Port()
	if dst.Host != "" {
		port = dst.Port
	}
	if reservedPorts[port] {
		return Plan{}, fmt.Errorf("%w: port %d is a mesh port", errRefused, port)
	}
	if dst.Host != "" {
		if ip, ok := r.ResolvePodHost(dst.Host); ok {
			// One pod of a headless service: as if addressed by its IP.
			dst = capture.Destination{Addr: netip.AddrPortFrom(ip, port)}
		} else {
			svc, ok := r.ResolveHost(dst.Host)
			if !ok {
				return Plan{}, fmt.Errorf("%w: %s is not a mesh service", errHostUnknown, dst.Host)
			}
			return r.planService(svc, from, port, hbonePort)
		}
	}
	if svc, ok := r.ServiceByVIP(dst.Addr.Addr()); ok {
		return r.planService(svc, from, port, hbonePort)
	}
	if w, ok := r.WorkloadByIP(dst.Addr.Addr()); ok {
		hop, wp, err := r.workloadHop(w, from, dst.Addr, hbonePort)
		if err != nil {
			return Plan{}, err
		}
		return Plan{Waypoint: wp, Hops: []Hop{hop}}, nil
	}
	if !allowPassthrough {
		return Plan{}, fmt.Errorf("%w: %s is not a mesh destination and passthrough is off", errRefused, dst)
	}
	return Plan{Hops: []Hop{{Kind: Passthrough, Address: dst.Addr}}}, nil
}

func (r *Registry) planService(svc *meshv1.Service, from locality.Place, port, hbonePort uint16) (Plan, error) {
	var sp *meshv1.ServicePort
	for _, p := range svc.GetPorts() {
		if p.GetPort() == uint32(port) {
			sp = p
		}
	}
	if why := svc.GetInvalidReason(); why != "" {
		return Plan{}, fmt.Errorf("%w: the control plane refused service %s/%s: %s", errRefused, svc.GetNamespace(), svc.GetName(), why)
	}
	if sp == nil {
		return Plan{}, fmt.Errorf("%w: service %s/%s has no port %d", errRefused, svc.GetNamespace(), svc.GetName(), port)
	}
	if ref := svc.GetWaypoint(); ref != nil {
		wp, err := r.Waypoint(ref)
		if err != nil {
			return Plan{}, fmt.Errorf("service %s/%s: %w", svc.GetNamespace(), svc.GetName(), err)
		}
		vip, err := netip.ParseAddr(firstOr(svc.GetVips(), ""))
		if err != nil {
			return Plan{}, fmt.Errorf("service %s/%s has no VIP to address its waypoint with", svc.GetNamespace(), svc.GetName())
		}
		hops, err := r.waypointHops(wp, from, netip.AddrPortFrom(vip, port))
		if err != nil {
			return Plan{}, err
		}
		return Plan{Service: svc, Waypoint: wp, Hops: hops}, nil
	}
	var hops []Hop
	for _, ep := range svc.GetEndpoints() {
		w, ok := r.byUID[ep.GetWorkloadUid()]
		if !ok || w.GetInvalidReason() != "" {
			continue // a refused workload is no endpoint; the others still serve
		}
		ip, err := netip.ParseAddr(ep.GetAddress())
		if err != nil {
			continue
		}
		target := ep.GetPorts()[uint32(port)]
		if target == 0 {
			target = sp.GetTargetPort()
		}
		if target == 0 {
			target = uint32(port)
		}
		hop, _, err := r.workloadHop(w, from, netip.AddrPortFrom(ip, uint16(target)), hbonePort)
		if err != nil {
			return Plan{}, err
		}
		// The endpoint's own place, not its waypoint's: the service's
		// trafficDistribution is about its endpoints.
		hop.Tier = locality.Rank(svc.GetTrafficDistribution(), from, locality.Of(w))
		hops = append(hops, hop)
	}
	if len(hops) == 0 {
		return Plan{}, fmt.Errorf("service %s/%s has no endpoints", svc.GetNamespace(), svc.GetName())
	}
	return Plan{Service: svc, Hops: hops}, nil
}

// workloadHop is how to reach workload w at addr from a client at from:
// through its own waypoint (one of its closest pods), over HBONE, or over
// plain TCP when it is not in the mesh.
func (r *Registry) workloadHop(w *meshv1.Workload, from locality.Place, addr netip.AddrPort, hbonePort uint16) (Hop, *meshv1.Waypoint, error) {
	if err := refusedWorkload(w); err != nil {
		return Hop{}, nil, err
	}
	if ref := w.GetWaypoint(); ref != nil {
		wp, err := r.Waypoint(ref)
		if err != nil {
			return Hop{}, nil, fmt.Errorf("workload %s/%s: %w", w.GetNamespace(), w.GetName(), err)
		}
		hops, err := r.waypointHops(wp, from, addr)
		if err != nil {
			return Hop{}, nil, err
		}
		return randomClosest(hops), wp, nil
	}
	if !w.GetHbone() {
		return Hop{Kind: PlainTCP, Address: addr, Workload: w}, nil, nil
	}
	id, err := trust.ParseIdentity(w.GetIdentity())
	if err != nil {
		return Hop{}, nil, fmt.Errorf("workload %s/%s: %w", w.GetNamespace(), w.GetName(), err)
	}
	return Hop{Kind: Direct, Address: netip.AddrPortFrom(addr.Addr(), hbonePort), Authority: addr, Expected: id, Workload: w}, nil, nil
}

// waypointHops are the ways to reach waypoint wp's pods, each ranked by
// the waypoint's trafficDistribution for a client at from.
func (r *Registry) waypointHops(wp *meshv1.Waypoint, from locality.Place, authority netip.AddrPort) ([]Hop, error) {
	id, err := WaypointIdentity(wp)
	if err != nil {
		return nil, err
	}
	port := uint16(wp.GetHbonePort())
	if port == 0 {
		port = 15008
	}
	var hops []Hop
	for _, a := range wp.GetAddresses() {
		ip, err := netip.ParseAddr(a)
		if err != nil {
			continue
		}
		pod, _ := r.WorkloadByIP(ip) // nil (no place) when not described
		tier := locality.Rank(wp.GetTrafficDistribution(), from, locality.Of(pod))
		hops = append(hops, Hop{Kind: ViaWaypoint, Address: netip.AddrPortFrom(ip.Unmap(), port), Authority: authority, Expected: id, Tier: tier})
	}
	if len(hops) == 0 {
		return nil, fmt.Errorf("waypoint %s/%s has no usable address", wp.GetNamespace(), wp.GetName())
	}
	return hops, nil
}

// randomClosest is a random one of the hops of the closest tier.
func randomClosest(hops []Hop) Hop {
	best := hops[0].Tier
	for _, h := range hops {
		best = min(best, h.Tier)
	}
	var closest []Hop
	for _, h := range hops {
		if h.Tier == best {
			closest = append(closest, h)
		}
	}
	return closest[rand.IntN(len(closest))]
}

func firstOr(s []string, d string) string {
	if len(s) == 0 {
		return d
	}
	return s[0]
}
