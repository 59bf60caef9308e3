package nodeproxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/net/proxy"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/causeway-mesh/causeway/pkg/capture"
	"github.com/causeway-mesh/causeway/pkg/hbone"
	"github.com/causeway-mesh/causeway/pkg/internal/testnet"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/authn"
	"github.com/causeway-mesh/causeway/pkg/trust/caclient"
	"github.com/causeway-mesh/causeway/pkg/trust/caserver"
	"github.com/causeway-mesh/causeway/pkg/trust/certmanager"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// The test mesh lives on 127.0.71.0/24 (pods) and 127.0.171.0/24 (apps).
const (
	podA, podB, podC, podD, podE = "127.0.71.1", "127.0.71.2", "127.0.71.3", "127.0.71.4", "127.0.71.5"
	podWaypoint                  = "127.0.71.9"
	podOutsider                  = "127.0.71.99"
	vipSvc                       = "127.0.72.1"
	td                           = "cluster.local"
)

func app(pod string) string { return strings.Replace(pod, "127.0.71.", "127.0.171.", 1) }

func meshResources() ([]*meshv1.Workload, []*meshv1.Service, []*meshv1.Waypoint) {
	wl := func(uid, ip, node, sa string, hbone bool) *meshv1.Workload {
		return &meshv1.Workload{Uid: uid, Name: uid, Namespace: "t", ServiceAccount: sa, Identity: "spiffe://cluster.local/ns/t/sa/" + sa,
			Node: node, Addresses: []string{ip}, Hbone: hbone, AppAddress: app(ip), ServingPorts: []uint32{8080},
			WorkloadName: uid, WorkloadType: "pod", CanonicalService: uid, CanonicalRevision: "latest"}
	}
	a := wl("a", podA, "node-a", "a", true)
	b := wl("b", podB, "node-b", "b", true)
	c := wl("c", podC, "node-b", "c", true)
	d := wl("d", podD, "node-b", "d", true)
	d.Waypoint = &meshv1.Ref{Namespace: "t", Name: "wp"}
	e := wl("e", podE, "node-c", "e", true) // node-c has no proxy: unreachable
	wp := wl("wp", podWaypoint, "node-a", "waypoint", false)
	wp.WaypointForGateway = &meshv1.Ref{Namespace: "t", Name: "wp"}
	svc := &meshv1.Service{Name: "svc", Namespace: "t", Hostname: "svc.t.svc.cluster.local", Vips: []string{vipSvc},
		Ports:     []*meshv1.ServicePort{{Port: 80, TargetPort: 8080}},
		Endpoints: []*meshv1.Endpoint{{WorkloadUid: "b", Address: podB}, {WorkloadUid: "c", Address: podC}, {WorkloadUid: "e", Address: podE}}}
	wps := []*meshv1.Waypoint{{Name: "wp", Namespace: "t", Identity: "spiffe://cluster.local/ns/t/sa/waypoint", Addresses: []string{podWaypoint}, HbonePort: 15008, WaypointFor: "workload"}}
	return []*meshv1.Workload{a, b, c, d, e, wp}, []*meshv1.Service{svc}, wps
}

// startApp serves a TCP app that answers "<name>:" + everything it read,
// after the client half-closes; then it half-closes too.
func startApp(t *testing.T, addr, name string) {
	t.Helper()
	testnet.Serve(t, testnet.Listen(t, addr), func(c net.Conn) {
		data, _ := io.ReadAll(c)
		c.Write(append([]byte(name+":"), data...))
		c.(*net.TCPConn).CloseWrite()
		io.Copy(io.Discard, c)
	})
}

