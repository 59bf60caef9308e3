// Package locality ranks a Service's endpoints by how close they are to
// whoever chooses among them (the client's node proxy, a waypoint), as the
// Service's spec.trafficDistribution asks: the same tiers as kube-proxy's
// topology hints (same node, same zone), with the region between the zone
// and the rest as Istio ranks it. Closeness is a preference, never a
// filter: callers fall back tier by tier when the closer endpoints are
// gone or failing.
package locality

import "github.com/causeway-mesh/causeway/pkg/xds/meshv1"

// Place is where a workload runs.
type Place struct {
	Node, Region, Zone string
}

// Of is where w runs (the zero Place for nil).
func Of(w *meshv1.Workload) Place {
	return Place{Node: w.GetNode(), Region: w.GetLocality().GetRegion(), Zone: w.GetLocality().GetZone()}
}

// Tiers, closest first. Every endpoint is in TierAny when the Service
// states no preference.
const (
	TierNode   = 0
	TierZone   = 1
	TierRegion = 2
	TierAny    = 3
)

// Rank is the tier of an endpoint at to for a chooser at from. An empty
// name matches nothing: an endpoint of unknown place is never "close".
func Rank(td meshv1.TrafficDistribution, from, to Place) int {
	if td != meshv1.TrafficDistribution_PREFER_SAME_NODE && td != meshv1.TrafficDistribution_PREFER_CLOSE {
		return TierAny
	}
	sameNode := from.Node != "" && from.Node == to.Node
	switch {
	case sameNode && td == meshv1.TrafficDistribution_PREFER_SAME_NODE:
		return TierNode
	case sameNode, from.Zone != "" && from.Zone == to.Zone && from.Region == to.Region:
		return TierZone
	case from.Region != "" && from.Region == to.Region:
		return TierRegion
	}
	return TierAny
}
