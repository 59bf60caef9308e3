package l7

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// ---- builders for the mesh model ----

const testNS = "default"

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func svcPort(port uint32, proto string) *meshv1.ServicePort {
	return &meshv1.ServicePort{Name: "p", Port: port, TargetPort: port, AppProtocol: proto}
}

func service(name string, ports ...*meshv1.ServicePort) *meshv1.Service {
	return &meshv1.Service{Namespace: testNS, Name: name, Hostname: name + "." + testNS + ".svc.cluster.local", Ports: ports}
}

func parent(name string, port uint32) *meshv1.ParentRef {
	return &meshv1.ParentRef{Namespace: testNS, Name: name, Port: port}
}

func httpRoute(name string, created time.Time, rules ...*meshv1.HTTPRouteRule) *meshv1.HTTPRoute {
	return &meshv1.HTTPRoute{Namespace: testNS, Name: name, CreationTime: timestamppb.New(created),
		Parents: []*meshv1.ParentRef{parent("web", 0)}, Rules: rules}
}

func grpcRoute(name string, created time.Time, rules ...*meshv1.GRPCRouteRule) *meshv1.GRPCRoute {
	return &meshv1.GRPCRoute{Namespace: testNS, Name: name, CreationTime: timestamppb.New(created),
		Parents: []*meshv1.ParentRef{parent("web", 0)}, Rules: rules}
}

// to is a rule sending everything it matches to the service named dest.
func to(dest string, matches ...*meshv1.HTTPRouteMatch) *meshv1.HTTPRouteRule {
	return &meshv1.HTTPRouteRule{Matches: matches, Backends: []*meshv1.HTTPBackendRef{backendRef(dest, 80, 1)}}
}

func grpcTo(dest string, matches ...*meshv1.GRPCRouteMatch) *meshv1.GRPCRouteRule {
	return &meshv1.GRPCRouteRule{Matches: matches, Backends: []*meshv1.HTTPBackendRef{backendRef(dest, 80, 1)}}
}

func backendRef(name string, port, weight uint32) *meshv1.HTTPBackendRef {
	return &meshv1.HTTPBackendRef{Backend: &meshv1.BackendRef{Name: name, Port: port}, Weight: weight}
}

func pathM(t meshv1.PathMatch_Type, v string) *meshv1.HTTPRouteMatch {
	return &meshv1.HTTPRouteMatch{Path: &meshv1.PathMatch{Type: t, Value: v}}
}

func prefixM(v string) *meshv1.HTTPRouteMatch { return pathM(meshv1.PathMatch_PATH_PREFIX, v) }
func exactM(v string) *meshv1.HTTPRouteMatch  { return pathM(meshv1.PathMatch_EXACT, v) }
func regexM(v string) *meshv1.HTTPRouteMatch  { return pathM(meshv1.PathMatch_REGULAR_EXPRESSION, v) }

func hdr(name, value string) *meshv1.StringMatch {
	return &meshv1.StringMatch{Name: name, Value: value}
}

func hdrRe(name, value string) *meshv1.StringMatch {
	return &meshv1.StringMatch{Type: meshv1.StringMatch_REGULAR_EXPRESSION, Name: name, Value: value}
}

// backends are the services routes point at; each names an expected outcome.
var backendNames = []string{"web", "v1", "v2", "v3", "exact", "prefix", "regex", "method", "headers", "query", "old", "new", "a", "b", "host", "wild", "none", "grpc", "http"}

func backendServices() []*meshv1.Service {
	var out []*meshv1.Service
	for _, n := range backendNames {
		out = append(out, service(n, svcPort(80, "http")))
	}
	return out
}

type probe struct {
	method, target string
	headers        map[string]string
	want           string // backend service name; "" = no route
}

func compileWeb(t *testing.T, routes []*meshv1.HTTPRoute, grpcRoutes []*meshv1.GRPCRoute) *Config {
	t.Helper()
	c := Compile(routes, grpcRoutes, backendServices(), nil)
	return c
}

func routeOf(t *testing.T, c *Config, p probe) string {
	t.Helper()
	method := p.method
	if method == "" {
		method = http.MethodGet
	}
	r := httptest.NewRequest(method, "http://web"+p.target, nil)
	for k, v := range p.headers {
		if strings.EqualFold(k, "host") {
			r.Host = v
			continue
		}
		r.Header.Add(k, v)
	}
	path, err := normalizePath(r.URL.EscapedPath())
	if err != nil {
		t.Fatal(err)
	}
	v := newReqView(r, path)
	ru := c.tables[tableKey{ServiceRef{testNS, "web"}, 80}].route(&v)
	if ru == nil {
		return ""
	}
	return ru.backends[0].svc.Name
}