type testMesh struct {
	ca      *trusttest.CA
	caSrv   *trusttest.CAServer
	index   *trusttest.WorkloadIndex // what the CA knows of the nodes' workloads
	proxies map[string]*Proxy
	socks   map[string]string
	logs    map[string]*observer.ObservedLogs
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// startMesh runs a node proxy per node with a real CA (gRPC, token
// authentication, node authorization) and the resources of meshResources.
func startMesh(t testing.TB, nodes ...string) *testMesh {
	return startMeshWith(t, nil, nodes...)
}

// startMeshWith is startMesh with a change to every proxy's options.
func startMeshWith(t testing.TB, mutate func(*Options), nodes ...string) *testMesh {
	t.Helper()
	ca := trusttest.NewCA(t, td)
	ws, ss, wps := meshResources()
	index := trusttest.NewWorkloadIndex(caWorkloads(t, ws)...)
	dir := t.TempDir()
	var lines []string
	for _, n := range nodes {
		lines = append(lines, fmt.Sprintf("token-for-%s-0123456789 causeway-system/nodeproxy %s", n, n))
	}
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tf, err := authn.NewTokenFile(tokens, td, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	caSrv := ca.StartCAServer(t, caserver.Options{TrustDomain: td, Authenticator: tf, Workloads: index,
		TrustedNodeAccounts: []trust.Identity{trusttest.Identity(t, "spiffe://cluster.local/ns/causeway-system/sa/nodeproxy")}})

	ctx, cancel := context.WithCancel(context.Background())
	m := &testMesh{ca: ca, caSrv: caSrv, index: index, proxies: map[string]*Proxy{}, socks: map[string]string{}, logs: map[string]*observer.ObservedLogs{}, cancel: cancel}
	t.Cleanup(m.stop)
	for _, n := range nodes {
		client, err := caclient.New(caclient.Options{Address: caSrv.Addr, Bundle: ca.Bundle, ServerIdentity: caSrv.Identity,
			Token: caclient.StaticToken(fmt.Sprintf("token-for-%s-0123456789", n))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { client.Close() })
		certs, err := certmanager.New(certmanager.Options{Fetcher: client, InitialBackoff: 100 * time.Millisecond, MaxBackoff: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		core, logs := observer.New(zapcore.InfoLevel)
		o := Options{Node: n, Bundle: ca.Bundle, Certificates: certs, Logger: zap.New(core), AllowPlaintext: true,
			ConnectTimeout: 2 * time.Second, CertWait: 5 * time.Second}
		if mutate != nil {
			mutate(&o)
		}
		p, err := New(o)
		if err != nil {
			t.Fatal(err)
		}
		p.Update(NewRegistry(n, ws, ss, wps))
		sl, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		s5 := &capture.SOCKS5{Handler: p, Logger: zap.NewNop()}
		m.wg.Add(3)
		go func() { defer m.wg.Done(); certs.Run(ctx) }()
		go func() { defer m.wg.Done(); p.Run(ctx, 2*time.Second) }()
		go func() { defer m.wg.Done(); s5.Serve(ctx, sl) }()
		m.proxies[n], m.socks[n], m.logs[n] = p, sl.Addr().String(), logs
	}
	for _, n := range nodes {
		waitFor(t, "node proxy "+n+" ready", func() error { return m.proxies[n].Ready() })
		for _, w := range m.proxies[n].Registry().LocalWorkloads() {
			waitFor(t, "HBONE listener of "+w.GetUid(), func() error {
				c, err := net.Dial("tcp", net.JoinHostPort(w.GetAddresses()[0], "15008"))
				if err == nil {
					c.Close()
				}
				return err
			})
		}
	}
	return m
}

// caWorkloads are the CA's view of ws: the mesh workloads' identities and
// nodes, as the control plane's snapshot would say.
func caWorkloads(t testing.TB, ws []*meshv1.Workload) []trust.Workload {
	var out []trust.Workload
	for _, w := range ws {
		if w.GetHbone() {
			out = append(out, trust.Workload{Node: w.GetNode(), Identity: trusttest.Identity(t, w.GetIdentity())})
		}
	}
	return out
}

func (m *testMesh) stop() {
	m.cancel()
	m.wg.Wait()
}

func waitFor(t testing.TB, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// dial connects to dst through a node's SOCKS5 from a pod IP.
func (m *testMesh) dial(t *testing.T, node, from, dst string) (net.Conn, error) {
	t.Helper()
	d, err := proxy.SOCKS5("tcp", m.socks[node], nil, &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return d.Dial("tcp", dst)
}

// exchange dials dst through a node's SOCKS5 from a pod IP, sends msg,
// half-closes, and returns all it reads back.
func (m *testMesh) exchange(t *testing.T, node, from, dst, msg string) (string, error) {
	t.Helper()
	c, err := m.dial(t, node, from, dst)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, msg); err != nil {
		return "", err
	}
	c.(interface{ CloseWrite() error }).CloseWrite()
	out, err := io.ReadAll(c)
	return string(out), err
}

func accessLines(logs *observer.ObservedLogs, direction string) []map[string]any {
	var out []map[string]any
	for _, e := range logs.FilterMessage("connection").All() {
		f := e.ContextMap()
		if f["direction"] == direction {
			out = append(out, f)
		}
	}
	return out
}

func TestPodToPodAcrossNodes(t *testing.T) {
	startApp(t, app(podB)+":8080", "B")
	m := startMesh(t, "node-a", "node-b")
	big := strings.Repeat("x", 1<<20)
	got, err := m.exchange(t, "node-a", podA, podB+":8080", big)
	if err != nil {
		t.Fatal(err)
	}
	if got != "B:"+big {
		t.Fatalf("reply of %d bytes, want %d", len(got), len(big)+2)
	}
	idA := "spiffe://cluster.local/ns/t/sa/a"
	waitFor(t, "access logs", func() error {
		out, in := accessLines(m.logs["node-a"], "outbound"), accessLines(m.logs["node-b"], "inbound")
		if len(out) == 0 || len(in) == 0 {
			return fmt.Errorf("outbound %d, inbound %d lines", len(out), len(in))
		}
		if out[0]["src_identity"] != idA || in[0]["src_identity"] != idA || in[0]["dst_identity"] != "spiffe://cluster.local/ns/t/sa/b" {
			return fmt.Errorf("identities: outbound %v, inbound %v", out[0], in[0])
		}
		if out[0]["result"] != "ok" || in[0]["result"] != "ok" {
			return fmt.Errorf("results: %v / %v", out[0]["result"], in[0]["result"])
		}
		// The tunnel left node proxy A from pod A's IP, as from its netns.
		if src := fmt.Sprint(in[0]["src"]); !strings.HasPrefix(src, podA+":") {
			return fmt.Errorf("node proxy B saw the tunnel come from %s, want pod A's IP %s", src, podA)
		}
		return nil
	})
}

func TestServiceSpreadsAndSkipsDeadEndpoint(t *testing.T) {
	startApp(t, app(podB)+":8080", "B")
	startApp(t, app(podC)+":8080", "C")
	m := startMesh(t, "node-a", "node-b")
	seen := map[string]int{}
	for i := range 30 {
		got, err := m.exchange(t, "node-a", podA, vipSvc+":80", fmt.Sprint(i))
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		seen[strings.SplitN(got, ":", 2)[0]]++
	}
	if seen["B"] == 0 || seen["C"] == 0 || len(seen) != 2 {
		t.Fatalf("connections per endpoint = %v; want both B and C, and E (down) skipped", seen)
	}
	if dead := netip.MustParseAddrPort(podE + ":15008"); !m.proxies["node-a"].outliers.ejected(dead) {
		t.Fatalf("the dead endpoint %s is not ejected after 30 connections", dead)
	}
	// By hostname too.
	if got, err := m.exchange(t, "node-a", podA, "svc.t:80", "h"); err != nil || !strings.HasSuffix(got, ":h") {
		t.Fatalf("by hostname: %q, %v", got, err)
	}
}

func TestWaypointOnlyIngress(t *testing.T) {
	startApp(t, app(podD)+":8080", "D")
	m := startMesh(t, "node-a", "node-b")
	pool, err := hbone.NewPool(hbone.PoolOptions{Bundle: m.ca.Bundle})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	dial := func(sa string) (net.Conn, error) {
		id := trusttest.Identity(t, "spiffe://cluster.local/ns/t/sa/"+sa)
		cert := m.ca.Certificate(t, id, 0)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return pool.Dial(ctx, hbone.Target{Address: netip.MustParseAddrPort(podD + ":15008"), Authority: podD + ":8080",
			Source: id, Cert: func() (*tls.Certificate, error) { return cert, nil },
			Expected: []trust.Identity{trusttest.Identity(t, "spiffe://cluster.local/ns/t/sa/d")}})
	}
	if c, err := dial("a"); err == nil {
		c.Close()
		t.Fatal("a client reached a waypoint-bound pod directly")
	} else if !strings.Contains(err.Error(), "401") {
		t.Fatalf("direct tunnel error = %v, want a 401", err)
	}
	c, err := dial("waypoint")
	if err != nil {
		t.Fatalf("waypoint tunnel: %v", err)
	}
	io.WriteString(c, "via waypoint")
	c.(interface{ CloseWrite() error }).CloseWrite()
	out, _ := io.ReadAll(c)
	c.Close()
	if string(out) != "D:via waypoint" {
		t.Fatalf("reply %q", out)
	}
	// Outbound from a mesh pod to D goes to the waypoint, which is down:
	// the connection fails closed instead of going direct.
	if _, err := m.exchange(t, "node-a", podA, podD+":8080", "x"); err == nil {
		t.Fatal("traffic to a waypoint-bound pod bypassed its unreachable waypoint")
	}
	// The SOCKS reply goes out before the access log line is written.
	waitFor(t, "an access log line saying the connection failed closed", func() error {
		for _, l := range accessLines(m.logs["node-a"], "outbound") {
			if strings.Contains(fmt.Sprint(l["result"]), "failing closed") {
				return nil
			}
		}
		return fmt.Errorf("none yet")
	})
}

// A plaintext client outside the mesh reaches a waypoint-bound pod only
// through a TLS-only tunnel to the waypoint, which sees no identity.
func TestHairpinIsUnauthenticated(t *testing.T) {
	m := startMesh(t, "node-a", "node-b")
	// D's connection policies do not judge the hairpin: the waypoint
	// does, and they judge what the waypoint sends on.
	m.proxies["node-b"].UpdateConnectionPolicies(context.Background(),
		[]*meshv1.ConnectionPolicy{connectionPolicy(t, "deny", "package envoy.authz\n\ndefault allow := false\n", nil)})
	peers := make(chan *hbone.Request, 1)
	startWaypoint(t, m, hbone.HandlerFunc(func(ctx context.Context, r *hbone.Request) (hbone.Stream, error) {
		peers <- r
		return hbone.StreamFunc(func(ctx context.Context, tunnel net.Conn) {
			data, _ := io.ReadAll(tunnel)
			tunnel.Write(append([]byte("waypoint:"), data...))
			tunnel.(interface{ CloseWrite() error }).CloseWrite()
			io.Copy(io.Discard, tunnel)
			tunnel.Close()
		}), nil
	}))

	c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(podOutsider)}}).Dial("tcp", podD+":8080")
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(20 * time.Second))
	io.WriteString(c, "hello")
	c.(*net.TCPConn).CloseWrite()
	out, _ := io.ReadAll(c)
	c.Close()
	if string(out) != "waypoint:hello" {
		dumpLogs(t, m)
		t.Fatalf("reply %q", out)
	}
	r := <-peers
	if r.Peer.Authenticated() {
		t.Fatalf("hairpinned tunnel carries identity %v", r.Peer)
	}
	if r.Authority.String() != podD+":8080" || r.Forwarded.Addr().String() != podOutsider {
		t.Fatalf("authority %v forwarded %v", r.Authority, r.Forwarded)
	}
}

// The CA refuses an identity that has no workload on the asking node: the
// proxy reports it Unavailable and refuses that workload's traffic.
func TestCARefusesForeignIdentity(t *testing.T) {
	m := startMesh(t, "node-a")
	ws, ss, wps := meshResources()
	// node-a's registry claims pod B, but the CA knows B runs on node-b.
	for _, w := range ws {
		if w.GetUid() == "b" {
			w.Node = "node-a"
		}
	}
	p := m.proxies["node-a"]
	p.Update(NewRegistry("node-a", ws, ss, wps))
	waitFor(t, "B's certificate refused", func() error {
		for _, c := range p.opts.Certificates.Snapshot() {
			if c.Identity == "spiffe://cluster.local/ns/t/sa/b" && strings.HasPrefix(c.State, certmanager.StateUnavailable) &&
				strings.Contains(c.State, "no workload with identity spiffe://cluster.local/ns/t/sa/b on node node-a") {
				return nil
			}
		}
		return fmt.Errorf("snapshot %+v", p.opts.Certificates.Snapshot())
	})
	d, err := p.Dump()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	fmt.Fprint(&buf, d.Certificates)
	if !strings.Contains(buf.String(), "Unavailable") {
		t.Fatalf("config dump certificates: %s", buf.String())
	}
	if _, err := m.exchange(t, "node-a", podB, podA+":8080", "x"); err == nil {
		t.Fatal("traffic from a workload without a certificate was carried")
	}
	if err := p.Ready(); err == nil {
		t.Fatal("proxy ready although a local identity has no certificate")
	}
}

// With the CA gone, existing certificates keep new connections working.
func TestKeepsWorkingWithoutCA(t *testing.T) {
	startApp(t, app(podB)+":8080", "B")
	m := startMesh(t, "node-a", "node-b")
	m.caSrv.Stop()
	for i := range 3 {
		if got, err := m.exchange(t, "node-a", podA, podB+":8080", "still"); err != nil || got != "B:still" {
			t.Fatalf("connection %d with the CA down: %q, %v", i, got, err)
		}
	}
}

func TestUnknownSourceRefused(t *testing.T) {
	m := startMesh(t, "node-a")
	if _, err := m.exchange(t, "node-a", podOutsider, podA+":8080", "x"); err == nil {
		t.Fatal("a connection from a non-mesh address was carried")
	}
}

func dumpLogs(t *testing.T, m *testMesh) {
	for n, l := range m.logs {
		for _, e := range l.All() {
			t.Logf("%s: %s %v", n, e.Message, e.ContextMap())
		}
	}
}

// A relayed connection on which nothing moves is closed after the idle timeout.
func TestIdleConnectionClosed(t *testing.T) {
	startApp(t, app(podB)+":8080", "B")
	m := startMeshWith(t, func(o *Options) { o.IdleTimeout = 300 * time.Millisecond }, "node-a", "node-b")
	c, err := m.dial(t, "node-a", podA, podB+":8080")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	start := time.Now()
	if _, err := io.ReadAll(c); err != nil && time.Since(start) >= 20*time.Second {
		t.Fatal("idle connection was not closed")
	}
	// Both proxies run the same idle timeout on their side of the tunnel;
	// whichever fires first closes the connection and says so.
	waitFor(t, "idle close in the access log", func() error {
		lines := append(accessLines(m.logs["node-a"], "outbound"), accessLines(m.logs["node-b"], "inbound")...)
		for _, l := range lines {
			if strings.Contains(fmt.Sprint(l["result"]), "idle timeout") {
				return nil
			}
		}
		return fmt.Errorf("no access line with an idle timeout: %v", lines)
	})
}

// TestOutboundDrainsOnShutdown: a connection the proxy relays when it is
// told to stop keeps flowing while the proxy drains (new ones are refused
// by the closed capture listener); it is cut only at the drain deadline.
func TestOutboundDrainsOnShutdown(t *testing.T) {
	startApp(t, app(podB)+":8080", "B")
	m := startMesh(t, "node-a", "node-b")
	c, err := m.dial(t, "node-a", podA, podB+":8080")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, "before "); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // relayed before the stop
	m.cancel()                         // both proxies start draining (2 s)
	time.Sleep(300 * time.Millisecond)
	if _, err := io.WriteString(c, "after"); err != nil {
		t.Fatalf("write while draining: %v", err)
	}
	c.(interface{ CloseWrite() error }).CloseWrite()
	out, err := io.ReadAll(c)
	if err != nil || string(out) != "B:before after" {
		t.Fatalf("read while draining: %q, %v", out, err)
	}
}

// startWaypoint serves HBONE as the waypoint does, on its pod's address
// with its identity's certificate, handing tunnels to h, until the test
// ends.
func startWaypoint(t *testing.T, m *testMesh, h hbone.Handler) {
	t.Helper()
	wpCert := m.ca.Certificate(t, trusttest.Identity(t, "spiffe://cluster.local/ns/t/sa/waypoint"), 0)
	srv, err := hbone.NewServer(hbone.ServerOptions{
		TLS:     trust.ServerConfig(m.ca.Bundle, func(net.Addr) (*tls.Certificate, error) { return wpCert, nil }, trust.VerifyIfGiven),
		Handler: h,
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", podWaypoint+":15008")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

// /config_dump lists the waypoints a node proxy knows with the addresses
// it sends their traffic to (during a waypoint's rollout, which pods it
// may choose).
func TestDumpListsWaypoints(t *testing.T) {
	m := startMesh(t, "node-a")
	d, err := m.proxies["node-a"].Dump()
	if err != nil {
		t.Fatal(err)
	}
	var wp meshv1.Waypoint
	if err := protojson.Unmarshal(d.Waypoints["t/wp"], &wp); err != nil {
		t.Fatalf("waypoint t/wp in the dump %v: %v", d.Waypoints, err)
	}
	if got := strings.Join(wp.GetAddresses(), ","); got != podWaypoint || wp.GetIdentity() != "spiffe://cluster.local/ns/t/sa/waypoint" {
		t.Errorf("dumped waypoint %v, want addresses %s", &wp, podWaypoint)
	}
}

// The destination's node proxy lists an open inbound connection in its
// /config_dump (meshctl proxy-config connections) while it lasts.
func TestDumpListsOpenConnections(t *testing.T) {
	startApp(t, app(podB)+":8080", "B")
	m := startMesh(t, "node-a", "node-b")
	c, err := m.dial(t, "node-a", podA, podB+":8080")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "held"); err != nil {
		t.Fatal(err)
	}
	conns := func() ([]map[string]any, error) {
		d, err := m.proxies["node-b"].Dump()
		if err != nil {
			return nil, err
		}
		list, _ := d.Connections.([]map[string]any)
		return list, nil
	}
	waitFor(t, "node-b lists the connection", func() error {
		list, err := conns()
		if err != nil {
			return err
		}
		for _, f := range list {
			if f["dst"] == podB+":8080" && f["src_identity"] == "spiffe://cluster.local/ns/t/sa/a" {
				return nil
			}
		}
		return fmt.Errorf("connections %v", list)
	})
	c.Close()
	waitFor(t, "node-b no longer lists it", func() error {
		if list, err := conns(); err != nil || len(list) != 0 {
			return fmt.Errorf("connections %v, %v", list, err)
		}
		return nil
	})
}
