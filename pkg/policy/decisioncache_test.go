package policy

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/causeway-mesh/causeway/pkg/trust"
)

func compiledModules(t *testing.T, policy string) map[string]*ast.Module {
	t.Helper()
	m, err := ast.ParseModuleWithOpts("authz.rego", policy, ast.ParserOptions{RegoVersion: ast.RegoV1})
	if err != nil {
		t.Fatal(err)
	}
	c := ast.NewCompiler().WithDefaultRegoVersion(ast.RegoV1).WithEnablePrintStatements(true)
	c.Compile(map[string]*ast.Module{"authz.rego": m})
	if c.Failed() {
		t.Fatal(c.Errors)
	}
	return c.Modules
}

func TestDecisionCacheAnalysis(t *testing.T) {
	const pkg = "package envoy.authz\n\n"
	for name, tc := range map[string]struct {
		policy string
		paths  []string // nil: not cached
		reason string
	}{
		"principal, method and path segment": {
			policy: `allow if {
	input.attributes.source.principal == "spiffe://cluster.local/ns/a/sa/b"
	input.attributes.request.http.method in {"GET", "HEAD"}
	input.parsed_path[0] == "api"
}`,
			paths: []string{"input.attributes.request.http.method", "input.attributes.source.principal", `input.parsed_path[0]`},
		},
		"import aliases resolve to what is read": {
			policy: `import input.attributes.request.http as request

allow if request.method == "GET"`,
			paths: []string{"input.attributes.request.http.method"},
		},
		"variable parts cut the path; their own references count": {
			policy: `allow if {
	some name
	input.attributes.request.http.headers[name] == "x"
	input.parsed_query[input.source_principal]
}`,
			paths: []string{"input.attributes.request.http.headers", "input.parsed_query", "input.source_principal"},
		},
		"a shorter path covers longer ones": {
			policy: `allow if {
	input.attributes.request.http.method == "GET"
	count(input.attributes.request) > 0
}`,
			paths: []string{"input.attributes.request"},
		},
		"references in function arguments, comprehensions, every and with": {
			policy: `f(x) := x

names := {n | some n, _ in input.parsed_query}

allow if {
	f(input.a) == 1
	every s in input.b { s != "" }
	count(names) > 0
	g with input.c as 1
}

g if input.d`,
			paths: []string{"input.a", "input.b", "input.c", "input.d", "input.parsed_query"},
		},
		"input as a whole": {
			policy: `allow if count(input) > 0`,
			reason: "reads input as a whole",
		},
		"input assigned": {
			policy: `allow if {
	x := input
	x.a == 1
}`,
			reason: "input as a whole",
		},
		"first step variable": {
			policy: `allow if {
	some k
	input[k] == 1
}`,
			reason: "reads input as a whole",
		},
		"walk over input": {
			policy: `allow if {
	some path, value
	walk(input, [path, value])
	value == "x"
}`,
			reason: "input as a whole",
		},
		"clock": {
			policy: `allow if time.now_ns() > input.t`,
			reason: "nondeterministic built-in time.now_ns",
		},
		"http.send": {
			policy: `allow if http.send({"method": "GET", "url": input.u}).status_code == 200`,
			reason: "http.send",
		},
		"random": {
			policy: `allow if rand.intn("x", 10) > input.n`,
			reason: "rand.intn",
		},
		"x509 verification reads the clock": {
			policy: `allow if {
	[valid, _] := crypto.x509.parse_and_verify_certificates(input.chain)
	valid
}`,
			reason: "reads the clock",
		},
		"print": {
			policy: `allow if {
	print(input.a)
	input.a == 1
}`,
			reason: "print",
		},
		"nondeterminism anywhere in the set": {
			policy: `allow if input.a == 1

unrelated := time.now_ns()`,
			reason: "time.now_ns",
		},
	} {
		t.Run(name, func(t *testing.T) {
			c, reason := newDecisionCache(compiledModules(t, pkg+tc.policy))
			if tc.paths == nil {
				if c != nil || !strings.Contains(reason, tc.reason) {
					t.Fatalf("cache %v, reason %q; want none because %q", c != nil, reason, tc.reason)
				}
				return
			}
			if c == nil {
				t.Fatalf("not cached: %s", reason)
			}
			if got := c.status().InputPaths; !reflect.DeepEqual(got, tc.paths) {
				t.Fatalf("paths %q, want %q", got, tc.paths)
			}
		})
	}
}