func checkProbes(t *testing.T, c *Config, probes []probe) {
	t.Helper()
	for _, p := range probes {
		if got := routeOf(t, c, p); got != p.want {
			t.Errorf("%s %s %v: routed to %q, want %q", p.method, p.target, p.headers, got, p.want)
		}
	}
}

// ---- tables ----

func TestPathMatchTypes(t *testing.T) {
	c := compileWeb(t, []*meshv1.HTTPRoute{httpRoute("r", epoch,
		to("exact", exactM("/abc")),
		to("prefix", prefixM("/pre/")),
		to("regex", regexM(`/items/[0-9]+`)),
	)}, nil)
	checkProbes(t, c, []probe{
		{target: "/abc", want: "exact"},
		{target: "/abc/", want: ""}, // Exact: not "/abc/", "/Abc" or "/abcd"
		{target: "/Abc", want: ""},
		{target: "/abcd", want: ""},
		{target: "/abc?x=1", want: "exact"},
		{target: "/pre", want: "prefix"}, // trailing "/" of the prefix is ignored
		{target: "/pre/", want: "prefix"},
		{target: "/pre/x/y", want: "prefix"},
		{target: "/prefix", want: ""}, // by segment, not by character
		{target: "/items/42", want: "regex"},
		{target: "/items/42/x", want: ""}, // a regular expression matches the whole path
		{target: "/x/items/42", want: ""},
		{target: "/items/4a", want: ""},
		// Matching happens on the normalized path.
		{target: "/x/../abc", want: "exact"},
		{target: "/%61bc", want: "exact"},
	})
}

// The conformance suite's HTTPRouteMatching manifest and expectations.
func TestConformanceHTTPRouteMatching(t *testing.T) {
	c := compileWeb(t, []*meshv1.HTTPRoute{httpRoute("matching", epoch,
		&meshv1.HTTPRouteRule{Matches: []*meshv1.HTTPRouteMatch{prefixM("/"), {Headers: []*meshv1.StringMatch{hdr("version", "one")}}},
			Backends: []*meshv1.HTTPBackendRef{backendRef("v1", 80, 1)}},
		&meshv1.HTTPRouteRule{Matches: []*meshv1.HTTPRouteMatch{prefixM("/v2"), {Headers: []*meshv1.StringMatch{hdr("version", "two")}}},
			Backends: []*meshv1.HTTPBackendRef{backendRef("v2", 80, 1)}},
	)}, nil)
	checkProbes(t, c, []probe{
		{target: "/", want: "v1"},
		{target: "/example", want: "v1"},
		{target: "/", headers: map[string]string{"Version": "one"}, want: "v1"},
		{target: "/v2", want: "v2"},
		{target: "/v2/example", want: "v2"},
		{target: "/", headers: map[string]string{"Version": "two"}, want: "v2"},
	})
}

