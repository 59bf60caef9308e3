package nodeproxy

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/causeway-mesh/causeway/pkg/locality"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// TestServiceTrafficDistribution: with real node proxies and sockets, a
// Service's PreferSameNode sends every connection to the endpoint on the
// client's node; once that endpoint is withdrawn (not ready) the others
// serve; PreferClose keeps to the client's zone, and leaves it when its
// endpoints there cannot be reached.
func TestServiceTrafficDistribution(t *testing.T) {
	const podF = "127.0.71.6"
	for pod, name := range map[string]string{podB: "B", podC: "C", podF: "F"} {
		startApp(t, app(pod)+":8080", name)
	}
	m := startMesh(t, "node-a", "node-b")
	ws, ss, wps := meshResources()
	// F: a second pod of a's account, on the client's node.
	f := proto.Clone(ws[0]).(*meshv1.Workload)
	f.Uid, f.Name, f.Addresses, f.AppAddress = "f", "f", []string{podF}, app(podF)
	ws = append(ws, f)
	byUID := map[string]*meshv1.Workload{}
	for _, w := range ws {
		byUID[w.GetUid()] = w
	}
	svc := ss[0] // endpoints B, C (node-b) and E (node-c: no node proxy, unreachable)
	svc.Endpoints = append(svc.Endpoints, &meshv1.Endpoint{WorkloadUid: "f", Address: podF})
	update := func() {
		for n, p := range m.proxies {
			p.Update(NewRegistry(n, ws, ss, wps))
		}
	}
	answers := func(n int) map[string]int {
		t.Helper()
		seen := map[string]int{}
		for i := range n {
			got, err := m.exchange(t, "node-a", podA, vipSvc+":80", fmt.Sprint(i))
			if err != nil {
				t.Fatalf("connection %d: %v", i, err)
			}
			seen[strings.SplitN(got, ":", 2)[0]]++
		}
		return seen
	}

	svc.TrafficDistribution = meshv1.TrafficDistribution_PREFER_SAME_NODE
	update()
	waitFor(t, "HBONE listener of f", func() error {
		c, err := net.Dial("tcp", podF+":15008")
		if err == nil {
			c.Close()
		}
		return err
	})
	if seen := answers(20); seen["F"] != 20 {
		t.Fatalf("PreferSameNode: connections per endpoint %v, want all 20 to F on the client's node", seen)
	}

	svc.Endpoints = slices.DeleteFunc(svc.Endpoints, func(ep *meshv1.Endpoint) bool { return ep.GetWorkloadUid() == "f" })
	update()
	if seen := answers(20); seen["B"] == 0 || seen["C"] == 0 || seen["B"]+seen["C"] != 20 {
		t.Fatalf("PreferSameNode with none on the node: connections per endpoint %v, want B and C", seen)
	}

	// Zones: the client's node and E's share z1, B and C are in z2. E
	// cannot be reached: the other zone serves.
	zones := func(z map[string]string) {
		for uid, zone := range z {
			byUID[uid].Locality = &meshv1.Locality{Region: "r1", Zone: zone}
		}
		update()
	}
	svc.TrafficDistribution = meshv1.TrafficDistribution_PREFER_CLOSE
	zones(map[string]string{"a": "z1", "e": "z1", "b": "z2", "c": "z2"})
	if seen := answers(20); seen["B"] == 0 || seen["C"] == 0 || seen["B"]+seen["C"] != 20 {
		t.Fatalf("PreferClose, the zone's endpoint unreachable: connections per endpoint %v, want B and C", seen)
	}
	if dead := netip.MustParseAddrPort(podE + ":15008"); !m.proxies["node-a"].outliers.ejected(dead) {
		t.Fatalf("the unreachable endpoint %s is not ejected", dead)
	}
	// B joins the client's zone: it takes every connection.
	zones(map[string]string{"b": "z1"})
	if seen := answers(20); seen["B"] != 20 {
		t.Fatalf("PreferClose: connections per endpoint %v, want all 20 to B, the reachable one of the client's zone", seen)
	}
}