func TestDecisionCacheKeysOnlyIdenticalValues(t *testing.T) {
	c, reason := newDecisionCache(compiledModules(t, "package p\n\nallow if input.a == input.b\n"))
	if c == nil {
		t.Fatal(reason)
	}
	key := func(src string) string {
		k, ok := c.key(nil, astInput{ast.MustParseTerm(src).Value})
		if !ok {
			t.Fatalf("%s: not cacheable", src)
		}
		return string(k)
	}
	distinct := []string{
		`{}`,
		`{"a": 1}`,
		`{"a": 1.0}`,
		`{"a": "1"}`,
		`{"a": null}`,
		`{"b": 1}`,
		`{"a": [1]}`,
		`{"a": {1}}`,
		`{"a": {}}`,
		`{"a": set()}`,
		`{"a": "x\u0000y"}`,
		`{"a": "x", "b": "y"}`,
		`{"a": "x\u0000\"y\"", "b": ""}`,
		`{"a": []}`,
		`{"a": [""]}`,
		`{"a": ["", ""]}`,
		`{"a": ["x"]}`,
		`{"a": ["x", "y"]}`,
		`{"a": ["xy"]}`,
		`{"a": ["x", 1]}`,
		`{"a": ["x"], "b": ["y"]}`,
		`{"a": ["x", "y"], "b": []}`,
		`{"a": [["x"]]}`,
		`{"a": ["x", "s:y"]}`,
		`{"a": ["xs:", "y"]}`,
	}
	seen := map[string]string{}
	for _, src := range distinct {
		k := key(src)
		if prev, dup := seen[k]; dup {
			t.Errorf("%s and %s share key %q", prev, src, k)
		}
		seen[k] = src
	}
	if key(`{"a": 1, "c": "ignored"}`) != key(`{"a": 1, "c": "other"}`) {
		t.Error("a value the policy cannot read changed the key")
	}
	big := fmt.Sprintf(`{"a": %q}`, strings.Repeat("x", maxCacheKey))
	if _, ok := c.key(nil, astInput{ast.MustParseTerm(big).Value}); ok {
		t.Error("an oversized key was accepted")
	}
}

func TestDecisionCacheExpires(t *testing.T) {
	c, _ := newDecisionCache(compiledModules(t, "package p\n\nallow if input.a\n"))
	now := time.Now()
	c.put([]byte("k"), nil, Decision{}, now)
	if _, ok := c.get([]byte("k"), now.Add(decisionCacheTTL-time.Nanosecond)); !ok {
		t.Fatal("entry gone before its time")
	}
	if _, ok := c.get([]byte("k"), now.Add(decisionCacheTTL)); ok {
		t.Fatal("entry outlived the TTL")
	}
	if _, ok := c.get([]byte("other"), now); ok {
		t.Fatal("hit for a key never stored")
	}
}