// Precedence: Exact path, longest prefix, method, most headers, most query
// parameters; then oldest route, then namespace/name; then rule order.
func TestPrecedence(t *testing.T) {
	t.Run("exact over prefix", func(t *testing.T) {
		c := compileWeb(t, []*meshv1.HTTPRoute{httpRoute("r", epoch,
			to("prefix", prefixM("/foo")),
			to("exact", exactM("/foo")),
		)}, nil)
		checkProbes(t, c, []probe{{target: "/foo", want: "exact"}, {target: "/foo/bar", want: "prefix"}})
	})
	t.Run("longest prefix", func(t *testing.T) {
		c := compileWeb(t, []*meshv1.HTTPRoute{httpRoute("r", epoch,
			to("v1", prefixM("/")),
			to("v3", prefixM("/foo/bar")),
			to("v2", prefixM("/foo")),
		)}, nil)
		checkProbes(t, c, []probe{
			{target: "/foo/bar/baz", want: "v3"},
			{target: "/foo/x", want: "v2"},
			{target: "/foobar", want: "v1"},
			{target: "/x", want: "v1"},
		})
	})
	t.Run("prefix length over method and headers", func(t *testing.T) {
		m := prefixM("/")
		m.Method = "GET"
		m.Headers = []*meshv1.StringMatch{hdr("a", "1"), hdr("b", "2")}
		c := compileWeb(t, []*meshv1.HTTPRoute{httpRoute("r", epoch, to("headers", m), to("prefix", prefixM("/api")))}, nil)
		checkProbes(t, c, []probe{{target: "/api/x", headers: map[string]string{"a": "1", "b": "2"}, want: "prefix"}})
	})
	t.Run("method over headers", func(t *testing.T) {
		withMethod := prefixM("/")
		withMethod.Method = "GET"
		withHeaders := prefixM("/")
		withHeaders.Headers = []*meshv1.StringMatch{hdr("a", "1"), hdr("b", "2")}
		c := compileWeb(t, []*meshv1.HTTPRoute{httpRoute("r", epoch, to("headers", withHeaders), to("method", withMethod))}, nil)
		checkProbes(t, c, []probe{
			{target: "/", headers: map[string]string{"a": "1", "b": "2"}, want: "method"},
			{method: "POST", target: "/", headers: map[string]string{"a": "1", "b": "2"}, want: "headers"},
			{method: "POST", target: "/", want: ""},
		})
	})
	t.Run("headers over query parameters", func(t *testing.T) {
		h := prefixM("/")
		h.Headers = []*meshv1.StringMatch{hdr("a", "1")}
		q := prefixM("/")
		q.QueryParams = []*meshv1.StringMatch{hdr("x", "1"), hdr("y", "2")}
		c := compileWeb(t, []*meshv1.HTTPRoute{httpRoute("r", epoch, to("query", q), to("headers", h))}, nil)
		checkProbes(t, c, []probe{
			{target: "/?x=1&y=2", headers: map[string]string{"a": "1"}, want: "headers"},
			{target: "/?x=1&y=2", want: "query"},
			{target: "/?x=1", want: ""},
		})
	})
	t.Run("most query parameters", func(t *testing.T) {
		one := prefixM("/")
		one.QueryParams = []*meshv1.StringMatch{hdr("x", "1")}
		two := prefixM("/")
		two.QueryParams = []*meshv1.StringMatch{hdr("x", "1"), hdr("y", "2")}
		c := compileWeb(t, []*meshv1.HTTPRoute{httpRoute("r", epoch, to("v1", one), to("v2", two))}, nil)
		checkProbes(t, c, []probe{{target: "/?y=2&x=1", want: "v2"}, {target: "/?x=1", want: "v1"}})
	})
	t.Run("oldest route, then namespace/name, then rule order", func(t *testing.T) {
		c := compileWeb(t, []*meshv1.HTTPRoute{
			httpRoute("a-new", epoch.Add(time.Hour), to("new", prefixM("/p"))),
			httpRoute("z-old", epoch, to("old", prefixM("/p"))),
			httpRoute("b", epoch.Add(2*time.Hour), to("b", prefixM("/q"))),
			httpRoute("a", epoch.Add(2*time.Hour), to("a", prefixM("/q")), to("b", prefixM("/q"))),
		}, nil)
		checkProbes(t, c, []probe{{target: "/p", want: "old"}, {target: "/q", want: "a"}})
	})
	t.Run("regular expression ranks by length after an equal prefix", func(t *testing.T) {
		c := compileWeb(t, []*meshv1.HTTPRoute{httpRoute("r", epoch,
			to("regex", regexM(`/v[0-9]+/items`)), // 14 characters
			to("prefix", prefixM("/v1")),
			to("v1", regexM(`/v1.*`)), // 5 characters, equal to prefix "/v1/x"
			to("v2", prefixM("/v1/x")),
		)}, nil)
		checkProbes(t, c, []probe{
			{target: "/v1/items", want: "regex"},
			{target: "/v1/x", want: "v2"},
			{target: "/v1/y", want: "v1"},
			{target: "/v1", want: "v1"},
		})
	})
}

