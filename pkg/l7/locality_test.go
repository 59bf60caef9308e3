package l7

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// TestTrafficDistributionAtWaypoint: a Service's PreferSameNode sends
// every request to the endpoint on the waypoint's own node; with no
// preference both endpoints serve; when the near endpoint cannot be
// reached the far one takes the requests (the near one is dialled once,
// then ejected).
func TestTrafficDistributionAtWaypoint(t *testing.T) {
	h := newHarness(t, func(o *Options) {
		o.Pod = PodRef{testNS, "waypoint-0"}
		o.EjectionTime = time.Minute
	})
	near := h.backend("near", "http", false)
	far := h.backend("far", "http", false)
	svc := h.addService("spot", "http", near.addr, far.addr)
	h.works[len(h.works)-2].Node, h.works[len(h.works)-1].Node = "node-a", "node-b"
	// The waypoint's own pod, by which it knows its node.
	h.works = append(h.works, &meshv1.Workload{Uid: "waypoint-0", Name: "waypoint-0", Namespace: testNS, Node: "node-a",
		Addresses: []string{"127.0.0.99"}, WaypointForGateway: &meshv1.Ref{Namespace: testNS, Name: "waypoint"}})
	info := webInfo(trust.Unauthenticated())
	info.Service = ServiceRef{testNS, "spot"}
	c := h1Client(h.front(info))
	answers := func(n int) map[string]int {
		t.Helper()
		seen := map[string]int{}
		for i := range n {
			res := get(t, c, fmt.Sprintf("/%d", i), nil)
			if res.status != 200 {
				t.Fatalf("request %d: %d %q", i, res.status, res.body)
			}
			seen[res.echo.Backend]++
		}
		return seen
	}

	svc.TrafficDistribution = meshv1.TrafficDistribution_PREFER_SAME_NODE
	h.update(nil, nil)
	if seen := answers(40); seen["near"] != 40 {
		t.Fatalf("PreferSameNode: answers %v, want all 40 from the endpoint on the waypoint's node", seen)
	}

	svc.TrafficDistribution = meshv1.TrafficDistribution_ANY
	h.update(nil, nil)
	if seen := answers(40); seen["near"] == 0 || seen["far"] == 0 {
		t.Fatalf("no preference: answers %v, want both endpoints", seen)
	}

	// The near endpoint stops answering (its pod is gone, its endpoint
	// not yet withdrawn).
	dead := deadAddr(t)
	svc.TrafficDistribution = meshv1.TrafficDistribution_PREFER_SAME_NODE
	svc.Endpoints[0].Ports[80] = uint32(dead.Port())
	h.update(nil, nil)
	if seen := answers(40); seen["far"] != 40 {
		t.Fatalf("near endpoint unreachable: answers %v, want all 40 from the far one", seen)
	}
	if n := h.dialer.count(netip.AddrPortFrom(dead.Addr(), dead.Port())); n != 1 {
		t.Errorf("the unreachable near endpoint dialled %d times, want once (then ejected)", n)
	}
}

// pickEndpoint takes the closest tier with a healthy endpoint, and with
// none healthy the closest tier again (panic mode), skipping what skip
// excludes.
func TestPickEndpointByTier(t *testing.T) {
	near, far1, far2 := &endpoint{}, &endpoint{}, &endpoint{}
	tiers := endpointTiers{{near}, {far1, far2}}
	for range 50 {
		if got := pickEndpoint(tiers, nil); got != near {
			t.Fatal("a healthy endpoint of the closest tier is always chosen")
		}
	}
	near.ejectedTill.Store(time.Now().Add(time.Hour).UnixNano())
	seen := map[*endpoint]bool{}
	for range 50 {
		seen[pickEndpoint(tiers, nil)] = true
	}
	if seen[near] || !seen[far1] || !seen[far2] {
		t.Fatal("with the closest tier ejected, the next tier's endpoints serve, all of them")
	}
	far1.ejectedTill.Store(time.Now().Add(time.Hour).UnixNano())
	far2.ejectedTill.Store(time.Now().Add(time.Hour).UnixNano())
	if got := pickEndpoint(tiers, nil); got != near {
		t.Fatal("with every endpoint ejected, the closest tier is tried again")
	}
	if got := pickEndpoint(tiers, func(ep *endpoint) bool { return ep == near }); got != far1 && got != far2 {
		t.Fatal("an endpoint skip excludes is never chosen")
	}
}
