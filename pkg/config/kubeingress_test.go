package config

import (
	"fmt"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"

	"github.com/causeway-mesh/causeway/internal/ingresstest"
	"github.com/causeway-mesh/causeway/pkg/backendtls/backendtlstest"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// kubeIngressGatewayYAML is the default Gateway of an IngressClass of ours
// without parameters, admitting routes of every namespace, with its own
// certificate on HTTPS.
const kubeIngressGatewayYAML = `
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {namespace: causeway-system, name: causeway-ingress}
spec:
  gatewayClassName: causeway
  listeners:
  - {name: http, port: 80, protocol: HTTP, allowedRoutes: {namespaces: {from: All}}}
  - name: https
    port: 443
    protocol: HTTPS
    tls: {certificateRefs: [{name: own}]}
    allowedRoutes: {namespaces: {from: All}}
---
apiVersion: v1
kind: Service
metadata: {namespace: shop, name: api}
spec:
  clusterIP: 127.0.20.2
  ports: [{name: web, port: 8080}]
`

// defaultClassYAML is our IngressClass, the cluster's default, without
// parameters: Gateway causeway-system/causeway-ingress serves it.
var defaultClassYAML = ingresstest.IngressClassYAML("causeway", true, "")

// shopIngressYAML has no ingressClassName: the default class serves it.
const shopIngressYAML = `
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {namespace: shop, name: store}
spec:
  defaultBackend: {service: {name: gone, port: {number: 80}}}
  tls: [{hosts: [Shop.example.com, shop.example.com], secretName: shop-tls}, {secretName: shop-tls}]
  rules:
  - host: Shop.example.com
    http:
      paths:
      - {path: /exact, pathType: Exact, backend: {service: {name: web, port: {number: 80}}}}
      - {path: /api, pathType: Prefix, backend: {service: {name: api, port: {name: web}}}}
      - {path: /impl, pathType: ImplementationSpecific, backend: {service: {name: web, port: {number: 80}}}}
  - host: "*.wild.example.com"
    http:
      paths: [{pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]
  - http:
      paths: [{path: /any, pathType: Prefix, backend: {service: {name: web, port: {number: 81}}}}]
`

// ingressRouteSummary is a listener's routes as "hostnames=match>backend,...".
func ingressRouteSummary(l *meshv1.IngressListener) []string {
	var out []string
	for _, r := range l.GetHttpRoutes() {
		var rules []string
		for _, ru := range r.GetRules() {
			p := ru.GetMatches()[0].GetPath()
			kind := "prefix"
			if p.GetType() == meshv1.PathMatch_EXACT {
				kind = "exact"
			}
			b := ru.GetBackends()[0].GetBackend()
			rules = append(rules, fmt.Sprintf("%s %s>%s/%s:%d", kind, p.GetValue(), b.GetNamespace(), b.GetName(), b.GetPort()))
		}
		out = append(out, r.GetNamespace()+"/"+r.GetName()+" "+strings.Join(r.GetHostnames(), ",")+"="+strings.Join(rules, ","))
	}
	return out
}

// An Ingress of the default class becomes routes of the class's default
// Gateway on its HTTP and HTTPS listeners: one route per host (lowercased,
// wildcards kept), each with its paths (Exact exact; Prefix and
// ImplementationSpecific prefix), the host-less rule's paths and the
// defaultBackend last; a route for any other host with the latter two. A
// port name resolves through the Service; a Service that does not exist
// (gone) is no refusal. Its tls Secret serves after the Gateway's own, for
// its entry's hosts only (lowercased, once each).
func TestKubeIngressTranslation(t *testing.T) {
	ca, err := backendtlstest.NewCA("kube ingress test")
	if err != nil {
		t.Fatal(err)
	}
	own := secretYAML(t, ca, "causeway-system", "own", "gateway.example.net")
	shopTLS := secretYAML(t, ca, "shop", "shop-tls", "shop.example.com")
	s := mustTranslate(t, kubeIngressGatewayYAML, defaultClassYAML, shopIngressYAML, own, shopTLS)
	g := s.IngressGateways["causeway-system/causeway-ingress"]
	if g == nil || len(g.GetListeners()) != 2 {
		t.Fatalf("ingress gateway %v", g)
	}
	any := "prefix /any>shop/web:81,prefix />shop/gone:80"
	want := []string{
		"shop/store shop.example.com=exact /exact>shop/web:80,prefix /api>shop/api:8080,prefix /impl>shop/web:80," + any,
		"shop/store *.wild.example.com=prefix />shop/web:80," + any,
		"shop/store =" + any,
	}
	for _, l := range g.GetListeners() {
		if got := ingressRouteSummary(l); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("listener %s routes\n got %q\nwant %q", l.GetName(), got, want)
		}
	}
	var secrets []string
	for _, kp := range g.GetListeners()[1].GetCertificates() {
		secrets = append(secrets, fmt.Sprint(kp.GetSecret(), kp.GetHosts()))
	}
	if got, want := fmt.Sprint(secrets), "[causeway-system/own[] shop/shop-tls[shop.example.com] shop/shop-tls[*]]"; got != want {
		t.Errorf("HTTPS key pairs %v, want %v: the Gateway's own (any name) then the Ingress's for its tls hosts (any, for an entry naming none)", got, want)
	}
	if err := meshv1.Validate(g); err != nil {
		t.Error(err)
	}

	// The Kubernetes source's incremental translation agrees.
	sameTranslation(t, "kube ingress", NewIncremental(Options{}), decodeDocs(t, kubeIngressGatewayYAML, defaultClassYAML, shopIngressYAML, own, shopTLS))
}

