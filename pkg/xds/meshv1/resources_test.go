package meshv1

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
)

func TestValidate(t *testing.T) {
	good := &Workload{Uid: "u", Name: "p", Namespace: "ns", Identity: "spiffe://cluster.local/ns/ns/sa/sa", Addresses: []string{"127.0.10.1"}}
	if err := Validate(good); err != nil {
		t.Fatalf("good workload: %v", err)
	}
	pct := 150.0
	cases := []struct {
		name string
		msg  proto.Message
		want string
	}{
		{"workload identity", &Workload{Uid: "u", Name: "p", Namespace: "ns", Identity: "spiffe://cluster.local/x"}, "path must be"},
		{"workload address", &Workload{Uid: "u", Name: "p", Namespace: "ns", Identity: good.Identity, Addresses: []string{"0.0.0.0"}}, "unspecified"},
		{"workload zone", &Workload{Uid: "u", Name: "p", Namespace: "ns", Identity: good.Identity, Addresses: []string{"fe80::1%eth0"}}, "not an IP"},
		{"workload port", &Workload{Uid: "u", Name: "p", Namespace: "ns", Identity: good.Identity, ServingPorts: []uint32{70000}}, "out of range"},
		{"service VIP", &Service{Name: "s", Namespace: "ns", Vips: []string{"nope"}}, "not an IP"},
		{"service endpoint ports", &Service{Name: "s", Namespace: "ns", Endpoints: []*Endpoint{{Address: "127.0.0.1", Ports: map[uint32]uint32{80: 0}}}}, "out of range"},
		{"waypoint for", &Waypoint{Name: "w", Namespace: "ns", Identity: good.Identity, HbonePort: 15008, WaypointFor: "some"}, "waypoint-for"},
		{"route regex", &HTTPRoute{Name: "r", Namespace: "ns", Rules: []*HTTPRouteRule{{Matches: []*HTTPRouteMatch{{Path: &PathMatch{Type: PathMatch_REGULAR_EXPRESSION, Value: "(["}}}}}}, "path regex"},
		{"route path", &HTTPRoute{Name: "r", Namespace: "ns", Rules: []*HTTPRouteRule{{Matches: []*HTTPRouteMatch{{Path: &PathMatch{Value: "x"}}}}}}, "must start with /"},
		{"mirror percent", &HTTPRoute{Name: "r", Namespace: "ns", Rules: []*HTTPRouteRule{{Filters: []*HTTPRouteFilter{{Filter: &HTTPRouteFilter_RequestMirror{RequestMirror: &RequestMirror{Backend: &BackendRef{}, Percent: &pct}}}}}}}, "percent"},
		{"grpc regex", &GRPCRoute{Name: "g", Namespace: "ns", Rules: []*GRPCRouteRule{{Matches: []*GRPCRouteMatch{{Method: &GRPCMethodMatch{Type: GRPCMethodMatch_REGULAR_EXPRESSION, Service: "("}}}}}}, "method regex"},
		{"empty filter", &GRPCRoute{Name: "g", Namespace: "ns", Rules: []*GRPCRouteRule{{Filters: []*HTTPRouteFilter{{}}}}}, "empty filter"},
		{"connection policy without set", &ConnectionPolicy{Name: "p", Namespace: "ns"}, "no policy set"},
		{"connection policy selecting both", &ConnectionPolicy{Name: "p", Namespace: "ns", Policy: "s", Revision: "r",
			Selector: map[string]string{"app": "db"}, TargetGateways: []string{"wp"}}, "exclusive"},
		{"backend TLS without policy", tlsService(&BackendTLS{Hostname: "a.example", SystemRoots: true}), "policy"},
		{"backend TLS hostname", tlsService(&BackendTLS{Policy: &Ref{Namespace: "ns", Name: "p"}, Hostname: "*.example", SystemRoots: true}), "not a DNS name"},
		{"backend TLS both roots", tlsService(&BackendTLS{Policy: &Ref{Namespace: "ns", Name: "p"}, Hostname: "a.example", SystemRoots: true, CaCertificates: []byte("x")}), "exactly one"},
		{"backend TLS no roots", tlsService(&BackendTLS{Policy: &Ref{Namespace: "ns", Name: "p"}, Hostname: "a.example"}), "exactly one"},
		{"backend TLS empty SAN", tlsService(&BackendTLS{Policy: &Ref{Namespace: "ns", Name: "p"}, Hostname: "a.example", SystemRoots: true,
			SubjectAltNames: []*SubjectAltName{{Type: SubjectAltName_URI}}}), "empty subject alt name"},
		{"connection policy without files", &ConnectionPolicy{Name: "p", Namespace: "ns", Policy: "s", Revision: "r"}, "revision and files"},
		{"key pair host", &IngressGateway{Name: "gw", Namespace: "ns", Identity: good.Identity, Listeners: []*IngressListener{{Name: "https", Port: 443,
			Protocol: IngressListener_HTTPS, Certificates: []*TLSKeyPair{{Secret: "ns/c", CertificateChain: []byte("c"), PrivateKey: []byte("k"), Hosts: []string{"a.*.example"}}}}}},
			"host \"a.*.example\""},
	}
	for _, c := range cases {
		err := Validate(c.msg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want error containing %q", c.name, err, c.want)
		}
	}
	refused := tlsService(&BackendTLS{Policy: &Ref{Namespace: "ns", Name: "p"}, InvalidReason: "no CA"})
	if err := Validate(refused); err != nil {
		t.Errorf("a refused backend TLS policy is served as it is: %v", err)
	}
	if ResourceName(good) != "u" || ResourceName(&Service{Name: "s", Namespace: "ns"}) != "ns/s" {
		t.Error("ResourceName")
	}
	for _, u := range TypeURLs {
		m, err := NewResource(u)
		if err != nil || typePrefix+string(m.ProtoReflect().Descriptor().FullName()) != u {
			t.Errorf("NewResource(%s) = %v, %v", u, m, err)
		}
	}
}

func tlsService(b *BackendTLS) *Service {
	return &Service{Name: "s", Namespace: "ns", Ports: []*ServicePort{{Port: 443, BackendTls: b}}}
}
