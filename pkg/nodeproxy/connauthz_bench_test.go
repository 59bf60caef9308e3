package nodeproxy

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// benchPolicy reads the caller's principal and address, so connections
// from different sockets never share a cached decision.
func benchPolicy(revision int) string {
	return fmt.Sprintf(`package envoy.authz

import rego.v1

# revision %d
default allow := false

allow if {
	startswith(input.attributes.source.principal, "spiffe://cluster.local/ns/t/sa/")
	not input.attributes.source.address.socketAddress.address in {"10.9.9.9"}
	input.attributes.destination.address.socketAddress.portValue == 9000
}
`, revision)
}

// BenchmarkConnectionPolicyCost opens connections from A to B through
// real node proxies (HBONE over mTLS, one pooled TLS connection, a TCP
// echo behind B), without and with a connection policy at B's node
// proxy, in alternating rounds; it reports both per-connection times and
// their ratio.
func BenchmarkConnectionPolicyCost(b *testing.B) {
	startEcho(b, app(podB)+":9000")
	m := startMesh(b, "node-a", "node-b")
	nb := m.proxies["node-b"]
	pool := newPool(b, m)
	policy := connectionPolicy(b, "bench", benchPolicy(0), nil)
	open := func() {
		c, err := tunnel(b, m, pool, "a", podB+":9000")
		if err != nil {
			b.Fatal(err)
		}
		if err := echoes(c, "x"); err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
	const rounds = 10
	perRound := max(b.N/(2*rounds), 1)
	var none, with time.Duration
	b.ResetTimer()
	for range rounds {
		nb.UpdateConnectionPolicies(context.Background(), nil)
		start := time.Now()
		for range perRound {
			open()
		}
		none += time.Since(start)
		nb.UpdateConnectionPolicies(context.Background(), []*meshv1.ConnectionPolicy{policy})
		start = time.Now()
		for range perRound {
			open()
		}
		with += time.Since(start)
	}
	n := float64(rounds * perRound)
	b.ReportMetric(float64(none.Nanoseconds())/n, "ns/conn_nopolicy")
	b.ReportMetric(float64(with.Nanoseconds())/n, "ns/conn_policy")
	b.ReportMetric(float64(with)/float64(none), "policy_vs_none_ratio")
}

// BenchmarkRecheck10000 measures how long re-checking 10,000 open
// connections takes after a policy change (a new revision, so nothing is
// cached): every connection has its own source address and is evaluated.
func BenchmarkRecheck10000(b *testing.B) {
	ca := trusttest.NewCA(b, td)
	ws, ss, wps := meshResources()
	p, err := New(Options{Node: "node-b", Bundle: ca.Bundle, Certificates: noCertificates{}})
	if err != nil {
		b.Fatal(err)
	}
	p.reg.Store(NewRegistry("node-b", ws, ss, wps))
	ctx := context.Background()
	peers := make([]trust.Peer, 16)
	for i := range peers {
		peers[i] = ca.Peer(b, ca.Certificate(b, trusttest.Identity(b, fmt.Sprintf("spiffe://cluster.local/ns/t/sa/c%d", i)), 0))
	}
	p.UpdateConnectionPolicies(ctx, []*meshv1.ConnectionPolicy{connectionPolicy(b, "bench", benchPolicy(0), nil)})
	const conns = 10000
	for i := range conns {
		c := &inboundConn{local: netip.MustParseAddr(podB), authority: netip.MustParseAddrPort(podB + ":9000"), peer: peers[i%len(peers)],
			remote: netip.AddrPortFrom(netip.MustParseAddr("127.0.71.1"), uint16(1024+i))}
		if _, v, err := p.admit(ctx, c, false); err != nil || !v.Allowed {
			b.Fatalf("connection %d not admitted: %v %v", i, err, v.Reason)
		}
		_, untrack := p.track(ctx, c, func() {})
		b.Cleanup(untrack)
	}
	revisions := make([]*meshv1.ConnectionPolicy, b.N)
	for i := range revisions {
		revisions[i] = connectionPolicy(b, "bench", benchPolicy(i+1), nil)
	}
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		p.policies.Update(ctx, []*meshv1.ConnectionPolicy{revisions[i]}) // compiled off the clock
		b.StartTimer()
		if checked, closed := p.RecheckConnections(ctx); checked != conns || closed != 0 {
			b.Fatalf("checked %d, closed %d", checked, closed)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e6, "ms/recheck_10000")
}

// noCertificates serves a proxy that never presents a certificate.
type noCertificates struct{ Certificates }

func (noCertificates) Prefetch(trust.Identity) {}
func (noCertificates) Forget(trust.Identity)   {}