// Which Ingresses a class serves: the default class only serves Ingresses
// without a class when it is the cluster's only default; an explicit
// ingressClassName of another controller's class, or the legacy
// annotation naming one, is not ours; spec.parameters name the Gateway.
func TestKubeIngressClasses(t *testing.T) {
	ingress := func(extra string) string {
		return `
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {namespace: shop, name: store` + extra + `
  defaultBackend: {service: {name: web, port: {number: 80}}}
`
	}
	nginx := `
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata:
  name: nginx
  annotations: {ingressclass.kubernetes.io/is-default-class: "true"}
spec: {controller: k8s.io/ingress-nginx}
`
	// Only the HTTP listener serves (the HTTPS one lacks its Secret here).
	routes := func(s *Snapshot, gw string) int {
		n := 0
		for _, l := range s.IngressGateways[gw].GetListeners() {
			n += len(l.GetHttpRoutes())
		}
		return n
	}
	const def = "causeway-system/causeway-ingress"
	for _, c := range []struct {
		name  string
		docs  []string
		gw    string
		want  int
		error string
	}{
		{name: "default class", docs: []string{defaultClassYAML, ingress("}\nspec:")}, gw: def, want: 1},
		{name: "two default classes", docs: []string{defaultClassYAML, nginx, ingress("}\nspec:")}, gw: def, want: 0},
		{name: "explicit class", docs: []string{defaultClassYAML, nginx, ingress("}\nspec:\n  ingressClassName: causeway")}, gw: def, want: 1},
		{name: "another class", docs: []string{defaultClassYAML, nginx, ingress("}\nspec:\n  ingressClassName: nginx")}, gw: def, want: 0},
		{name: "legacy annotation", docs: []string{defaultClassYAML, ingress(", annotations: {kubernetes.io/ingress.class: nginx}}\nspec:")}, gw: def, want: 0},
		{name: "class without a default mark", docs: []string{ingresstest.IngressClassYAML("causeway", false, ""), ingress("}\nspec:")}, gw: def, want: 0},
		{name: "parameters", gw: "edge/public", want: 1, docs: []string{strings.Replace(strings.Split(kubeIngressGatewayYAML, "---")[0], "causeway-system, name: causeway-ingress", "edge, name: public", 1),
			ingresstest.IngressClassYAML("causeway", true, "{apiGroup: gateway.networking.k8s.io, kind: Gateway, scope: Namespace, namespace: edge, name: public}"), ingress("}\nspec:")}},
		{name: "parameters of another kind", gw: def, want: 0, error: "spec.parameters must name a Gateway",
			docs: []string{ingresstest.IngressClassYAML("causeway", true, "{kind: ConfigMap, name: x}"), ingress("}\nspec:")}},
		{name: "cluster-scoped parameters", gw: def, want: 0, error: "scope Namespace and a namespace are required",
			docs: []string{ingresstest.IngressClassYAML("causeway", true, "{apiGroup: gateway.networking.k8s.io, kind: Gateway, name: causeway-ingress}"), ingress("}\nspec:")}},
		{name: "a missing Gateway", gw: def, want: 0, error: "Gateway edge/none not found",
			docs: []string{ingresstest.IngressClassYAML("causeway", true, "{apiGroup: gateway.networking.k8s.io, kind: Gateway, scope: Namespace, namespace: edge, name: none}"), ingress("}\nspec:")}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var s *Snapshot
			docs := append([]string{kubeIngressGatewayYAML}, c.docs...)
			if c.error != "" {
				var err error
				s, err = translateYAML(t, docs...)
				wantProblem(t, err, "", c.error)
			} else {
				s = mustTranslate(t, docs...)
			}
			if got := routes(s, c.gw); got != c.want {
				t.Errorf("%d routes on %s's listeners, want %d", got, c.gw, c.want)
			}
		})
	}
}