func TestHeaderAndQueryMatching(t *testing.T) {
	exactHdr := prefixM("/")
	exactHdr.Headers = []*meshv1.StringMatch{hdr("X-Env", "Prod")}
	reHdr := prefixM("/re")
	reHdr.Headers = []*meshv1.StringMatch{hdrRe("x-version", `v[12]`)}
	dup := prefixM("/dup")
	dup.Headers = []*meshv1.StringMatch{hdr("x-a", "1"), hdr("X-A", "2")} // only the first counts
	q := prefixM("/q")
	q.QueryParams = []*meshv1.StringMatch{hdr("Color", "red")}
	qre := prefixM("/qre")
	qre.QueryParams = []*meshv1.StringMatch{hdrRe("n", `[0-9]+`)}
	host := prefixM("/host")
	host.Headers = []*meshv1.StringMatch{hdr("host", "web:8080")}
	c := compileWeb(t, []*meshv1.HTTPRoute{httpRoute("r", epoch,
		to("headers", exactHdr), to("v1", reHdr), to("v2", dup), to("query", q), to("v3", qre), to("host", host),
	)}, nil)
	checkProbes(t, c, []probe{
		{target: "/", headers: map[string]string{"x-env": "Prod"}, want: "headers"}, // names are case-insensitive
		{target: "/", headers: map[string]string{"X-Env": "prod"}, want: ""},        // values are not
		{target: "/re", headers: map[string]string{"X-Version": "v2"}, want: "v1"},
		{target: "/re", headers: map[string]string{"X-Version": "v22"}, want: ""}, // full match
		{target: "/dup", headers: map[string]string{"x-a": "1"}, want: "v2"},
		{target: "/dup", headers: map[string]string{"x-a": "2"}, want: ""},
		{target: "/q?Color=red", want: "query"},
		{target: "/q?color=red", want: ""}, // query parameter names are exact
		{target: "/q?Color=red&Color=blue", want: "query"},
		{target: "/q?Color=blue&Color=red", want: ""}, // the first value counts
		{target: "/qre?n=123", want: "v3"},
		{target: "/qre?n=12a", want: ""},
		{target: "/host", headers: map[string]string{"Host": "web:8080"}, want: "host"},
	})
}

func TestHostnamePrecedence(t *testing.T) {
	exact := httpRoute("exact-host", epoch.Add(time.Hour), to("host", prefixM("/")))
	exact.Hostnames = []string{"foo.example.com"}
	wild := httpRoute("wildcard", epoch, to("wild", prefixM("/")))
	wild.Hostnames = []string{"*.example.com"}
	none := httpRoute("no-hosts", epoch, to("none", exactM("/a")))
	c := compileWeb(t, []*meshv1.HTTPRoute{exact, wild, none}, nil)
	checkProbes(t, c, []probe{
		// The most specific hostname wins before path precedence is looked at.
		{target: "/a", headers: map[string]string{"Host": "foo.example.com:80"}, want: "host"},
		{target: "/a", headers: map[string]string{"Host": "FOO.example.com"}, want: "host"},
		{target: "/a", headers: map[string]string{"Host": "bar.example.com"}, want: "wild"},
		{target: "/a", headers: map[string]string{"Host": "a.b.example.com"}, want: "wild"},
		{target: "/a", headers: map[string]string{"Host": "example.com"}, want: "none"},
		{target: "/b", headers: map[string]string{"Host": "example.com"}, want: ""},
	})
}

func TestImplicitRouteAndNoRoute(t *testing.T) {
	c := Compile(nil, nil, []*meshv1.Service{service("web", svcPort(80, "http"), svcPort(81, "tcp"))}, nil)
	tb := c.tables[tableKey{ServiceRef{testNS, "web"}, 80}]
	if tb == nil || tb.implicit == nil {
		t.Fatal("a service port without routes must have an implicit route")
	}
	if b := tb.implicit.backends[0]; b.svc.Name != "web" || b.port != 80 || b.invalid != "" {
		t.Fatalf("implicit backend = %v (%s)", b, b.invalid)
	}
	if c.tables[tableKey{ServiceRef{testNS, "web"}, 81}] != nil {
		t.Fatal("a TCP port has no route table")
	}
	// With a route attached, unmatched requests get no rule (404).
	c = compileWeb(t, []*meshv1.HTTPRoute{httpRoute("r", epoch, to("v1", exactM("/only")))}, nil)
	checkProbes(t, c, []probe{{target: "/only", want: "v1"}, {target: "/other", want: ""}})
}

