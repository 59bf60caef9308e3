package xdsserver

import (
	"bytes"
	"sync/atomic"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/pkg/trust/caclient"
	"github.com/causeway-mesh/causeway/pkg/xds"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// secretKey stands for a listener's private key: it must reach the
// gateway's identity and no one else.
var secretKey = []byte("-----BEGIN EC PRIVATE KEY-----\nnot-a-real-key\n-----END EC PRIVATE KEY-----\n")

// edge is ingress gateway a/edge, with an HTTPS listener whose route
// sends to Service b/s1.
func edge() *meshv1.IngressGateway {
	return &meshv1.IngressGateway{Namespace: "a", Name: "edge", Identity: "spiffe://cluster.local/ns/a/sa/edge",
		Listeners: []*meshv1.IngressListener{{Name: "https", Port: 443, Protocol: meshv1.IngressListener_HTTPS,
			Certificates: []*meshv1.TLSKeyPair{{Secret: "a/cert", CertificateChain: []byte("chain"), PrivateKey: secretKey}},
			HttpRoutes:   []*meshv1.HTTPRoute{routeTo("b", "r", "b", "s1", "")}}}}
}

// An IngressGateway goes to the gateway's own identity alone: not to the
// trusted node proxies, not to another account of its namespace. The
// gateway reads the Services its routes reach in other namespaces, their
// workloads and the waypoints they are bound to.
func TestIngressGatewayIsReadByItsIdentityAlone(t *testing.T) {
	env := newEnv(t)
	cp := env.startCP(t, "127.0.0.1:0")
	bound := service("b", "s1", "127.0.20.1")
	bound.Waypoint = &meshv1.Ref{Namespace: "b", Name: "wp"}
	bound.Endpoints = []*meshv1.Endpoint{{WorkloadUid: "b/w1", Address: "127.0.10.1", Ports: map[uint32]uint32{80: 8080}}}
	wp := &meshv1.Waypoint{Namespace: "b", Name: "wp", Identity: "spiffe://cluster.local/ns/b/sa/wp", Addresses: []string{"127.0.30.1"},
		HbonePort: 15008, WaypointFor: meshv1.WaypointForService}
	if err := cp.server.Update(resources(edge(), bound, wp, workload("b", "w1", "127.0.10.1"), service("b", "s2", "127.0.20.2"),
		&meshv1.Waypoint{Namespace: "b", Name: "other", Identity: "spiffe://cluster.local/ns/b/sa/other", HbonePort: 15008, WaypointFor: meshv1.WaypointForService})); err != nil {
		t.Fatal(err)
	}
	var follow atomic.Pointer[xds.RouteBackends]
	gw := env.startClient(t, cp.addr, xds.ClientOptions{NodeID: xds.IngressID("a", "edge"), Token: caclient.StaticToken(ingressToken),
		Subscriptions: xds.IngressSubscriptions("a", "edge"),
		OnChange: func(s *xds.State, _ []string) {
			if f := follow.Load(); f != nil {
				if err := f.Update(s); err != nil {
					t.Error(err)
				}
			}
		}})
	follow.Store(xds.NewIngressBackends(gw.Client, "a", "edge"))
	waitReady(t, gw)
	if err := follow.Load().Update(gw.State()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the gateway holds its IngressGateway, b/s1, its workload and waypoint b/wp", func() bool {
		s := gw.State()
		return names(s.IngressGateways) == "a/edge" && names(s.Services) == "b/s1" && names(s.Workloads) == "b/w1" && names(s.Waypoints) == "b/wp"
	})
	if got := gw.State().IngressGateways["a/edge"].GetListeners()[0].GetCertificates()[0].GetPrivateKey(); !bytes.Equal(got, secretKey) {
		t.Errorf("the gateway got key %q", got)
	}

	node := env.startClient(t, cp.addr, xds.ClientOptions{NodeID: xds.NodeProxyID("node-a"), Token: caclient.StaticToken(nodeProxyToken),
		Subscriptions: append(xds.NodeProxySubscriptions(), xds.Subscription{TypeURL: meshv1.IngressGatewayTypeURL})})
	neighbour := env.startClient(t, cp.addr, xds.ClientOptions{NodeID: xds.WaypointID("a", "waypoint"), Token: caclient.StaticToken(waypointToken),
		Subscriptions: []xds.Subscription{{TypeURL: meshv1.IngressGatewayTypeURL, Names: []string{"a/*", "a/edge"}}}})
	waitReady(t, node)
	waitReady(t, neighbour)
	// A change after both synced must not reach them either.
	changed := edge()
	changed.Listeners[0].Port = 8443
	if err := cp.server.Update(resources(changed, bound, wp, workload("b", "w1", "127.0.10.1"))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the gateway sees its listener move", func() bool {
		return gw.State().IngressGateways["a/edge"].GetListeners()[0].GetPort() == 8443
	})
	time.Sleep(200 * time.Millisecond) // what was wrongly sent would have arrived by now
	for name, c := range map[string]*testClient{"the node proxy": node, "another account of namespace a": neighbour} {
		if n := len(c.State().IngressGateways); n != 0 {
			t.Errorf("%s holds %d ingress gateways", name, n)
		}
	}
	if s := node.State(); names(s.Services) != "b/s1" || names(s.Waypoints) != "b/wp" {
		t.Errorf("the node proxy still reads the rest: services %s, waypoints %s", names(s.Services), names(s.Waypoints))
	}
}
