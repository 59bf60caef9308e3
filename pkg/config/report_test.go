package config

import (
	"reflect"
	"strings"
	"testing"

	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"
)

func analyzeYAML(t *testing.T, docs string) *Reports {
	t.Helper()
	objs, err := Decode("file0.yaml", []byte(docs))
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	return Analyze(objs, Options{})
}

func TestAnalyzeRouteReports(t *testing.T) {
	r := analyzeYAML(t, routeServices+`---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: good, namespace: shop}
spec:
  parentRefs: [{group: "", kind: Service, name: reviews}]
  rules: [{backendRefs: [{name: v2, port: 80}, {name: remote, namespace: other, port: 80}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: refs, namespace: shop}
spec:
  parentRefs: [{name: ingress}, {group: "", kind: Service, name: missing}, {group: "", kind: Service, name: reviews}]
  rules:
  - backendRefs: [{name: private, namespace: other, port: 80}, {name: v2, port: 9}, {name: x, kind: Bucket, group: s3.example.com}]
  - filters: [{type: ExtensionRef, extensionRef: {group: example.com, kind: Magic, name: m}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: bad, namespace: shop}
spec:
  parentRefs: [{group: "", kind: Service, name: reviews}]
  rules: [{matches: [{path: {type: RegularExpression, value: "("}}]}]
`)
	if r.Err != nil {
		t.Fatalf("a missing parent and a bad regex refuse those objects, not the configuration: %v", r.Err)
	}
	good := r.Routes["HTTPRoute shop/good"]
	if want := (&RouteReport{Parents: []ParentReport{{Index: 0, Service: "shop/reviews"}}}); !reflect.DeepEqual(good, want) {
		t.Errorf("good route: got %+v, want %+v", good, want)
	}
	refs := r.Routes["HTTPRoute shop/refs"]
	if want := []ParentReport{{Index: 1, Problem: "dangling reference: parentRef Service shop/missing does not exist"}, {Index: 2, Service: "shop/reviews"}}; !reflect.DeepEqual(refs.Parents, want) {
		t.Errorf("parents: got %+v, want %+v", refs.Parents, want)
	}
	if len(refs.Problems) != 0 {
		t.Errorf("a parent's problem is not the route's: %q", refs.Problems)
	}
	var reasons []gwv1.RouteConditionReason
	for _, ri := range refs.Refs {
		reasons = append(reasons, ri.Reason)
	}
	if want := []gwv1.RouteConditionReason{gwv1.RouteReasonRefNotPermitted, gwv1.RouteReasonBackendNotFound, gwv1.RouteReasonInvalidKind}; !reflect.DeepEqual(reasons, want) {
		t.Errorf("ref reasons: got %v, want %v (%+v)", reasons, want, refs.Refs)
	}
	if len(refs.Unsupported) != 1 || !strings.Contains(refs.Unsupported[0], "rule 1: unsupported filter ExtensionRef") {
		t.Errorf("unsupported: %q", refs.Unsupported)
	}
	if p := r.Problems["HTTPRoute shop/bad"]; len(p) != 1 {
		t.Errorf("problems of the bad route by object: %q", p)
	}
	bad := r.Routes["HTTPRoute shop/bad"]
	if len(bad.Problems) != 1 || !strings.Contains(bad.Problems[0], "regular expression") {
		t.Errorf("bad route problems: %q", bad.Problems)
	}
}

func TestAnalyzeServiceBindings(t *testing.T) {
	r := analyzeYAML(t, bindingConfig(map[string]string{LabelUseWaypoint: "wp-svc"}, nil, nil)+`---
apiVersion: v1
kind: Service
metadata: {name: lost, namespace: app, labels: {causeway.dev/use-waypoint: gone}}
spec: {clusterIP: 127.0.20.90, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: wrongkind, namespace: app, labels: {causeway.dev/use-waypoint: wp-wl}}
spec: {clusterIP: 127.0.20.91, ports: [{port: 80}]}
`)
	want := map[string]WaypointBinding{
		"app/s":         {Waypoint: "app/wp-svc"},
		"app/lost":      {Waypoint: "app/gone", Problem: "waypoint app/gone does not exist: no Gateway of class causeway-waypoint named gone in namespace app; the Service's traffic is refused"},
		"app/wrongkind": {Waypoint: "app/wp-wl", Problem: "waypoint app/wp-wl serves workload traffic only (label causeway.dev/waypoint-for=workload)"},
	}
	if !reflect.DeepEqual(r.Services, want) {
		t.Errorf("bindings:\n got %+v\nwant %+v", r.Services, want)
	}
}

