package nodeproxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/causeway-mesh/causeway/pkg/connpolicy/connpolicytest"
	"github.com/causeway-mesh/causeway/pkg/hbone"
	"github.com/causeway-mesh/causeway/pkg/internal/metricstest"
	"github.com/causeway-mesh/causeway/pkg/internal/testnet"
	"github.com/causeway-mesh/causeway/pkg/logging"
	"github.com/causeway-mesh/causeway/pkg/policy"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// connectionPolicy is the ConnectionPolicy t/name with rego, selecting
// what selector selects.
func connectionPolicy(t testing.TB, name, rego string, selector map[string]string) *meshv1.ConnectionPolicy {
	return connpolicytest.Policy(t, "t", name, rego, &meshv1.ConnectionPolicy{Selector: selector})
}

// allowRego allows the listed service accounts of namespace t and, when
// unauthenticated is set, callers without identity.
func allowRego(unauthenticated bool, accounts ...string) string {
	var b strings.Builder
	b.WriteString("package envoy.authz\n\ndefault allow := false\n\n")
	for _, sa := range accounts {
		fmt.Fprintf(&b, "allow if input.attributes.source.principal == %q\n", "spiffe://cluster.local/ns/t/sa/"+sa)
	}
	if unauthenticated {
		b.WriteString("allow if not input.attributes.source.principal\n")
	}
	return b.String()
}

// startEcho serves an app that echoes every byte back until the client closes.
func startEcho(t testing.TB, addr string) {
	t.Helper()
	testnet.Serve(t, testnet.Listen(t, addr), func(c net.Conn) { io.Copy(c, c) })
}

// tunnel opens an HBONE tunnel to pod B's port as the service account sa.
func tunnel(t testing.TB, m *testMesh, pool *hbone.Pool, sa, authority string) (net.Conn, error) {
	t.Helper()
	id := trusttest.Identity(t, "spiffe://cluster.local/ns/t/sa/"+sa)
	cert := m.ca.Certificate(t, id, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return pool.Dial(ctx, hbone.Target{Address: netip.MustParseAddrPort(podB + ":15008"), Authority: authority,
		Source: id, Cert: func() (*tls.Certificate, error) { return cert, nil },
		Expected: []trust.Identity{trusttest.Identity(t, "spiffe://cluster.local/ns/t/sa/b")}})
}

func newPool(t testing.TB, m *testMesh) *hbone.Pool {
	pool, err := hbone.NewPool(hbone.PoolOptions{Bundle: m.ca.Bundle})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	return pool
}

// echoes reports whether c still carries bytes both ways.
func echoes(c net.Conn, msg string) error {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, msg); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != msg {
		return fmt.Errorf("echo %q, want %q", buf, msg)
	}
	return nil
}

// counter reads connection_policy_decisions_total{policy, result}.
func counter(t *testing.T, reg *prometheus.Registry, pol, result string) float64 {
	t.Helper()
	v, _ := metricstest.Value(t, reg, "connection_policy_decisions_total", map[string]string{"policy": pol, "result": result})
	return v
}

