package waypoint

import (
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/pkg/internal/testnet"
	"github.com/causeway-mesh/causeway/pkg/l7"
	"github.com/causeway-mesh/causeway/pkg/xds"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// A TCP port's connections honour the Service's trafficDistribution as
// requests do: PreferSameNode connects to the endpoint on the waypoint's
// own node, and to the other when that one does not answer.
func TestTCPTrafficDistribution(t *testing.T) {
	f := start(t, func(o *Options) { o.L7.Pod = l7.PodRef{Namespace: "shop", Name: "wp-0"} })
	greeter := func(addr, name string) netip.AddrPort {
		ln := testnet.Listen(t, addr)
		testnet.Serve(t, ln, func(c net.Conn) { io.WriteString(c, name); io.Copy(io.Discard, c) })
		return netip.MustParseAddrPort(ln.Addr().String())
	}
	near, far := greeter("127.0.173.11:0", "near"), greeter("127.0.173.12:0", "far")
	workload := func(uid, node string, a netip.AddrPort) *meshv1.Workload {
		return &meshv1.Workload{Uid: uid, Name: uid, Namespace: "shop", Identity: "spiffe://cluster.local/ns/shop/sa/db",
			Node: node, Addresses: []string{a.Addr().String()}}
	}
	update := func(nearPort uint16) {
		f.w.Update(&xds.State{Set: meshv1.Set{
			Workloads: map[string]*meshv1.Workload{
				"near": workload("near", "node-a", near), "far": workload("far", "node-b", far),
				"wp-0": {Uid: "wp-0", Name: "wp-0", Namespace: "shop", Node: "node-a", Addresses: []string{"127.0.73.2"},
					WaypointForGateway: &meshv1.Ref{Namespace: "shop", Name: "wp"}},
			},
			Services: map[string]*meshv1.Service{"shop/spot": {Name: "spot", Namespace: "shop", Vips: []string{"127.0.74.9"},
				Waypoint: &meshv1.Ref{Namespace: "shop", Name: "wp"}, Ports: []*meshv1.ServicePort{{Port: 80, AppProtocol: "tcp"}},
				TrafficDistribution: meshv1.TrafficDistribution_PREFER_SAME_NODE,
				Endpoints: []*meshv1.Endpoint{
					{WorkloadUid: "near", Address: near.Addr().String(), Ports: map[uint32]uint32{80: uint32(nearPort)}},
					{WorkloadUid: "far", Address: far.Addr().String(), Ports: map[uint32]uint32{80: uint32(far.Port())}},
				}}},
		}})
	}
	greetings := func() map[string]int {
		t.Helper()
		seen := map[string]int{}
		for i := range 20 {
			c, err := f.tunnel(t, frontend, "127.0.74.9:80")
			if err != nil {
				t.Fatalf("connection %d: %v", i, err)
			}
			c.SetDeadline(time.Now().Add(10 * time.Second))
			c.(interface{ CloseWrite() error }).CloseWrite()
			out, _ := io.ReadAll(c)
			c.Close()
			seen[string(out)]++
		}
		return seen
	}
	update(near.Port())
	if seen := greetings(); seen["near"] != 20 {
		t.Fatalf("PreferSameNode: connections per endpoint %v, want all 20 to the one on the waypoint's node", seen)
	}
	dead := deadPort(t)
	update(dead)
	if seen := greetings(); seen["far"] != 20 {
		t.Fatalf("PreferSameNode, the near endpoint not answering: connections per endpoint %v, want all 20 to the far one", seen)
	}
}

// deadPort is a port of 127.0.173.11 where nothing listens.
func deadPort(t *testing.T) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.173.11:0")
	if err != nil {
		t.Fatal(err)
	}
	port := netip.MustParseAddrPort(ln.Addr().String()).Port()
	ln.Close()
	return port
}