// The hops a plan tries first are the closest: a service's endpoints by
// its trafficDistribution, a waypoint's pods by the waypoint's (its own
// Service's).
func TestPlanPrefersClosestHops(t *testing.T) {
	here := locality.Place{Node: "node-a", Region: "r1", Zone: "z1"}
	ws := []*meshv1.Workload{
		{Uid: "near", Namespace: "t", Identity: "spiffe://cluster.local/ns/t/sa/s", Node: "node-a", Addresses: []string{"127.0.80.1"}, Hbone: true},
		{Uid: "zone", Namespace: "t", Identity: "spiffe://cluster.local/ns/t/sa/s", Node: "node-b", Addresses: []string{"127.0.80.2"}, Hbone: true, Locality: &meshv1.Locality{Region: "r1", Zone: "z1"}},
		{Uid: "far", Namespace: "t", Identity: "spiffe://cluster.local/ns/t/sa/s", Node: "node-c", Addresses: []string{"127.0.80.3"}, Hbone: true, Locality: &meshv1.Locality{Region: "r2", Zone: "z9"}},
		{Uid: "wp-far", Namespace: "t", Node: "node-c", Addresses: []string{"127.0.80.11"}, WaypointForGateway: &meshv1.Ref{Namespace: "t", Name: "wp"}},
		{Uid: "wp-near", Namespace: "t", Node: "node-a", Addresses: []string{"127.0.80.12"}, WaypointForGateway: &meshv1.Ref{Namespace: "t", Name: "wp"}},
		{Uid: "bound", Namespace: "t", Identity: "spiffe://cluster.local/ns/t/sa/b", Node: "node-c", Addresses: []string{"127.0.80.20"}, Hbone: true, Waypoint: &meshv1.Ref{Namespace: "t", Name: "wp"}},
	}
	port := []*meshv1.ServicePort{{Port: 80, TargetPort: 8080}}
	eps := []*meshv1.Endpoint{{WorkloadUid: "far", Address: "127.0.80.3"}, {WorkloadUid: "zone", Address: "127.0.80.2"}, {WorkloadUid: "near", Address: "127.0.80.1"}}
	ss := []*meshv1.Service{
		{Name: "node", Namespace: "t", Vips: []string{"127.0.81.1"}, Ports: port, Endpoints: eps, TrafficDistribution: meshv1.TrafficDistribution_PREFER_SAME_NODE},
		{Name: "close", Namespace: "t", Vips: []string{"127.0.81.2"}, Ports: port, Endpoints: eps, TrafficDistribution: meshv1.TrafficDistribution_PREFER_CLOSE},
		{Name: "any", Namespace: "t", Vips: []string{"127.0.81.3"}, Ports: port, Endpoints: eps},
		{Name: "bound", Namespace: "t", Vips: []string{"127.0.81.4"}, Ports: port, Endpoints: eps, Waypoint: &meshv1.Ref{Namespace: "t", Name: "wp"}},
	}
	wp := &meshv1.Waypoint{Name: "wp", Namespace: "t", Identity: "spiffe://cluster.local/ns/t/sa/wp", Addresses: []string{"127.0.80.11", "127.0.80.12"}, HbonePort: 15008}
	r := NewRegistry("node-a", ws, ss, []*meshv1.Waypoint{wp})
	p := &Proxy{active: map[netip.AddrPort]int{}, outliers: newOutliers()}
	// firsts counts the first hop of 100 plans' orders.
	firsts := func(dst string) map[string]int {
		t.Helper()
		n := map[string]int{}
		for range 100 {
			plan, err := r.planOutbound(addr(dst), here, 15008, false)
			if err != nil {
				t.Fatal(err)
			}
			n[p.order(plan.Hops)[0].Address.Addr().String()]++
		}
		return n
	}
	for _, c := range []struct {
		name, dst string
		want      []string // the possible first hops
	}{
		{"PreferSameNode", "127.0.81.1:80", []string{"127.0.80.1"}},
		{"PreferClose", "127.0.81.2:80", []string{"127.0.80.1", "127.0.80.2"}},
		{"no preference", "127.0.81.3:80", []string{"127.0.80.1", "127.0.80.2", "127.0.80.3"}},
		{"waypoint without a preference", "127.0.81.4:80", []string{"127.0.80.11", "127.0.80.12"}},
	} {
		got := firsts(c.dst)
		if len(got) != len(c.want) {
			t.Errorf("%s: first hops %v, want each of %v", c.name, got, c.want)
		}
		for a := range got {
			if !slices.Contains(c.want, a) {
				t.Errorf("%s: first hops %v, want only %v", c.name, got, c.want)
			}
		}
	}

	// The waypoint's own Service prefers its pods on the client's node:
	// for a service bound to it and for a workload bound to it.
	wp.TrafficDistribution = meshv1.TrafficDistribution_PREFER_SAME_NODE
	if got := firsts("127.0.81.4:80"); got["127.0.80.12"] != 100 {
		t.Errorf("waypoint with PreferSameNode: first hops %v, want its pod on node-a", got)
	}
	for range 100 {
		plan, err := r.planOutbound(addr("127.0.80.20:8080"), here, 15008, false)
		if err != nil {
			t.Fatal(err)
		}
		if h := plan.Hops[0].Address.Addr().String(); len(plan.Hops) != 1 || h != "127.0.80.12" {
			t.Fatalf("workload bound to a waypoint with PreferSameNode: hops %v, want its pod on node-a", plan.Hops)
		}
	}
}
