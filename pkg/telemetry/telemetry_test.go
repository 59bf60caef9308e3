package telemetry

import (
	"testing"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// peerOf is the peer a real mTLS handshake yields for a certificate of id.
func peerOf(t *testing.T, ca *trusttest.CA, id string) trust.Peer {
	t.Helper()
	return ca.Peer(t, ca.Certificate(t, trusttest.Identity(t, id), 0))
}

func TestCaller(t *testing.T) {
	const frontend = "spiffe://cluster.local/ns/web/sa/frontend"
	ca := trusttest.NewCA(t, "cluster.local")
	w := &meshv1.Workload{Namespace: "web", Identity: frontend, WorkloadName: "frontend", CanonicalService: "frontend",
		CanonicalRevision: "v1", App: "", Version: "v1-label"}
	named := Peer{Workload: "frontend", Namespace: "web", Principal: frontend, App: "frontend", Version: "v1-label",
		CanonicalService: "frontend", CanonicalRevision: "v1", Cluster: Cluster}
	for _, c := range []struct {
		name string
		peer trust.Peer
		w    *meshv1.Workload
		want Peer
	}{
		{"authenticated, the workload at its address holds its identity", peerOf(t, ca, frontend), w, named},
		{"authenticated, a workload of another identity at its address", peerOf(t, ca, "spiffe://cluster.local/ns/web/sa/other"), w, UnknownPeer},
		{"authenticated, nothing at its address", peerOf(t, ca, frontend), nil,
			Peer{Unknown, "web", frontend, Unknown, Unknown, Unknown, Unknown, Unknown}},
		{"unauthenticated, at the workload's address", trust.Unauthenticated(), w, UnknownPeer},
	} {
		if got := Caller(c.peer, c.w); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

func TestValuesFollowLabels(t *testing.T) {
	c := Connection{Reporter: ReporterSource, Source: UnknownPeer, Destination: Of(&meshv1.Workload{Identity: "spiffe://td/ns/a/sa/b"}),
		Service: ServiceOf(&meshv1.Service{Name: "s", Namespace: "a", Hostname: "s.a.svc.cluster.local"}), Protocol: "tcp", SecurityPolicy: MutualTLS}
	v := c.Values(nil)
	if len(v) != len(Labels) {
		t.Fatalf("%d values for %d labels", len(v), len(Labels))
	}
	got := map[string]string{}
	for i, l := range Labels {
		got[l] = v[i]
	}
	for l, want := range map[string]string{"reporter": "source", "source_principal": "unknown", "destination_principal": "spiffe://td/ns/a/sa/b",
		"destination_workload": "unknown", "destination_service": "s.a.svc.cluster.local", "destination_service_name": "s",
		"destination_service_namespace": "a", "request_protocol": "tcp", "response_flags": "-", "connection_security_policy": "mutual_tls"} {
		if got[l] != want {
			t.Errorf("%s = %q, want %q", l, got[l], want)
		}
	}
}