// A cached engine must decide every request exactly as an uncached one,
// whatever the order of requests: random requests over a small domain (so
// keys repeat), several policy shapes.
func TestDecisionCacheAgreesWithEvaluation(t *testing.T) {
	p := newPeers(t)
	policies := map[string]string{
		"example": `package envoy.authz

import input.attributes.request.http as request

allowed := {"spiffe://cluster.local/ns/shop/sa/checkout": {"spiffe://cluster.local/ns/shop/sa/frontend"}}

default allow := {"allowed": false, "http_status": 403}

allow := {"allowed": true, "headers": {"x-by": input.source_principal}} if {
	input.source_principal in allowed[input.destination_principal]
	request.method != "DELETE"
}

allow := {"allowed": true} if input.parsed_path == ["healthz"]
`,
		"headers and query": `package envoy.authz

default allow := false

allow if {
	some name, value in input.attributes.request.http.headers
	startswith(name, "x-tenant")
	value == input.parsed_query.tenant[0]
}

allow if input.attributes.request.http.headers["x-admin"] == "yes"
`,
		"path and method sets": `package envoy.authz

rules := [{"m": "GET", "p": "a"}, {"m": "POST", "p": "b"}]

allow if {
	some r in rules
	r.m == input.attributes.request.http.method
	r.p == input.parsed_path[0]
	not input.parsed_path[1] == "secret"
}
`,
		"with, functions and object.get": `package envoy.authz

is_get if input.attributes.request.http.method == "GET"

tenant(h) := t if t := h["x-tenant-id"]

tenant(h) := t if {
	not h["x-tenant-id"]
	t := object.get(input.parsed_query, "tenant", ["none"])[0]
}

allow if {
	is_get with input.attributes.request.http.method as "GET"
	tenant(input.attributes.request.http.headers) == "t1"
	not input.attributes.request.http.headers["x-admin"]
}
`,
		"dynamic path index": `package envoy.authz

allow if {
	n := count(input.parsed_path)
	input.parsed_path[n - 1] == "ok"
}
`,
	}
	methods := []string{"GET", "POST", "DELETE"}
	paths := []string{"/a", "/b", "/a/secret", "/healthz", "/x/ok", "/a/ok", "/b?tenant=t1", "/a?tenant=t2"}
	headers := []string{"", "X-Tenant-Id: t1\n", "X-Tenant: t2\n", "X-Admin: yes\n", "X-Admin: no\n"}
	peersFor := []trust.Peer{p.frontend, p.tlsOnly}
	for name, policy := range policies {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			writeFiles(t, dir, map[string]string{"authz.rego": policy})
			cached, _ := loadEngine(t, Options{Dir: dir, Registerer: prometheus.NewRegistry()})
			plain, _ := loadEngine(t, Options{Dir: dir, NoDecisionCache: true})
			if st := cached.Status().DecisionCache; st == nil || !st.Enabled {
				t.Fatalf("cache not enabled: %+v", st)
			}
			if st := plain.Status().DecisionCache; st == nil || st.Enabled {
				t.Fatalf("NoDecisionCache: status %+v", st)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			for i := 0; i < 600; i++ {
				raw := fmt.Sprintf("%s %s HTTP/1.1\nHost: shop\n%s\n", methods[rng.IntN(len(methods))], paths[rng.IntN(len(paths))], headers[rng.IntN(len(headers))])
				req := &Request{HTTP: readRequest(t, raw), Source: peersFor[rng.IntN(len(peersFor))],
					SourceAddr: netip.MustParseAddrPort(fmt.Sprintf("127.0.10.%d:%d", 1+rng.IntN(3), 40000+rng.IntN(3))),
					DestAddr:   netip.MustParseAddrPort("127.0.20.1:8080"), Destination: p.checkout, Time: fixedTime}
				got, want := cached.Decide(context.Background(), req), plain.Decide(context.Background(), req)
				got.ID, want.ID = "", ""
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("request %d %q: cached %+v, evaluated %+v", i, raw, got, want)
				}
			}
			if hits := counterValue(t, cached.metrics.cacheHit); hits == 0 {
				t.Error("no decision was reused")
			}
		})
	}
}

func TestDecisionCacheIsPerPolicy(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"authz.rego": goodPolicy})
	e, _ := loadEngine(t, Options{Dir: dir})
	req := &Request{HTTP: request(t, "GET / HTTP/1.1\nHost: x\n\n")}
	for range 2 {
		if d := e.Decide(context.Background(), req); !d.Allowed {
			t.Fatalf("denied: %s", d.Reason)
		}
	}
	writeFiles(t, dir, map[string]string{"authz.rego": strings.Replace(goodPolicy, `"GET"`, `"POST"`, 1)})
	if err := e.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := e.Decide(context.Background(), req); d.Allowed {
		t.Fatal("a decision of the previous policy was reused")
	}
}

