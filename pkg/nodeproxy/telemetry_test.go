package nodeproxy

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/causeway-mesh/causeway/pkg/hbone"
	"github.com/causeway-mesh/causeway/pkg/internal/metricstest"
	"github.com/causeway-mesh/causeway/pkg/internal/testnet"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
)

// side is the standard labels of one side ("source" or "destination") for
// a workload of meshResources, or of nothing known ("" uid).
func side(prefix, uid string) map[string]string {
	v := map[string]string{"workload": "unknown", "workload_namespace": "unknown", "principal": "unknown", "app": "unknown",
		"version": "unknown", "canonical_service": "unknown", "canonical_revision": "unknown", "cluster": "unknown"}
	if uid != "" {
		v = map[string]string{"workload": uid, "workload_namespace": "t", "principal": "spiffe://cluster.local/ns/t/sa/" + uid, "app": uid,
			"version": "latest", "canonical_service": uid, "canonical_revision": "latest", "cluster": "Kubernetes"}
	}
	out := map[string]string{}
	for k, val := range v {
		out[prefix+"_"+k] = val
	}
	return out
}

// tcpLabels is a connection's full label set.
func tcpLabels(reporter, src, dst, service, security string) string {
	l := map[string]string{"reporter": reporter, "request_protocol": "tcp", "response_flags": "-", "connection_security_policy": security,
		"destination_service": "unknown", "destination_service_name": "unknown", "destination_service_namespace": "unknown"}
	if service != "" {
		l["destination_service"], l["destination_service_name"], l["destination_service_namespace"] = service+".t.svc.cluster.local", service, "t"
	}
	maps.Copy(l, side("source", src))
	maps.Copy(l, side("destination", dst))
	return metricstest.Labels(l)
}

// The node proxies' standard metrics on real tunnels: each side reports
// the connection, the caller named by what authenticated it. A tunnel
// whose identity is not that of the pod at its source address, and a
// hairpinned plaintext connection (a TLS-only tunnel), name no caller.
func TestStandardTCPMetrics(t *testing.T) {
	regs := map[string]*prometheus.Registry{"node-a": prometheus.NewRegistry(), "node-b": prometheus.NewRegistry()}
	m := startMeshWith(t, func(o *Options) { o.Registry = regs[o.Node] }, "node-a", "node-b")
	startApp(t, app(podB)+":8080", "B")
	startWaypoint(t, m, hbone.HandlerFunc(func(ctx context.Context, r *hbone.Request) (hbone.Stream, error) {
		return hbone.StreamFunc(func(_ context.Context, tunnel net.Conn) {
			data, _ := io.ReadAll(tunnel)
			tunnel.Write(data)
		}), nil
	}))

	// a -> b, pod to pod: "hello" (5 bytes) out, "B:hello" (7) back.
	if got, err := m.exchange(t, "node-a", podA, podB+":8080", "hello"); err != nil || got != "B:hello" {
		t.Fatalf("a -> b: %q %v", got, err)
	}
	// a's identity from e's address, straight to b's node proxy.
	m.helloAsA(t, podE, "")
	// Plaintext from outside the mesh to d, hairpinned through the
	// waypoint over a TLS-only tunnel.
	pc, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(podOutsider)}}).Dial("tcp", podD+":8080")
	if err != nil {
		t.Fatal(err)
	}
	pc.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(pc, "plain")
	pc.(*net.TCPConn).CloseWrite()
	if out, _ := io.ReadAll(pc); string(out) != "plain" {
		t.Fatalf("hairpin: %q", out)
	}
	pc.Close()

	want := map[string]map[string]map[string]float64{
		"node-a": {
			"istio_tcp_connections_opened_total": {tcpLabels("source", "a", "b", "", "mutual_tls"): 1},
			"istio_tcp_connections_closed_total": {tcpLabels("source", "a", "b", "", "mutual_tls"): 1},
			"istio_tcp_received_bytes_total":     {tcpLabels("source", "a", "b", "", "mutual_tls"): 5},
			"istio_tcp_sent_bytes_total":         {tcpLabels("source", "a", "b", "", "mutual_tls"): 7},
		},
		"node-b": {
			"istio_tcp_connections_opened_total": {
				tcpLabels("destination", "a", "b", "svc", "mutual_tls"): 1, // b serves svc's port 8080
				tcpLabels("destination", "", "b", "svc", "mutual_tls"):  1, // a's identity from e's address
				tcpLabels("destination", "", "d", "", "none"):           1, // the hairpin
			},
			"istio_tcp_received_bytes_total": {
				tcpLabels("destination", "a", "b", "svc", "mutual_tls"): 5,
				tcpLabels("destination", "", "b", "svc", "mutual_tls"):  2,
				tcpLabels("destination", "", "d", "", "none"):           5,
			},
		},
	}
	waitFor(t, "the standard metrics", func() error {
		for node, metrics := range want {
			for name, series := range metrics {
				if got := metricstest.All(t, regs[node], name); !maps.Equal(got, series) {
					return fmt.Errorf("%s %s:\n got %v\nwant %v", node, name, got, series)
				}
			}
		}
		return nil
	})
}

