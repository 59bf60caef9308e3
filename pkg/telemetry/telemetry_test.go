package telemetry

import (
	"errors"
	"strings"
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
	w := &meshv1.Workload{Namespace: "web", Identity: frontend, WorkloadName: "frontend", WorkloadType: "deployment",
		CanonicalService: "frontend", CanonicalRevision: "v1", App: "", Version: "v1-label"}
	named := Peer{Workload: "frontend", Namespace: "web", Principal: frontend, App: "frontend", Version: "v1-label",
		CanonicalService: "frontend", CanonicalRevision: "v1", Cluster: Cluster}
	principalOnly := Peer{Unknown, "web", frontend, Unknown, Unknown, Unknown, Unknown, Unknown}
	baggage := Baggage(w)
	// What another web workload's node proxy says, of a workload the index
	// would name otherwise: the index wins.
	other := "k8s.namespace.name=web,k8s.deployment.name=billing,service.name=billing"
	for _, c := range []struct {
		name    string
		peer    trust.Peer
		w       *meshv1.Workload
		baggage string
		want    Peer
		reason  string // of the BaggageError, "" for none
	}{
		{"authenticated, the workload at its address holds its identity", peerOf(t, ca, frontend), w, "", named, ""},
		{"authenticated, the index names it, other names in the baggage", peerOf(t, ca, frontend), w, other, named, ""},
		{"authenticated, a workload of another identity at its address", peerOf(t, ca, "spiffe://cluster.local/ns/web/sa/other"), w, baggage, UnknownPeer, ""},
		{"authenticated, nothing at its address, no baggage", peerOf(t, ca, frontend), nil, "", principalOnly, ""},
		{"authenticated, nothing at its address, its node proxy's baggage", peerOf(t, ca, frontend), nil, baggage, named, ""},
		{"authenticated, nothing at its address, baggage of another namespace", peerOf(t, ca, frontend), nil,
			"k8s.namespace.name=shop,k8s.deployment.name=frontend", principalOnly, BaggageNamespaceMismatch},
		{"authenticated, nothing at its address, baggage without namespace", peerOf(t, ca, frontend), nil,
			"k8s.deployment.name=frontend", principalOnly, BaggageNamespaceMismatch},
		{"authenticated, nothing at its address, malformed baggage", peerOf(t, ca, frontend), nil,
			baggage + ",k8s.namespace.name=web", principalOnly, BaggageMalformed},
		{"unauthenticated, at the workload's address", trust.Unauthenticated(), w, "", UnknownPeer, ""},
		{"unauthenticated, with its baggage", trust.Unauthenticated(), nil, baggage, UnknownPeer, BaggageUnauthenticated},
	} {
		got, err := Caller(c.peer, c.w, c.baggage)
		if got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
		reason := ""
		if be := (*BaggageError)(nil); errors.As(err, &be) {
			reason = be.Reason
		} else if err != nil {
			t.Errorf("%s: %v is no BaggageError", c.name, err)
		}
		if reason != c.reason {
			t.Errorf("%s: ignored for %q (%v), want %q", c.name, reason, err, c.reason)
		}
	}
}

// The names a proxy sends are ztunnel's keys, and what it reads back.
func TestBaggageRoundTrip(t *testing.T) {
	w := &meshv1.Workload{Namespace: "web", WorkloadName: "frontend", WorkloadType: "deployment", CanonicalService: "frontend",
		CanonicalRevision: "v1", App: "frontend-app", Version: "v1.2"}
	const want = "k8s.cluster.name=Kubernetes,k8s.namespace.name=web,k8s.deployment.name=frontend,service.name=frontend,service.version=v1,app.name=frontend-app,app.version=v1.2"
	if got := Baggage(w); got != want {
		t.Fatalf("Baggage = %q, want %q", got, want)
	}
	n, err := ParseBaggage(want)
	if err != nil {
		t.Fatal(err)
	}
	if n != (Names{Cluster: Cluster, Namespace: "web", Workload: "frontend", CanonicalService: "frontend", CanonicalRevision: "v1",
		App: "frontend-app", Version: "v1.2"}) {
		t.Errorf("ParseBaggage = %+v", n)
	}
	// No workload type (an older control plane): no workload name rather
	// than one under a made-up key; no namespace: nothing at all.
	w.WorkloadType = "statefulset"
	if got := Baggage(w); strings.Contains(got, "frontend,service.name") || !strings.Contains(got, "k8s.namespace.name=web") {
		t.Errorf("Baggage of an unknown type = %q", got)
	}
	if got := Baggage(&meshv1.Workload{WorkloadName: "x"}); got != "" {
		t.Errorf("Baggage without namespace = %q", got)
	}
}

