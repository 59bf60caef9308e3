package xdsserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/authn"
	"github.com/causeway-mesh/causeway/pkg/trust/caclient"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
	"github.com/causeway-mesh/causeway/pkg/xds"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

const (
	td             = "cluster.local"
	nodeProxyToken = "node-a-proxy-token-0123456789"
	waypointToken  = "a-waypoint-token-0123456789ab"
	ingressToken   = "a-edge-ingress-token-0123456789"
	// eventually waits this long: generous, the machine may be loaded.
	patience = 10 * time.Second
)

// testCP is an xDS server on 127.0.0.1 over TLS, as the control plane runs it.
type testCP struct {
	addr   string
	server *Server
	grpc   *grpc.Server
	cancel context.CancelFunc
	done   chan struct{}
	logs   *observer.ObservedLogs
}

type testEnv struct {
	ca     *trusttest.CA
	tokens string
	cpCert *tls.Certificate
}

func newEnv(t *testing.T) *testEnv {
	t.Helper()
	ca := trusttest.NewCA(t, td)
	tokens := filepath.Join(t.TempDir(), "tokens")
	content := nodeProxyToken + " causeway-system/nodeproxy node-a\n" + waypointToken + " a/waypoint\n" + ingressToken + " a/edge\n"
	if err := os.WriteFile(tokens, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	cpID, err := trust.ControlPlaneIdentity(td)
	if err != nil {
		t.Fatal(err)
	}
	return &testEnv{ca: ca, tokens: tokens, cpCert: ca.Certificate(t, cpID, 0)}
}

// startCP serves on addr ("127.0.0.1:0" for any port).
func (e *testEnv) startCP(t *testing.T, addr string) *testCP {
	t.Helper()
	return e.startCPWith(t, addr, nil)
}

// startCPWith is startCP with the server's metrics registered with reg.
func (e *testEnv) startCPWith(t *testing.T, addr string, reg prometheus.Registerer) *testCP {
	t.Helper()
	tf, err := authn.NewTokenFile(e.tokens, td, nil)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := authn.NewPeerCertificate(td)
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := NewServer(ctx, ServerOptions{Authenticator: authn.Chain{tf, pc}, TrustedNodeAccounts: []trust.Identity{
		trusttest.Identity(t, "spiffe://cluster.local/ns/causeway-system/sa/nodeproxy")}, // the node proxy token's account
		Logger: zap.New(core), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	cert := e.cpCert
	tlsConf := trust.ServerConfig(e.ca.Bundle, func(net.Addr) (*tls.Certificate, error) { return cert, nil }, trust.VerifyIfGiven)
	g := grpc.NewServer(append(GRPCServerOptions(), grpc.Creds(credentials.NewTLS(tlsConf)))...)
	srv.Register(g)
	var ln net.Listener
	for i := 0; ; i++ { // the port of a stopped server may take a moment to free
		ln, err = net.Listen("tcp", addr)
		if err == nil || i > 50 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	cp := &testCP{addr: ln.Addr().String(), server: srv, grpc: g, cancel: cancel, done: make(chan struct{}), logs: logs}
	go func() {
		defer close(cp.done)
		_ = g.Serve(ln)
	}()
	t.Cleanup(cp.stop)
	return cp
}

func (cp *testCP) stop() {
	cp.cancel() // ends the streams, so that Stop does not wait on them
	cp.grpc.Stop()
	<-cp.done
}

type testClient struct {
	*xds.Client
	logs    *observer.ObservedLogs
	changes chan []string
}

func (e *testEnv) startClient(t *testing.T, addr string, o xds.ClientOptions) *testClient {
	t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	o.Address = addr
	if o.Bundle == nil {
		o.Bundle = e.ca.Bundle
	}
	o.Logger = zap.New(core)
	if o.InitialBackoff == 0 {
		o.InitialBackoff, o.MaxBackoff = 50*time.Millisecond, 500*time.Millisecond
	}
	tc := &testClient{logs: logs, changes: make(chan []string, 100)}
	onChange := o.OnChange
	o.OnChange = func(s *xds.State, types []string) {
		if onChange != nil {
			onChange(s, types)
		}
		select {
		case tc.changes <- types:
		default:
		}
	}
	c, err := xds.NewClient(o)
	if err != nil {
		t.Fatal(err)
	}
	tc.Client = c
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("client Run: %v", err)
		}
	})
	return tc
}

func workload(ns, name, ip string) *meshv1.Workload {
	return &meshv1.Workload{
		Uid: ns + "/" + name, Name: name, Namespace: ns, ServiceAccount: "sa",
		Identity: "spiffe://cluster.local/ns/" + ns + "/sa/sa", Node: "node-a", Addresses: []string{ip}, Hbone: true,
	}
}

func service(ns, name, vip string) *meshv1.Service {
	return &meshv1.Service{Name: name, Namespace: ns, Hostname: name + "." + ns + ".svc.cluster.local", Vips: []string{vip},
		Ports: []*meshv1.ServicePort{{Name: "http", Port: 80, TargetPort: 8080, AppProtocol: "http"}}}
}

func route(ns, name string) *meshv1.HTTPRoute {
	return &meshv1.HTTPRoute{Name: name, Namespace: ns, Parents: []*meshv1.ParentRef{{Namespace: ns, Name: "s1"}}}
}

// resources builds an Update argument from messages.
func resources(msgs ...proto.Message) map[string]map[string]proto.Message {
	out := map[string]map[string]proto.Message{}
	for _, m := range msgs {
		var t string
		switch m.(type) {
		case *meshv1.Workload:
			t = meshv1.WorkloadTypeURL
		case *meshv1.Service:
			t = meshv1.ServiceTypeURL
		case *meshv1.Waypoint:
			t = meshv1.WaypointTypeURL
		case *meshv1.HTTPRoute:
			t = meshv1.HTTPRouteTypeURL
		case *meshv1.GRPCRoute:
			t = meshv1.GRPCRouteTypeURL
		case *meshv1.IngressGateway:
			t = meshv1.IngressGatewayTypeURL
		}
		if out[t] == nil {
			out[t] = map[string]proto.Message{}
		}
		out[t][meshv1.ResourceName(m)] = m
	}
	return out
}

func names[M any](m map[string]M) string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitReady(t *testing.T, c *testClient) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
}

