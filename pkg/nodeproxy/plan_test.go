package nodeproxy

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/causeway-mesh/causeway/pkg/capture"
	"github.com/causeway-mesh/causeway/pkg/locality"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

func testRegistry() *Registry {
	ws := []*meshv1.Workload{
		{Uid: "web/frontend", Name: "frontend", Namespace: "web", Identity: "spiffe://cluster.local/ns/web/sa/frontend", Node: "node-a", Addresses: []string{"127.0.10.1"}, Hbone: true},
		{Uid: "shop/reviews-v1", Name: "reviews-v1", Namespace: "shop", Identity: "spiffe://cluster.local/ns/shop/sa/reviews", Node: "node-a", Addresses: []string{"127.0.10.11"}, Hbone: true},
		{Uid: "shop/reviews-v2", Name: "reviews-v2", Namespace: "shop", Identity: "spiffe://cluster.local/ns/shop/sa/reviews", Node: "node-b", Addresses: []string{"127.0.10.12"}, Hbone: true},
		{Uid: "db/legacy", Name: "legacy", Namespace: "db", Identity: "spiffe://cluster.local/ns/db/sa/default", Node: "node-b", Addresses: []string{"127.0.10.50"}},
		{Uid: "shop/cart", Name: "cart", Namespace: "shop", Identity: "spiffe://cluster.local/ns/shop/sa/cart", Node: "node-b", Addresses: []string{"127.0.10.60"}, Hbone: true, Waypoint: &meshv1.Ref{Namespace: "shop", Name: "waypoint"}},
		{Uid: "shop/checkout", Name: "checkout", Namespace: "shop", Identity: "spiffe://cluster.local/ns/shop/sa/checkout", Node: "node-a", Addresses: []string{"127.0.10.13"}, Hbone: true, Waypoint: &meshv1.Ref{Namespace: "shop", Name: "waypoint"}},
		{Uid: "shop/orphan", Name: "orphan", Namespace: "shop", Identity: "spiffe://cluster.local/ns/shop/sa/orphan", Node: "node-b", Addresses: []string{"127.0.10.61"}, Hbone: true, Waypoint: &meshv1.Ref{Namespace: "shop", Name: "gone"}},
	}
	port := []*meshv1.ServicePort{{Name: "http", Port: 80, TargetPort: 8080, AppProtocol: "http"}}
	ss := []*meshv1.Service{
		{Name: "reviews", Namespace: "shop", Hostname: "reviews.shop.svc.cluster.local", Vips: []string{"127.0.20.1"}, Ports: port,
			Endpoints: []*meshv1.Endpoint{{WorkloadUid: "shop/reviews-v1", Address: "127.0.10.11"}, {WorkloadUid: "shop/reviews-v2", Address: "127.0.10.12", Ports: map[uint32]uint32{80: 9090}}},
			Waypoint:  &meshv1.Ref{Namespace: "shop", Name: "waypoint"}},
		{Name: "direct", Namespace: "shop", Hostname: "direct.shop.svc.cluster.local", Vips: []string{"127.0.20.2"}, Ports: port,
			Endpoints: []*meshv1.Endpoint{{WorkloadUid: "shop/reviews-v1", Address: "127.0.10.11"}, {WorkloadUid: "db/legacy", Address: "127.0.10.50"}}},
		{Name: "empty", Namespace: "shop", Vips: []string{"127.0.20.3"}, Ports: port},
		{Name: "ring", Namespace: "shop", Hostname: "ring.shop.svc.cluster.local", Ports: port, // headless
			Endpoints: []*meshv1.Endpoint{{WorkloadUid: "shop/reviews-v2", Address: "127.0.10.12", Hostname: "ring-1.ring.shop.svc.cluster.local"}}},
	}
	wps := []*meshv1.Waypoint{{Name: "waypoint", Namespace: "shop", Identity: "spiffe://cluster.local/ns/shop/sa/waypoint", Addresses: []string{"127.0.10.2"}, HbonePort: 15008}}
	return NewRegistry("node-a", ws, ss, wps)
}

func addr(s string) capture.Destination { return capture.Destination{Addr: netip.MustParseAddrPort(s)} }