func TestParentPort(t *testing.T) {
	r := httpRoute("r", epoch, to("v1"))
	r.Parents = []*meshv1.ParentRef{parent("web", 80)}
	svcs := append(backendServices()[1:], service("web", svcPort(80, "http"), svcPort(8080, "http")))
	c := Compile([]*meshv1.HTTPRoute{r}, nil, svcs, nil)
	if tb := c.tables[tableKey{ServiceRef{testNS, "web"}, 80}]; tb.implicit != nil || len(tb.http) != 1 {
		t.Fatal("route must attach to port 80")
	}
	if tb := c.tables[tableKey{ServiceRef{testNS, "web"}, 8080}]; tb.implicit == nil {
		t.Fatal("port 8080 has no route: implicit")
	}
	r.Parents = []*meshv1.ParentRef{parent("web", 9), parent("missing", 0)}
	c = Compile([]*meshv1.HTTPRoute{r}, nil, svcs, nil)
	if p := strings.Join(c.Problems(), "\n"); !strings.Contains(p, "has no port 9") || !strings.Contains(p, "missing not found") {
		t.Fatalf("problems = %q", p)
	}
}

func TestGRPCRouteMatching(t *testing.T) {
	exact := func(svc, method string) *meshv1.GRPCRouteMatch {
		return &meshv1.GRPCRouteMatch{Method: &meshv1.GRPCMethodMatch{Service: svc, Method: method}}
	}
	re := func(svc, method string) *meshv1.GRPCRouteMatch {
		return &meshv1.GRPCRouteMatch{Method: &meshv1.GRPCMethodMatch{Type: meshv1.GRPCMethodMatch_REGULAR_EXPRESSION, Service: svc, Method: method}}
	}
	withHeader := exact("pkg.Echo", "")
	withHeader.Headers = []*meshv1.StringMatch{hdr("x-canary", "1")}
	c := compileWeb(t, nil, []*meshv1.GRPCRoute{grpcRoute("g", epoch,
		grpcTo("v1", exact("pkg.Echo", "")),
		grpcTo("v2", exact("pkg.Echo", "Say")),
		grpcTo("v3", withHeader),
		grpcTo("regex", re(`pkg\..*`, `Get.*`)),
		grpcTo("method", exact("", "Ping")),
		grpcTo("a"),
	)})
	g := map[string]string{"Content-Type": "application/grpc"}
	gh := map[string]string{"Content-Type": "application/grpc+proto", "X-Canary": "1"}
	checkProbes(t, c, []probe{
		{method: "POST", target: "/pkg.Echo/Say", headers: g, want: "v2"},   // service and method beat service only
		{method: "POST", target: "/pkg.Echo/Other", headers: g, want: "v1"}, // service only
		{method: "POST", target: "/pkg.Echo/Other", headers: gh, want: "v3"},
		{method: "POST", target: "/pkg.Store/GetItem", headers: g, want: "regex"},
		{method: "POST", target: "/pkg.Store/PutItem", headers: g, want: "a"},
		{method: "POST", target: "/other.Svc/Ping", headers: g, want: "method"},
		{method: "POST", target: "/not-grpc-path", headers: g, want: "a"},
		{method: "GET", target: "/pkg.Echo/Say", want: ""}, // not gRPC: GRPCRoutes do not match
	})
}

func TestHTTPAndGRPCRouteConflict(t *testing.T) {
	older := httpRoute("h", epoch, to("http"))
	newer := grpcRoute("g", epoch.Add(time.Hour), grpcTo("grpc"))
	c := compileWeb(t, []*meshv1.HTTPRoute{older}, []*meshv1.GRPCRoute{newer})
	g := map[string]string{"Content-Type": "application/grpc"}
	checkProbes(t, c, []probe{{method: "POST", target: "/pkg.S/M", headers: g, want: "http"}})
	if !slices.ContainsFunc(c.Problems(), func(p string) bool { return strings.Contains(p, "GRPCRoute default/g: not accepted") }) {
		t.Fatalf("problems = %q", c.Problems())
	}
	// Disjoint hostnames: both accepted.
	older.Hostnames = []string{"a.example.com"}
	newer.Hostnames = []string{"b.example.com"}
	c = compileWeb(t, []*meshv1.HTTPRoute{older}, []*meshv1.GRPCRoute{newer})
	checkProbes(t, c, []probe{
		{method: "POST", target: "/pkg.S/M", headers: map[string]string{"Content-Type": "application/grpc", "Host": "b.example.com"}, want: "grpc"},
		{method: "POST", target: "/pkg.S/M", headers: map[string]string{"Content-Type": "application/grpc", "Host": "a.example.com"}, want: "http"},
	})
}