// A node proxy names its caller in the baggage of the CONNECTs it opens
// (ztunnel's keys); the destination's node proxy believes a baggage only
// for a caller its index does not hold, within the namespace of the
// tunnel's identity.
func TestConnectBaggage(t *testing.T) {
	regs := map[string]*prometheus.Registry{"node-a": prometheus.NewRegistry(), "node-b": prometheus.NewRegistry()}
	m := startMeshWith(t, func(o *Options) { o.Registry = regs[o.Node] }, "node-a", "node-b")
	startApp(t, app(podB)+":8080", "B")
	seen := make(chan string, 1)
	startWaypoint(t, m, hbone.HandlerFunc(func(ctx context.Context, r *hbone.Request) (hbone.Stream, error) {
		seen <- r.Baggage
		return hbone.StreamFunc(func(_ context.Context, tunnel net.Conn) { io.Copy(tunnel, tunnel) }), nil
	}))

	// a -> d, through d's waypoint: the CONNECT names a.
	if got, err := m.exchange(t, "node-a", podA, podD+":8080", "hi"); err != nil || got != "hi" {
		t.Fatalf("a -> d: %q %v", got, err)
	}
	const aBaggage = "k8s.cluster.name=Kubernetes,k8s.namespace.name=t,k8s.pod.name=a,service.name=a,service.version=latest"
	if got := <-seen; got != aBaggage {
		t.Errorf("the waypoint got baggage %q, want %q", got, aBaggage)
	}

	// a's identity from an address node-b's index does not hold, naming
	// a; then naming a workload of another namespace.
	m.helloAsA(t, "127.0.71.50", aBaggage)
	m.helloAsA(t, "127.0.71.50", strings.Replace(aBaggage, "=t,", "=other,", 1))
	principalOnly := side("source", "")
	principalOnly["source_principal"], principalOnly["source_workload_namespace"] = "spiffe://cluster.local/ns/t/sa/a", "t"
	l := map[string]string{"reporter": "destination", "request_protocol": "tcp", "response_flags": "-", "connection_security_policy": "mutual_tls",
		"destination_service": "svc.t.svc.cluster.local", "destination_service_name": "svc", "destination_service_namespace": "t"}
	maps.Copy(l, side("destination", "b"))
	maps.Copy(l, principalOnly)
	want := map[string]float64{tcpLabels("destination", "a", "b", "svc", "mutual_tls"): 1, metricstest.Labels(l): 1}
	waitFor(t, "node-b's opened connections", func() error {
		if got := metricstest.All(t, regs["node-b"], "istio_tcp_connections_opened_total"); !maps.Equal(got, want) {
			return fmt.Errorf("\n got %v\nwant %v", got, want)
		}
		return nil
	})
	if got := metricstest.ByLabel(t, regs["node-b"], "hbone_baggage_ignored_total", "reason"); !maps.Equal(got, map[string]float64{"namespace_mismatch": 1}) {
		t.Errorf("hbone_baggage_ignored_total: %v", got)
	}
}

