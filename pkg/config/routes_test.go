package config

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

const routeServices = `
apiVersion: v1
kind: Service
metadata: {name: reviews, namespace: shop}
spec: {clusterIP: 127.0.20.1, ports: [{name: http, port: 80, appProtocol: http}]}
---
apiVersion: v1
kind: Service
metadata: {name: v2, namespace: shop}
spec: {clusterIP: 127.0.20.2, ports: [{name: http, port: 80}, {name: alt, port: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: ext, namespace: shop}
spec: {type: ExternalName, externalName: example.com}
---
apiVersion: v1
kind: Service
metadata: {name: remote, namespace: other}
spec: {clusterIP: 127.0.20.3, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: private, namespace: other}
spec: {clusterIP: 127.0.20.4, ports: [{port: 80}]}
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: shop-to-remote, namespace: other}
spec:
  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: shop}, {group: gateway.networking.k8s.io, kind: GRPCRoute, namespace: shop}]
  to: [{group: "", kind: Service, name: remote}]
`

func httpRouteYAML(rules string) string {
	return `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: shop}
spec:
  parentRefs: [{group: "", kind: Service, name: reviews, port: 80}]
  rules:
` + indent(rules, "  ")
}

func indent(s, prefix string) string {
	lines := strings.Split(strings.Trim(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = prefix + l
	}
	return strings.Join(lines, "\n") + "\n"
}

func prefixMatch(v string) *meshv1.HTTPRouteMatch {
	return &meshv1.HTTPRouteMatch{Path: &meshv1.PathMatch{Type: meshv1.PathMatch_PATH_PREFIX, Value: v}}
}

func backend(ns, name string, port, weight uint32) *meshv1.HTTPBackendRef {
	return &meshv1.HTTPBackendRef{Backend: &meshv1.BackendRef{Namespace: ns, Name: name, Port: port}, Weight: weight}
}

func invalidBackend(ns, name string, port uint32, reason string) *meshv1.HTTPBackendRef {
	b := backend(ns, name, port, 1)
	b.Backend.InvalidReason = reason
	return b
}

func pct(v float64) *float64 { return &v }

// TestHTTPRouteTranslationTable covers every match type and filter of
// Gateway API v1 HTTPRoute, the defaults the translation writes out, and
// backend resolution.
func TestHTTPRouteTranslationTable(t *testing.T) {
	cases := []struct {
		name  string
		rules string
		want  *meshv1.HTTPRouteRule
	}{
		{
			name:  "defaults: no match is PathPrefix /, weight 1",
			rules: `- backendRefs: [{name: reviews, port: 80}]`,
			want: &meshv1.HTTPRouteRule{
				Matches:  []*meshv1.HTTPRouteMatch{prefixMatch("/")},
				Backends: []*meshv1.HTTPBackendRef{backend("shop", "reviews", 80, 1)},
			},
		},
		{
			name:  "path match without type is PathPrefix; without value is /",
			rules: "- matches: [{path: {value: /api}}, {path: {type: PathPrefix}}, {headers: [{name: X-A, value: b}]}]",
			want: &meshv1.HTTPRouteRule{Matches: []*meshv1.HTTPRouteMatch{
				prefixMatch("/api"), prefixMatch("/"),
				{Path: &meshv1.PathMatch{Value: "/"}, Headers: []*meshv1.StringMatch{{Name: "x-a", Value: "b"}}},
			}},
		},
		{
			name:  "path Exact and RegularExpression",
			rules: `- matches: [{path: {type: Exact, value: /a/b}}, {path: {type: RegularExpression, value: "/v[0-9]+/.*"}}]`,
			want: &meshv1.HTTPRouteRule{Matches: []*meshv1.HTTPRouteMatch{
				{Path: &meshv1.PathMatch{Type: meshv1.PathMatch_EXACT, Value: "/a/b"}},
				{Path: &meshv1.PathMatch{Type: meshv1.PathMatch_REGULAR_EXPRESSION, Value: "/v[0-9]+/.*"}},
			}},
		},
		{
			name: "headers: Exact default, RegularExpression, names lower-cased, later duplicates ignored",
			rules: `
- matches:
  - headers:
    - {name: X-Version, value: v2}
    - {name: x-user, type: RegularExpression, value: "^(alice|bob)$"}
    - {name: x-version, value: ignored}`,
			want: &meshv1.HTTPRouteRule{Matches: []*meshv1.HTTPRouteMatch{{
				Path: &meshv1.PathMatch{Value: "/"},
				Headers: []*meshv1.StringMatch{
					{Name: "x-version", Value: "v2"},
					{Type: meshv1.StringMatch_REGULAR_EXPRESSION, Name: "x-user", Value: "^(alice|bob)$"},
				},
			}}},
		},
		{
			name:  "query params: Exact default, RegularExpression, names case-sensitive",
			rules: `- matches: [{queryParams: [{name: Debug, value: "1"}, {name: q, type: RegularExpression, value: "a.*"}]}]`,
			want: &meshv1.HTTPRouteRule{Matches: []*meshv1.HTTPRouteMatch{{
				Path: &meshv1.PathMatch{Value: "/"},
				QueryParams: []*meshv1.StringMatch{
					{Name: "Debug", Value: "1"},
					{Type: meshv1.StringMatch_REGULAR_EXPRESSION, Name: "q", Value: "a.*"},
				},
			}}},
		},
		{
			name:  "method",
			rules: `- matches: [{method: POST, path: {type: Exact, value: /orders}}]`,
			want: &meshv1.HTTPRouteRule{Matches: []*meshv1.HTTPRouteMatch{{
				Path: &meshv1.PathMatch{Type: meshv1.PathMatch_EXACT, Value: "/orders"}, Method: "POST",
			}}},
		},
		{
			name: "request and response header modifiers",
			rules: `
- filters:
  - type: RequestHeaderModifier
    requestHeaderModifier: {set: [{name: X-Set, value: a}], add: [{name: X-Add, value: b}], remove: [X-Gone]}
  - type: ResponseHeaderModifier
    responseHeaderModifier: {add: [{name: x-routed-by, value: waypoint}]}`,
			want: &meshv1.HTTPRouteRule{
				Matches: []*meshv1.HTTPRouteMatch{prefixMatch("/")},
				Filters: []*meshv1.HTTPRouteFilter{
					{Filter: &meshv1.HTTPRouteFilter_RequestHeaderModifier{RequestHeaderModifier: &meshv1.HeaderModifier{
						Set: []*meshv1.Header{{Name: "x-set", Value: "a"}}, Add: []*meshv1.Header{{Name: "x-add", Value: "b"}}, Remove: []string{"x-gone"},
					}}},
					{Filter: &meshv1.HTTPRouteFilter_ResponseHeaderModifier{ResponseHeaderModifier: &meshv1.HeaderModifier{
						Add: []*meshv1.Header{{Name: "x-routed-by", Value: "waypoint"}},
					}}},
				},
			},
		},
		{
			name:  "redirect defaults to 302",
			rules: `- filters: [{type: RequestRedirect, requestRedirect: {scheme: https}}]`,
			want: &meshv1.HTTPRouteRule{
				Matches: []*meshv1.HTTPRouteMatch{prefixMatch("/")},
				Filters: []*meshv1.HTTPRouteFilter{{Filter: &meshv1.HTTPRouteFilter_RequestRedirect{RequestRedirect: &meshv1.RequestRedirect{Scheme: "https", StatusCode: 302}}}},
			},
		},
		{
			name: "redirect with every field and a prefix replacement",
			rules: `
- matches: [{path: {type: PathPrefix, value: /old}}]
  filters:
  - type: RequestRedirect
    requestRedirect: {scheme: http, hostname: New.Example, port: 8080, statusCode: 301, path: {type: ReplacePrefixMatch, replacePrefixMatch: /new}}`,
			want: &meshv1.HTTPRouteRule{
				Matches: []*meshv1.HTTPRouteMatch{prefixMatch("/old")},
				Filters: []*meshv1.HTTPRouteFilter{{Filter: &meshv1.HTTPRouteFilter_RequestRedirect{RequestRedirect: &meshv1.RequestRedirect{
					Scheme: "http", Hostname: "new.example", Port: 8080, StatusCode: 301,
					Path: &meshv1.PathModifier{Type: meshv1.PathModifier_REPLACE_PREFIX_MATCH, Value: "/new"},
				}}}},
			},
		},
		{
			name:  "URL rewrite: hostname and full path",
			rules: `- filters: [{type: URLRewrite, urlRewrite: {hostname: internal, path: {type: ReplaceFullPath, replaceFullPath: /x}}}]`,
			want: &meshv1.HTTPRouteRule{
				Matches: []*meshv1.HTTPRouteMatch{prefixMatch("/")},
				Filters: []*meshv1.HTTPRouteFilter{{Filter: &meshv1.HTTPRouteFilter_UrlRewrite{UrlRewrite: &meshv1.URLRewrite{
					Hostname: "internal", Path: &meshv1.PathModifier{Type: meshv1.PathModifier_REPLACE_FULL_PATH, Value: "/x"},
				}}}},
			},
		},
		{
			name: "request mirror: all, percent, fraction",
			rules: `
- filters:
  - {type: RequestMirror, requestMirror: {backendRef: {name: v2, port: 8080}}}
  - {type: RequestMirror, requestMirror: {backendRef: {name: v2, port: 80}, percent: 25}}
  - {type: RequestMirror, requestMirror: {backendRef: {name: remote, namespace: other, port: 80}, fraction: {numerator: 1, denominator: 8}}}`,
			want: &meshv1.HTTPRouteRule{
				Matches: []*meshv1.HTTPRouteMatch{prefixMatch("/")},
				Filters: []*meshv1.HTTPRouteFilter{
					{Filter: &meshv1.HTTPRouteFilter_RequestMirror{RequestMirror: &meshv1.RequestMirror{Backend: &meshv1.BackendRef{Namespace: "shop", Name: "v2", Port: 8080}}}},
					{Filter: &meshv1.HTTPRouteFilter_RequestMirror{RequestMirror: &meshv1.RequestMirror{Backend: &meshv1.BackendRef{Namespace: "shop", Name: "v2", Port: 80}, Percent: pct(25)}}},
					{Filter: &meshv1.HTTPRouteFilter_RequestMirror{RequestMirror: &meshv1.RequestMirror{Backend: &meshv1.BackendRef{Namespace: "other", Name: "remote", Port: 80}, Percent: pct(12.5)}}},
				},
			},
		},
		{
			name: "CORS with the default max age",
			rules: `
- filters:
  - type: CORS
    cors: {allowOrigins: ["https://*.example.com"], allowCredentials: true, allowMethods: [GET, POST], allowHeaders: [X-Token], exposeHeaders: [X-Trace]}`,
			want: &meshv1.HTTPRouteRule{
				Matches: []*meshv1.HTTPRouteMatch{prefixMatch("/")},
				Filters: []*meshv1.HTTPRouteFilter{{Filter: &meshv1.HTTPRouteFilter_Cors{Cors: &meshv1.CORS{
					AllowOrigins: []string{"https://*.example.com"}, AllowCredentials: true, AllowMethods: []string{"GET", "POST"},
					AllowHeaders: []string{"x-token"}, ExposeHeaders: []string{"x-trace"}, MaxAgeSeconds: 5,
				}}}},
			},
		},
		{
			name: "ExtensionRef and ExternalAuth are never skipped: the rule answers 500",
			rules: `
- filters:
  - {type: ExtensionRef, extensionRef: {group: example.com, kind: Fancy, name: f}}
  - {type: ExternalAuth, externalAuth: {protocol: HTTP, backendRef: {name: v2, port: 80}}}
  backendRefs: [{name: reviews, port: 80}]`,
			want: &meshv1.HTTPRouteRule{
				Matches:       []*meshv1.HTTPRouteMatch{prefixMatch("/")},
				Backends:      []*meshv1.HTTPBackendRef{backend("shop", "reviews", 80, 1)},
				InvalidReason: "unsupported filter ExtensionRef example.com/Fancy f; unsupported filter ExternalAuth",
			},
		},
		{
			name: "weights and per-backend filters",
			rules: `
- name: split
  backendRefs:
  - {name: reviews, port: 80, weight: 80}
  - name: v2
    port: 80
    weight: 0
    filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: x-canary, value: "1"}]}}]`,
			want: &meshv1.HTTPRouteRule{
				Name:    "split",
				Matches: []*meshv1.HTTPRouteMatch{prefixMatch("/")},
				Backends: []*meshv1.HTTPBackendRef{
					backend("shop", "reviews", 80, 80),
					{Backend: &meshv1.BackendRef{Namespace: "shop", Name: "v2", Port: 80}, Weight: 0, Filters: []*meshv1.HTTPRouteFilter{
						{Filter: &meshv1.HTTPRouteFilter_RequestHeaderModifier{RequestHeaderModifier: &meshv1.HeaderModifier{Set: []*meshv1.Header{{Name: "x-canary", Value: "1"}}}}},
					}},
				},
			},
		},
		{
			name: "invalid backends keep their share and say why",
			rules: `
- backendRefs:
  - {name: missing, port: 80}
  - {name: v2, port: 9999}
  - {name: v2}
  - {name: ext, port: 80}
  - {group: example.com, kind: Bucket, name: b}
  - {name: private, namespace: other, port: 80}
  - {name: remote, namespace: other, port: 80}
  - name: reviews
    port: 80
    filters: [{type: ExtensionRef, extensionRef: {group: example.com, kind: Fancy, name: f}}]`,
			want: &meshv1.HTTPRouteRule{
				Matches: []*meshv1.HTTPRouteMatch{prefixMatch("/")},
				Backends: []*meshv1.HTTPBackendRef{
					invalidBackend("shop", "missing", 80, "Service shop/missing not found"),
					invalidBackend("shop", "v2", 9999, "Service shop/v2 has no port 9999"),
					invalidBackend("shop", "v2", 0, "port is required for a Service backend"),
					invalidBackend("shop", "ext", 80, "Service shop/ext is an ExternalName service, which is not supported"),
					invalidBackend("shop", "b", 0, `unsupported backend kind Bucket (group "example.com"): only Services are supported`),
					invalidBackend("other", "private", 80, "reference from HTTPRoute in namespace shop to Service other/private is not permitted by a ReferenceGrant"),
					backend("other", "remote", 80, 1),
					invalidBackend("shop", "reviews", 80, "unsupported filter ExtensionRef example.com/Fancy f"),
				},
			},
		},
		{
			name: "timeouts and retry (attempts default 1)",
			rules: `
- timeouts: {request: 10s, backendRequest: 2s500ms}
  retry: {codes: [503, 504], backoff: 100ms}
- retry: {attempts: 3}
  timeouts: {request: 0s}`,
			want: &meshv1.HTTPRouteRule{
				Matches:               []*meshv1.HTTPRouteMatch{prefixMatch("/")},
				RequestTimeout:        durationpb.New(10 * time.Second),
				BackendRequestTimeout: durationpb.New(2500 * time.Millisecond),
				Retry:                 &meshv1.HTTPRouteRetry{Codes: []uint32{503, 504}, Attempts: 1, Backoff: durationpb.New(100 * time.Millisecond)},
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := mustTranslate(t, routeServices, httpRouteYAML(c.rules))
			r := s.HTTPRoutes["shop/r"]
			if r == nil {
				t.Fatalf("route not translated; have %v", s.HTTPRoutes)
			}
			assertProto(t, "rule 0", c.want, r.Rules[0])
		})
	}
}

func TestHTTPRouteSecondRuleOfTimeoutCase(t *testing.T) {
	s := mustTranslate(t, routeServices, httpRouteYAML(`
- matches: [{path: {value: /a}}]
- retry: {attempts: 3}
  timeouts: {request: 0s}`))
	r := s.HTTPRoutes["shop/r"].Rules[1]
	assertProto(t, "rule 1", &meshv1.HTTPRouteRule{
		Matches:        []*meshv1.HTTPRouteMatch{prefixMatch("/")},
		RequestTimeout: durationpb.New(0), // 0s: explicitly no timeout
		Retry:          &meshv1.HTTPRouteRetry{Attempts: 3},
	}, r)
}

func TestHTTPRouteMetadata(t *testing.T) {
	s := mustTranslate(t, routeServices, `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: meta, namespace: shop, creationTimestamp: "2026-01-02T03:04:05Z"}
spec:
  hostnames: [Reviews.Shop.svc.cluster.local]
  parentRefs:
  - {group: "", kind: Service, name: reviews}
  - {group: "", kind: Service, name: remote, namespace: other, port: 80}
  - {name: ingress}   # a Gateway parent: not mesh traffic, ignored
  rules: [{backendRefs: [{name: reviews, port: 80}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: ingress-only, namespace: shop}
spec:
  parentRefs: [{name: ingress}]
  rules: [{backendRefs: [{name: reviews, port: 80}]}]
`)
	r := s.HTTPRoutes["shop/meta"]
	assertProto(t, "route", &meshv1.HTTPRoute{
		Name: "meta", Namespace: "shop",
		CreationTime: timestamppb.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)),
		Parents:      []*meshv1.ParentRef{{Namespace: "shop", Name: "reviews"}, {Namespace: "other", Name: "remote", Port: 80}},
		Hostnames:    []string{"reviews.shop.svc.cluster.local"},
		Rules: []*meshv1.HTTPRouteRule{{
			Matches:  []*meshv1.HTTPRouteMatch{prefixMatch("/")},
			Backends: []*meshv1.HTTPBackendRef{backend("shop", "reviews", 80, 1)},
		}},
	}, r)
	if _, ok := s.HTTPRoutes["shop/ingress-only"]; ok {
		t.Error("a route with no Service parent must not be served to the mesh")
	}
}