func TestInvalidInputNeverWidens(t *testing.T) {
	bad := prefixM("/")
	bad.Headers = []*meshv1.StringMatch{hdrRe("x", `(`)}
	badRegex := regexM(`[`)
	c := compileWeb(t, []*meshv1.HTTPRoute{httpRoute("r", epoch,
		to("v1", bad, exactM("/ok")), // the bad match is dropped, the good one stays
		to("v2", badRegex),           // no usable match: rule dropped
	)}, nil)
	checkProbes(t, c, []probe{{target: "/ok", want: "v1"}, {target: "/", want: ""}})
	if len(c.Problems()) != 3 {
		t.Fatalf("problems = %q", c.Problems())
	}

	// A filter that cannot be carried out makes the rule answer 500.
	rw := to("v1", exactM("/x"))
	rw.Filters = []*meshv1.HTTPRouteFilter{{Filter: &meshv1.HTTPRouteFilter_UrlRewrite{UrlRewrite: &meshv1.URLRewrite{
		Path: &meshv1.PathModifier{Type: meshv1.PathModifier_REPLACE_PREFIX_MATCH, Value: "/y"}}}}}
	c = compileWeb(t, []*meshv1.HTTPRoute{httpRoute("r", epoch, rw)}, nil)
	ru := c.tables[tableKey{ServiceRef{testNS, "web"}, 80}].http[0].rule
	if !strings.Contains(ru.invalid, "ReplacePrefixMatch") {
		t.Fatalf("invalid = %q", ru.invalid)
	}

	// Invalid hostnames drop the whole route.
	hr := httpRoute("r", epoch, to("v1"))
	hr.Hostnames = []string{"a.*.example.com"}
	c = compileWeb(t, []*meshv1.HTTPRoute{hr}, nil)
	checkProbes(t, c, []probe{{target: "/", want: "web"}}) // implicit: no route attached
}

func FuzzRouteMatch(f *testing.F) {
	f.Add("/foo", "/foo/bar", "x-a", "1", "q=1")
	f.Add("/", "/%2e%2e/a", "X-A", "", "")
	f.Add("/a/", "/a", "", "", "a=b&a=c")
	f.Fuzz(func(t *testing.T, prefix, target, hname, hval, query string) {
		m := prefixM(prefix)
		if hname != "" {
			m.Headers = []*meshv1.StringMatch{hdr(hname, hval)}
		}
		c := Compile([]*meshv1.HTTPRoute{httpRoute("r", epoch, to("v1", m), to("v2", regexM(prefix)))}, nil, backendServices(), nil)
		r, err := http.NewRequest("GET", "http://web/", nil)
		if err != nil {
			return
		}
		r.URL.Path, r.URL.RawPath, r.URL.RawQuery = "", target, query
		if hname != "" {
			r.Header[http.CanonicalHeaderKey(hname)] = []string{hval}
		}
		p, err := normalizePath(target)
		if err != nil {
			return
		}
		v := newReqView(r, p)
		ru := c.tables[tableKey{ServiceRef{testNS, "web"}, 80}].route(&v)
		// A prefix match that is valid must agree with the segment rule.
		pm, err := compilePathMatch(&meshv1.PathMatch{Value: prefix})
		if err != nil || ru == nil {
			return
		}
		if ru.backends[0].svc.Name == "v1" && !hasSegmentPrefix(p, pm.trimmed) {
			t.Fatalf("prefix %q matched %q", prefix, p)
		}
	})
}

func TestDump(t *testing.T) {
	m := prefixM("/api")
	m.Method = "GET"
	m.Headers = []*meshv1.StringMatch{hdr("x-a", "1")}
	r := httpRoute("r", epoch, to("v1", m), to("v2", exactM("/api")))
	r.Hostnames = []string{"*.example.com"}
	d := compileWeb(t, []*meshv1.HTTPRoute{r}, nil).Dump()
	var web *TableDump
	for i := range d.Tables {
		if d.Tables[i].Service == "default/web" {
			web = &d.Tables[i]
		}
	}
	if web == nil || web.Implicit || len(web.Rules) != 2 {
		t.Fatalf("dump = %+v", d)
	}
	if got := web.Rules[0]; got.Match != `Exact /api` || got.Backends[0] != "default/v2:80 weight=1" || got.Hostnames[0] != "*.example.com" {
		t.Errorf("first rule = %+v", got)
	}
	if got := web.Rules[1].Match; got != `PathPrefix /api method=GET header:X-A=1` {
		t.Errorf("second rule match = %q", got)
	}
}