func hasLog(logs *observer.ObservedLogs, msg string, fields map[string]string) bool {
	for _, e := range logs.FilterMessage(msg).All() {
		ok := true
		ctx := e.ContextMap()
		for k, want := range fields {
			got, _ := ctx[k].(string)
			if !strings.Contains(got, want) {
				ok = false
			}
		}
		if ok {
			return true
		}
	}
	return false
}

func TestClientsReceiveOnlyWhatTheySubscribedTo(t *testing.T) {
	env := newEnv(t)
	cp := env.startCP(t, "127.0.0.1:0")
	if err := cp.server.Update(resources(
		workload("a", "w1", "127.0.10.1"), workload("b", "w2", "127.0.10.2"),
		service("a", "s1", "127.0.20.1"), service("a", "s2", "127.0.20.2"), service("b", "s3", "127.0.20.3"),
		route("a", "r1"), route("b", "r2"),
	)); err != nil {
		t.Fatal(err)
	}
	node := env.startClient(t, cp.addr, xds.ClientOptions{
		NodeID: xds.NodeProxyID("node-a"), Token: caclient.StaticToken(nodeProxyToken),
		Subscriptions: xds.NodeProxySubscriptions(),
	})
	// Across namespaces, which only a trusted node account may read.
	wp := env.startClient(t, cp.addr, xds.ClientOptions{
		NodeID: "test~subscriptions", Token: caclient.StaticToken(nodeProxyToken),
		Subscriptions: []xds.Subscription{
			{TypeURL: meshv1.ServiceTypeURL, Names: []string{"a/*", "b/s3"}},
			{TypeURL: meshv1.HTTPRouteTypeURL, Names: []string{"a/r1", "a/later"}}, // a/later does not exist yet
		},
	})
	nsWaypoint := env.startClient(t, cp.addr, xds.ClientOptions{
		NodeID: xds.WaypointID("a", "wp"), Token: caclient.StaticToken(waypointToken), Subscriptions: xds.WaypointSubscriptions("a", "wp"),
	})
	waitReady(t, node)
	waitReady(t, wp) // complete although a/later does not exist: the server says so
	waitReady(t, nsWaypoint)
	if s := nsWaypoint.State(); names(s.Workloads)+" | "+names(s.Services)+" | "+names(s.HTTPRoutes) != "a/w1 | a/s1,a/s2 | a/r1" {
		t.Errorf("namespace waypoint holds %s | %s | %s", names(s.Workloads), names(s.Services), names(s.HTTPRoutes))
	}

	ns, ws := node.State(), wp.State()
	if got := names(ns.Workloads) + " | " + names(ns.Services) + " | " + names(ns.HTTPRoutes); got != "a/w1,b/w2 | a/s1,a/s2,b/s3 | " {
		t.Errorf("node proxy holds %s", got)
	}
	if got := names(ws.Workloads) + " | " + names(ws.Services) + " | " + names(ws.HTTPRoutes); got != " | a/s1,a/s2,b/s3 | a/r1" {
		t.Errorf("waypoint holds %s", got)
	}

	// Changes reach exactly the clients that subscribed to them.
	changedS2 := service("a", "s2", "127.0.20.22")
	if err := cp.server.Update(resources(
		workload("a", "w1", "127.0.10.1"), workload("b", "w2", "127.0.10.2"),
		changedS2, service("b", "s3", "127.0.20.3"), service("a", "s4", "127.0.20.4"), service("b", "s5", "127.0.20.5"),
		route("a", "r1"), route("b", "r2"), route("a", "later"),
	)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "waypoint sees a/s4, a/later and loses a/s1", func() bool {
		s := wp.State()
		return names(s.Services) == "a/s2,a/s4,b/s3" && names(s.HTTPRoutes) == "a/later,a/r1"
	})
	if !proto.Equal(wp.State().Services["a/s2"], changedS2) {
		t.Errorf("waypoint has stale a/s2: %v", wp.State().Services["a/s2"])
	}
	eventually(t, "node proxy sees every service", func() bool {
		return names(node.State().Services) == "a/s2,a/s4,b/s3,b/s5"
	})
	if n := names(node.State().HTTPRoutes); n != "" {
		t.Errorf("node proxy received routes it did not ask for: %s", n)
	}

	// Subscriptions change while connected.
	if err := wp.Subscribe(meshv1.WorkloadTypeURL, "b/w2"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "waypoint receives a newly subscribed workload", func() bool { return names(wp.State().Workloads) == "b/w2" })
	if err := wp.Unsubscribe(meshv1.ServiceTypeURL, "a/*"); err != nil {
		t.Fatal(err)
	}
	if got := names(wp.State().Services); got != "b/s3" {
		t.Errorf("after unsubscribing a/*, waypoint holds services %s", got)
	}
	select {
	case <-node.changes:
	case <-time.After(patience):
		t.Error("node proxy's OnChange was never called")
	}
	if list := node.State().List(); len(list) != 6 || list[0].Version == "" {
		t.Errorf("State.List = %v", list)
	}
}

