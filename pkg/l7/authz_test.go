package l7

import (
	"context"
	"net/http"
	"reflect"
	"slices"
	"sync"
	"testing"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

func TestAuthorization(t *testing.T) {
	h := newHarness(t)
	h.addService("web", "http")
	h.backend("v1", "http", false)
	r := to("v1", prefixM("/"))
	r.Name = "all"
	h.update([]*meshv1.HTTPRoute{httpRoute("r", epoch,
		withFilters(to("v1", prefixM("/moved")), redirect(&meshv1.RequestRedirect{Hostname: "elsewhere.example"})),
		withFilters(to("v1", prefixM("/filtered")), reqHeaders([]*meshv1.Header{hv("X-Secret", "from-filter")}, nil), rewrite("", false, "/rewritten")),
		to("v1", exactM("/admin")),
		r,
	)}, nil)
	c := h1Client(h.front(webInfo(trust.Unauthenticated())))

	var mu sync.Mutex
	var calls []*AuthzRequest
	// Every request gets the same Decision, as from a decision cache: the
	// engine must leave its maps and lists as they were.
	var current, was Decision
	unchanged := func() {
		if !reflect.DeepEqual(current.Headers, was.Headers) || !reflect.DeepEqual(current.ResponseHeadersToAdd, was.ResponseHeadersToAdd) ||
			!reflect.DeepEqual(current.RequestHeadersToRemove, was.RequestHeadersToRemove) {
			t.Errorf("serving requests changed the decision: now %+v, was %+v", current, was)
		}
	}
	t.Cleanup(unchanged)
	decide := func(d Decision) {
		unchanged()
		current = d
		was = Decision{Headers: d.Headers.Clone(), ResponseHeadersToAdd: d.ResponseHeadersToAdd.Clone(),
			RequestHeadersToRemove: slices.Clone(d.RequestHeadersToRemove)}
		h.setAuthz(AuthorizerFunc(func(_ context.Context, r *AuthzRequest) Decision {
			mu.Lock()
			calls = append(calls, r)
			mu.Unlock()
			return d
		}))
	}
	last := func() *AuthzRequest {
		mu.Lock()
		defer mu.Unlock()
		if len(calls) == 0 {
			return nil
		}
		return calls[len(calls)-1]
	}

	decide(Decision{Allowed: false, Reason: "no rule matched", ID: "d-1"})
	res := get(t, c, "/x", nil)
	if res.status != 403 || string(res.body) != "RBAC: access denied\n" {
		t.Errorf("default deny: %d %q", res.status, res.body)
	}
	if n := h.backends["v1"].count.Load(); n != 0 {
		t.Fatalf("a denied request reached the backend")
	}

	decide(Decision{Allowed: false, Status: 401, Body: []byte("log in first"), Headers: http.Header{"Www-Authenticate": {"Bearer"}}})
	res = get(t, c, "/x", nil)
	if res.status != 401 || string(res.body) != "log in first" || res.header.Get("WWW-Authenticate") != "Bearer" {
		t.Errorf("custom deny: %d %q %v", res.status, res.body, res.header)
	}
	decide(Decision{Allowed: false, Status: 200})
	if res = get(t, c, "/x", nil); res.status != 403 {
		t.Errorf("deny with a success status must still deny: %d", res.status)
	}

	decide(Decision{Allowed: true,
		Headers:                http.Header{"X-Authz": {"checked"}, SourcePrincipalHeader: {"spiffe://cluster.local/ns/x/sa/forged"}},
		RequestHeadersToRemove: []string{"x-secret"},
		ResponseHeadersToAdd:   http.Header{"X-Decision": {"allowed"}},
	})
	res = do(t, c, "POST", "/public/%2e%2e/admin?a=1", []byte("payload"), map[string]string{"X-Secret": "s3cret", "X-Forwarded-Client-Cert": "URI=spiffe://x"})
	if res.status != 200 || res.echo.Path != "/admin" {
		t.Fatalf("allowed: %d %q", res.status, res.body)
	}
	if res.echo.Header.Get("X-Authz") != "checked" || res.echo.Header.Get("X-Secret") != "" || res.header.Get("X-Decision") != "allowed" {
		t.Errorf("allow headers: request %v response %v", res.echo.Header, res.header)
	}
	if res.echo.Header.Get(SourcePrincipalHeader) != "" {
		t.Error("a policy set the identity header for an unauthenticated peer")
	}
	a := last()
	if a.Request.URL.Path != "/admin" || a.Request.Header.Get("X-Secret") != "s3cret" || a.Request.Header.Get("X-Forwarded-Client-Cert") != "" {
		t.Errorf("authorizer request: path %q headers %v", a.Request.URL.Path, a.Request.Header)
	}
	if string(a.Body) != "payload" || a.BodyTruncated || a.Route != "default/r" || a.Service != (ServiceRef{testNS, "web"}) || a.Port != 80 {
		t.Errorf("authorizer input: body %q truncated %v route %q service %v port %d", a.Body, a.BodyTruncated, a.Route, a.Service, a.Port)
	}
	if a.Peer.Authenticated() || a.Source != callerAddr || a.Destination != h.backends["v1"].addr || a.DestinationIdentity.String() != "spiffe://cluster.local/ns/default/sa/v1" {
		t.Errorf("authorizer addresses: %+v", a)
	}
	res = get(t, c, "/y", map[string]string{"X-Secret": "again"})
	if res.echo.Header.Get("X-Authz") != "checked" || res.echo.Header.Get("X-Secret") != "" || res.header.Get("X-Decision") != "allowed" {
		t.Errorf("allow headers, decision reused: request %v response %v", res.echo.Header, res.header)
	}
	if a := last(); a.Rule != "all" {
		t.Errorf("rule name = %q", a.Rule)
	}

	// The policy sees the request as sent, not as route filters changed it.
	res = get(t, c, "/filtered/a", map[string]string{"X-Secret": "as-sent"})
	if res.status != 200 || res.echo.Path != "/rewritten/a" || res.echo.Header.Get("X-Secret") != "" {
		t.Errorf("filtered request upstream: %d path %q headers %v", res.status, res.echo.Path, res.echo.Header)
	}
	if a := last(); a.Request.URL.Path != "/filtered/a" || a.Request.Header.Get("X-Secret") != "as-sent" {
		t.Errorf("authorizer saw the filtered request: path %q headers %v", a.Request.URL.Path, a.Request.Header)
	}

	// A policy's header changes come last: a client's Connection header
	// cannot strip them, they replace the forwarding headers (as Envoy's
	// ext_authz does), and hop-by-hop ones are not sent.
	decide(Decision{Allowed: true, Headers: http.Header{"X-Authz": {"checked"}, "Connection": {"X-Keep"}, "X-Forwarded-For": {"192.0.2.1"}}})
	res = get(t, c, "/y", map[string]string{"Connection": "X-Authz, X-Drop", "X-Drop": "1", "X-Keep": "kept"})
	if res.status != 200 || res.echo.Header.Get("X-Authz") != "checked" || res.echo.Header.Get("X-Forwarded-For") != "192.0.2.1" ||
		res.echo.Header.Get("Connection") != "" || res.echo.Header.Get("X-Drop") != "" || res.echo.Header.Get("X-Keep") != "kept" {
		t.Errorf("policy headers upstream: %d %v", res.status, res.echo.Header)
	}

	// Local answers are authorized too, and get the allow's response headers.
	mu.Lock()
	calls = nil
	mu.Unlock()
	if res := get(t, c, "/moved", nil); res.status != 302 {
		t.Errorf("redirect: %d", res.status)
	}
	if a := last(); a == nil || a.Request.URL.Path != "/moved" || a.Destination != h.backends["v1"].addr {
		t.Errorf("the authorizer was not asked about the redirect as the request it is: %+v", a)
	}
}

// Nothing is answered before the policy: a denied caller cannot tell a
// redirect, a missing route, an invalid backend, a service without
// endpoints or a CORS preflight from any other denial. An allowed one gets
// those answers, and PreflightBeforePolicy answers preflights first.
func TestPolicyBeforeLocalAnswers(t *testing.T) {
	for _, preflightFirst := range []bool{false, true} {
		h := newHarness(t, func(o *Options) { o.PreflightBeforePolicy = preflightFirst })
		h.addService("web", "http")
		h.backend("v1", "http", false)
		h.addService("empty", "http")
		cors := &meshv1.HTTPRouteFilter{Filter: &meshv1.HTTPRouteFilter_Cors{Cors: &meshv1.CORS{
			AllowOrigins: []string{"https://app.example"}, AllowMethods: []string{"PUT"}, MaxAgeSeconds: 5}}}
		bad := to("v1", prefixM("/bad"))
		bad.Backends[0].Backend.InvalidReason = "not permitted"
		h.update([]*meshv1.HTTPRoute{httpRoute("r", epoch,
			withFilters(to("v1", prefixM("/moved")), redirect(&meshv1.RequestRedirect{Hostname: "elsewhere.example", StatusCode: 302})),
			withFilters(to("v1", prefixM("/api")), cors),
			to("empty", prefixM("/empty")),
			bad,
		)}, nil)
		c := h1Client(h.front(webInfo(trust.Unauthenticated())))
		var asked []string
		var mu sync.Mutex
		allow := false
		h.setAuthz(AuthorizerFunc(func(_ context.Context, r *AuthzRequest) Decision {
			mu.Lock()
			defer mu.Unlock()
			asked = append(asked, r.Request.Method+" "+r.Request.URL.Path)
			return Decision{Allowed: allow, Reason: "test"}
		}))
		preflight := map[string]string{"Origin": "https://app.example", "Access-Control-Request-Method": "PUT"}
		cases := []struct {
			method, path string
			hdr          map[string]string
			allowed      int
		}{
			{"GET", "/moved", nil, 302},
			{"GET", "/nowhere", nil, 404},
			{"GET", "/bad", nil, 500},
			{"GET", "/empty", nil, 503},
			{"OPTIONS", "/api", preflight, 204},
		}
		for _, a := range []bool{false, true} {
			mu.Lock()
			allow, asked = a, nil
			mu.Unlock()
			for _, tc := range cases {
				res := do(t, c, tc.method, tc.path, nil, tc.hdr)
				want := tc.allowed
				if !a && !(preflightFirst && tc.method == "OPTIONS") {
					want = 403
				}
				if res.status != want {
					t.Errorf("preflight first %v, allow %v: %s %s: %d %q, want %d", preflightFirst, a, tc.method, tc.path, res.status, res.body, want)
				}
				if want == 403 && (res.header.Get("Location") != "" || res.header.Get("Access-Control-Allow-Origin") != "") {
					t.Errorf("a denied %s %s got %v", tc.method, tc.path, res.header)
				}
			}
			mu.Lock()
			n := len(asked)
			mu.Unlock()
			if want := len(cases) - map[bool]int{false: 0, true: 1}[preflightFirst]; n != want {
				t.Errorf("preflight first %v, allow %v: the policy was asked %d times (%v), want %d", preflightFirst, a, n, asked, want)
			}
		}
		if n := h.backends["v1"].count.Load(); n != 0 {
			t.Errorf("%d requests reached the backend", n)
		}
	}
}

func TestEngineRequiresDialerAndAuthorizer(t *testing.T) {
	if _, err := NewEngine(Options{Authorizer: AllowAll()}); err == nil {
		t.Error("no dialer accepted")
	}
	if _, err := NewEngine(Options{Dialer: &testDialer{}}); err == nil {
		t.Error("no authorizer accepted: the engine must not default to allow")
	}
}

func TestAuthorizerPanicDenies(t *testing.T) {
	h := newHarness(t)
	h.backend("web", "http", false)
	h.update(nil, nil)
	h.setAuthz(AuthorizerFunc(func(context.Context, *AuthzRequest) Decision { panic("policy bug") }))
	c := h1Client(h.front(webInfo(trust.Unauthenticated())))
	if res := get(t, c, "/", nil); res.status != 500 {
		t.Fatalf("panicking authorizer: %d", res.status)
	}
	if n := h.backends["web"].count.Load(); n != 0 {
		t.Fatal("request passed a panicking authorizer")
	}
}