func TestHTTPRouteRejections(t *testing.T) {
	cases := []struct{ name, rules, reason string }{
		{"bad path regex", `- matches: [{path: {type: RegularExpression, value: "(["}}]`, "regular expression"},
		{"bad header regex", `- matches: [{headers: [{name: a, type: RegularExpression, value: "a(b"}]}]`, "regular expression"},
		{"relative path", `- matches: [{path: {type: Exact, value: api}}]`, "must start with /"},
		{"unnormalized path", `- matches: [{path: {value: /a/../b}}]`, "not a normalized path"},
		{"filter without its field", `- filters: [{type: RequestHeaderModifier}]`, "needs field requestHeaderModifier"},
		{"prefix rewrite with exact match", `
- matches: [{path: {type: Exact, value: /a}}]
  filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /b}}}]`, "ReplacePrefixMatch needs exactly one PathPrefix match"},
		{"bad duration", `- timeouts: {request: 10 seconds}`, "not a Gateway API duration"},
		{"backend timeout above request timeout", `- timeouts: {request: 1s, backendRequest: 2s}`, "cannot be longer"},
		{"retry code out of range", `- retry: {codes: [200]}`, "not in 400-599"},
		{"redirect status", `- filters: [{type: RequestRedirect, requestRedirect: {statusCode: 200}}]`, "redirect status 200"},
		{"mirror percent and fraction", `- filters: [{type: RequestMirror, requestMirror: {backendRef: {name: v2, port: 80}, percent: 5, fraction: {numerator: 1}}}]`, "only one of percent or fraction"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := translateYAML(t, routeServices, httpRouteYAML(c.rules))
			wantProblem(t, err, "file1.yaml", c.reason)
		})
	}
	t.Run("dangling parent", func(t *testing.T) {
		_, err := translateYAML(t, routeServices, `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: shop}
spec:
  parentRefs: [{group: "", kind: Service, name: nope}]
`)
		wantProblem(t, err, "file1.yaml", "dangling reference: parentRef Service shop/nope does not exist")
	})
	t.Run("parent port", func(t *testing.T) {
		_, err := translateYAML(t, routeServices, `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: shop}
spec:
  parentRefs: [{group: "", kind: Service, name: reviews, port: 81}]
`)
		wantProblem(t, err, "file1.yaml", "has no port 81")
	})
}

