package config

import (
	"fmt"
	"strings"
	"testing"

	"github.com/causeway-mesh/causeway/internal/ingresstest"
	"github.com/causeway-mesh/causeway/pkg/backendtls/backendtlstest"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// secretYAML is s as a YAML document (data base64, as the API serves it).
func secretYAML(t *testing.T, ca *backendtlstest.CA, ns, name string, dns ...string) string {
	return backendtlstest.SecretYAML(ns, name, ca.SecretData(t, dns...))
}

// ingressYAML: Gateway edge/ingress with an HTTP listener, two HTTPS
// listeners on one port (the wildcard's Secret in certs) and one whose
// Secret is missing, and two HTTPRoutes, one from shop.
var ingressYAML = ingresstest.GatewayYAML("edge", "ingress",
	ingresstest.Listener{Name: "http", Port: 80, Protocol: "HTTP"},
	ingresstest.Listener{Name: "shop", Port: 443, Protocol: "HTTPS", Hostname: "shop.example.com", Certificates: []string{"shop"}},
	ingresstest.Listener{Name: "wild", Port: 443, Protocol: "HTTPS", Hostname: "*.example.com", Certificates: []string{"certs/wild"}, AllNamespaces: true},
	ingresstest.Listener{Name: "broken", Port: 8443, Protocol: "HTTPS", Certificates: []string{"absent"}}) +
	ingresstest.HTTPRouteYAML("edge", "front", []ingresstest.Parent{{Name: "ingress", Section: "shop"}, {Name: "ingress", Section: "http"}}, nil,
		ingresstest.Backend{Namespace: "shop", Name: "web", Port: 80}) +
	ingresstest.HTTPRouteYAML("shop", "api", []ingresstest.Parent{{Namespace: "edge", Name: "ingress"}}, []string{"api.example.com"},
		ingresstest.Backend{Name: "web", Port: 80}) +
	ingresstest.GrantYAML("shop", "from-edge", "edge", "Service", "HTTPRoute") + `
apiVersion: v1
kind: Service
metadata: {namespace: shop, name: web}
spec:
  clusterIP: 127.0.20.1
  ports: [{port: 80, appProtocol: http}]
`

var certGrantYAML = ingresstest.GrantYAML("certs", "to-edge", "edge", "Secret", "Gateway")

// An ingress Gateway becomes an IngressGateway: the listeners that serve
// (one whose Secret is missing is left out, the others serve), each with
// its key pairs and the routes attached to it, hostnames intersected,
// served to the identity of the service account named after it.
// Secrets decode from YAML; another namespace's needs a ReferenceGrant.
func TestIngressGatewayTranslation(t *testing.T) {
	ca, err := backendtlstest.NewCA("ingress test")
	if err != nil {
		t.Fatal(err)
	}
	shop := secretYAML(t, ca, "edge", "shop", "shop.example.com")
	wild := secretYAML(t, ca, "certs", "wild", "*.example.com")
	s, err := translateYAML(t, ingressYAML, shop, wild, certGrantYAML)
	if err != nil { // the broken listener's Secret is its status's to report, not a refusal
		t.Fatal(err)
	}
	g := s.IngressGateways["edge/ingress"]
	if g == nil {
		t.Fatalf("no ingress gateway; refusals: %v", s.Rejected)
	}
	if g.GetIdentity() != "spiffe://cluster.local/ns/edge/sa/ingress" {
		t.Errorf("identity %s", g.GetIdentity())
	}
	var got []string
	for _, l := range g.GetListeners() {
		var routes []string
		for _, r := range l.GetHttpRoutes() {
			routes = append(routes, r.GetNamespace()+"/"+r.GetName()+strings.Join(r.GetHostnames(), ","))
		}
		got = append(got, fmt.Sprintf("%s:%d:%s:%d certs:%v", l.GetName(), l.GetPort(), l.GetHostname(), len(l.GetCertificates()), routes))
	}
	want := []string{"http:80::0 certs:[edge/front]", "shop:443:shop.example.com:1 certs:[edge/frontshop.example.com]",
		"wild:443:*.example.com:1 certs:[shop/apiapi.example.com]"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("listeners\n got %v\nwant %v", got, want)
	}
	if b := g.GetListeners()[0].GetHttpRoutes()[0].GetRules()[0].GetBackends()[0].GetBackend(); b.GetInvalidReason() != "" || b.GetNamespace() != "shop" {
		t.Errorf("backend %v", b)
	}
	if !s.IsWaypoint(mustIdentity(t, g.GetIdentity())) {
		t.Error("the gateway's identity is not reserved from node proxies")
	}
	for _, p := range s.Rejected {
		if strings.Contains(p.Reason, "PRIVATE KEY") {
			t.Errorf("a refusal carries key material: %s", p)
		}
	}

	// Without the grant in certs, the wildcard listener does not serve
	// (its route attaches to it, and is served nowhere); the others do.
	s, _ = translateYAML(t, ingressYAML, shop, wild)
	var names []string
	for _, l := range s.IngressGateways["edge/ingress"].GetListeners() {
		names = append(names, l.GetName())
	}
	if fmt.Sprint(names) != "[http shop]" {
		t.Errorf("without the ReferenceGrant the listeners are %v", names)
	}
	if err := meshv1.Validate(g); err != nil {
		t.Error(err)
	}
	// The Kubernetes source's incremental translation agrees.
	objs := decodeDocs(t, ingressYAML, shop, wild, certGrantYAML)
	if got := sameTranslation(t, "ingress", NewIncremental(Options{}), objs); len(got.IngressGateways) != 1 {
		t.Errorf("incremental: %d ingress gateways", len(got.IngressGateways))
	}
}

func mustIdentity(t *testing.T, s string) trust.Identity {
	t.Helper()
	id, err := trust.ParseIdentity(s)
	if err != nil {
		t.Fatal(err)
	}
	return id
}
