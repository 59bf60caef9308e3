package policy

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/pkg/internal/metricstest"
	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// writeFiles writes name -> content under dir.
func writeFiles(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func newTestEngine(t testing.TB, opts Options) (*Engine, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	if opts.Logger == nil {
		opts.Logger = zap.New(core)
	}
	e, err := NewEngine(opts)
	if err != nil {
		t.Fatal(err)
	}
	return e, logs
}

func loadEngine(t testing.TB, opts Options) (*Engine, *observer.ObservedLogs) {
	t.Helper()
	e, logs := newTestEngine(t, opts)
	if err := e.Load(context.Background()); err != nil {
		t.Fatalf("Load: %v", err)
	}
	return e, logs
}

func request(t testing.TB, raw string) *http.Request {
	t.Helper()
	return readRequest(t, raw)
}

func TestIstioQuickStartPolicyUnchanged(t *testing.T) {
	e, _ := loadEngine(t, Options{Dir: "testdata/istio-quickstart", DecisionPath: "istio/authz/allow"})
	basic := func(user string) string {
		return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":password"))
	}
	p := newPeers(t)
	for _, tc := range []struct {
		method, path, auth string
		allowed            bool
	}{
		{"GET", "/health", "", true},
		{"POST", "/health", "", false},
		{"GET", "/productpage", basic("alice"), true},
		{"GET", "/api/v1/products", basic("alice"), false},
		{"GET", "/api/v1/products", basic("bob"), true},
		{"GET", "/productpage", "", false},
	} {
		raw := fmt.Sprintf("%s %s HTTP/1.1\nHost: productpage\n", tc.method, tc.path)
		if tc.auth != "" {
			raw += "Authorization: " + tc.auth + "\n"
		}
		d := e.Decide(context.Background(), &Request{HTTP: request(t, raw+"\n"), Source: p.frontend})
		if d.Allowed != tc.allowed {
			t.Errorf("%s %s (%q): allowed = %v (%s), want %v", tc.method, tc.path, tc.auth, d.Allowed, d.Reason, tc.allowed)
		}
		if !d.Allowed && d.Status != http.StatusForbidden {
			t.Errorf("%s %s: status %d, want 403", tc.method, tc.path, d.Status)
		}
		if d.ID == "" || d.Revision == "" {
			t.Errorf("decision without id or revision: %+v", d)
		}
	}
}

