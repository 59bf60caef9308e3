package policy

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
)

func TestDecideConnection(t *testing.T) {
	dir := t.TempDir()
	rego := `package envoy.authz

default allow := false

allow if input.attributes.source.principal == "spiffe://cluster.local/ns/web/sa/frontend"

# HTTP rules stay undefined for connections.
allow if input.attributes.request.http.method == "GET"
`
	if err := os.WriteFile(filepath.Join(dir, "authz.rego"), []byte(rego), 0o600); err != nil {
		t.Fatal(err)
	}
	e, err := NewEngine(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	ca := trusttest.NewCA(t, "cluster.local")
	frontend := ca.Peer(t, ca.Certificate(t, trusttest.Identity(t, "spiffe://cluster.local/ns/web/sa/frontend"), 0))
	other := ca.Peer(t, ca.Certificate(t, trusttest.Identity(t, "spiffe://cluster.local/ns/web/sa/other"), 0))
	dst := trusttest.Identity(t, "spiffe://cluster.local/ns/shop/sa/db")
	addr := netip.MustParseAddrPort
	for _, tc := range []struct {
		name string
		req  ConnectionRequest
		want bool
	}{
		{"named principal", ConnectionRequest{Source: frontend, SourceAddr: addr("127.0.0.1:5000"), DestAddr: addr("127.0.20.9:5432"), Destination: dst}, true},
		{"other principal", ConnectionRequest{Source: other, SourceAddr: addr("127.0.0.1:5000"), DestAddr: addr("127.0.20.9:5432"), Destination: dst}, false},
		{"unauthenticated", ConnectionRequest{Source: ca.Peer(t, nil), SourceAddr: addr("127.0.0.1:5000"), DestAddr: addr("127.0.20.9:5432")}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := e.DecideConnection(context.Background(), &tc.req)
			if d.Allowed != tc.want {
				t.Fatalf("allowed = %v (%s), want %v", d.Allowed, d.Reason, tc.want)
			}
		})
	}
	in := BuildConnectionInput(&ConnectionRequest{Source: ca.Peer(t, nil), SourceAddr: addr("127.0.0.1:5000"), DestAddr: addr("127.0.20.9:5432"), Destination: dst})
	got := in.String()
	for _, absent := range []string{"source_principal", `"request"`} {
		if strings.Contains(got, absent) {
			t.Errorf("unauthenticated connection input has %s: %s", absent, got)
		}
	}
	// Only an authenticated peer can be the destination's waypoint.
	fw := BuildConnectionInput(&ConnectionRequest{Source: ca.Peer(t, nil), FromWaypoint: true}).String()
	if !strings.Contains(fw, `"from_waypoint": false`) {
		t.Errorf("unauthenticated peer counted as the waypoint: %s", fw)
	}
	fw = BuildConnectionInput(&ConnectionRequest{Source: frontend, FromWaypoint: true,
		DestinationWorkload: &Workload{Namespace: "shop", Name: "db-0", Labels: map[string]string{"app": "db"}},
		DestinationServices: []string{"db.shop.svc.cluster.local"}}).String()
	for _, want := range []string{`"from_waypoint": true`, `"labels": {"app": "db"}`, `"destination_services": ["db.shop.svc.cluster.local"]`, `"name": "db-0"`} {
		if !strings.Contains(fw, want) {
			t.Errorf("input lacks %s: %s", want, fw)
		}
	}
	if !strings.Contains(got, `"destination_principal": "spiffe://cluster.local/ns/shop/sa/db"`) {
		t.Errorf("input lacks the destination principal: %s", got)
	}
}