// policyMesh is startMesh on node-a and node-b with node-b's metrics and
// decision log kept for the test.
func policyMesh(t *testing.T) (*testMesh, *prometheus.Registry, *observer.ObservedLogs) {
	reg := prometheus.NewRegistry()
	core, decisions := observer.New(zapcore.InfoLevel)
	dl, err := policy.NewDecisionLogger(zap.New(core), policy.DecisionLogOptions{Mode: policy.LogDenials})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { dl.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	m := startMeshWith(t, func(o *Options) {
		if o.Node == "node-b" {
			o.Registry, o.PolicyDecisionLog = reg, dl
		}
	}, "node-a", "node-b")
	return m, reg, decisions
}

// The destination node proxy admits by principal; the denied caller gets
// 401, the decision is logged and counted.
func TestConnectionPolicyByPrincipal(t *testing.T) {
	startApp(t, app(podB)+":8080", "B")
	m, reg, decisions := policyMesh(t)
	nb := m.proxies["node-b"]
	nb.UpdateConnectionPolicies(context.Background(), []*meshv1.ConnectionPolicy{connectionPolicy(t, "b-clients", allowRego(false, "a"), nil)})

	// A, through its own node proxy (HBONE with A's certificate).
	if out, err := m.exchange(t, "node-a", podA, podB+":8080", "hi"); err != nil || out != "B:hi" {
		dumpLogs(t, m)
		t.Fatalf("allowed principal: %q, %v", out, err)
	}
	pool := newPool(t, m)
	if c, err := tunnel(t, m, pool, "c", podB+":8080"); err == nil {
		c.Close()
		t.Fatal("a principal the policy does not name reached B")
	} else if !strings.Contains(err.Error(), "401") || !strings.Contains(err.Error(), "t/b-clients") {
		t.Fatalf("denied tunnel: %v, want a 401 naming the policy", err)
	}
	if got := counter(t, reg, "t/b-clients", "allow"); got != 1 {
		t.Errorf("allow decisions = %v, want 1", got)
	}
	if got := counter(t, reg, "t/b-clients", "deny"); got != 1 {
		t.Errorf("deny decisions = %v, want 1", got)
	}
	waitFor(t, "the denial in the decision log", func() error {
		for _, e := range decisions.All() {
			if in, ok := e.ContextMap()["input"].(logging.RawJSON); ok && strings.Contains(string(in), `"source_principal":"spiffe://cluster.local/ns/t/sa/c"`) {
				return nil
			}
		}
		return fmt.Errorf("no decision naming the caller among %d", decisions.Len())
	})
	// A workload the policy does not select is not held to it.
	other := connectionPolicy(t, "b-clients", allowRego(false, "a"), map[string]string{"app": "elsewhere"})
	nb.UpdateConnectionPolicies(context.Background(), []*meshv1.ConnectionPolicy{other})
	c, err := tunnel(t, m, pool, "c", podB+":8080")
	if err != nil {
		t.Fatalf("a policy selecting other workloads denied B's caller: %v", err)
	}
	c.Close()
}

// Plaintext from outside the mesh has no principal: a principal allow-list
// refuses it, a policy that admits unauthenticated callers lets it in.
func TestConnectionPolicyUnauthenticated(t *testing.T) {
	startApp(t, app(podB)+":8080", "B")
	m, reg, _ := policyMesh(t)
	nb := m.proxies["node-b"]
	plain := func() (string, error) {
		c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(podOutsider)}}).Dial("tcp", podB+":8080")
		if err != nil {
			return "", err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c, "plain")
		c.(*net.TCPConn).CloseWrite()
		out, err := io.ReadAll(c)
		return string(out), err
	}
	nb.UpdateConnectionPolicies(context.Background(), []*meshv1.ConnectionPolicy{connectionPolicy(t, "p", allowRego(false, "a"), nil)})
	if out, _ := plain(); out != "" {
		t.Fatalf("unauthenticated caller got %q through a principal allow-list", out)
	}
	if got := counter(t, reg, "t/p", "deny"); got != 1 {
		t.Errorf("deny decisions = %v, want 1", got)
	}
	nb.UpdateConnectionPolicies(context.Background(), []*meshv1.ConnectionPolicy{connectionPolicy(t, "p", allowRego(true, "a"), nil)})
	if out, err := plain(); out != "B:plain" {
		t.Fatalf("policy admitting unauthenticated callers: %q, %v", out, err)
	}
}

// A policy change closes the open connections it now denies, names the
// revision that did, and leaves the others flowing.
func TestConnectionPolicyUpdateClosesDenied(t *testing.T) {
	startEcho(t, app(podB)+":9000")
	m, reg, _ := policyMesh(t)
	nb := m.proxies["node-b"]
	nb.UpdateConnectionPolicies(context.Background(), []*meshv1.ConnectionPolicy{connectionPolicy(t, "p", allowRego(false, "a", "c"), nil)})
	pool := newPool(t, m)
	fromA, err := tunnel(t, m, pool, "a", podB+":9000")
	if err != nil {
		t.Fatal(err)
	}
	defer fromA.Close()
	// Another pool: C's tunnel must not share A's connection.
	fromC, err := tunnel(t, m, newPool(t, m), "c", podB+":9000")
	if err != nil {
		t.Fatal(err)
	}
	defer fromC.Close()
	for _, c := range []net.Conn{fromA, fromC} {
		if err := echoes(c, "before"); err != nil {
			t.Fatal(err)
		}
	}
	v2 := connectionPolicy(t, "p", allowRego(false, "a"), nil)
	nb.UpdateConnectionPolicies(context.Background(), []*meshv1.ConnectionPolicy{v2})
	// C learns it at once, without sending: its tunnel is reset, not only
	// the connection to the app behind it.
	fromC.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := fromC.Read(make([]byte, 16)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("C's tunnel after the update: read %d bytes, %v; want it reset", n, err)
	}
	if err := echoes(fromA, "after"); err != nil {
		t.Fatalf("allowed connection broken by the update: %v", err)
	}
	var line map[string]any
	for _, e := range m.logs["node-b"].FilterMessage("open connection no longer authorized; closed").All() {
		line = e.ContextMap()
	}
	if line == nil || line["policy_revision"] != v2.GetRevision() || line["policy"] != "t/p" || line["src_identity"] != "spiffe://cluster.local/ns/t/sa/c" {
		t.Fatalf("close log = %v, want policy t/p revision %s for C", line, v2.GetRevision())
	}
	if got := counter(t, reg, "t/p", "recheck_deny"); got != 1 {
		t.Errorf("recheck_deny = %v, want 1", got)
	}
	waitFor(t, "the access log's reason", func() error {
		for _, l := range accessLines(m.logs["node-b"], "inbound") {
			if strings.Contains(fmt.Sprint(l["result"]), "closed by connection policy re-check") {
				return nil
			}
		}
		return fmt.Errorf("none yet")
	})
}

