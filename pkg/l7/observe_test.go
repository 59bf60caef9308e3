package l7

import (
	"context"
	"testing"

	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

func TestAccessLogAndMetrics(t *testing.T) {
	h := newHarness(t)
	h.addService("web", "http")
	h.backend("v1", "http", false)
	h.update([]*meshv1.HTTPRoute{httpRoute("r", epoch, to("v1", prefixM("/app")))}, nil)
	ca := trusttest.NewCA(t, "cluster.local")
	client := trusttest.Identity(t, "spiffe://cluster.local/ns/client/sa/app")
	authed := h1Client(h.front(webInfo(ca.Peer(t, ca.Certificate(t, client, 0)))))
	anon := h1Client(h.front(webInfo(ca.Peer(t, nil))))

	if res := do(t, authed, "POST", "/app/x?secret=1", []byte("12345"), nil); res.status != 200 {
		t.Fatalf("status %d", res.status)
	}
	h.setAuthz(AuthorizerFunc(func(context.Context, *AuthzRequest) Decision {
		return Decision{Allowed: false, Reason: "principal not allowed", ID: "dec-42"}
	}))
	if res := get(t, anon, "/app/y", nil); res.status != 403 {
		t.Fatalf("status %d", res.status)
	}
	h.setAuthz(AllowAll())
	if res := get(t, anon, "/elsewhere", nil); res.status != 404 {
		t.Fatalf("status %d", res.status)
	}

	entries := h.logs.FilterMessage("request").AllUntimed()
	if len(entries) != 3 {
		t.Fatalf("%d access log entries, want 3", len(entries))
	}
	want := []map[string]any{
		{"identity": client.String(), "route": "default/r", "decision": "allow", "status": int64(200), "service": "default/web",
			"source": "10.1.2.3:45678", "method": "POST", "path": "/app/x", "bytes_received": int64(5), "attempts": int64(1),
			"endpoint": h.backends["v1"].addr.String(), "backend": "default/v1:80"},
		{"identity": "unauthenticated", "route": "default/r", "decision": "deny", "reason": "principal not allowed", "decision_id": "dec-42", "status": int64(403)},
		{"identity": "unauthenticated", "route": "none", "decision": "allow", "reason": "no matching route", "status": int64(404)},
	}
	for i, e := range entries {
		fields := e.ContextMap()
		for k, v := range want[i] {
			if fields[k] != v {
				t.Errorf("entry %d: %s = %#v, want %#v", i, k, fields[k], v)
			}
		}
		if _, ok := fields["duration"]; !ok {
			t.Errorf("entry %d has no duration", i)
		}
		if n, _ := fields["bytes_sent"].(int64); n <= 0 {
			t.Errorf("entry %d: bytes_sent = %v", i, fields["bytes_sent"])
		}
	}

	for _, tc := range []struct {
		labels map[string]string
		want   float64
	}{
		{map[string]string{"response_code": "200", "source_principal": client.String(), "destination_service": "default/web", "route": "default/r"}, 1},
		{map[string]string{"response_code": "403", "source_principal": "unauthenticated", "route": "default/r"}, 1},
		{map[string]string{"response_code": "404", "route": "none"}, 1},
		{map[string]string{}, 3},
	} {
		if got := h.counter(tc.labels); got != tc.want {
			t.Errorf("requests_total%v = %v, want %v", tc.labels, got, tc.want)
		}
	}
	mfs, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var samples uint64
	for _, mf := range mfs {
		if mf.GetName() == "request_duration_seconds" {
			for _, m := range mf.GetMetric() {
				samples += m.GetHistogram().GetSampleCount()
			}
		}
	}
	if samples != 3 {
		t.Errorf("request_duration_seconds has %d samples, want 3", samples)
	}
}
