package l7

import (
	"net/http"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

func reqHeaders(set, add []*meshv1.Header, remove ...string) *meshv1.HTTPRouteFilter {
	return &meshv1.HTTPRouteFilter{Filter: &meshv1.HTTPRouteFilter_RequestHeaderModifier{RequestHeaderModifier: &meshv1.HeaderModifier{Set: set, Add: add, Remove: remove}}}
}

func respHeaders(set, add []*meshv1.Header, remove ...string) *meshv1.HTTPRouteFilter {
	return &meshv1.HTTPRouteFilter{Filter: &meshv1.HTTPRouteFilter_ResponseHeaderModifier{ResponseHeaderModifier: &meshv1.HeaderModifier{Set: set, Add: add, Remove: remove}}}
}

func hv(name, value string) *meshv1.Header { return &meshv1.Header{Name: name, Value: value} }

func rewrite(host string, full bool, path string) *meshv1.HTTPRouteFilter {
	rw := &meshv1.URLRewrite{Hostname: host}
	if path != "" || !full {
		t := meshv1.PathModifier_REPLACE_PREFIX_MATCH
		if full {
			t = meshv1.PathModifier_REPLACE_FULL_PATH
		}
		rw.Path = &meshv1.PathModifier{Type: t, Value: path}
	}
	return &meshv1.HTTPRouteFilter{Filter: &meshv1.HTTPRouteFilter_UrlRewrite{UrlRewrite: rw}}
}

func redirect(r *meshv1.RequestRedirect) *meshv1.HTTPRouteFilter {
	return &meshv1.HTTPRouteFilter{Filter: &meshv1.HTTPRouteFilter_RequestRedirect{RequestRedirect: r}}
}

func mirrorTo(name string, percent *float64) *meshv1.HTTPRouteFilter {
	return &meshv1.HTTPRouteFilter{Filter: &meshv1.HTTPRouteFilter_RequestMirror{RequestMirror: &meshv1.RequestMirror{
		Backend: &meshv1.BackendRef{Name: name, Port: 80}, Percent: percent}}}
}

func withFilters(r *meshv1.HTTPRouteRule, fs ...*meshv1.HTTPRouteFilter) *meshv1.HTTPRouteRule {
	r.Filters = fs
	return r
}

func TestHeaderModifiers(t *testing.T) {
	h := newHarness(t)
	h.addService("web", "http")
	h.backend("v1", "http", false)
	h.update([]*meshv1.HTTPRoute{httpRoute("r", epoch,
		// The conformance suite's HTTPRouteRequestHeaderModifier case.
		withFilters(to("v1", prefixM("/req")), reqHeaders(
			[]*meshv1.Header{hv("X-Header-Set", "set-overwrites-values")},
			[]*meshv1.Header{hv("X-Header-Add", "header-val-1"), hv("X-Header-Add-Append", "header-val-2")},
			"X-Header-Remove")),
		withFilters(to("v1", prefixM("/resp")), respHeaders(
			[]*meshv1.Header{hv("Content-Type", "text/x-rewritten")},
			[]*meshv1.Header{hv("X-Extra", "1")},
			"x-backend")),
		withFilters(to("v1", prefixM("/host")), reqHeaders([]*meshv1.Header{hv("Host", "other.example")}, nil)),
		withFilters(to("v1", prefixM("/forge")), reqHeaders([]*meshv1.Header{hv(SourcePrincipalHeader, "spiffe://cluster.local/ns/x/sa/y")}, nil)),
	)}, nil)
	c := h1Client(h.front(webInfo(trust.Unauthenticated())))

	res := get(t, c, "/req", map[string]string{"X-Header-Remove": "remove-val", "X-Header-Add-Append": "append-val-1", "X-Header-Set": "set-val"})
	want := map[string]string{"X-Header-Add": "header-val-1", "X-Header-Add-Append": "append-val-1,header-val-2", "X-Header-Set": "set-overwrites-values"}
	for k, v := range want {
		if got := res.echo.Header.Values(k); len(got) != 1 || got[0] != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	if _, ok := res.echo.Header["X-Header-Remove"]; ok {
		t.Error("X-Header-Remove reached the backend")
	}
	// A client's Connection header removes the fields it names from what it
	// sent, not the ones a filter adds.
	res = get(t, c, "/req", map[string]string{"Connection": "X-Header-Set, x-drop, keep-alive", "X-Drop": "1", "X-Header-Set": "set-val"})
	if res.echo.Header.Get("X-Header-Set") != "set-overwrites-values" || res.echo.Header.Get("X-Drop") != "" || res.echo.Header.Get("Connection") != "" {
		t.Errorf("Connection-nominated headers: %v", res.echo.Header)
	}

	res = get(t, c, "/resp", nil)
	if res.header.Get("Content-Type") != "text/x-rewritten" || res.header.Get("X-Extra") != "1" || res.header.Get("X-Backend") != "" {
		t.Errorf("response headers = %v", res.header)
	}
	if res = get(t, c, "/host", nil); res.echo.Host != "other.example" {
		t.Errorf("Host set by a header modifier: %q", res.echo.Host)
	}
	// A route cannot mint the identity header: only the tunnel's peer can.
	if res = get(t, c, "/forge", nil); res.echo.Header.Get(SourcePrincipalHeader) != "" {
		t.Errorf("route filter set the identity header: %q", res.echo.Header.Get(SourcePrincipalHeader))
	}
}

func TestURLRewrite(t *testing.T) {
	h := newHarness(t)
	h.addService("web", "http")
	h.backend("v1", "http", false)
	h.update([]*meshv1.HTTPRoute{httpRoute("rewrite-path", epoch,
		// The conformance suite's HTTPRouteRewritePath manifest.
		withFilters(to("v1", prefixM("/prefix/one")), rewrite("", false, "/one")),
		withFilters(to("v1", prefixM("/strip-prefix")), rewrite("", false, "/")),
		withFilters(to("v1", prefixM("/full/one")), rewrite("", true, "/one")),
		withFilters(to("v1", prefixM("/host")), rewrite("rewritten.example", true, "")),
	)}, nil)
	c := h1Client(h.front(webInfo(trust.Unauthenticated())))
	for target, want := range map[string]string{
		"/prefix/one/two":     "/one/two",
		"/prefix/one":         "/one",
		"/strip-prefix/three": "/three",
		"/strip-prefix":       "/",
		"/full/one/two":       "/one",
		"/full/one":           "/one",
	} {
		if res := get(t, c, target+"?q=1", nil); res.echo.Path != want || res.echo.Query != "q=1" {
			t.Errorf("%s rewritten to %q?%s, want %q?q=1", target, res.echo.Path, res.echo.Query, want)
		}
	}
	if res := get(t, c, "/host/x", nil); res.echo.Host != "rewritten.example" || res.echo.Path != "/host/x" {
		t.Errorf("hostname rewrite: host %q path %q", res.echo.Host, res.echo.Path)
	}
}

func TestRequestRedirect(t *testing.T) {
	h := newHarness(t)
	h.addService("web", "http")
	h.backend("v1", "http", false)
	pfx := func(v string) *meshv1.PathModifier {
		return &meshv1.PathModifier{Type: meshv1.PathModifier_REPLACE_PREFIX_MATCH, Value: v}
	}
	full := func(v string) *meshv1.PathModifier {
		return &meshv1.PathModifier{Type: meshv1.PathModifier_REPLACE_FULL_PATH, Value: v}
	}
	h.update([]*meshv1.HTTPRoute{httpRoute("redirect", epoch,
		// The conformance suite's HTTPRouteRedirectPath cases, and more.
		withFilters(to("v1", prefixM("/original-prefix")), redirect(&meshv1.RequestRedirect{Path: pfx("/replacement-prefix")})),
		withFilters(to("v1", prefixM("/full")), redirect(&meshv1.RequestRedirect{Path: full("/full-path-replacement")})),
		withFilters(to("v1", prefixM("/path-and-host")), redirect(&meshv1.RequestRedirect{Hostname: "example.org", Path: pfx("/replacement-prefix")})),
		withFilters(to("v1", prefixM("/path-and-status")), redirect(&meshv1.RequestRedirect{Path: pfx("/replacement-prefix"), StatusCode: 301})),
		withFilters(to("v1", prefixM("/scheme")), redirect(&meshv1.RequestRedirect{Scheme: "https"})),
		withFilters(to("v1", prefixM("/scheme-port")), redirect(&meshv1.RequestRedirect{Scheme: "https", Port: 8443})),
		withFilters(to("v1", prefixM("/port")), redirect(&meshv1.RequestRedirect{Port: 8080, Hostname: "example.org"})),
		withFilters(to("v1", prefixM("/http80")), redirect(&meshv1.RequestRedirect{Scheme: "http", Port: 80})),
	)}, nil)
	c := h1Client(h.front(webInfo(trust.Unauthenticated())))
	for _, tc := range []struct {
		target, location string
		status           int
	}{
		{"/original-prefix/lemon", "http://web/replacement-prefix/lemon", 302},
		{"/full/path/original?x=1", "http://web/full-path-replacement?x=1", 302},
		{"/path-and-host", "http://example.org/replacement-prefix", 302},
		{"/path-and-status", "http://web/replacement-prefix", 301},
		{"/scheme/a", "https://web/scheme/a", 302},
		{"/scheme-port/a", "https://web:8443/scheme-port/a", 302},
		{"/port", "http://example.org:8080/port", 302},
		{"/http80", "http://web/http80", 302},
	} {
		res := get(t, c, tc.target, map[string]string{"Host": "web:80"})
		if res.status != tc.status || res.header.Get("Location") != tc.location {
			t.Errorf("%s: %d %q, want %d %q", tc.target, res.status, res.header.Get("Location"), tc.status, tc.location)
		}
	}
	if n := h.backends["v1"].count.Load(); n != 0 {
		t.Errorf("redirects reached the backend %d times", n)
	}
}

// Without a configured scheme or port, the redirect keeps the request's
// scheme and the listener's (the service's) port.
func TestRedirectListenerPort(t *testing.T) {
	ru := &rule{hasPrefix: true, prefix: "/a"}
	s, err := compileRedirect(&meshv1.RequestRedirect{Hostname: "example.org"}, ru.hasPrefix)
	if err != nil {
		t.Fatal(err)
	}
	r, _ := http.NewRequest("GET", "http://web:8000/a/b?q", nil)
	if got := s.location(r, "/a/b", ru.prefix, 8000, false); got != "http://example.org:8000/a/b?q" {
		t.Fatalf("location = %q", got)
	}
	r.Host = "[fd00::1]:8000"
	s.hostname = ""
	if got := s.location(r, "/a/b", ru.prefix, 8000, false); got != "http://[fd00::1]:8000/a/b?q" {
		t.Fatalf("location = %q", got)
	}
	s.scheme = "https"
	if got := s.location(r, "/a/b", ru.prefix, 8000, false); got != "https://[fd00::1]/a/b?q" {
		t.Fatalf("location = %q", got)
	}
	// On an ingress listener that terminated TLS the request's scheme is
	// https: kept without a configured scheme, its port 443 left out.
	s.scheme = ""
	if got := s.location(r, "/a/b", ru.prefix, 443, true); got != "https://[fd00::1]/a/b?q" {
		t.Fatalf("location = %q", got)
	}
	s.port = 8443
	if got := s.location(r, "/a/b", ru.prefix, 443, true); got != "https://[fd00::1]:8443/a/b?q" {
		t.Fatalf("location = %q", got)
	}
	s.scheme = "http"
	if got := s.location(r, "/a/b", ru.prefix, 443, true); got != "http://[fd00::1]:8443/a/b?q" {
		t.Fatalf("location = %q", got)
	}
}

func TestRequestMirror(t *testing.T) {
	h := newHarness(t)
	h.addService("web", "http")
	h.backend("v1", "http", false)
	m := h.backend("mirror", "http", false)
	m.got = make(chan echo, 16)
	zero := 0.0
	// Rule filters run in order, backend filters after them.
	mirrored := withFilters(to("v1", prefixM("/mirrored")), reqHeaders([]*meshv1.Header{hv("X-Before", "1")}, nil), mirrorTo("mirror", nil))
	mirrored.Backends[0].Filters = []*meshv1.HTTPRouteFilter{reqHeaders([]*meshv1.Header{hv("X-After", "1")}, nil)}
	h.update([]*meshv1.HTTPRoute{httpRoute("r", epoch,
		mirrored,
		withFilters(to("v1", prefixM("/never")), mirrorTo("mirror", &zero)),
		withFilters(to("v1", prefixM("/to-missing")), mirrorTo("missing", nil)),
	)}, nil)
	c := h1Client(h.front(webInfo(trust.Unauthenticated())))

	// A failing mirror never changes the main response.
	m.setBehave(func(_ int64, w http.ResponseWriter, _ *http.Request) bool { w.WriteHeader(500); return true })
	for i := 0; i < 5; i++ {
		if res := get(t, c, "/never", nil); res.status != 200 {
			t.Fatalf("main response %d", res.status)
		}
		if res := get(t, c, "/to-missing", nil); res.status != 200 {
			t.Fatalf("main response with an unresolvable mirror: %d", res.status)
		}
	}
	res := do(t, c, "POST", "/mirrored/x", []byte("copy me"), nil)
	if res.status != 200 || res.echo.Backend != "v1" || res.echo.Header.Get("X-After") != "1" {
		t.Fatalf("main response: %d %q", res.status, res.body)
	}
	select {
	case got := <-m.got:
		// The copy is the request as it stood where the filter is listed.
		if got.Method != "POST" || got.Path != "/mirrored/x" || got.Body != "copy me" || got.Header.Get("X-Before") != "1" || got.Header.Get("X-After") != "" {
			t.Errorf("mirrored request = %+v", got)
		}
		if got.Header.Get("X-Forwarded-For") != "10.1.2.3" {
			t.Errorf("mirror X-Forwarded-For = %q", got.Header.Get("X-Forwarded-For"))
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no mirrored request")
	}
	// Wait for the mirror to finish; the 0% and unresolvable mirrors sent nothing.
	waitFor(t, "mirrors to finish", func() bool { return len(h.engine.mirrorSem) == 0 })
	if n := m.count.Load(); n != 1 {
		t.Errorf("mirror backend got %d requests, want 1", n)
	}
}

func TestPerBackendFilters(t *testing.T) {
	h := newHarness(t)
	h.addService("web", "http")
	h.backend("v1", "http", false)
	h.backend("v2", "http", false)
	b1 := backendRef("v1", 80, 1)
	b1.Filters = []*meshv1.HTTPRouteFilter{reqHeaders([]*meshv1.Header{hv("X-Backend-Filter", "v1")}, nil)}
	b2 := backendRef("v2", 80, 1)
	h.update([]*meshv1.HTTPRoute{httpRoute("r", epoch, &meshv1.HTTPRouteRule{
		Filters:  []*meshv1.HTTPRouteFilter{reqHeaders([]*meshv1.Header{hv("X-Rule-Filter", "yes")}, nil)},
		Backends: []*meshv1.HTTPBackendRef{b1, b2},
	})}, nil)
	c := h1Client(h.front(webInfo(trust.Unauthenticated())))
	seen := map[string]int{}
	for i := 0; i < 20; i++ {
		res := get(t, c, "/", nil)
		seen[res.echo.Backend]++
		if res.echo.Header.Get("X-Rule-Filter") != "yes" {
			t.Fatal("rule filter missing")
		}
		if got, want := res.echo.Header.Get("X-Backend-Filter"), map[string]string{"v1": "v1", "v2": ""}[res.echo.Backend]; got != want {
			t.Fatalf("%s saw X-Backend-Filter %q, want %q", res.echo.Backend, got, want)
		}
	}
	if seen["v1"] != 10 || seen["v2"] != 10 {
		t.Fatalf("split = %v", seen)
	}
}

func TestCORS(t *testing.T) {
	h := newHarness(t)
	h.addService("web", "http")
	h.backend("v1", "http", false)
	cors := &meshv1.HTTPRouteFilter{Filter: &meshv1.HTTPRouteFilter_Cors{Cors: &meshv1.CORS{
		AllowOrigins:     []string{"https://app.example.com", "https://*.trusted.example", "http://local.example:8080"},
		AllowCredentials: true,
		AllowMethods:     []string{"GET", "PUT"},
		AllowHeaders:     []string{"X-Token"},
		ExposeHeaders:    []string{"X-Backend"},
		MaxAgeSeconds:    5,
	}}}
	h.update([]*meshv1.HTTPRoute{httpRoute("r", epoch, withFilters(to("v1"), cors))}, nil)
	c := h1Client(h.front(webInfo(trust.Unauthenticated())))
	preflight := func(origin string) result {
		return do(t, c, http.MethodOptions, "/api", nil, map[string]string{
			"Origin": origin, "Access-Control-Request-Method": "PUT", "Access-Control-Request-Headers": "x-token"})
	}
	for _, origin := range []string{"https://app.example.com", "https://a.b.trusted.example", "https://app.example.com:443", "http://local.example:8080"} {
		res := preflight(origin)
		if res.status != 204 || res.header.Get("Access-Control-Allow-Origin") != origin ||
			res.header.Get("Access-Control-Allow-Methods") != "GET, PUT" || res.header.Get("Access-Control-Allow-Headers") != "X-Token" ||
			res.header.Get("Access-Control-Allow-Credentials") != "true" || res.header.Get("Access-Control-Max-Age") != "5" ||
			res.header.Get("Access-Control-Expose-Headers") != "X-Backend" {
			t.Errorf("preflight from %s: %d %v", origin, res.status, res.header)
		}
	}
	for _, origin := range []string{"https://evil.example", "http://app.example.com", "https://trusted.example", "http://local.example"} {
		if res := preflight(origin); res.status != 204 || res.header.Get("Access-Control-Allow-Origin") != "" || res.header.Get("Access-Control-Expose-Headers") != "" {
			t.Errorf("preflight from disallowed %s: %d %v", origin, res.status, res.header)
		}
	}
	if n := h.backends["v1"].count.Load(); n != 0 {
		t.Errorf("preflights reached the backend %d times", n)
	}
	res := get(t, c, "/api", map[string]string{"Origin": "https://app.example.com"})
	if res.status != 200 || res.header.Get("Access-Control-Allow-Origin") != "https://app.example.com" || res.header.Get("Access-Control-Expose-Headers") != "X-Backend" {
		t.Errorf("actual request: %d %v", res.status, res.header)
	}
	if res := get(t, c, "/api", map[string]string{"Origin": "https://evil.example"}); res.status != 200 || res.header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("request from a disallowed origin: %d %v", res.status, res.header)
	}
}

func TestMirrorConcurrencyBound(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.MaxMirrorsInFlight = 1; o.MirrorTimeout = time.Minute })
	h.addService("web", "http")
	h.backend("v1", "http", false)
	m := h.backend("mirror", "http", false)
	m.got = make(chan echo, 4)
	m.setBehave(func(_ int64, w http.ResponseWriter, r *http.Request) bool { stall(w, r); return true })
	// Closing the engine cancels the stalled mirror; it must happen before
	// the mirror backend's Close waits for its handlers.
	t.Cleanup(func() { _ = h.engine.Close() })
	h.update([]*meshv1.HTTPRoute{httpRoute("r", epoch, withFilters(to("v1"), mirrorTo("mirror", nil)))}, nil)
	c := h1Client(h.front(webInfo(trust.Unauthenticated())))
	if res := get(t, c, "/1", nil); res.status != 200 {
		t.Fatalf("status %d", res.status)
	}
	select {
	case <-m.got: // the first mirror is in flight, stalled
	case <-time.After(20 * time.Second):
		t.Fatal("no mirrored request")
	}
	for i := 0; i < 2; i++ {
		if res := get(t, c, "/more", nil); res.status != 200 {
			t.Fatalf("status %d while mirrors are saturated", res.status)
		}
	}
	if got := mirrorCount(t, h, "dropped"); got != 2 {
		t.Fatalf("dropped mirrors = %v, want 2", got)
	}
}

func mirrorCount(t *testing.T, h *harness, outcome string) float64 {
	mfs, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "request_mirrors_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "outcome" && lp.GetValue() == outcome {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