func TestNACKIsLoggedAndBlocksNoOne(t *testing.T) {
	env := newEnv(t)
	cp := env.startCP(t, "127.0.0.1:0")
	good := workload("a", "w1", "127.0.10.1")
	if err := cp.server.Update(resources(good, service("a", "s1", "127.0.20.1"))); err != nil {
		t.Fatal(err)
	}
	wl := env.startClient(t, cp.addr, xds.ClientOptions{NodeID: xds.NodeProxyID("node-a"), Token: caclient.StaticToken(nodeProxyToken),
		Subscriptions: []xds.Subscription{{TypeURL: meshv1.WorkloadTypeURL}}})
	sv := env.startClient(t, cp.addr, xds.ClientOptions{NodeID: xds.WaypointID("a", "wp"), Token: caclient.StaticToken(waypointToken),
		Subscriptions: []xds.Subscription{{TypeURL: meshv1.ServiceTypeURL, Names: []string{"a/*"}}}})
	waitReady(t, wl)
	waitReady(t, sv)

	bad := workload("a", "w2", "127.0.10.2")
	bad.Identity = "spiffe://cluster.local/not-a-workload"
	if err := cp.server.Update(resources(good, bad, service("a", "s1", "127.0.20.1"), service("a", "s2", "127.0.20.2"))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the server logs the NACK with node id and reason", func() bool {
		return hasLog(cp.logs, "xDS client rejected an update (NACK)", map[string]string{
			"node_id": "nodeproxy~node-a", "type": "workload", "error_detail": "not-a-workload",
		})
	})
	eventually(t, "the other client still gets its update", func() bool { return names(sv.State().Services) == "a/s1,a/s2" })
	if got := names(wl.State().Workloads); got != "a/w1" {
		t.Errorf("after a NACK the client holds %s, want its previous state a/w1", got)
	}
	if !hasLog(wl.logs, "rejecting xDS update (NACK); keeping the previous state", map[string]string{"reason": "a/w2"}) {
		t.Error("client did not log its NACK")
	}
	// The next good update is taken.
	if err := cp.server.Update(resources(good, workload("a", "w2", "127.0.10.2"), service("a", "s1", "127.0.20.1"))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the NACKing client recovers with the next good update", func() bool { return names(wl.State().Workloads) == "a/w1,a/w2" })
}