func grpcRouteYAML(rules string) string {
	return `
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: g, namespace: shop}
spec:
  parentRefs: [{group: "", kind: Service, name: reviews}]
  rules:
` + indent(rules, "  ")
}

func TestGRPCRouteTranslationTable(t *testing.T) {
	cases := []struct {
		name  string
		rules string
		want  *meshv1.GRPCRouteRule
	}{
		{
			name:  "no match matches everything; weight default 1",
			rules: `- backendRefs: [{name: reviews, port: 80}]`,
			want: &meshv1.GRPCRouteRule{
				Matches:  []*meshv1.GRPCRouteMatch{{}},
				Backends: []*meshv1.HTTPBackendRef{backend("shop", "reviews", 80, 1)},
			},
		},
		{
			name: "method Exact default, RegularExpression, headers",
			rules: `
- matches:
  - method: {service: shop.Ratings}
  - method: {service: shop.Ratings, method: Get}
  - method: {type: RegularExpression, service: "shop\\..*", method: "Get.*"}
    headers: [{name: X-Tenant, value: a}, {name: x-b, type: RegularExpression, value: "b+"}]`,
			want: &meshv1.GRPCRouteRule{Matches: []*meshv1.GRPCRouteMatch{
				{Method: &meshv1.GRPCMethodMatch{Service: "shop.Ratings"}},
				{Method: &meshv1.GRPCMethodMatch{Service: "shop.Ratings", Method: "Get"}},
				{
					Method:  &meshv1.GRPCMethodMatch{Type: meshv1.GRPCMethodMatch_REGULAR_EXPRESSION, Service: `shop\..*`, Method: "Get.*"},
					Headers: []*meshv1.StringMatch{{Name: "x-tenant", Value: "a"}, {Type: meshv1.StringMatch_REGULAR_EXPRESSION, Name: "x-b", Value: "b+"}},
				},
			}},
		},
		{
			name: "filters and backends",
			rules: `
- filters:
  - {type: RequestHeaderModifier, requestHeaderModifier: {add: [{name: x-a, value: "1"}]}}
  - {type: ResponseHeaderModifier, responseHeaderModifier: {remove: [x-b]}}
  - {type: RequestMirror, requestMirror: {backendRef: {name: v2, port: 80}}}
  backendRefs:
  - {name: remote, namespace: other, port: 80, weight: 3}
  - name: v2
    port: 80
    filters: [{type: ExtensionRef, extensionRef: {group: example.com, kind: K, name: nf}}]`,
			want: &meshv1.GRPCRouteRule{
				Matches: []*meshv1.GRPCRouteMatch{{}},
				Filters: []*meshv1.HTTPRouteFilter{
					{Filter: &meshv1.HTTPRouteFilter_RequestHeaderModifier{RequestHeaderModifier: &meshv1.HeaderModifier{Add: []*meshv1.Header{{Name: "x-a", Value: "1"}}}}},
					{Filter: &meshv1.HTTPRouteFilter_ResponseHeaderModifier{ResponseHeaderModifier: &meshv1.HeaderModifier{Remove: []string{"x-b"}}}},
					{Filter: &meshv1.HTTPRouteFilter_RequestMirror{RequestMirror: &meshv1.RequestMirror{Backend: &meshv1.BackendRef{Namespace: "shop", Name: "v2", Port: 80}}}},
				},
				Backends: []*meshv1.HTTPBackendRef{
					backend("other", "remote", 80, 3),
					invalidBackend("shop", "v2", 80, "unsupported filter ExtensionRef example.com/K nf"),
				},
			},
		},
		{
			name:  "rule-level ExtensionRef answers 500",
			rules: `- filters: [{type: ExtensionRef, extensionRef: {group: example.com, kind: K, name: nf}}]`,
			want: &meshv1.GRPCRouteRule{
				Matches:       []*meshv1.GRPCRouteMatch{{}},
				InvalidReason: "unsupported filter ExtensionRef example.com/K nf",
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := mustTranslate(t, routeServices, grpcRouteYAML(c.rules))
			r := s.GRPCRoutes["shop/g"]
			if r == nil {
				t.Fatalf("route not translated")
			}
			assertProto(t, "rule 0", c.want, r.Rules[0])
		})
	}
	t.Run("method match needs service or method", func(t *testing.T) {
		_, err := translateYAML(t, routeServices, grpcRouteYAML(`- matches: [{method: {type: Exact}}]`))
		wantProblem(t, err, "file1.yaml", "needs service or method")
	})
	t.Run("bad method regex", func(t *testing.T) {
		_, err := translateYAML(t, routeServices, grpcRouteYAML(`- matches: [{method: {type: RegularExpression, service: "("}}]`))
		wantProblem(t, err, "file1.yaml", "regular expression")
	})
}

