package ingresstest

import (
	"testing"

	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/causeway-mesh/causeway/pkg/config"
)

// The documents decode strictly, as a local mesh reads them, into what
// the arguments say.
func TestYAMLDecodes(t *testing.T) {
	doc := GatewayYAML("edge", "ingress",
		Listener{Name: "http", Port: 80, Protocol: "HTTP", AllNamespaces: true},
		Listener{Name: "tls", Port: 443, Protocol: "HTTPS", Hostname: "*.example.com", Certificates: []string{"own", "certs/other"}}) +
		PodYAML("edge", "ingress", "node-a", "127.0.0.9") +
		HTTPRouteYAML("shop", "r", []Parent{{Namespace: "edge", Name: "ingress", Section: "tls"}}, []string{"a.example.com"},
			Backend{Name: "web", Port: 80}, Backend{Namespace: "other", Name: "api", Port: 8080}) +
		GrantYAML("other", "from-shop", "shop", "Service", "HTTPRoute", "GRPCRoute")
	objs, err := config.Decode("test", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 4 {
		t.Fatalf("%d objects, want 4", len(objs))
	}
	gw, ok := objs[0].Obj.(*gwv1.Gateway)
	if !ok || gw.Namespace != "edge" || gw.Name != "ingress" || gw.Spec.GatewayClassName != "causeway" || len(gw.Spec.Listeners) != 2 {
		t.Fatalf("gateway %+v", objs[0].Obj)
	}
	l := gw.Spec.Listeners[1]
	if l.Port != 443 || l.Protocol != gwv1.HTTPSProtocolType || l.Hostname == nil || *l.Hostname != "*.example.com" || l.TLS == nil ||
		len(l.TLS.CertificateRefs) != 2 || l.TLS.CertificateRefs[1].Namespace == nil || *l.TLS.CertificateRefs[1].Namespace != "certs" ||
		l.AllowedRoutes != nil {
		t.Errorf("HTTPS listener %+v", l)
	}
	if a := gw.Spec.Listeners[0].AllowedRoutes; a == nil || *a.Namespaces.From != gwv1.NamespacesFromAll {
		t.Errorf("HTTP listener's allowedRoutes %+v", a)
	}
	r, ok := objs[2].Obj.(*gwv1.HTTPRoute)
	if !ok || len(r.Spec.ParentRefs) != 1 || *r.Spec.ParentRefs[0].SectionName != "tls" || *r.Spec.ParentRefs[0].Namespace != "edge" ||
		len(r.Spec.Hostnames) != 1 || len(r.Spec.Rules) != 1 || len(r.Spec.Rules[0].BackendRefs) != 2 ||
		r.Spec.Rules[0].BackendRefs[0].Namespace != nil || *r.Spec.Rules[0].BackendRefs[1].Namespace != "other" {
		t.Errorf("route %+v", objs[2].Obj)
	}
	g, ok := objs[3].Obj.(*gwv1.ReferenceGrant)
	if !ok || len(g.Spec.From) != 2 || g.Spec.From[1].Kind != "GRPCRoute" || g.Spec.From[0].Namespace != "shop" || g.Spec.To[0].Kind != "Service" {
		t.Errorf("grant %+v", objs[3].Obj)
	}
}
