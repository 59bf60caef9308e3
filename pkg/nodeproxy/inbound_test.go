package nodeproxy

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
)

func TestAdmitInbound(t *testing.T) {
	r := testRegistry()
	ca := trusttest.NewCA(t, "cluster.local")
	peer := func(id string) trust.Peer {
		return ca.Peer(t, ca.Certificate(t, trusttest.Identity(t, id), 0))
	}
	frontend := peer("spiffe://cluster.local/ns/web/sa/frontend")
	waypoint := peer("spiffe://cluster.local/ns/shop/sa/waypoint")
	ip := netip.MustParseAddr
	ap := netip.MustParseAddrPort

	for _, tc := range []struct {
		name      string
		local     string
		authority string
		peer      trust.Peer
		wantErr   string
		viaWP     bool
	}{
		// waypoint-for workload|all: the pod itself is bound, pod-IP traffic included.
		{"waypoint-bound pod refuses a client", "127.0.10.13", "127.0.10.13:8080", frontend, "only accepts traffic through its waypoint", false},
		{"waypoint-bound pod admits its waypoint", "127.0.10.13", "127.0.10.13:8080", waypoint, "", true},
		// waypoint-for service: only service traffic is bound; a client
		// addressing the pod IP is admitted directly (MeshFrontend, "to the pod IP").
		{"endpoint of a waypoint-bound service admits a client", "127.0.10.11", "127.0.10.11:8080", frontend, "", false},
		{"endpoint of a waypoint-bound service knows its waypoint", "127.0.10.11", "127.0.10.11:8080", waypoint, "", true},
		{"unbound pod admits a mesh client", "127.0.10.1", "127.0.10.1:8080", frontend, "", false},
		{"unauthenticated peer", "127.0.10.1", "127.0.10.1:8080", ca.Peer(t, nil), "unauthenticated", false},
		{"authority names another pod", "127.0.10.1", "127.0.10.11:8080", frontend, "not the pod", false},
		{"pod on another node", "127.0.10.12", "127.0.10.12:8080", waypoint, "not a mesh pod on node node-a", false},
		{"mesh port", "127.0.10.1", "127.0.10.1:15008", frontend, "mesh port", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := r.admitInbound(ip(tc.local), ap(tc.authority), tc.peer)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if a.FromWaypoint != tc.viaWP {
				t.Fatalf("FromWaypoint = %v, want %v", a.FromWaypoint, tc.viaWP)
			}
		})
	}
}

func TestPlanPlaintextInbound(t *testing.T) {
	r := testRegistry()
	_, hop, err := r.planPlaintextInbound(netip.MustParseAddrPort("127.0.10.11:8080"), false)
	if err != nil || hop == nil || hop.Kind != ViaWaypoint || hop.Authority.String() != "127.0.10.11:8080" {
		t.Fatalf("waypoint-bound pod: hop %+v, err %v; want a hairpin through the waypoint", hop, err)
	}
	if _, hop, err := r.planPlaintextInbound(netip.MustParseAddrPort("127.0.10.1:8080"), true); err != nil || hop != nil {
		t.Fatalf("unbound pod with plaintext allowed: hop %+v, err %v; want direct delivery", hop, err)
	}
	if _, _, err := r.planPlaintextInbound(netip.MustParseAddrPort("127.0.10.1:8080"), false); err == nil {
		t.Fatal("plaintext delivered although denied")
	}
}
