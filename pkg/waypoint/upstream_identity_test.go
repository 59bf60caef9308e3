package waypoint

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/pkg/hbone"
	"github.com/causeway-mesh/causeway/pkg/internal/testnet"
	"github.com/causeway-mesh/causeway/pkg/l7"
	"github.com/causeway-mesh/causeway/pkg/telemetry"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
	"github.com/causeway-mesh/causeway/pkg/xds"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// nodeProxy stands in for the node proxy of an endpoint: HBONE on ln under
// a certificate for whatever identity presents names, every tunnel joined
// to backend. tunnels counts the CONNECTs that reached it, baggage holds
// the last one's baggage.
type nodeProxy struct {
	presents atomic.Pointer[tls.Certificate]
	tunnels  atomic.Int32
	baggage  atomic.Pointer[string]
}

func startNodeProxy(t *testing.T, ca *trusttest.CA, ln net.Listener, backend netip.AddrPort) *nodeProxy {
	t.Helper()
	np := &nodeProxy{}
	srv, err := hbone.NewServer(hbone.ServerOptions{
		TLS: trust.ServerConfig(ca.Bundle, func(net.Addr) (*tls.Certificate, error) { return np.presents.Load(), nil }, trust.VerifyIfGiven),
		Handler: hbone.HandlerFunc(func(ctx context.Context, req *hbone.Request) (hbone.Stream, error) {
			np.tunnels.Add(1)
			np.baggage.Store(&req.Baggage)
			up, err := net.Dial("tcp", backend.String())
			if err != nil {
				return nil, hbone.Unavailable(err.Error())
			}
			return hbone.StreamFunc(func(ctx context.Context, tunnel net.Conn) { hbone.JoinIdle(ctx, tunnel, up, 0) }), nil
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return np
}

func (np *nodeProxy) present(t *testing.T, ca *trusttest.CA, id string) {
	np.presents.Store(ca.Certificate(t, trusttest.Identity(t, id), 0))
}

// The waypoint dials each endpoint expecting exactly that endpoint's
// workload identity, on every path: the HTTP connection pool, a TCP port,
// and failover to another endpoint after a failed connect. A node proxy
// presenting the waypoint's own identity, or another endpoint's, gets no
// tunnel.
func TestUpstreamIdentityIsTheEndpointDialled(t *testing.T) {
	const (
		podUp, podDown = "127.0.173.3", "127.0.173.4" // podDown: nothing listens
		wpID           = "spiffe://cluster.local/ns/shop/sa/wp"
		upID, downID   = "spiffe://cluster.local/ns/shop/sa/up", "spiffe://cluster.local/ns/shop/sa/down"
	)
	ln := testnet.Listen(t, podUp+":0")
	hbonePort := netip.MustParseAddrPort(ln.Addr().String()).Port()
	f := start(t, func(o *Options) { o.HBONEPort = hbonePort })
	httpBackend := serveHTTP(t, "127.0.173.1:0", nil, nil)
	tcpBackend := serveTCP(t, "127.0.173.1:0")
	httpNP := startNodeProxy(t, f.ca, ln, httpBackend)
	tcpLn := testnet.Listen(t, "127.0.173.5:"+fmt.Sprint(hbonePort))
	tcpNP := startNodeProxy(t, f.ca, tcpLn, tcpBackend)

	wp := &meshv1.Ref{Namespace: "shop", Name: "wp"}
	wl := func(name, ip, id string) *meshv1.Workload {
		return &meshv1.Workload{Uid: "shop/" + name, Name: name, Namespace: "shop", Identity: id, Addresses: []string{ip}, Hbone: true}
	}
	svc := func(name, vip, proto string, eps ...string) *meshv1.Service {
		s := &meshv1.Service{Name: name, Namespace: "shop", Vips: []string{vip}, Waypoint: wp, Ports: []*meshv1.ServicePort{{Port: 80, TargetPort: 8080, AppProtocol: proto}}}
		for _, uid := range eps {
			s.Endpoints = append(s.Endpoints, &meshv1.Endpoint{WorkloadUid: "shop/" + uid, Address: map[string]string{"up": podUp, "down": podDown, "tcp": "127.0.173.5"}[uid]})
		}
		return s
	}
	f.w.Update(&xds.State{Set: meshv1.Set{
		Workloads: map[string]*meshv1.Workload{"shop/up": wl("up", podUp, upID), "shop/down": wl("down", podDown, downID), "shop/tcp": wl("tcp", "127.0.173.5", upID)},
		Services: map[string]*meshv1.Service{
			"shop/web":  svc("web", "127.0.74.1", "http", "up"),
			"shop/db":   svc("db", "127.0.74.2", "tcp", "tcp"),
			"shop/pair": svc("pair", "127.0.74.4", "http", "down", "up"),
			"shop/pdb":  svc("pdb", "127.0.74.5", "tcp", "down", "tcp"),
		},
	}})
	httpGet := func(vip string) int {
		t.Helper()
		c, err := f.tunnel(t, frontend, vip+":80")
		if err != nil {
			t.Fatal(err)
		}
		code, _ := get(t, c, "")
		return code
	}
	tcpGreeting := func(vip string) (string, error) {
		t.Helper()
		c, err := f.tunnel(t, frontend, vip+":80")
		if err != nil {
			return "", err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		c.(interface{ CloseWrite() error }).CloseWrite()
		out, err := io.ReadAll(c)
		return string(out), err
	}

	// Wrong identities first: a connection that verified would be pooled.
	// Failover picks at random, so each failover case is tried often
	// enough to take both orders.
	for _, id := range []string{wpID, downID} {
		httpNP.present(t, f.ca, id)
		tcpNP.present(t, f.ca, id)
		if code := httpGet("127.0.74.1"); code != 503 {
			t.Errorf("HTTP pool: node proxy presenting %s: %d, want 503", id, code)
		}
		if out, err := tcpGreeting("127.0.74.2"); err == nil || !strings.Contains(err.Error(), "503") {
			t.Errorf("TCP port: node proxy presenting %s: %q %v, want a 503", id, out, err)
		}
		for range 8 {
			if code := httpGet("127.0.74.4"); code != 503 {
				t.Errorf("HTTP failover: node proxy of the live endpoint presenting %s: %d, want 503", id, code)
			}
			if out, err := tcpGreeting("127.0.74.5"); err == nil {
				t.Errorf("TCP failover: node proxy of the live endpoint presenting %s: %q", id, out)
			}
		}
	}
	if n := httpNP.tunnels.Load() + tcpNP.tunnels.Load(); n != 0 {
		t.Fatalf("%d tunnels reached node proxies presenting the wrong identity", n)
	}

	httpNP.present(t, f.ca, upID)
	tcpNP.present(t, f.ca, upID)
	if code := httpGet("127.0.74.1"); code != 200 {
		t.Errorf("HTTP pool, right identity: %d", code)
	}
	if out, err := tcpGreeting("127.0.74.2"); out != "tcp backend\n" {
		t.Errorf("TCP port, right identity: %q %v", out, err)
	}
	for range 8 {
		if code := httpGet("127.0.74.4"); code != 200 {
			t.Errorf("HTTP failover, right identity: %d", code)
		}
		if out, err := tcpGreeting("127.0.74.5"); out != "tcp backend\n" {
			t.Errorf("TCP failover, right identity: %q %v", out, err)
		}
	}
}

// The waypoint's tunnels to endpoints carry its own pod's names, on the
// HTTP and the TCP path alike: it re-tunnels under its own identity, and
// cannot vouch for its caller's.
func TestUpstreamBaggageNamesTheWaypoint(t *testing.T) {
	const podUp, upID = "127.0.173.3", "spiffe://cluster.local/ns/shop/sa/up"
	ln := testnet.Listen(t, podUp+":0")
	hbonePort := netip.MustParseAddrPort(ln.Addr().String()).Port()
	f := start(t, func(o *Options) { o.HBONEPort, o.L7.Pod = hbonePort, l7.PodRef{Namespace: "shop", Name: "wp-5f9-abc"} })
	httpNP := startNodeProxy(t, f.ca, ln, serveHTTP(t, "127.0.173.1:0", nil, nil))
	tcpNP := startNodeProxy(t, f.ca, testnet.Listen(t, "127.0.173.5:"+fmt.Sprint(hbonePort)), serveTCP(t, "127.0.173.1:0"))
	httpNP.present(t, f.ca, upID)
	tcpNP.present(t, f.ca, upID)
	self := &meshv1.Workload{Uid: "shop/wp-5f9-abc", Name: "wp-5f9-abc", Namespace: "shop", Identity: "spiffe://cluster.local/ns/shop/sa/wp",
		Addresses: []string{"127.0.73.2"}, WorkloadName: "wp", WorkloadType: "deployment", CanonicalService: "wp", CanonicalRevision: "latest",
		WaypointForGateway: &meshv1.Ref{Namespace: "shop", Name: "wp"}}
	wp := &meshv1.Ref{Namespace: "shop", Name: "wp"}
	ep := func(ip string) []*meshv1.Endpoint {
		return []*meshv1.Endpoint{{WorkloadUid: "shop/" + ip, Address: ip}}
	}
	f.w.Update(&xds.State{Set: meshv1.Set{
		Workloads: map[string]*meshv1.Workload{self.Uid: self,
			"shop/" + podUp:    {Uid: "shop/" + podUp, Name: "up", Namespace: "shop", Identity: upID, Addresses: []string{podUp}, Hbone: true},
			"shop/127.0.173.5": {Uid: "shop/127.0.173.5", Name: "tcp", Namespace: "shop", Identity: upID, Addresses: []string{"127.0.173.5"}, Hbone: true}},
		Services: map[string]*meshv1.Service{
			"shop/web": {Name: "web", Namespace: "shop", Vips: []string{"127.0.74.1"}, Waypoint: wp,
				Ports: []*meshv1.ServicePort{{Port: 80, TargetPort: 8080, AppProtocol: "http"}}, Endpoints: ep(podUp)},
			"shop/db": {Name: "db", Namespace: "shop", Vips: []string{"127.0.74.2"}, Waypoint: wp,
				Ports: []*meshv1.ServicePort{{Port: 80, TargetPort: 8080, AppProtocol: "tcp"}}, Endpoints: ep("127.0.173.5")},
		},
	}})
	callerBaggage := telemetry.Baggage(&meshv1.Workload{Namespace: "web", WorkloadName: "frontend", WorkloadType: "deployment"})
	if code, body := get(t, f.tunnelWithBaggage(t, "127.0.178.1", frontend, "127.0.74.1:80", callerBaggage), ""); code != 200 {
		t.Fatalf("HTTP: %d %s", code, body)
	}
	c := f.tunnelWithBaggage(t, "127.0.178.1", frontend, "127.0.74.2:80", callerBaggage)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	c.(interface{ CloseWrite() error }).CloseWrite()
	if out, err := io.ReadAll(c); string(out) != "tcp backend\n" {
		t.Fatalf("TCP: %q %v", out, err)
	}
	c.Close()
	want := "k8s.cluster.name=Kubernetes,k8s.namespace.name=shop,k8s.deployment.name=wp,service.name=wp,service.version=latest"
	for name, np := range map[string]*nodeProxy{"HTTP": httpNP, "TCP": tcpNP} {
		got := "(no tunnel)"
		if b := np.baggage.Load(); b != nil {
			got = *b
		}
		if got != want {
			t.Errorf("%s: the endpoint's node proxy got baggage %q, want %q", name, got, want)
		}
	}
}