// hs256 makes the kind of token the primer's policy verifies.
func hs256(t testing.TB, claims map[string]any) string {
	t.Helper()
	enc := base64.RawURLEncoding
	header := enc.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`))
	body, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	signing := header + "." + enc.EncodeToString(body)
	mac := hmac.New(sha256.New, []byte("secret"))
	mac.Write([]byte(signing))
	return signing + "." + enc.EncodeToString(mac.Sum(nil))
}

func TestPrimerPolicyUnchanged(t *testing.T) {
	e, _ := loadEngine(t, Options{Dir: "testdata/primer", Input: InputOptions{ParseBody: true}})
	now := time.Now().Unix()
	token := func(role string) string {
		return hs256(t, map[string]any{"role": role, "sub": base64.RawURLEncoding.EncodeToString([]byte("alice")),
			"nbf": now - 60, "exp": now + 3600})
	}
	decide := func(method, path, tok, body string) Decision {
		raw := fmt.Sprintf("%s %s HTTP/1.1\nHost: example\nAuthorization: Bearer %s\n", method, path, tok)
		if body != "" {
			raw += fmt.Sprintf("Content-Type: application/json\nContent-Length: %d\n", len(body))
		}
		return e.Decide(context.Background(), &Request{HTTP: request(t, raw+"\n"+body), Body: []byte(body)})
	}
	if d := decide("GET", "/people/1", token("guest"), ""); !d.Allowed {
		t.Errorf("guest GET /people/1 denied: %s", d.Reason)
	}
	if d := decide("POST", "/people", token("guest"), `{"firstname":"Bob"}`); d.Allowed {
		t.Error("guest POST /people allowed")
	}
	if d := decide("POST", "/people", token("admin"), `{"firstname":"Bob"}`); !d.Allowed {
		t.Errorf("admin POST /people (parsed_body) denied: %s", d.Reason)
	}
	if d := decide("POST", "/people", token("admin"), `{"firstname":"Alice"}`); d.Allowed {
		t.Error("admin POST /people for themselves allowed")
	}
	if d := decide("GET", "/people/1", token("guest")+"x", ""); d.Allowed {
		t.Error("bad signature allowed")
	}
	if d := decide("POST", "/people", token("admin"), `{"firstname":`); d.Allowed || d.Status != http.StatusBadRequest {
		t.Errorf("invalid JSON body: %+v, want 400 deny", d)
	}
}

// principalPolicy allows principal X by the attribute and by the top-level
// field, the two ways OPA-Envoy policies name the caller.
const principalPolicy = `package envoy.authz

default allow := false

allow if input.attributes.source.principal == "` + frontendID + `"

allow if input.source_principal == "` + frontendID + `"
`

func TestTLSOnlyTunnelCannotClaimPrincipal(t *testing.T) {
	p := newPeers(t)
	claims := "POST /orders HTTP/1.1\nHost: checkout\n" +
		"X-Forwarded-Client-Cert: By=" + checkoutID + ";URI=" + frontendID + "\n" +
		"Forwarded: for=\"127.0.0.1:4000\";by=\"" + frontendID + "\"\n" +
		"Baggage: k8s.serviceaccount.name=frontend\n\n"

	for name, dir := range map[string]string{"principal policy": "", "example policy": "testdata/example"} {
		t.Run(name, func(t *testing.T) {
			if dir == "" {
				dir = t.TempDir()
				writeFiles(t, dir, map[string]string{"authz.rego": principalPolicy})
			}
			e, _ := loadEngine(t, Options{Dir: dir})
			d := e.Decide(context.Background(), &Request{HTTP: request(t, claims), Source: p.tlsOnly, Destination: p.checkout})
			if d.Allowed || d.Status != http.StatusForbidden {
				t.Fatalf("TLS-only tunnel claiming %s by headers: %+v, want 403 deny", frontendID, d)
			}
			// The same request over an mTLS tunnel from that identity passes.
			d = e.Decide(context.Background(), &Request{HTTP: request(t, claims), Source: p.frontend, Destination: p.checkout})
			if !d.Allowed {
				t.Fatalf("authenticated %s denied: %s", frontendID, d.Reason)
			}
		})
	}
}

func TestExamplePolicyPair(t *testing.T) {
	e, _ := loadEngine(t, Options{Dir: "testdata/example"})
	st := e.Status()
	if st.Tests != 5 || st.Revision == "" || len(st.Files) != 2 {
		t.Fatalf("status = %+v, want 5 tests passed, 2 files and a revision", st)
	}
	p := newPeers(t)
	d := e.Decide(context.Background(), &Request{HTTP: request(t, "POST /orders HTTP/1.1\nHost: checkout\n\n"), Source: p.frontend, Destination: p.checkout})
	if !d.Allowed || d.Status != http.StatusOK || d.Headers.Get("X-Authz-Policy") != "example" {
		t.Fatalf("frontend -> checkout: %+v", d)
	}
	d = e.Decide(context.Background(), &Request{HTTP: request(t, "POST /orders HTTP/1.1\nHost: checkout\n\n"), Source: p.tlsOnly, Destination: p.checkout})
	if d.Allowed || d.Status != 403 || d.Body != "denied by mesh policy\n" || d.Headers.Get("Content-Type") != "text/plain" {
		t.Fatalf("unauthenticated -> checkout: %+v", d)
	}
}

func TestDecisionResults(t *testing.T) {
	cases := []struct {
		name, rego string
		check      func(t *testing.T, d Decision)
	}{
		{"undefined denies", "package envoy.authz\n\nallow if input.nothing == true\n", func(t *testing.T, d Decision) {
			if d.Allowed || d.Status != 403 || d.Reason != "undefined decision" {
				t.Errorf("%+v, want 403 undefined decision", d)
			}
		}},
		{"false denies", "package envoy.authz\n\nallow := false\n", func(t *testing.T, d Decision) {
			if d.Allowed || d.Status != 403 {
				t.Errorf("%+v, want 403", d)
			}
		}},
		{"object honoured on deny", `package envoy.authz

allow := {
	"allowed": false,
	"http_status": 429,
	"body": "slow down",
	"headers": [{"retry-after": "5"}, {"x-a": ["1", "2"]}],
}
`, func(t *testing.T, d Decision) {
			if d.Allowed || d.Status != 429 || d.Body != "slow down" || d.Headers.Get("Retry-After") != "5" ||
				strings.Join(d.Headers.Values("X-A"), ",") != "1,2" {
				t.Errorf("%+v", d)
			}
		}},
		{"object honoured on allow", `package envoy.authz

allow := {
	"allowed": true,
	"http_status": 404,
	"headers": {"x-user": "alice"},
	"response_headers_to_add": {"x-seen": "yes"},
	"request_headers_to_remove": ["authorization"],
}
`, func(t *testing.T, d Decision) {
			if !d.Allowed || d.Status != 200 || d.Headers.Get("X-User") != "alice" ||
				d.ResponseHeadersToAdd.Get("X-Seen") != "yes" || len(d.RequestHeadersToRemove) != 1 ||
				d.RequestHeadersToRemove[0] != "authorization" {
				t.Errorf("%+v", d)
			}
		}},
		{"non-boolean allowed denies", "package envoy.authz\n\nallow := {\"allowed\": \"yes\"}\n", func(t *testing.T, d Decision) {
			if d.Allowed || d.Status != 500 || !strings.Contains(d.Reason, `"allowed" is string`) {
				t.Errorf("%+v, want 500 about allowed", d)
			}
		}},
		{"missing allowed denies", "package envoy.authz\n\nallow := {\"headers\": {}}\n", func(t *testing.T, d Decision) {
			if d.Allowed || d.Status != 500 {
				t.Errorf("%+v, want 500", d)
			}
		}},
		{"number result denies", "package envoy.authz\n\nallow := 1\n", func(t *testing.T, d Decision) {
			if d.Allowed || d.Status != 500 {
				t.Errorf("%+v, want 500", d)
			}
		}},
		{"bad header in allow denies", "package envoy.authz\n\nallow := {\"allowed\": true, \"headers\": {\"x\": \"a\\r\\nb\"}}\n", func(t *testing.T, d Decision) {
			if d.Allowed || d.Status != 500 {
				t.Errorf("%+v, want 500 (header injection refused)", d)
			}
		}},
		{"bad http_status denies", "package envoy.authz\n\nallow := {\"allowed\": false, \"http_status\": 999}\n", func(t *testing.T, d Decision) {
			if d.Allowed || d.Status != 500 {
				t.Errorf("%+v, want 500", d)
			}
		}},
		{"evaluation error denies", `package envoy.authz

allow := true if input.attributes.request.http.method == "GET"

allow := false if input.attributes.request.http.host == "x"
`, func(t *testing.T, d Decision) {
			if d.Allowed || d.Status != 500 || !strings.Contains(d.Reason, "evaluation error") {
				t.Errorf("%+v, want 500 evaluation error", d)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFiles(t, dir, map[string]string{"authz.rego": tc.rego})
			e, _ := loadEngine(t, Options{Dir: dir})
			d := e.Decide(context.Background(), &Request{HTTP: request(t, "GET / HTTP/1.1\nHost: x\n\n")})
			if d.ID == "" {
				t.Error("decision without id")
			}
			tc.check(t, d)
		})
	}
}

func TestInterpretSeveralResults(t *testing.T) {
	rs := rego.ResultSet{
		{Expressions: []*rego.ExpressionValue{{Value: true}}},
		{Expressions: []*rego.ExpressionValue{{Value: true}}},
	}
	if d := interpret(rs); d.Allowed || d.Status != 500 {
		t.Fatalf("two results: %+v, want 500 deny", d)
	}
}

func TestNoPolicyDenies(t *testing.T) {
	e, _ := newTestEngine(t, Options{Dir: t.TempDir()})
	if err := e.Load(context.Background()); err == nil {
		t.Fatal("empty directory activated")
	}
	d := e.Decide(context.Background(), &Request{HTTP: request(t, "GET / HTTP/1.1\nHost: x\n\n")})
	if d.Allowed || d.Status != 500 || e.Ready() == nil {
		t.Fatalf("no policy: %+v ready=%v", d, e.Ready())
	}
}

func TestDecisionPathMustExist(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"authz.rego": "package other\n\nallow := true\n"})
	e, _ := newTestEngine(t, Options{Dir: dir})
	var re *RejectError
	if err := e.Load(context.Background()); !errors.As(err, &re) || re.Stage != "decision" {
		t.Fatalf("Load = %v, want rejection at decision", err)
	}
	e2, _ := loadEngine(t, Options{Dir: dir, DecisionPath: "data.other.allow"})
	if d := e2.Decide(context.Background(), &Request{HTTP: request(t, "GET / HTTP/1.1\nHost: x\n\n")}); !d.Allowed {
		t.Fatalf("data.other.allow: %+v", d)
	}
	// A decision held in a data document is a decision too.
	writeFiles(t, dir, map[string]string{"authz.rego": "package other\n\nx := 1\n", "envoy/authz/data.json": `{"allow": true}`})
	e3, _ := loadEngine(t, Options{Dir: dir})
	if d := e3.Decide(context.Background(), &Request{HTTP: request(t, "GET / HTTP/1.1\nHost: x\n\n")}); !d.Allowed {
		t.Fatalf("data document decision: %+v", d)
	}
}

func TestParseDecisionPath(t *testing.T) {
	for in, want := range map[string]string{
		"":                       "data.envoy.authz.allow",
		"envoy/authz/allow":      "data.envoy.authz.allow",
		"/istio/authz/allow":     "data.istio.authz.allow",
		"data.envoy.authz.allow": "data.envoy.authz.allow",
		"a-b/allow":              `data["a-b"].allow`,
	} {
		ref, err := ParseDecisionPath(in)
		if err != nil || ref.String() != want {
			t.Errorf("ParseDecisionPath(%q) = %v, %v; want %s", in, ref, err, want)
		}
	}
	for _, bad := range []string{"a//b", "data.x[y]", "data"} {
		if _, err := ParseDecisionPath(bad); err == nil {
			t.Errorf("ParseDecisionPath(%q) accepted", bad)
		}
	}
}

const goodPolicy = `package envoy.authz

default allow := false

allow if input.attributes.request.http.method == "GET"
`

const goodTest = `package envoy.authz_test

import data.envoy.authz

test_get_allowed if authz.allow with input as {"attributes": {"request": {"http": {"method": "GET"}}}}

test_post_denied if not authz.allow with input as {"attributes": {"request": {"http": {"method": "POST"}}}}
`

func TestBrokenPolicyKeepsPrevious(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"authz.rego": goodPolicy, "authz_test.rego": goodTest})
	e, logs := loadEngine(t, Options{Dir: dir})
	rev := e.Revision()
	get := func() Decision {
		return e.Decide(context.Background(), &Request{HTTP: request(t, "GET / HTTP/1.1\nHost: x\n\n")})
	}

	for name, files := range map[string]map[string]string{
		"syntax error":    {"broken.rego": "package envoy.authz\n\nallow if {\n"},
		"v0 syntax":       {"broken.rego": "package envoy.authz\n\nallow { true }\n"},
		"compile error":   {"broken.rego": "package envoy.authz\n\nx if undefined_function(1)\n"},
		"recursive rules": {"broken.rego": "package envoy.authz\n\np if q\n\nq if p\n"},
	} {
		t.Run(name, func(t *testing.T) {
			writeFiles(t, dir, files)
			defer os.Remove(filepath.Join(dir, "broken.rego"))
			err := e.Load(context.Background())
			var re *RejectError
			if !errors.As(err, &re) {
				t.Fatalf("Load = %v, want a rejection", err)
			}
			if e.Revision() != rev {
				t.Fatalf("active revision changed to %s", e.Revision())
			}
			if d := get(); !d.Allowed || d.Revision != rev {
				t.Fatalf("previous policy not serving: %+v", d)
			}
			found := false
			for _, entry := range logs.FilterMessage("policy rejected, keeping the active policy").All() {
				reason, _ := entry.ContextMap()["reason"].(string)
				if strings.Contains(reason, "broken.rego") && entry.ContextMap()["active_revision"] == rev {
					found = true
				}
			}
			if !found {
				t.Fatalf("no rejection log naming broken.rego; logs: %v", logs.All())
			}
			if st := e.Status(); st.LastRejection == nil || st.LastRejection.Revision != re.Revision {
				t.Fatalf("status last rejection = %+v", st.LastRejection)
			}
		})
	}
	// Repairing the directory activates again.
	writeFiles(t, dir, map[string]string{"extra.rego": "package envoy.authz\n\nextra := 1\n"})
	if err := e.Load(context.Background()); err != nil {
		t.Fatalf("repaired directory: %v", err)
	}
	if e.Revision() == rev {
		t.Fatal("revision did not change after a good change")
	}
}

func TestFailingTestsBlockActivation(t *testing.T) {
	failing := goodTest + "\ntest_post_allowed if authz.allow with input as {\"attributes\": {\"request\": {\"http\": {\"method\": \"POST\"}}}}\n"

	// Never activated: nothing serves.
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"authz.rego": goodPolicy, "authz_test.rego": failing})
	e, logs := newTestEngine(t, Options{Dir: dir})
	err := e.Load(context.Background())
	var re *RejectError
	if !errors.As(err, &re) || re.Stage != "test" || len(re.FailedTests) != 1 ||
		!strings.Contains(re.FailedTests[0], "envoy.authz_test.test_post_allowed") {
		t.Fatalf("Load = %#v, want test rejection naming test_post_allowed", err)
	}
	if err := e.Ready(); err == nil || !strings.Contains(err.Error(), "test_post_allowed") {
		t.Fatalf("engine with failing tests: ready = %v, want the failing test named", err)
	}
	entries := logs.FilterMessage("policy rejected, keeping the active policy").All()
	if len(entries) == 0 || !strings.Contains(fmt.Sprint(entries[len(entries)-1].ContextMap()["failed_tests"]), "test_post_allowed") {
		t.Fatalf("rejection log lacks the failing test: %v", entries)
	}

	// Active policy, then a change whose tests fail: the old one stays.
	writeFiles(t, dir, map[string]string{"authz_test.rego": goodTest})
	if err := e.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	rev := e.Revision()
	writeFiles(t, dir, map[string]string{"authz.rego": strings.Replace(goodPolicy, `"GET"`, `"POST"`, 1)})
	if err := e.Load(context.Background()); !errors.As(err, &re) || re.Stage != "test" {
		t.Fatalf("Load = %v, want test rejection", err)
	}
	if e.Revision() != rev {
		t.Fatal("policy with failing tests was activated")
	}

	// SkipTests (meshctl policy eval) activates regardless.
	e2, _ := newTestEngine(t, Options{Dir: dir, SkipTests: true})
	if err := e2.Load(context.Background()); err != nil {
		t.Fatalf("SkipTests: %v", err)
	}
}

func TestDataDocuments(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"authz.rego": `package envoy.authz

allow if input.attributes.request.http.method in data.config.methods
`,
		"config/data.yaml": "methods: [GET, HEAD]\n",
	})
	e, _ := loadEngine(t, Options{Dir: dir})
	if d := e.Decide(context.Background(), &Request{HTTP: request(t, "HEAD / HTTP/1.1\nHost: x\n\n")}); !d.Allowed {
		t.Fatalf("HEAD: %+v", d)
	}
	writeFiles(t, dir, map[string]string{"config/data.yaml": "methods: [GET]\n"})
	if err := e.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := e.Decide(context.Background(), &Request{HTTP: request(t, "HEAD / HTTP/1.1\nHost: x\n\n")}); d.Allowed {
		t.Fatal("data change not picked up")
	}
}

func TestSourceLimits(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"authz.rego": goodPolicy + "# " + strings.Repeat("x", 2000) + "\n"})
	e, _ := newTestEngine(t, Options{Dir: dir, Limits: Limits{MaxFileBytes: 1000}})
	if err := e.Load(context.Background()); err == nil || !strings.Contains(err.Error(), "larger than 1000 bytes") {
		t.Fatalf("Load = %v, want size limit error", err)
	}
}

func TestDecisionLogMaskingAndDrops(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	reg := prometheus.NewRegistry()
	dl, err := NewDecisionLogger(zap.New(core), DecisionLogOptions{Buffer: 1, Registerer: reg, MaskHeaders: []string{"X-Api-Key"}})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"authz.rego": `package envoy.authz

allow := {"allowed": true, "response_headers_to_add": {"set-cookie": "session=s3cr3t", "x-ok": "1"}}
`})
	e, _ := loadEngine(t, Options{Dir: dir, DecisionLog: dl, Input: InputOptions{ParseBody: true}})
	body := `{"password":"hunter2"}`
	raw := "POST /login HTTP/1.1\nHost: x\nAuthorization: Bearer tok3n\nProxy-Authorization: Basic cHc=\n" +
		"Cookie: sid=c00kie\nX-Api-Key: k3y\nUser-Agent: test\nContent-Type: application/json\n" +
		fmt.Sprintf("Content-Length: %d\n\n%s", len(body), body)
	d := e.Decide(context.Background(), &Request{HTTP: request(t, raw), Body: []byte(body)})
	if !d.Allowed {
		t.Fatal(d.Reason)
	}
	// The queue holds one entry and nobody drains it yet: the next is dropped.
	e.Decide(context.Background(), &Request{HTTP: request(t, "GET / HTTP/1.1\nHost: x\n\n")})
	if dl.Dropped() != 1 {
		t.Fatalf("dropped = %d, want 1", dl.Dropped())
	}
	if got := counterValue(t, dl.droppedTotal); got != 1 {
		t.Fatalf("dropped counter = %v, want 1", got)
	}
	if v := gathered(t, reg, "policy_decision_logs_dropped_total"); v != 1 {
		t.Fatalf("registered dropped counter = %v, want 1", v)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	dl.Run(ctx) // drains what is queued, then returns
	entries := logs.FilterMessage("decision").All()
	if len(entries) != 1 {
		t.Fatalf("%d decision log entries, want 1", len(entries))
	}
	line, err := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()).EncodeEntry(entries[0].Entry, entries[0].Context)
	if err != nil {
		t.Fatal(err)
	}
	text := line.String()
	for _, secret := range []string{"tok3n", "cHc=", "c00kie", "k3y", "s3cr3t", "hunter2"} {
		if strings.Contains(text, secret) {
			t.Errorf("decision log leaks %q: %s", secret, text)
		}
	}
	var m map[string]any
	if err := json.Unmarshal(line.Bytes(), &m); err != nil {
		t.Fatalf("decision log is not one JSON line: %v", err)
	}
	headers := dig(m["input"].(map[string]any), "attributes", "request", "http")["headers"].(map[string]any)
	for _, h := range []string{"authorization", "proxy-authorization", "cookie", "x-api-key"} {
		if headers[h] != Masked {
			t.Errorf("header %s = %v, want masked", h, headers[h])
		}
	}
	if headers["user-agent"] != "test" || m["decision_id"] != d.ID || m["allowed"] != true || m["revision"] != d.Revision {
		t.Errorf("decision log lost fields: %s", text)
	}
	if rh := m["result"].(map[string]any)["response_headers_to_add"].(map[string]any); rh["set-cookie"] != Masked || rh["x-ok"] != "1" {
		t.Errorf("result headers = %v", rh)
	}
}

func TestDecideNeverBlocksOnLog(t *testing.T) {
	dl, err := NewDecisionLogger(zap.NewNop(), DecisionLogOptions{Buffer: 4})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"authz.rego": goodPolicy})
	e, _ := loadEngine(t, Options{Dir: dir, DecisionLog: dl})
	r := request(t, "GET / HTTP/1.1\nHost: x\n\n")
	for i := 0; i < 100; i++ { // nobody drains: must not block
		e.Decide(context.Background(), &Request{HTTP: r})
	}
	if dl.Dropped() != 96 {
		t.Fatalf("dropped = %d, want 96", dl.Dropped())
	}
}

func TestEngineMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"authz.rego": goodPolicy})
	e, _ := loadEngine(t, Options{Dir: dir, Registerer: reg})
	e.Decide(context.Background(), &Request{HTTP: request(t, "GET / HTTP/1.1\nHost: x\n\n")})
	e.Decide(context.Background(), &Request{HTTP: request(t, "POST / HTTP/1.1\nHost: x\n\n")})
	e.Decide(context.Background(), &Request{HTTP: request(t, "GET /?a=%zz HTTP/1.1\nHost: x\n\n")})
	m := e.metrics
	for result, c := range map[string]prometheus.Counter{"allow": m.allow, "deny": m.deny, "bad_request": m.badRequest, "error": m.errorDeny} {
		want := 1.0
		if result == "error" {
			want = 0
		}
		if got := counterValue(t, c); got != want {
			t.Errorf("decisions{result=%s} = %v, want %v", result, got, want)
		}
	}
	if _, err := NewEngine(Options{Dir: dir, Registerer: reg}); err == nil {
		t.Error("second engine on one registry: want a registration error")
	}
}

func TestDecideInputFromJSON(t *testing.T) {
	e, _ := loadEngine(t, Options{Dir: "testdata/example"})
	in, err := ast.ValueFromReader(strings.NewReader(`{"source_principal": "` + frontendID + `", "destination_principal": "` + checkoutID + `"}`))
	if err != nil {
		t.Fatal(err)
	}
	if d := e.DecideInput(context.Background(), in); !d.Allowed {
		t.Fatalf("%+v", d)
	}
}

func counterValue(t testing.TB, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// gathered returns the value of an unlabelled counter from a registry, -1 if absent.
func gathered(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	if v, ok := metricstest.Value(t, reg, name, nil); ok {
		return v
	}
	return -1
}

// slowPolicy needs millions of steps; evaluation must be cut off.
const slowPolicy = `package envoy.authz

r := numbers.range(1, 3000)

allow if {
	every a in r {
		every b in r {
			a + b > 0
		}
	}
}
`

func TestEvaluationIsBounded(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"authz.rego": slowPolicy})
	req := &Request{HTTP: request(t, "GET / HTTP/1.1\nHost: x\n\n")}

	e, _ := loadEngine(t, Options{Dir: dir, EvalTimeout: 50 * time.Millisecond})
	start := time.Now()
	d := e.Decide(context.Background(), req)
	if d.Allowed || d.Status != http.StatusInternalServerError || !strings.Contains(d.Reason, "cancel") {
		t.Fatalf("slow policy with a timeout: %+v, want 500 canceled", d)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("evaluation ran %v despite a 50ms timeout", took)
	}

	// The caller's context cancels too.
	e2, _ := loadEngine(t, Options{Dir: dir, EvalTimeout: -1})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if d := e2.Decide(ctx, req); d.Allowed || d.Status != http.StatusInternalServerError || !strings.Contains(d.Reason, "evaluation cancelled") {
		t.Fatalf("slow policy with a canceled context: %+v", d)
	}
	// The timeout is the policy's failure; the caller giving up is not.
	if got := counterValue(t, e.metrics.errorDeny); got != 1 {
		t.Errorf("evaluation timeout: decisions{result=error} = %v, want 1", got)
	}
	if got, errs := counterValue(t, e2.metrics.cancelled), counterValue(t, e2.metrics.errorDeny); got != 1 || errs != 0 {
		t.Errorf("caller cancelled: decisions{result=cancelled} = %v, {result=error} = %v; want 1, 0", got, errs)
	}
}

func dig(m map[string]any, keys ...string) map[string]any {
	for _, k := range keys {
		next, ok := m[k].(map[string]any)
		if !ok {
			return nil
		}
		m = next
	}
	return m
}

// The decision log records all decisions, only denials, or none.
func TestDecisionLogModes(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"authz.rego": goodPolicy})
	get := &Request{HTTP: request(t, "GET / HTTP/1.1\nHost: x\n\n")}
	del := &Request{HTTP: request(t, "DELETE / HTTP/1.1\nHost: x\n\n")}
	bad := &Request{HTTP: request(t, "GET /a?b=%zz HTTP/1.1\nHost: x\n\n")}
	for mode, want := range map[DecisionLogMode][]bool{
		"":              {true, false, false}, // all: allowed, denied, bad request
		LogAllDecisions: {true, false, false},
		LogDenials:      {false, false},
		LogNoDecisions:  {},
	} {
		core, logs := observer.New(zapcore.InfoLevel)
		dl, err := NewDecisionLogger(zap.New(core), DecisionLogOptions{Mode: mode})
		if err != nil {
			t.Fatal(err)
		}
		e, _ := loadEngine(t, Options{Dir: dir, DecisionLog: dl})
		if !e.Decide(context.Background(), get).Allowed || e.Decide(context.Background(), del).Allowed || e.Decide(context.Background(), bad).Allowed {
			t.Fatal("policy decided unexpectedly")
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		dl.Run(ctx)
		var got []bool
		for _, entry := range logs.FilterMessage("decision").All() {
			got = append(got, entry.ContextMap()["allowed"].(bool))
		}
		if !slices.Equal(got, want) {
			t.Errorf("mode %q logged allowed=%v, want %v", mode, got, want)
		}
	}
	if _, err := NewDecisionLogger(nil, DecisionLogOptions{Mode: "some"}); err == nil {
		t.Error("unknown mode accepted")
	}
	if _, err := ParseDecisionLogMode("denied"); err != nil {
		t.Error(err)
	}
}