// An invalid Ingress is refused, with a problem naming what is wrong, and
// serves nowhere; so is one no listener admits.
func TestKubeIngressRefused(t *testing.T) {
	ca, err := backendtlstest.NewCA("kube ingress test")
	if err != nil {
		t.Fatal(err)
	}
	own := secretYAML(t, ca, "causeway-system", "own", "gateway.example.net")
	other := secretYAML(t, ca, "shop", "other-tls", "other.example.com")
	rule := func(host, path string) string {
		return "  rules:\n  - host: " + host + "\n    http:\n      paths: [" + path + "]\n"
	}
	ok := `{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}`
	for _, c := range []struct{ name, spec, error string }{
		{"resource backend", rule("a.example.com", `{path: /, pathType: Prefix, backend: {resource: {apiGroup: x.io, kind: Bucket, name: b}}}`), "resource backends are not supported"},
		{"missing port", rule("a.example.com", `{path: /, pathType: Prefix, backend: {service: {name: web, port: {}}}}`), "exactly one of port number and port name"},
		{"unknown port name", rule("a.example.com", `{path: /, pathType: Prefix, backend: {service: {name: api, port: {name: grpc}}}}`), `has no port named "grpc"`},
		{"bad host", rule("a_b.example.com", ok), `host "a_b.example.com"`},
		{"wildcard inside", rule("a.*.example.com", ok), `host "a.*.example.com"`},
		{"relative path", rule("a.example.com", `{path: x, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}`), "must begin with /"},
		{"no pathType", rule("a.example.com", `{path: /, backend: {service: {name: web, port: {number: 80}}}}`), "pathType is required"},
		{"unknown pathType", rule("a.example.com", `{path: /, pathType: Regex, backend: {service: {name: web, port: {number: 80}}}}`), `unknown pathType "Regex"`},
		{"missing Secret", "  tls: [{hosts: [a.example.com], secretName: absent}]\n" + rule("a.example.com", ok), "Secret shop/absent not found"},
		{"Secret of another host", "  tls: [{hosts: [a.example.com], secretName: other-tls}]\n" + rule("a.example.com", ok), "not valid for host a.example.com"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ing := "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {namespace: shop, name: bad}\nspec:\n" + c.spec
			s, err := translateYAML(t, kubeIngressGatewayYAML, defaultClassYAML, own, other, ing)
			wantProblem(t, err, "file4.yaml", c.error)
			for _, l := range s.IngressGateways["causeway-system/causeway-ingress"].GetListeners() {
				if len(l.GetHttpRoutes()) > 0 || len(l.GetCertificates()) > 1 {
					t.Errorf("the refused Ingress is served on %s", l.GetName())
				}
			}
		})
	}
	// The Gateway's listeners admit only their own namespace's routes.
	sameNS := strings.ReplaceAll(kubeIngressGatewayYAML, ", allowedRoutes: {namespaces: {from: All}}", "")
	sameNS = strings.ReplaceAll(sameNS, "    allowedRoutes: {namespaces: {from: All}}\n", "")
	_, err = translateYAML(t, sameNS, defaultClassYAML, own, "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {namespace: shop, name: bad}\nspec:\n"+rule("a.example.com", ok))
	wantProblem(t, err, "file3.yaml", "not served by Gateway causeway-system/causeway-ingress: the allowedRoutes")
}

// CheckIngress, the webhook's check, refuses what the translation refuses
// without looking anything up; a backend Service or Secret that does not
// exist (yet) is no refusal.
func TestCheckIngress(t *testing.T) {
	var ing networkingv1.Ingress
	if err := yaml.UnmarshalStrict([]byte(`
metadata: {namespace: shop, name: store}
spec:
  tls: [{hosts: ["a_b.example.com"], secretName: absent}]
  defaultBackend: {resource: {apiGroup: x.io, kind: Bucket, name: b}}
  rules:
  - host: "*.example.com"
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: absent, port: {name: http}}}}
      - {path: x, pathType: Exact, backend: {service: {name: absent, port: {number: 80}}}}
`), &ing); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(CheckIngress(&ing), "\n")
	for _, want := range []string{"tls 0: host \"a_b.example.com\"", "defaultBackend: resource backends are not supported", "rule 0 path 1: path \"x\" must begin with /"} {
		if !strings.Contains(got, want) {
			t.Errorf("problems %q lack %q", got, want)
		}
	}
	if n := len(CheckIngress(&ing)); n != 3 {
		t.Errorf("%d problems, want 3: %q", n, got)
	}
}