// The conformance MeshConsumerRoute manifest: a route in the consumer's
// namespace whose parent and backend are the producer's Service. The
// backend is the parent itself, so it needs no ReferenceGrant; another
// Service of the producer's namespace still does.
func TestConsumerRouteBackendIsItsParent(t *testing.T) {
	s := mustTranslate(t, routeServices, `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: mesh-echo-add-header, namespace: consumer}
spec:
  parentRefs: [{group: "", kind: Service, name: private, namespace: other}]
  rules:
  - filters: [{type: ResponseHeaderModifier, responseHeaderModifier: {set: [{name: X-Header-Set, value: set}]}}]
    backendRefs:
    - {name: private, namespace: other, port: 80}
    - {name: remote, namespace: other, port: 80, weight: 0}
`)
	r := s.HTTPRoutes["consumer/mesh-echo-add-header"]
	if r == nil {
		t.Fatalf("consumer route not translated: %v", s.HTTPRoutes)
	}
	bs := r.GetRules()[0].GetBackends()
	if reason := bs[0].GetBackend().GetInvalidReason(); reason != "" {
		t.Errorf("backend to the route's parent: %s", reason)
	}
	if reason := bs[1].GetBackend().GetInvalidReason(); !strings.Contains(reason, "not permitted by a ReferenceGrant") {
		t.Errorf("backend to another Service of the parent's namespace: %q, want a missing ReferenceGrant", reason)
	}
}