func TestParseBaggage(t *testing.T) {
	for _, ok := range []struct{ in, ns, workload string }{
		{"k8s.namespace.name=web,k8s.job.name=nightly", "web", "nightly"},
		// W3C's optional white space, members of other keys (ztunnel's
		// cloud ones, properties), empty values (ztunnel's "unset").
		{" k8s.namespace.name = web , cloud.region=eu;p=1, k8s.pod.name=", "web", ""},
		{"", "", ""},
	} {
		n, err := ParseBaggage(ok.in)
		if err != nil || n.Namespace != ok.ns || n.Workload != ok.workload {
			t.Errorf("ParseBaggage(%q) = %+v, %v; want namespace %q, workload %q", ok.in, n, err, ok.ns, ok.workload)
		}
	}
	for name, in := range map[string]string{
		"no key=value":              "k8s.namespace.name=web,frontend",
		"empty member":              "k8s.namespace.name=web,,k8s.pod.name=x",
		"empty key":                 "=web",
		"namespace twice":           "k8s.namespace.name=web,k8s.namespace.name=shop",
		"two workload keys":         "k8s.deployment.name=a,k8s.pod.name=b",
		"namespace not a DNS label": "k8s.namespace.name=Web",
		"namespace too long":        "k8s.namespace.name=" + strings.Repeat("a", 64),
		"workload with a slash":     "k8s.deployment.name=a/b",
		"percent-encoded value":     "service.name=a%2Cb",
		"value with a property":     "service.version=v1;x=y",
		"label value too long":      "app.name=" + strings.Repeat("a", 254),
		"label value edge":          "app.version=-v1",
		"over the byte bound":       "k8s.namespace.name=web,x=" + strings.Repeat("a", MaxBaggageBytes),
		"over the member bound":     strings.Repeat("x=1,", MaxBaggageMembers) + "k8s.namespace.name=web",
	} {
		if n, err := ParseBaggage(in); err == nil {
			t.Errorf("%s: ParseBaggage(%.80q) = %+v, want an error", name, in, n)
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

// Whatever a CONNECT carries, ParseBaggage answers within its bounds, and
// what it accepts are names Kubernetes could have given.
func FuzzParseBaggage(f *testing.F) {
	f.Add(Baggage(&meshv1.Workload{Namespace: "web", WorkloadName: "frontend", WorkloadType: "deployment", CanonicalService: "frontend",
		CanonicalRevision: "v1", App: "frontend", Version: "v1"}))
	f.Add(" k8s.namespace.name = web , cloud.region=eu;p=1, k8s.pod.name=")
	f.Add("k8s.deployment.name=a,k8s.pod.name=b")
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseBaggage(s)
		if err != nil {
			return
		}
		if len(s) > MaxBaggageBytes {
			t.Fatalf("accepted %d bytes", len(s))
		}
		for _, v := range []string{n.Cluster, n.Namespace, n.Workload, n.CanonicalService, n.CanonicalRevision, n.App, n.Version} {
			if strings.ContainsAny(v, ",;=% \t/") {
				t.Fatalf("accepted value %q of %q", v, s)
			}
		}
	})
}
