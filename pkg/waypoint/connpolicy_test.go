package waypoint

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/pkg/connpolicy/connpolicytest"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// withConnectionPolicies re-sends the waypoint's configuration with these
// connection policies.
func (f *fixture) withConnectionPolicies(policies ...*meshv1.ConnectionPolicy) {
	s := *f.w.view.Load().state
	s.ConnectionPolicies = map[string]*meshv1.ConnectionPolicy{}
	for _, p := range policies {
		s.ConnectionPolicies[p.GetNamespace()+"/"+p.GetName()] = p
	}
	f.w.Update(&s)
}

// tunnelPolicy targets the waypoint shop/wp.
func tunnelPolicy(t *testing.T, rego string) *meshv1.ConnectionPolicy {
	return connpolicytest.Policy(t, "shop", "tunnels", rego, &meshv1.ConnectionPolicy{TargetGateways: []string{"wp"}})
}

const frontendOnly = "package envoy.authz\n\nallow if input.attributes.source.principal == \"spiffe://cluster.local/ns/web/sa/frontend\"\n"

// A connection policy targeting the waypoint refuses a tunnel as it opens,
// before any HTTP: a refused caller gets the CONNECT's 401, not a 403
// from the request policy.
func TestConnectionPolicyAtTunnelOpen(t *testing.T) {
	f := start(t)
	f.withConnectionPolicies(tunnelPolicy(t, frontendOnly))
	if status, _ := get(t, f.webTunnel(t), ""); status != http.StatusOK {
		t.Fatalf("frontend: %d", status)
	}
	for _, src := range []string{"spiffe://cluster.local/ns/web/sa/other", ""} {
		c, err := f.tunnel(t, src, "127.0.74.1:80")
		if err == nil {
			c.Close()
			t.Fatalf("caller %q: tunnel opened", src)
		}
		if !strings.Contains(err.Error(), "401") || !strings.Contains(err.Error(), "shop/tunnels") {
			t.Fatalf("caller %q: %v, want a 401 naming the policy", src, err)
		}
	}
	// A policy that admits unauthenticated tunnels (the hairpin) hands
	// them to the request policy, which refuses them per request.
	f.withConnectionPolicies(tunnelPolicy(t, frontendOnly+"allow if not input.attributes.source.principal\n"))
	c, err := f.tunnel(t, "", "127.0.74.1:80")
	if err != nil {
		t.Fatalf("unauthenticated tunnel under a policy admitting it: %v", err)
	}
	if status, _ := get(t, c, ""); status != http.StatusForbidden {
		t.Fatalf("unauthenticated request: %d, want the request policy's 403", status)
	}
	// Policies targeting another waypoint do not apply here.
	other := connpolicytest.Policy(t, "shop", "other", "package envoy.authz\n\ndefault allow := false\n", &meshv1.ConnectionPolicy{TargetGateways: []string{"other"}})
	f.withConnectionPolicies(other)
	if status, _ := get(t, f.webTunnel(t), ""); status != http.StatusOK {
		t.Fatalf("frontend under another waypoint's policy: %d", status)
	}
}

// An open tunnel that a new policy revision denies is closed.
func TestConnectionPolicyUpdateClosesTunnel(t *testing.T) {
	f := start(t)
	f.withConnectionPolicies(tunnelPolicy(t, frontendOnly))
	c, err := f.tunnel(t, frontend, "127.0.74.2:80") // shop/db, TCP
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	greeting := make([]byte, len("tcp backend\n"))
	if _, err := io.ReadFull(c, greeting); err != nil {
		t.Fatal(err)
	}
	f.withConnectionPolicies(tunnelPolicy(t, "package envoy.authz\n\ndefault allow := false\n"))
	// The backend sends nothing more: only the close ends this read.
	if _, err := c.Read(greeting); err == nil || strings.Contains(err.Error(), "timeout") {
		t.Fatalf("read on the denied tunnel: %v, want it closed", err)
	}
}