func TestPlanOutbound(t *testing.T) {
	r := testRegistry()
	type hop struct {
		kind                         HopKind
		address, authority, expected string
	}
	for _, tc := range []struct {
		name string
		dst  capture.Destination
		want []hop
	}{
		{"service bound to waypoint", addr("127.0.20.1:80"), []hop{{ViaWaypoint, "127.0.10.2:15008", "127.0.20.1:80", "spiffe://cluster.local/ns/shop/sa/waypoint"}}},
		{"hostname resolves to the VIP", capture.Destination{Host: "reviews.shop", Port: 80}, []hop{{ViaWaypoint, "127.0.10.2:15008", "127.0.20.1:80", "spiffe://cluster.local/ns/shop/sa/waypoint"}}},
		{"full hostname", capture.Destination{Host: "Reviews.shop.svc.cluster.local.", Port: 80}, []hop{{ViaWaypoint, "127.0.10.2:15008", "127.0.20.1:80", "spiffe://cluster.local/ns/shop/sa/waypoint"}}},
		{"service endpoints: HBONE and plain TCP", addr("127.0.20.2:80"), []hop{
			{Direct, "127.0.10.11:15008", "127.0.10.11:8080", "spiffe://cluster.local/ns/shop/sa/reviews"},
			{PlainTCP, "127.0.10.50:8080", "", ""}}},
		{"pod IP of a waypoint-bound service: direct", addr("127.0.10.12:9090"), []hop{{Direct, "127.0.10.12:15008", "127.0.10.12:9090", "spiffe://cluster.local/ns/shop/sa/reviews"}}},
		{"a headless service's pod by its own name", capture.Destination{Host: "ring-1.ring.shop.svc.cluster.local", Port: 7000},
			[]hop{{Direct, "127.0.10.12:15008", "127.0.10.12:7000", "spiffe://cluster.local/ns/shop/sa/reviews"}}},
		{"pod IP bound to a waypoint", addr("127.0.10.60:8080"), []hop{{ViaWaypoint, "127.0.10.2:15008", "127.0.10.60:8080", "spiffe://cluster.local/ns/shop/sa/waypoint"}}},
		{"pod outside the mesh", addr("127.0.10.50:5432"), []hop{{PlainTCP, "127.0.10.50:5432", "", ""}}},
		{"unknown with passthrough", addr("127.0.99.1:443"), []hop{{Passthrough, "127.0.99.1:443", "", ""}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := r.planOutbound(tc.dst, locality.Place{}, 15008, true)
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Hops) != len(tc.want) {
				t.Fatalf("hops = %+v, want %+v", p.Hops, tc.want)
			}
			for i, w := range tc.want {
				h := p.Hops[i]
				auth := ""
				if h.Authority.IsValid() {
					auth = h.Authority.String()
				}
				if h.Kind != w.kind || h.Address.String() != w.address || auth != w.authority || h.Expected.String() != w.expected {
					t.Errorf("hop %d = {%v %v %q %q}, want %+v", i, h.Kind, h.Address, auth, h.Expected, w)
				}
			}
		})
	}
}

func TestPlanOutboundRefusals(t *testing.T) {
	r := testRegistry()
	for _, tc := range []struct {
		name        string
		dst         capture.Destination
		passthrough bool
		is          error
	}{
		{"unknown host", capture.Destination{Host: "nope.shop", Port: 80}, true, errHostUnknown},
		{"unknown address without passthrough", addr("127.0.99.1:443"), false, errRefused},
		{"mesh port", addr("127.0.10.11:15008"), true, errRefused},
		{"service port missing", addr("127.0.20.1:81"), true, errRefused},
		{"waypoint unknown fails closed", addr("127.0.10.61:80"), true, nil},
		{"no endpoints", addr("127.0.20.3:80"), true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := r.planOutbound(tc.dst, locality.Place{}, 15008, tc.passthrough)
			if err == nil {
				t.Fatal("planned a route")
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Fatalf("err = %v, want %v", err, tc.is)
			}
		})
	}
}

func TestIngressWaypoints(t *testing.T) {
	r := testRegistry()
	got := r.IngressWaypoints("shop/reviews-v1")
	if len(got) != 1 || got[0].GetName() != "waypoint" {
		t.Fatalf("reviews-v1 ingress waypoints = %v (it is an endpoint of a waypoint-bound service)", got)
	}
	if got := r.IngressWaypoints("db/legacy"); len(got) != 0 {
		t.Fatalf("legacy ingress waypoints = %v", got)
	}
	if _, ok := r.LocalWorkload(netip.MustParseAddr("127.0.10.12")); ok {
		t.Fatal("a node-b pod is local to node-a")
	}
	if w, ok := r.LocalWorkload(netip.MustParseAddr("127.0.10.1")); !ok || w.GetName() != "frontend" {
		t.Fatal("frontend is not local to node-a")
	}
}