func TestCheckRoute(t *testing.T) {
	for _, c := range []struct {
		name, route string
		want        []string // substrings, one per reason
	}{
		{name: "valid, references not checked", route: `
kind: HTTPRoute
metadata: {name: r, namespace: shop}
spec:
  parentRefs: [{group: "", kind: Service, name: nowhere}]
  rules: [{matches: [{path: {type: PathPrefix, value: /api}}], backendRefs: [{name: absent, namespace: elsewhere, port: 80}]}]
`},
		{name: "bad match and unsupported filter", route: `
kind: HTTPRoute
metadata: {name: r, namespace: shop}
spec:
  rules:
  - matches: [{path: {type: PathPrefix, value: "api"}}, {headers: [{name: x, type: RegularExpression, value: "[" }]}]
  - filters: [{type: ExtensionRef, extensionRef: {group: example.com, kind: Magic, name: m}}]
    backendRefs: [{name: b, port: 80, filters: [{type: RequestRedirect, requestRedirect: {statusCode: 301}}]}]
`, want: []string{`rule 0: path "api" must start with /`, "rule 0 header x: regular expression", "rule 1: unsupported filter ExtensionRef", "rule 1 backend b: unsupported backend filter RequestRedirect"}},
		{name: "grpc", route: `
kind: GRPCRoute
metadata: {name: g, namespace: shop}
spec:
  rules: [{matches: [{method: {type: Exact}}]}]
`, want: []string{"rule 0: a method match needs service or method"}},
		{name: "unknown match types, repeated names, misplaced filters", route: `
kind: HTTPRoute
metadata: {name: r, namespace: shop}
spec:
  rules:
  - matches:
    - path: {type: Glob, value: /a}
      headers: [{name: X-A, type: Glob, value: a}, {name: x-a, type: RegularExpression, value: "["}, {name: "", value: b}]
      queryParams: [{name: q, type: RegularExpression, value: "("}, {name: Q, type: Glob, value: c}]
    - path: {value: /c}
    filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /b}}}, {type: ExternalAuth}]
    backendRefs:
    - {name: b, port: 80, weight: -1, filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /b}}}, {type: Bogus}]}
`, want: []string{`rule 0: unknown path match type "Glob"`, "rule 0 header x-a: unknown match type", "rule 0 header : empty name",
			"rule 0 query q: regular expression", "rule 0 query Q: unknown match type", "rule 0: ReplacePrefixMatch needs exactly one PathPrefix match",
			"rule 0: backend weight -1 is negative", "rule 0: unsupported filter ExternalAuth",
			"rule 0 backend b: unsupported backend filter URLRewrite with ReplacePrefixMatch", `rule 0 backend b: unsupported filter type "Bogus"`}},
		{name: "grpc unknown match types and filters", route: `
kind: GRPCRoute
metadata: {name: g, namespace: shop}
spec:
  rules:
  - matches: [{method: {type: Glob, service: s}, headers: [{name: h, type: Glob, value: v}, {name: H, value: w}]}, {method: {type: RegularExpression, method: "("}}]
    filters: [{type: URLRewrite}]
    backendRefs: [{name: b, port: 80, filters: [{type: RequestMirror}, {type: Bogus}]}]
`, want: []string{`rule 0: unknown method match type "Glob"`, "rule 0 header h: unknown match type", "rule 0 method: regular expression",
			"rule 0 backend b: filter type RequestMirror needs field requestMirror", `rule 0: unsupported filter type "URLRewrite"`,
			`rule 0 backend b: unsupported filter type "Bogus"`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var route any = &gwv1.HTTPRoute{}
			if strings.Contains(c.route, "GRPCRoute") {
				route = &gwv1.GRPCRoute{}
			}
			if err := yaml.Unmarshal([]byte(c.route), route); err != nil {
				t.Fatal(err)
			}
			got := CheckRoute(route)
			if len(got) != len(c.want) {
				t.Fatalf("got %d reasons %q, want %d", len(got), got, len(c.want))
			}
			for i, w := range c.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("reason %d = %q, want it to mention %q", i, got[i], w)
				}
			}
		})
	}
}
