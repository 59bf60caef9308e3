package nodeproxy

import (
	"fmt"
	"net/netip"

	"github.com/causeway-mesh/causeway/pkg/locality"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// admission is the outcome of checking an inbound HBONE tunnel.
type admission struct {
	Workload *meshv1.Workload
	// FromWaypoint: the peer is a waypoint the destination is bound to, so
	// its Forwarded header may be trusted for logs and metrics.
	FromWaypoint bool
}

// admitInbound checks a tunnel accepted at local (the pod IP whose listener
// took it) from peer, asking for authority. Only local mesh pods are served,
// the authority must name the listener's own pod, and a pod bound to a
// waypoint itself (waypoint-for workload or all) accepts only the identities
// of the waypoints it is reached through. A waypoint bound to one of the
// pod's services (waypoint-for service) does not make it exclusive: traffic
// addressed to the pod IP is not service traffic, so the source sends it
// directly (GEP-1294: a route applies to a Service's frontend, never to its
// backends), and only service traffic is held to that waypoint.
func (r *Registry) admitInbound(local netip.Addr, authority netip.AddrPort, peer trust.Peer) (admission, error) {
	w, ok := r.LocalWorkload(local)
	if !ok {
		return admission{}, fmt.Errorf("%s is not a mesh pod on node %s", local, r.node)
	}
	if err := refusedWorkload(w); err != nil {
		return admission{}, err
	}
	if authority.Addr().Unmap() != local.Unmap() {
		return admission{}, fmt.Errorf("authority %s is not the pod %s this listener serves", authority, local)
	}
	if reservedPorts[authority.Port()] {
		return admission{}, fmt.Errorf("authority port %d is a mesh port", authority.Port())
	}
	id, authenticated := peer.Identity()
	if !authenticated {
		return admission{}, fmt.Errorf("peer is unauthenticated; a mesh certificate is required")
	}
	for _, ref := range r.IngressWaypoints(w.GetUid()) {
		wp, err := r.Waypoint(ref)
		if err != nil {
			continue // an unknown waypoint admits nobody
		}
		wid, err := WaypointIdentity(wp)
		if err == nil && wid == id {
			return admission{Workload: w, FromWaypoint: true}, nil
		}
	}
	if w.GetWaypoint() != nil {
		return admission{}, fmt.Errorf("%s/%s only accepts traffic through its waypoint; %s is not it", w.GetNamespace(), w.GetName(), id)
	}
	return admission{Workload: w}, nil
}

// planPlaintextInbound decides what happens to plaintext arriving from
// outside the mesh for dst, a local pod's address: hairpin through the
// destination's waypoint over a TLS-only tunnel (it cannot vouch for the
// caller), or delivery when the pod has no waypoint and plaintext is allowed.
func (r *Registry) planPlaintextInbound(dst netip.AddrPort, allowPlaintext bool) (*meshv1.Workload, *Hop, error) {
	w, ok := r.LocalWorkload(dst.Addr())
	if !ok {
		return nil, nil, fmt.Errorf("%s is not a mesh pod on node %s", dst.Addr(), r.node)
	}
	if err := refusedWorkload(w); err != nil {
		return nil, nil, err
	}
	refs := r.IngressWaypoints(w.GetUid())
	if own := w.GetWaypoint(); own != nil {
		refs = append([]*meshv1.Ref{own}, refs...)
	}
	if len(refs) > 0 {
		wp, err := r.Waypoint(refs[0])
		if err != nil {
			return nil, nil, fmt.Errorf("%s/%s: %w", w.GetNamespace(), w.GetName(), err)
		}
		hops, err := r.waypointHops(wp, locality.Of(w), dst)
		if err != nil {
			return nil, nil, err
		}
		hop := randomClosest(hops)
		return w, &hop, nil
	}
	if !allowPlaintext {
		return nil, nil, fmt.Errorf("plaintext inbound to %s/%s is not allowed", w.GetNamespace(), w.GetName())
	}
	return w, nil, nil
}

// deliveryAddress is where the node proxy connects to reach the workload's
// application on port: its app address in local mode, else its pod IP.
func deliveryAddress(w *meshv1.Workload, pod netip.Addr, port uint16) (netip.AddrPort, error) {
	if a := w.GetAppAddress(); a != "" {
		ip, err := netip.ParseAddr(a)
		if err != nil {
			return netip.AddrPort{}, fmt.Errorf("workload %s/%s app address %q: %w", w.GetNamespace(), w.GetName(), a, err)
		}
		return netip.AddrPortFrom(ip, port), nil
	}
	return netip.AddrPortFrom(pod, port), nil
}