// The host routes match: port, brackets, case and a trailing dot go.
func TestRequestHost(t *testing.T) {
	for in, want := range map[string]string{
		"":                "",
		"example.com":     "example.com",
		"Example.COM.":    "example.com",
		"example.com:80":  "example.com",
		"Example.com.:80": "example.com",
		"10.0.0.1:8080":   "10.0.0.1",
		"[::1]:80":        "::1",
		"[::1]":           "::1",
		"[FE80::1]:443":   "fe80::1",
		"::1":             "::1",   // not a host:port: kept
		"a:b:c":           "a:b:c", // likewise
	} {
		if got := requestHost(in); got != want {
			t.Errorf("requestHost(%q) = %q, want %q", in, got, want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { requestHost("backend.bench") }); n != 0 {
		t.Errorf("%v allocations for a host without a port", n)
	}
}

// GEP-1294 (conformance MeshConsumerRoute): a route in another namespace
// than its parent Service is a consumer route. It applies only to callers
// from its own namespace, and for them instead of the producer's routes
// (the groups never merge); every other caller, and an unauthenticated one,
// gets the producer's routes.
func TestConsumerRoutes(t *testing.T) {
	h := newHarness(t)
	h.addService("web", "http")
	h.backend("v1", "http", false)
	h.backend("v2", "http", false)
	producer := httpRoute("producer", epoch, withFilters(to("v1"), respHeaders([]*meshv1.Header{hv("X-Route", "producer")}, nil)))
	consumerRule := withFilters(to("v2", prefixM("/")), respHeaders([]*meshv1.Header{hv("X-Route", "consumer")}, nil))
	consumerRule.Backends[0].Backend.Namespace = testNS
	consumer := &meshv1.HTTPRoute{Namespace: "client", Name: "consumer", CreationTime: timestamppb.New(epoch.Add(-time.Hour)),
		Parents: []*meshv1.ParentRef{parent("web", 80), {Namespace: "elsewhere", Name: "not-served-here"}}, Rules: []*meshv1.HTTPRouteRule{consumerRule}}
	// Only /only-here matches for callers from "client": the producer's
	// catch-all does not fill in.
	narrow := &meshv1.HTTPRoute{Namespace: "narrow", Name: "narrow", Parents: []*meshv1.ParentRef{parent("web", 0)},
		Rules: []*meshv1.HTTPRouteRule{to("v2", exactM("/only-here"))}}
	narrow.Rules[0].Backends[0].Backend.Namespace = testNS
	c := h.update([]*meshv1.HTTPRoute{producer, consumer, narrow}, nil)
	if p := c.Problems(); len(p) != 0 {
		t.Errorf("problems: %v", p)
	}

	ca := trusttest.NewCA(t, "cluster.local")
	from := func(id string) *http.Client {
		peer := trust.Unauthenticated()
		if id != "" {
			peer = ca.Peer(t, ca.Certificate(t, trusttest.Identity(t, id), 0))
		}
		return h1Client(h.front(webInfo(peer)))
	}
	for _, tc := range []struct {
		caller, path, want string
		status             int
	}{
		{"spiffe://cluster.local/ns/client/sa/app", "/", "consumer", 200},
		{"spiffe://cluster.local/ns/other/sa/app", "/", "producer", 200},
		{"spiffe://cluster.local/ns/" + testNS + "/sa/app", "/", "producer", 200},
		{"", "/", "producer", 200},
		{"spiffe://cluster.local/ns/narrow/sa/app", "/only-here", "", 200},
		{"spiffe://cluster.local/ns/narrow/sa/app", "/", "", 404},
	} {
		res := get(t, from(tc.caller), tc.path, nil)
		if res.status != tc.status || res.header.Get("X-Route") != tc.want {
			t.Errorf("caller %q %s: %d X-Route %q, want %d %q", tc.caller, tc.path, res.status, res.header.Get("X-Route"), tc.status, tc.want)
		}
	}
	var consumers []string
	for _, td := range c.Dump().Tables {
		if td.ConsumerNamespace != "" {
			consumers = append(consumers, fmt.Sprintf("%s:%d %s", td.Service, td.Port, td.ConsumerNamespace))
		}
	}
	if got := strings.Join(consumers, ", "); got != "default/web:80 client, default/web:80 narrow" {
		t.Errorf("consumer tables in the dump: %s", got)
	}
}