// The standard byte counters show an open connection's bytes as they
// flow, on both sides, and count them once after it closes.
func TestStandardBytesOfOpenConnections(t *testing.T) {
	regs := map[string]*prometheus.Registry{"node-a": prometheus.NewRegistry(), "node-b": prometheus.NewRegistry()}
	m := startMeshWith(t, func(o *Options) { o.Registry = regs[o.Node] }, "node-a", "node-b")
	// c's app echoes as it reads.
	testnet.Serve(t, testnet.Listen(t, app(podC)+":8080"), func(c net.Conn) { io.Copy(c, c) })
	c, err := m.dial(t, "node-a", podA, podC+":8080")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	msg := strings.Repeat("x", 1000)
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, len(msg))); err != nil {
		t.Fatal(err)
	}
	bytesOf := func(node, reporter string) (float64, float64) {
		l := map[string]string{"reporter": reporter, "destination_workload": "c"}
		received, _ := metricstest.Value(t, regs[node], "istio_tcp_received_bytes_total", l)
		sent, _ := metricstest.Value(t, regs[node], "istio_tcp_sent_bytes_total", l)
		return received, sent
	}
	expect := func(what string, want float64) {
		t.Helper()
		waitFor(t, what, func() error {
			for node, reporter := range map[string]string{"node-a": "source", "node-b": "destination"} {
				if received, sent := bytesOf(node, reporter); received != want || sent != want {
					return fmt.Errorf("%s (%s): received %v, sent %v, want %v each", node, reporter, received, sent, want)
				}
			}
			return nil
		})
	}
	expect("the open connection's bytes", 1000)
	if got := metricstest.ByLabel(t, regs["node-a"], "istio_tcp_connections_closed_total", "reporter"); len(got) != 0 {
		t.Fatalf("closed connections %v: the connection was to stay open", got)
	}
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, len(msg))); err != nil {
		t.Fatal(err)
	}
	expect("more bytes of the open connection", 2000)
	c.Close()
	waitFor(t, "the connection closed on both sides", func() error {
		for node, reporter := range map[string]string{"node-a": "source", "node-b": "destination"} {
			if got := metricstest.ByLabel(t, regs[node], "istio_tcp_connections_closed_total", "reporter"); got[reporter] != 1 {
				return fmt.Errorf("%s: closed %v", node, got)
			}
		}
		return nil
	})
	expect("the closed connection's bytes, once", 2000)
}

// helloAsA sends "hi" to b's app straight to b's node proxy, under a's
// identity, from the address from, with baggage on the CONNECT, and
// expects b's answer.
func (m *testMesh) helloAsA(t *testing.T, from, baggage string) {
	t.Helper()
	cert := m.ca.Certificate(t, trusttest.Identity(t, "spiffe://cluster.local/ns/t/sa/a"), 0)
	pool, err := hbone.NewPool(hbone.PoolOptions{Bundle: m.ca.Bundle})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pool.Dial(ctx, hbone.Target{Address: netip.MustParseAddrPort(podB + ":15008"), Authority: podB + ":8080",
		Source: trusttest.Identity(t, "spiffe://cluster.local/ns/t/sa/a"), Cert: func() (*tls.Certificate, error) { return cert, nil },
		Expected: []trust.Identity{trusttest.Identity(t, "spiffe://cluster.local/ns/t/sa/b")}, LocalAddr: netip.MustParseAddr(from),
		Baggage: baggage})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "hi")
	c.(interface{ CloseWrite() error }).CloseWrite()
	if out, _ := io.ReadAll(c); string(out) != "B:hi" {
		t.Fatalf("a's identity from %s: %q", from, out)
	}
}
