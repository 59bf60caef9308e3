package l7

import (
	"context"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// An ingress gateway's Config: a bound Service's targets are its
// waypoint's pods, addressed with the Service VIP:port; an endpoint whose
// workload is bound goes through that workload's waypoint; an unknown
// waypoint leaves no target (503, never a way around it); listeners of a
// port are chosen by host as listener isolation says.
func TestCompileGateway(t *testing.T) {
	wp := &meshv1.Waypoint{Namespace: "shop", Name: "wp", Identity: "spiffe://cluster.local/ns/shop/sa/wp",
		Addresses: []string{"10.0.0.9", "10.0.0.8"}, HbonePort: 15008, WaypointFor: meshv1.WaypointForAll}
	bound := &meshv1.Service{Namespace: "shop", Name: "bound", Vips: []string{"10.96.0.1"}, Waypoint: &meshv1.Ref{Namespace: "shop", Name: "wp"},
		Ports:     []*meshv1.ServicePort{{Port: 80, TargetPort: 8080, AppProtocol: "http"}},
		Endpoints: []*meshv1.Endpoint{{WorkloadUid: "w1", Address: "10.1.0.1"}}}
	lost := &meshv1.Service{Namespace: "shop", Name: "lost", Vips: []string{"10.96.0.2"}, Waypoint: &meshv1.Ref{Namespace: "shop", Name: "gone"},
		Ports: []*meshv1.ServicePort{{Port: 80, TargetPort: 8080}}, Endpoints: []*meshv1.Endpoint{{WorkloadUid: "w1", Address: "10.1.0.1"}}}
	mixed := &meshv1.Service{Namespace: "shop", Name: "mixed", Vips: []string{"10.96.0.3"},
		Ports:     []*meshv1.ServicePort{{Port: 80, TargetPort: 8080}},
		Endpoints: []*meshv1.Endpoint{{WorkloadUid: "w1", Address: "10.1.0.1"}, {WorkloadUid: "w2", Address: "10.1.0.2"}}}
	workloads := []*meshv1.Workload{
		{Uid: "w1", Namespace: "shop", Name: "p1", Identity: "spiffe://cluster.local/ns/shop/sa/app", Addresses: []string{"10.1.0.1"}, Hbone: true},
		{Uid: "w2", Namespace: "shop", Name: "p2", Identity: "spiffe://cluster.local/ns/shop/sa/app", Addresses: []string{"10.1.0.2"}, Hbone: true,
			Waypoint: &meshv1.Ref{Namespace: "shop", Name: "wp"}},
	}
	listeners := []*meshv1.IngressListener{
		{Name: "any", Port: 443, Protocol: meshv1.IngressListener_HTTPS},
		{Name: "wild", Port: 443, Protocol: meshv1.IngressListener_HTTPS, Hostname: "*.example.com"},
		{Name: "shop", Port: 443, Protocol: meshv1.IngressListener_HTTPS, Hostname: "shop.example.com"},
		{Name: "plain", Port: 80},
	}
	c := CompileGateway(listeners, []*meshv1.Service{bound, lost, mixed}, workloads, []*meshv1.Waypoint{wp})

	via := func(ref ServiceRef) []string {
		var out []string
		for _, tg := range c.services[ref].targets[80] {
			out = append(out, tg.Address.String()+" via "+tg.Via.String()+" as "+tg.Identity.String())
		}
		return out
	}
	wpID := " as spiffe://cluster.local/ns/shop/sa/wp"
	for ref, want := range map[ServiceRef][]string{
		{"shop", "bound"}: {"10.96.0.1:80 via 10.0.0.8:15008" + wpID, "10.96.0.1:80 via 10.0.0.9:15008" + wpID},
		{"shop", "lost"}:  nil,
		{"shop", "mixed"}: {"10.1.0.1:8080 via invalid AddrPort as spiffe://cluster.local/ns/shop/sa/app",
			"10.1.0.2:8080 via 10.0.0.8:15008" + wpID, "10.1.0.2:8080 via 10.0.0.9:15008" + wpID},
	} {
		if got := via(ref); len(got) != len(want) || len(got) > 0 && (got[0] != want[0] || got[len(got)-1] != want[len(want)-1]) {
			t.Errorf("%s targets\n got %q\nwant %q", ref, got, want)
		}
	}
	for _, tc := range []struct {
		port uint32
		host string
		want string
	}{
		{443, "shop.example.com", "shop"},
		{443, "api.example.com", "wild"},
		{443, "example.org", "any"},
		{80, "shop.example.com", "plain"},
		{8080, "shop.example.com", ""},
	} {
		got := ""
		if l, ok := c.listenerFor(tc.port, tc.host); ok {
			got = l.name
		}
		if got != tc.want {
			t.Errorf("port %d host %s: listener %q, want %q", tc.port, tc.host, got, tc.want)
		}
	}
}

// At an ingress gateway a backend port without an appProtocol is spoken to
// in HTTP/1.1 whatever the client spoke to the gateway (a TLS client
// negotiates HTTP/2 there, which the backend may not speak), gRPC in
// HTTP/2, its only protocol.
func TestIngressBackendProtocol(t *testing.T) {
	h := newHarness(t)
	h.backend("web", "", false) // HTTP/1.1 only
	h.addService("health", "", grpcBackend(t, healthpb.HealthCheckResponse_SERVING))
	var svcs []*meshv1.Service
	for _, s := range h.services {
		svcs = append(svcs, s)
	}
	h.engine.Update(CompileGateway([]*meshv1.IngressListener{
		{Name: "http", Port: 80, HttpRoutes: []*meshv1.HTTPRoute{{Namespace: testNS, Name: "web", Rules: []*meshv1.HTTPRouteRule{to("web")}}}},
		{Name: "grpc", Port: 81, GrpcRoutes: []*meshv1.GRPCRoute{{Namespace: testNS, Name: "health", Rules: []*meshv1.GRPCRouteRule{grpcTo("health")}}}},
	}, svcs, h.works, nil))
	front := func(port uint32) string {
		return h.front(ConnInfo{Peer: trust.Unauthenticated(), Source: callerAddr, Destination: netip.AddrPortFrom(netip.MustParseAddr("127.0.20.1"), uint16(port)),
			Port: port, Protocol: ProtocolHTTP, Ingress: true})
	}
	addr := front(80)
	for name, c := range map[string]*http.Client{"HTTP/1.1": h1Client(addr), "HTTP/2": h2cClient(addr)} {
		if res := get(t, c, "/", nil); res.status != 200 || res.echo.Proto != "HTTP/1.1" {
			t.Errorf("%s client: %d, backend got %q: want 200 in HTTP/1.1", name, res.status, res.echo.Proto)
		}
	}
	conn, err := grpc.NewClient("passthrough:///"+front(81), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "svc"}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("gRPC Check: %v %v", resp, err)
	}
}