func TestCallersMustAuthenticate(t *testing.T) {
	env := newEnv(t)
	cp := env.startCP(t, "127.0.0.1:0")
	if err := cp.server.Update(resources(workload("a", "w1", "127.0.10.1"))); err != nil {
		t.Fatal(err)
	}
	subs := []xds.Subscription{{TypeURL: meshv1.WorkloadTypeURL}}
	wrong := env.startClient(t, cp.addr, xds.ClientOptions{Token: caclient.StaticToken("wrong-token-0123456789abcdef"), Subscriptions: subs})
	none := env.startClient(t, cp.addr, xds.ClientOptions{Subscriptions: subs})
	eventually(t, "both refusals are logged by the server", func() bool {
		return len(cp.logs.FilterMessage("xDS stream refused").All()) >= 2
	})
	for name, c := range map[string]*testClient{"wrong token": wrong, "no credentials": none} {
		if c.Ready() || len(c.State().Workloads) != 0 {
			t.Errorf("%s: client got data", name)
		}
		eventually(t, name+": client sees Unauthenticated", func() bool {
			for _, e := range c.logs.FilterMessage("xDS stream ended; keeping the last state and reconnecting").All() {
				if err, ok := e.ContextMap()["error"].(string); ok && strings.Contains(err, "Unauthenticated") {
					return true
				}
			}
			return false
		})
	}
	// A mesh client certificate is a credential too.
	cert := env.ca.Certificate(t, trusttest.Identity(t, "spiffe://cluster.local/ns/a/sa/waypoint"), 0)
	withCert := env.startClient(t, cp.addr, xds.ClientOptions{
		ClientCertificate: func() (*tls.Certificate, error) { return cert, nil },
		Subscriptions:     []xds.Subscription{{TypeURL: meshv1.WorkloadTypeURL, Names: []string{"a/*"}}},
	})
	waitReady(t, withCert)
}