func TestDecisionCacheHitsGetTheirOwnID(t *testing.T) {
	e, _ := loadEngine(t, Options{Dir: "testdata/example", Registerer: prometheus.NewRegistry()})
	req := benchRequest(t)
	first := e.Decide(context.Background(), req)
	second := e.Decide(context.Background(), req)
	if !first.Allowed || !second.Allowed {
		t.Fatalf("denied: %s / %s", first.Reason, second.Reason)
	}
	if counterValue(t, e.metrics.cacheHit) != 1 || counterValue(t, e.metrics.cacheMiss) != 1 {
		t.Fatalf("hits %v misses %v, want 1 and 1", counterValue(t, e.metrics.cacheHit), counterValue(t, e.metrics.cacheMiss))
	}
	if first.ID == second.ID {
		t.Error("a reused decision kept the first decision's id")
	}
	// The rest is the first decision's (its maps shared: read only).
	first.ID, second.ID = "", ""
	if !reflect.DeepEqual(first, second) || second.Headers.Get("X-Authz-Policy") != "example" {
		t.Errorf("a reused decision differs:\n%+v\nwant %+v", second, first)
	}
}

// Hits share one result between requests and the decision log: reading it
// concurrently must be safe (run with -race).
func TestDecisionCacheConcurrentHits(t *testing.T) {
	core := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(discard{}), zapcore.InfoLevel)
	dl, err := NewDecisionLogger(zap.New(core), DecisionLogOptions{Buffer: 4096})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var logDone sync.WaitGroup
	logDone.Go(func() { dl.Run(ctx) })
	e, _ := loadEngine(t, Options{Dir: "testdata/example", DecisionLog: dl})
	req := benchRequest(t)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 200 {
				if d := e.Decide(context.Background(), req); !d.Allowed || d.Headers.Get("X-Authz-Policy") != "example" {
					t.Errorf("decision %+v", d)
					return
				}
			}
		})
	}
	wg.Wait()
	cancel()
	logDone.Wait()
}

// A miss is evaluated on only what the policy reads: the values at its
// paths, arrays whole, inside the objects that lead to them.
func TestDecisionCachePrunesTheInput(t *testing.T) {
	c, reason := newDecisionCache(compiledModules(t, `package p

allow if {
	input.attributes.request.http.method == "GET"
	input.attributes.request.http.headers["x-tenant"] == input.parsed_query.tenant[0]
	input.parsed_path[1] == "orders"
	not input.attributes.request.http.headers["x-blocked"]
	input.missing.value
}
`))
	if c == nil {
		t.Fatal(reason)
	}
	input := ast.MustParseTerm(`{
		"attributes": {"request": {"http": {"method": "GET", "path": "/api/orders?tenant=a",
			"headers": {"x-tenant": "a", "accept": "*/*"}}}, "source": {"principal": "p"}},
		"parsed_path": ["api", "orders"],
		"parsed_query": {"tenant": ["a"], "other": ["b"]},
		"version": {"ext_authz": "v3"}
	}`).Value
	want := ast.MustParseTerm(`{
		"attributes": {"request": {"http": {"method": "GET", "headers": {"x-tenant": "a"}}}},
		"parsed_path": ["api", "orders"],
		"parsed_query": {"tenant": ["a"]}
	}`).Value
	if got := c.prune(astInput{input}); got.Compare(want) != 0 {
		t.Fatalf("pruned input\n%v\nwant\n%v", got, want)
	}

	c, _ = newDecisionCache(compiledModules(t, "package p\n\nallow if input[0] == 1\n"))
	if c == nil || c.prune(astInput{input}) != nil {
		t.Fatal("a number as the first step must not prune")
	}
}
