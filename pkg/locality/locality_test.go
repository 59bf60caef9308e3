package locality

import (
	"testing"

	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

func TestRank(t *testing.T) {
	here := Place{Node: "n1", Region: "r1", Zone: "z1"}
	var (
		node   = meshv1.TrafficDistribution_PREFER_SAME_NODE
		closer = meshv1.TrafficDistribution_PREFER_CLOSE
		any    = meshv1.TrafficDistribution_ANY
	)
	for _, c := range []struct {
		name string
		td   meshv1.TrafficDistribution
		from Place
		to   Place
		want int
	}{
		{"same node", node, here, here, TierNode},
		{"same zone, other node", node, here, Place{"n2", "r1", "z1"}, TierZone},
		{"same region, other zone", node, here, Place{"n3", "r1", "z2"}, TierRegion},
		{"other region", node, here, Place{"n4", "r2", "z1"}, TierAny},
		{"close: same node is the zone's", closer, here, here, TierZone},
		{"close: same zone", closer, here, Place{"n2", "r1", "z1"}, TierZone},
		{"close: same region", closer, here, Place{"n3", "r1", "z2"}, TierRegion},
		{"close: zone of the same name in another region", closer, here, Place{"n4", "r2", "z1"}, TierAny},
		{"no preference", any, here, here, TierAny},
		{"unlabelled nodes: the node still counts", node, Place{Node: "n1"}, Place{Node: "n1"}, TierNode},
		{"unlabelled nodes: close means the node", closer, Place{Node: "n1"}, Place{Node: "n1"}, TierZone},
		{"unlabelled nodes: others are far", node, Place{Node: "n1"}, Place{Node: "n2"}, TierAny},
		{"unknown endpoint place", node, here, Place{}, TierAny},
		{"unknown chooser", node, Place{}, Place{}, TierAny},
		{"unknown value", meshv1.TrafficDistribution(7), here, here, TierAny},
	} {
		if got := Rank(c.td, c.from, c.to); got != c.want {
			t.Errorf("%s: Rank(%v, %+v, %+v) = %d, want %d", c.name, c.td, c.from, c.to, got, c.want)
		}
	}
}

func TestOf(t *testing.T) {
	w := &meshv1.Workload{Node: "n1", Locality: &meshv1.Locality{Region: "r", Zone: "z"}}
	if got, want := Of(w), (Place{"n1", "r", "z"}); got != want {
		t.Errorf("Of = %+v, want %+v", got, want)
	}
	if got := Of(nil); got != (Place{}) {
		t.Errorf("Of(nil) = %+v, want zero", got)
	}
}