func TestClientVerifiesControlPlaneIdentity(t *testing.T) {
	env := newEnv(t)
	cp := env.startCP(t, "127.0.0.1:0")
	if err := cp.server.Update(resources(workload("a", "w1", "127.0.10.1"))); err != nil {
		t.Fatal(err)
	}
	c := env.startClient(t, cp.addr, xds.ClientOptions{
		Token:          caclient.StaticToken(nodeProxyToken),
		ServerIdentity: trusttest.Identity(t, "spiffe://cluster.local/ns/causeway-system/sa/impostor"),
		Subscriptions:  []xds.Subscription{{TypeURL: meshv1.WorkloadTypeURL}},
	})
	eventually(t, "client refuses the server's identity", func() bool {
		for _, e := range c.logs.FilterMessage("xDS stream ended; keeping the last state and reconnecting").All() {
			if err, ok := e.ContextMap()["error"].(string); ok && strings.Contains(err, "does not match expected") {
				return true
			}
		}
		return false
	})
	if c.Ready() {
		t.Error("client trusted a control plane with the wrong identity")
	}
	// Another CA's roots: the chain does not verify.
	other := trusttest.NewCA(t, td)
	c2 := env.startClient(t, cp.addr, xds.ClientOptions{
		Bundle: other.Bundle, Token: caclient.StaticToken(nodeProxyToken),
		Subscriptions: []xds.Subscription{{TypeURL: meshv1.WorkloadTypeURL}},
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := c2.WaitReady(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("client with foreign roots: WaitReady = %v", err)
	}
}

func TestRestartKeepsStateAndConverges(t *testing.T) {
	env := newEnv(t)
	cp := env.startCP(t, "127.0.0.1:0")
	addr := cp.addr
	w1, w2 := workload("a", "w1", "127.0.10.1"), workload("a", "w2", "127.0.10.2")
	if err := cp.server.Update(resources(w1, w2)); err != nil {
		t.Fatal(err)
	}
	c := env.startClient(t, addr, xds.ClientOptions{NodeID: xds.NodeProxyID("node-a"), Token: caclient.StaticToken(nodeProxyToken),
		Subscriptions: []xds.Subscription{{TypeURL: meshv1.WorkloadTypeURL}}})
	waitReady(t, c)
	eventually(t, "connected", c.Connected)

	cp.stop()
	eventually(t, "client notices the control plane is gone", func() bool { return !c.Connected() })
	time.Sleep(300 * time.Millisecond) // a few reconnection attempts fail meanwhile
	if !c.Ready() || names(c.State().Workloads) != "a/w1,a/w2" {
		t.Fatalf("while the control plane is down the client must keep its state; ready=%v holds %s", c.Ready(), names(c.State().Workloads))
	}

	// A new control plane that has no configuration yet must not wipe clients.
	cp2 := env.startCP(t, addr)
	eventually(t, "client reconnects", func() bool { return len(cp2.server.Clients()) == 1 })
	time.Sleep(200 * time.Millisecond)
	if got := names(c.State().Workloads); got != "a/w1,a/w2" {
		t.Fatalf("a control plane without configuration changed the client's state to %s", got)
	}
	w2b := workload("a", "w2", "127.0.10.22")
	if err := cp2.server.Update(resources(w2b, workload("a", "w3", "127.0.10.3"))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "client converges on the new configuration", func() bool {
		s := c.State()
		return names(s.Workloads) == "a/w2,a/w3" && proto.Equal(s.Workloads["a/w2"], w2b)
	})
	if c2 := cp2.server.Clients(); c2[0].NodeID != "nodeproxy~node-a" || !strings.Contains(c2[0].Caller, "node-a") {
		t.Errorf("server's client info = %+v", c2)
	}
}

func TestServerAnswersNothingBeforeFirstUpdate(t *testing.T) {
	env := newEnv(t)
	cp := env.startCP(t, "127.0.0.1:0")
	c := env.startClient(t, cp.addr, xds.ClientOptions{Token: caclient.StaticToken(nodeProxyToken),
		Subscriptions: []xds.Subscription{{TypeURL: meshv1.WorkloadTypeURL}}})
	eventually(t, "client connects", func() bool { return len(cp.server.Clients()) == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if err := c.WaitReady(ctx); err == nil {
		t.Fatal("client ready before the server had any configuration")
	}
	if err := cp.server.Update(nil); err != nil { // an empty, but real, configuration
		t.Fatal(err)
	}
	waitReady(t, c)
}

func TestClientOptionsChecked(t *testing.T) {
	ca := trusttest.NewCA(t, td)
	for name, o := range map[string]xds.ClientOptions{
		"no address":       {Bundle: ca.Bundle, Subscriptions: []xds.Subscription{{TypeURL: meshv1.WorkloadTypeURL}}},
		"no bundle":        {Address: "127.0.0.1:1", Subscriptions: []xds.Subscription{{TypeURL: meshv1.WorkloadTypeURL}}},
		"no subscriptions": {Address: "127.0.0.1:1", Bundle: ca.Bundle},
		"unknown type":     {Address: "127.0.0.1:1", Bundle: ca.Bundle, Subscriptions: []xds.Subscription{{TypeURL: "type.googleapis.com/x.Y"}}},
		"twice":            {Address: "127.0.0.1:1", Bundle: ca.Bundle, Subscriptions: []xds.Subscription{{TypeURL: meshv1.WorkloadTypeURL}, {TypeURL: meshv1.WorkloadTypeURL}}},
	} {
		if _, err := xds.NewClient(o); err == nil {
			t.Errorf("%s: xds.NewClient accepted bad options", name)
		}
	}
}

// Only trusted node accounts read beyond their own namespace, and a node id
// must agree with the caller's credential.
func TestSubscriptionsAreAuthorized(t *testing.T) {
	env := newEnv(t)
	cp := env.startCP(t, "127.0.0.1:0")
	if err := cp.server.Update(resources(workload("a", "w1", "127.0.10.1"), workload("b", "w2", "127.0.10.2"),
		service("b", "s1", "127.0.20.1"))); err != nil {
		t.Fatal(err)
	}
	wpToken := caclient.StaticToken(waypointToken) // account a/waypoint
	refused := map[string]*testClient{
		"another namespace": env.startClient(t, cp.addr, xds.ClientOptions{NodeID: xds.WaypointID("a", "wp"), Token: wpToken,
			Subscriptions: []xds.Subscription{{TypeURL: meshv1.ServiceTypeURL, Names: []string{"b/*"}}}}),
		"everything": env.startClient(t, cp.addr, xds.ClientOptions{NodeID: xds.WaypointID("a", "wp"), Token: wpToken,
			Subscriptions: []xds.Subscription{{TypeURL: meshv1.WorkloadTypeURL}}}),
		"a waypoint of another namespace": env.startClient(t, cp.addr, xds.ClientOptions{NodeID: xds.WaypointID("b", "wp"), Token: wpToken,
			Subscriptions: []xds.Subscription{{TypeURL: meshv1.WorkloadTypeURL, Names: []string{"a/*"}}}}),
		"another node": env.startClient(t, cp.addr, xds.ClientOptions{NodeID: xds.NodeProxyID("node-b"), Token: caclient.StaticToken(nodeProxyToken),
			Subscriptions: xds.NodeProxySubscriptions()}),
	}
	allowed := env.startClient(t, cp.addr, xds.ClientOptions{NodeID: xds.WaypointID("a", "wp"), Token: wpToken,
		Subscriptions: []xds.Subscription{{TypeURL: meshv1.WorkloadTypeURL, Names: []string{"a/*", "a/w9"}}}})
	waitReady(t, allowed)
	if got := names(allowed.State().Workloads); got != "a/w1" {
		t.Errorf("own namespace: %s", got)
	}
	for name, c := range refused {
		eventually(t, name+": the client sees PermissionDenied", func() bool {
			for _, e := range c.logs.FilterMessage("xDS stream ended; keeping the last state and reconnecting").All() {
				if err, ok := e.ContextMap()["error"].(string); ok && strings.Contains(err, "PermissionDenied") {
					return true
				}
			}
			return false
		})
		if c.Ready() || len(c.State().Workloads)+len(c.State().Services) != 0 {
			t.Errorf("%s: the client got data", name)
		}
	}
	for _, want := range []string{`not "b/*"`, `not "*"`, "names a waypoint outside the caller's namespace a", "names node node-b, but the credential is for node node-a"} {
		eventually(t, "the server logs "+want, func() bool {
			for _, e := range cp.logs.FilterMessage("xDS request refused").All() {
				if strings.Contains(fmt.Sprint(e.ContextMap()["error"]), want) {
					return true
				}
			}
			return false
		})
	}
}

// routeTo is a route of namespace ns whose one rule sends to Service
// backendNS/backend (invalid: the configuration source found no
// ReferenceGrant for it) and mirrors to mirrorNS/mirror when given.
func routeTo(ns, name, backendNS, backend, invalid string, mirror ...string) *meshv1.HTTPRoute {
	r := route(ns, name)
	rule := &meshv1.HTTPRouteRule{Backends: []*meshv1.HTTPBackendRef{{Weight: 1,
		Backend: &meshv1.BackendRef{Namespace: backendNS, Name: backend, Port: 80, InvalidReason: invalid}}}}
	if len(mirror) == 2 {
		rule.Filters = []*meshv1.HTTPRouteFilter{{Filter: &meshv1.HTTPRouteFilter_RequestMirror{RequestMirror: &meshv1.RequestMirror{
			Backend: &meshv1.BackendRef{Namespace: mirror[0], Name: mirror[1], Port: 80}}}}}
	}
	r.Rules = []*meshv1.HTTPRouteRule{rule}
	return r
}

// startWaypoint runs the client of waypoint a/wp as cmd/waypoint does: its
// subscriptions, and the backends its routes name in other namespaces.
func (e *testEnv) startWaypoint(t *testing.T, addr string) *testClient {
	t.Helper()
	var follow atomic.Pointer[xds.RouteBackends]
	wp := e.startClient(t, addr, xds.ClientOptions{NodeID: xds.WaypointID("a", "wp"), Token: caclient.StaticToken(waypointToken),
		Subscriptions: xds.WaypointSubscriptions("a", "wp"),
		OnChange: func(s *xds.State, _ []string) {
			if f := follow.Load(); f != nil {
				if err := f.Update(s); err != nil {
					t.Error(err)
				}
			}
		}})
	follow.Store(xds.NewRouteBackends(wp.Client, "a"))
	waitReady(t, wp)
	if err := follow.Load().Update(wp.State()); err != nil {
		t.Fatal(err)
	}
	return wp
}

// A waypoint reads a Service of another namespace (and the workloads behind
// it) exactly while a route of its namespace sends traffic there, also
// across a control plane restart; nothing else of that namespace.
func TestWaypointReadsTheBackendsItsRoutesUse(t *testing.T) {
	env := newEnv(t)
	cp := env.startCP(t, "127.0.0.1:0")
	remote := service("b", "s1", "127.0.20.1")
	remote.Endpoints = []*meshv1.Endpoint{{WorkloadUid: "b/w1", Address: "127.0.10.1", Ports: map[uint32]uint32{80: 8080}}}
	mirrored := service("c", "m", "127.0.20.9")
	base := []proto.Message{remote, mirrored, service("b", "s2", "127.0.20.2"), service("b", "private", "127.0.20.3"),
		workload("b", "w1", "127.0.10.1"), workload("b", "w2", "127.0.10.2"), service("a", "front", "127.0.20.5")}
	withRoutes := func(routes ...proto.Message) map[string]map[string]proto.Message {
		return resources(append(append([]proto.Message{}, base...), routes...)...)
	}
	if err := cp.server.Update(withRoutes(routeTo("a", "r1", "b", "s1", "", "c", "m"),
		routeTo("a", "r2", "b", "private", "reference from HTTPRoute in namespace a to Service b/private is not permitted by a ReferenceGrant"))); err != nil {
		t.Fatal(err)
	}
	wp := env.startWaypoint(t, cp.addr)
	eventually(t, "the waypoint holds b/s1, its workload and the mirror c/m", func() bool {
		s := wp.State()
		return names(s.Services) == "a/front,b/s1,c/m" && names(s.Workloads) == "b/w1"
	})
	// Naming what no route uses gets nothing (and does not end the stream).
	if err := wp.Subscribe(meshv1.ServiceTypeURL, "b/s2", "b/private"); err != nil {
		t.Fatal(err)
	}
	if err := cp.server.Update(withRoutes(routeTo("a", "r1", "b", "s1", "", "c", "m"), route("a", "r3"))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the new route a/r3 arrives", func() bool { return wp.State().HTTPRoutes["a/r3"] != nil })
	if got := names(wp.State().Services); got != "a/front,b/s1,c/m" {
		t.Errorf("after asking for b/s2 and b/private the waypoint holds %s", got)
	}

	// A restarted control plane serves the same to the reconnecting client.
	addr := cp.addr
	cp.stop()
	cp = env.startCP(t, addr)
	if err := cp.server.Update(withRoutes(routeTo("a", "r1", "b", "s1", "", "c", "m"))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "after the restart a/r3 is gone and b/s1 still held", func() bool {
		s := wp.State()
		return s.HTTPRoutes["a/r3"] == nil && names(s.Services) == "a/front,b/s1,c/m" && names(s.Workloads) == "b/w1"
	})
	// The route stops using b: the waypoint loses b's service and workload.
	if err := cp.server.Update(withRoutes(routeTo("a", "r1", "a", "front", ""))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b/s1, b/w1 and c/m are dropped", func() bool {
		s := wp.State()
		return names(s.Services) == "a/front" && names(s.Workloads) == ""
	})
}

// A consumer route (GEP-1294) lives in the caller's namespace but is served
// by the waypoint of its parent Service's namespace: that waypoint receives
// it with its namespace's routes, and may read the route's backends in the
// consumer's namespace. Routes of other namespaces attached elsewhere stay
// out of its view.
func TestWaypointReceivesConsumerRoutes(t *testing.T) {
	env := newEnv(t)
	cp := env.startCP(t, "127.0.0.1:0")
	consumer := routeTo("c", "to-a", "c", "local", "")
	consumer.Parents = []*meshv1.ParentRef{{Namespace: "a", Name: "front"}}
	elsewhere := routeTo("c", "to-b", "c", "local", "")
	elsewhere.Parents = []*meshv1.ParentRef{{Namespace: "b", Name: "s1"}}
	local := service("c", "local", "127.0.20.7")
	local.Endpoints = []*meshv1.Endpoint{{WorkloadUid: "c/w", Address: "127.0.10.7"}}
	if err := cp.server.Update(resources(service("a", "front", "127.0.20.5"), service("b", "s1", "127.0.20.1"), local, workload("c", "w", "127.0.10.7"),
		route("a", "own"), consumer, elsewhere)); err != nil {
		t.Fatal(err)
	}
	wp := env.startWaypoint(t, cp.addr)
	eventually(t, "the waypoint of a holds its route, the consumer route c/to-a and its backend c/local", func() bool {
		s := wp.State()
		return names(s.HTTPRoutes) == "a/own,c/to-a" && names(s.Services) == "a/front,c/local" && names(s.Workloads) == "c/w"
	})
	// The consumer route moves to b: a's waypoint loses it and its backend.
	// (A new message: one given to Update is never modified.)
	consumer = proto.Clone(consumer).(*meshv1.HTTPRoute)
	consumer.Parents = []*meshv1.ParentRef{{Namespace: "b", Name: "s1"}}
	if err := cp.server.Update(resources(service("a", "front", "127.0.20.5"), service("b", "s1", "127.0.20.1"), local, workload("c", "w", "127.0.10.7"),
		route("a", "own"), consumer, elsewhere)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "c/to-a and c/local are dropped", func() bool {
		s := wp.State()
		return names(s.HTTPRoutes) == "a/own" && names(s.Services) == "a/front" && names(s.Workloads) == ""
	})
}

// Node proxies (wildcard streams, whose version maps the cache updates in
// place) and a waypoint keep receiving changes while they acknowledge
// and subscribe and unsubscribe names over the wildcard, which the delta
// server writes into the same maps; under -race this holds the cache and
// go-control-plane's server to never touching a map at once (deltaCache),
// and every client ends holding exactly what is served.
func TestConcurrentChangesWhileClientsResubscribe(t *testing.T) {
	env := newEnv(t)
	cp := env.startCP(t, "127.0.0.1:0")
	msgs := map[string]*meshv1.Workload{}
	put := func(i, rev int) {
		w := workload([]string{"a", "b"}[i%2], fmt.Sprintf("w%d", i), fmt.Sprintf("127.0.10.%d", i+1))
		w.Labels = map[string]string{"rev": fmt.Sprint(rev)}
		msgs[w.Uid] = w
	}
	update := func() {
		res := map[string]map[string]proto.Message{meshv1.WorkloadTypeURL: {}}
		for uid, w := range msgs {
			res[meshv1.WorkloadTypeURL][uid] = w
		}
		if err := cp.server.Update(res); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 40 {
		put(i, 0)
	}
	update()
	var nodes []*testClient
	for i := range 4 {
		nodes = append(nodes, env.startClient(t, cp.addr, xds.ClientOptions{
			NodeID: xds.NodeProxyID("node-a"), Token: caclient.StaticToken(nodeProxyToken), Subscriptions: xds.NodeProxySubscriptions(),
		}))
		waitReady(t, nodes[i])
	}
	wp := env.startClient(t, cp.addr, xds.ClientOptions{
		NodeID: xds.WaypointID("a", "wp"), Token: caclient.StaticToken(waypointToken), Subscriptions: xds.WaypointSubscriptions("a", "wp"),
	})
	waitReady(t, wp)

	stop := make(chan struct{})
	done := make(chan struct{})
	for i, n := range nodes {
		go func() {
			defer func() { done <- struct{}{} }()
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				name := fmt.Sprintf("a/w%d", 2*((i+k)%20))
				if err := n.Subscribe(meshv1.WorkloadTypeURL, name); err != nil {
					t.Error(err)
				}
				if err := n.Unsubscribe(meshv1.WorkloadTypeURL, name); err != nil {
					t.Error(err)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	for rev := 1; rev <= 200; rev++ {
		put(rev%45, rev) // changes, and adds 5 workloads
		if rev%7 == 0 {
			delete(msgs, fmt.Sprintf("b/w%d", rev%40|1))
		}
		update()
		time.Sleep(time.Millisecond)
	}
	close(stop)
	for range nodes {
		<-done
	}
	update()
	holds := func(s *xds.State, ns string) bool {
		n := 0
		for uid, w := range msgs {
			if ns != "" && w.Namespace != ns {
				continue
			}
			n++
			if !proto.Equal(s.Workloads[uid], w) {
				return false
			}
		}
		return len(s.Workloads) == n
	}
	for i, n := range nodes {
		eventually(t, fmt.Sprintf("node proxy %d holds every workload as served", i), func() bool { return holds(n.State(), "") })
	}
	eventually(t, "the waypoint holds namespace a's workloads as served", func() bool { return holds(wp.State(), "a") })
}

// OnChange sees the state Synced once every subscription's first sync is
// in it, and never before: a node proxy serves pods only from such a
// state (a Service not yet known would be refused). The types the server
// holds nothing of (waypoints here) complete the sync without a change.
func TestOnChangeSeesTheFirstSyncWhole(t *testing.T) {
	env := newEnv(t)
	cp := env.startCP(t, "127.0.0.1:0")
	if err := cp.server.Update(resources(
		workload("a", "w1", "127.0.10.1"), workload("b", "w2", "127.0.10.2"),
		service("a", "s1", "127.0.20.1"), service("b", "s3", "127.0.20.3"),
	)); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var calls []string
	node := env.startClient(t, cp.addr, xds.ClientOptions{
		NodeID: xds.NodeProxyID("node-a"), Token: caclient.StaticToken(nodeProxyToken),
		Subscriptions: xds.NodeProxySubscriptions(),
		OnChange: func(s *xds.State, _ []string) {
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, fmt.Sprintf("%t %s | %s", s.Synced(), names(s.Workloads), names(s.Services)))
		},
	})
	waitReady(t, node)
	if !node.State().Synced() {
		t.Error("the state is not Synced once the client is Ready")
	}
	eventually(t, "OnChange with the state Synced", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(calls) > 0 && strings.HasPrefix(calls[len(calls)-1], "true ")
	})
	mu.Lock()
	defer mu.Unlock()
	for i, c := range calls {
		synced, rest, _ := strings.Cut(c, " ")
		if synced == "true" && rest != "a/w1,b/w2 | a/s1,b/s3" {
			t.Errorf("OnChange call %d: Synced with %s", i, rest)
		}
		if synced == "false" && i > 0 && strings.HasPrefix(calls[i-1], "true ") {
			t.Errorf("OnChange call %d: no longer Synced after call %d was", i, i-1)
		}
	}
}