// A change of the mesh state a decision read (here the destination's
// labels) re-checks open connections too.
func TestConnectionPolicyRecheckOnMeshChange(t *testing.T) {
	startEcho(t, app(podB)+":9000")
	m, _, _ := policyMesh(t)
	nb := m.proxies["node-b"]
	rego := "package envoy.authz\n\nallow if input.attributes.destination.labels.tier == \"open\"\n"
	nb.UpdateConnectionPolicies(context.Background(), []*meshv1.ConnectionPolicy{connectionPolicy(t, "p", rego, nil)})
	labelB := func(tier string) {
		ws, ss, wps := meshResources()
		for _, w := range ws {
			if w.GetUid() == "b" {
				w.Labels = map[string]string{"tier": tier}
			}
		}
		nb.Update(NewRegistry("node-b", ws, ss, wps))
	}
	labelB("open")
	c, err := tunnel(t, m, newPool(t, m), "a", podB+":9000")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := echoes(c, "x"); err != nil {
		t.Fatal(err)
	}
	labelB("closed")
	waitFor(t, "the connection closed", func() error {
		if err := echoes(c, "y"); err == nil {
			return fmt.Errorf("still open")
		}
		return nil
	})
}

// A policy whose evaluation fails denies, and so does one that cannot be
// enforced at all.
func TestConnectionPolicyErrorDenies(t *testing.T) {
	startApp(t, app(podB)+":8080", "B")
	m, reg, _ := policyMesh(t)
	nb := m.proxies["node-b"]
	// Both bodies hold for every connection: a conflict, at evaluation.
	rego := "package envoy.authz\n\nallow := true if input.attributes.source.address\nallow := false if input.attributes.destination.address\n"
	nb.UpdateConnectionPolicies(context.Background(), []*meshv1.ConnectionPolicy{connectionPolicy(t, "broken", rego, nil)})
	pool := newPool(t, m)
	if c, err := tunnel(t, m, pool, "a", podB+":8080"); err == nil {
		c.Close()
		t.Fatal("a policy that fails to evaluate let the connection in")
	}
	if got := counter(t, reg, "t/broken", "error"); got != 1 {
		t.Errorf("error decisions = %v, want 1", got)
	}
	unenforceable := &meshv1.ConnectionPolicy{Namespace: "t", Name: "pending", Policy: "later", InvalidReason: "policy set \"later\" has no active revision"}
	nb.UpdateConnectionPolicies(context.Background(), []*meshv1.ConnectionPolicy{unenforceable})
	if c, err := tunnel(t, m, pool, "a", podB+":8080"); err == nil {
		c.Close()
		t.Fatal("a policy that cannot be enforced let the connection in")
	} else if !strings.Contains(err.Error(), "cannot be enforced") {
		t.Fatalf("error %v, want the reason", err)
	}
}

// A ConnectionPolicy the translator refused arrives denying: it denies
// what it selects, even when it both selects workloads and targets
// Gateways (one of its faults), and whatever the other policies allow.
func TestConnectionPolicyRefusedDenies(t *testing.T) {
	startApp(t, app(podB)+":8080", "B")
	m, _, _ := policyMesh(t)
	nb := m.proxies["node-b"]
	ws, ss, wps := meshResources()
	for _, w := range ws {
		if w.GetUid() == "b" {
			w.Labels = map[string]string{"app": "db"}
		}
	}
	nb.Update(NewRegistry("node-b", ws, ss, wps))
	refused := &meshv1.ConnectionPolicy{Namespace: "t", Name: "refused", Policy: "p",
		Selector: map[string]string{"app": "db"}, TargetGateways: []string{"waypoint"},
		InvalidReason: "refused: spec.selector and spec.targetRefs are exclusive"}
	if err := meshv1.Validate(refused); err != nil {
		t.Fatal(err)
	}
	allowAll := connectionPolicy(t, "open", "package envoy.authz\n\nallow := true\n", nil)
	nb.UpdateConnectionPolicies(context.Background(), []*meshv1.ConnectionPolicy{allowAll, refused})
	if c, err := tunnel(t, m, newPool(t, m), "a", podB+":8080"); err == nil {
		c.Close()
		t.Fatal("a refused policy let the connection in")
	} else if !strings.Contains(err.Error(), "t/refused cannot be enforced: refused:") {
		t.Fatalf("error %v, want the refusal", err)
	}
}
