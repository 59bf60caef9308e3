package nodeproxy

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/causeway-mesh/causeway/pkg/config"
	"github.com/causeway-mesh/causeway/pkg/locality"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// refusalRegistry translates pkg/config's refusal fixture (objects the
// translation refuses next to good ones) and indexes it for node-a.
func refusalRegistry(t *testing.T) (*config.Snapshot, *Registry) {
	t.Helper()
	objs, err := config.DecodeFile("../config/testdata/refusals.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s, err := config.Translate(objs, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var ws []*meshv1.Workload
	for _, w := range s.Workloads {
		ws = append(ws, w)
	}
	var ss []*meshv1.Service
	for _, v := range s.Services {
		ss = append(ss, v)
	}
	var wps []*meshv1.Waypoint
	for _, v := range s.Waypoints {
		wps = append(wps, v)
	}
	return s, NewRegistry("node-a", ws, ss, wps)
}

// What the translation refuses fails closed at the node proxy, and only
// that: the good Service still goes through its waypoint.
func TestTranslationRefusalsFailClosed(t *testing.T) {
	s, r := refusalRegistry(t)
	refused := map[string]bool{}
	for _, p := range s.Rejected {
		refused[p.Object] = true
	}
	for _, obj := range []string{"Namespace broken", "Service app/lost", "Pod app/impostor", "HTTPRoute app/bad"} {
		if !refused[obj] {
			t.Errorf("%s is not refused: %v", obj, s.Rejected)
		}
	}
	if len(refused) != 4 {
		t.Errorf("refused %v, want exactly the four bad objects", s.Rejected)
	}

	good, err := r.planOutbound(addr("127.0.31.1:80"), locality.Place{}, 15008, true)
	if err != nil || len(good.Hops) != 1 || good.Hops[0].Kind != ViaWaypoint || good.Hops[0].Address.String() != "127.0.30.2:15008" {
		t.Fatalf("the good Service: %+v, %v; want its waypoint", good, err)
	}
	for _, c := range []struct {
		name string
		dst  string
		why  string
	}{
		{"a Service naming no waypoint does not go direct", "127.0.31.2:80", "waypoint app/gone does not exist"},
		{"a Service inheriting a broken namespace label", "127.0.31.3:80", "namespace broken: causeway.dev/use-waypoint=missing"},
		{"a pod inheriting a broken namespace label", "127.0.30.13:8080", "namespace broken"},
		{"the impostor is no mesh destination", "127.0.30.14:8080", "not a mesh destination"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := r.planOutbound(addr(c.dst), locality.Place{}, 15008, false)
			if !errors.Is(err, errRefused) || !strings.Contains(err.Error(), c.why) {
				t.Fatalf("plan to %s: %+v, %v; want refused: %s", c.dst, p, err, c.why)
			}
		})
	}
	// Inbound to the pod whose binding is broken is refused from anyone.
	ca := trusttest.NewCA(t, "cluster.local")
	peer := ca.Peer(t, ca.Certificate(t, trusttest.Identity(t, "spiffe://cluster.local/ns/app/sa/good"), 0))
	if _, err := r.admitInbound(netip.MustParseAddr("127.0.30.13"), netip.MustParseAddrPort("127.0.30.13:8080"), peer); !errors.Is(err, errRefused) {
		t.Errorf("inbound to a refused workload: %v", err)
	}
	if _, _, err := r.planPlaintextInbound(netip.MustParseAddrPort("127.0.30.13:8080"), true); !errors.Is(err, errRefused) {
		t.Errorf("plaintext inbound to a refused workload: %v", err)
	}
	// The impostor is nobody's endpoint and its identity nobody's to grant.
	for _, ep := range s.Services["app/good"].GetEndpoints() {
		if ep.GetAddress() == "127.0.30.14" {
			t.Error("the impostor is an endpoint of app/good")
		}
	}
	if s.HasWorkload("node-a", trusttest.Identity(t, "spiffe://cluster.local/ns/app/sa/wp")) {
		t.Error("the waypoint's identity is grantable to node-a's proxy")
	}
	if s.HTTPRoutes["app/ok"] == nil || s.HTTPRoutes["app/bad"] != nil {
		t.Errorf("routes served: %v; want app/ok and not app/bad", s.HTTPRoutes)
	}
}
