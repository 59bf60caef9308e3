package l7

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// webHarness serves backend web with an authorizer that allows and keeps
// in *seen the last request it saw.
func webHarness(t *testing.T, seen **AuthzRequest) *harness {
	h := newHarness(t)
	h.backend("web", "http", false)
	h.update(nil, nil)
	h.setAuthz(AuthorizerFunc(func(_ context.Context, r *AuthzRequest) Decision {
		*seen = r
		return Decision{Allowed: true}
	}))
	return h
}

func TestForwardingAndIdentityHeaders(t *testing.T) {
	var seen *AuthzRequest
	h := webHarness(t, &seen)
	ca := trusttest.NewCA(t, "cluster.local")
	client := trusttest.Identity(t, "spiffe://cluster.local/ns/client/sa/app")
	forged := "spiffe://cluster.local/ns/admin/sa/admin"
	claims := map[string]string{
		"X-Forwarded-Client-Cert": "By=spiffe://x;URI=" + forged,
		SourcePrincipalHeader:     forged,
		"X-Causeway-Anything":     "reserved",
		"Client-Cert":             ":Zm9v:",
		"X-Forwarded-For":         "192.0.2.1",
		"Forwarded":               `for="192.0.2.1"`,
	}
	for _, tc := range []struct {
		name string
		peer trust.Peer
		want string
	}{
		{"authenticated", ca.Peer(t, ca.Certificate(t, client, 0)), client.String()},
		{"tls-only", ca.Peer(t, nil), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := get(t, h1Client(h.front(webInfo(tc.peer))), "/x", claims)
			if res.status != 200 || res.echo.Backend != "web" {
				t.Fatalf("got %d %q", res.status, res.body)
			}
			got := res.echo.Header
			for _, k := range []string{"X-Forwarded-Client-Cert", "X-Causeway-Anything", "Client-Cert"} {
				if v, ok := got[k]; ok {
					t.Errorf("%s reached the backend: %q", k, v)
				}
			}
			if v := got.Values(SourcePrincipalHeader); tc.want == "" && len(v) != 0 || tc.want != "" && (len(v) != 1 || v[0] != tc.want) {
				t.Errorf("%s = %q, want %q", SourcePrincipalHeader, v, tc.want)
			}
			if v := got.Get("X-Forwarded-For"); v != "192.0.2.1, 10.1.2.3" {
				t.Errorf("X-Forwarded-For = %q", v)
			}
			if v := got.Get("Forwarded"); v != `for="192.0.2.1", for="10.1.2.3:45678"` {
				t.Errorf("Forwarded = %q", v)
			}
			// Policy never sees the forged claims either.
			if seen == nil || seen.Request.Header.Get("X-Forwarded-Client-Cert") != "" || seen.Request.Header.Get(SourcePrincipalHeader) != "" {
				t.Errorf("authorizer saw identity headers: %v", seen)
			}
			if id, ok := seen.Peer.Identity(); ok != (tc.want != "") || ok && id.String() != tc.want {
				t.Errorf("authorizer peer = %v", seen.Peer)
			}
			if seen.DestinationIdentity.String() != "spiffe://cluster.local/ns/default/sa/web" || seen.Destination != h.backends["web"].addr {
				t.Errorf("authorizer destination = %v %v", seen.Destination, seen.DestinationIdentity)
			}
		})
	}
	// The dialer was asked for the endpoint with its identity.
	if d := h.dialer.seen[0]; d.Identity.String() != "spiffe://cluster.local/ns/default/sa/web" || d.Service.Name != "web" {
		t.Fatalf("dial target = %+v", d)
	}
}

// A field whose name reads as an identity, forwarding or framing field
// once '_' is taken for '-' never reaches policy or the backend: a backend
// that folds '_' into '-' (CGI, WSGI, Rack) would take it for the real one.
// Other names with '_' pass.
func TestUnderscoreNamesCannotClaimIdentity(t *testing.T) {
	var seen *AuthzRequest
	h := webHarness(t, &seen)
	forged := "spiffe://cluster.local/ns/admin/sa/admin"
	claims := map[string]string{
		"X_Forwarded_Client_Cert":     "URI=" + forged,
		"x-causeway-source_principal": forged,
		"X_CAUSEWAY_ANYTHING":         "reserved",
		"x_forwarded_for":             "192.0.2.1",
		"Transfer_Encoding":           "chunked",
		"Content_Length":              "5",
		"X_Request_Tag":               "kept",
	}
	res := get(t, h1Client(h.front(webInfo(trust.Unauthenticated()))), "/x", claims)
	if res.status != 200 {
		t.Fatalf("got %d %q", res.status, res.body)
	}
	for k := range res.echo.Header {
		if k != "X_request_tag" && strings.Contains(k, "_") {
			t.Errorf("%s reached the backend: %q", k, res.echo.Header[k])
		}
	}
	if v := res.echo.Header.Get("X_Request_Tag"); v != "kept" {
		t.Errorf("an ordinary name with '_' was dropped: %q", v)
	}
	if v := res.echo.Header.Values(SourcePrincipalHeader); len(v) != 0 {
		t.Errorf("%s = %q for a TLS-only tunnel", SourcePrincipalHeader, v)
	}
	if seen == nil {
		t.Fatal("not authorized")
	}
	for k := range seen.Request.Header {
		if k != "X_request_tag" && strings.Contains(k, "_") {
			t.Errorf("the authorizer saw %s", k)
		}
	}
}

func TestTrailersCannotClaimIdentity(t *testing.T) {
	h := newHarness(t)
	h.backend("web", "http", false)
	h.update(nil, nil)
	c := h1Client(h.front(webInfo(trust.Unauthenticated())))
	req, _ := http.NewRequest("POST", "http://web/", io.MultiReader(strings.NewReader("data")))
	req.Trailer = http.Header{"X-Checksum": {"abc"}, "X-Forwarded-Client-Cert": {"URI=spiffe://cluster.local/ns/admin/sa/admin"}}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	e := readResult(t, resp).echo
	if e.Body != "data" || e.Trailer.Get("X-Checksum") != "abc" {
		t.Fatalf("body %q trailer %v", e.Body, e.Trailer)
	}
	if v := e.Trailer.Get("X-Forwarded-Client-Cert"); v != "" {
		t.Fatalf("identity claim in a trailer reached the backend: %q", v)
	}
}

func TestNoRouteNoEndpointInvalidBackend(t *testing.T) {
	h := newHarness(t)
	h.addService("web", "http")
	h.addService("empty", "http")
	h.backend("v1", "http", false)
	badRef := &meshv1.HTTPRouteRule{Matches: []*meshv1.HTTPRouteMatch{exactM("/invalid")},
		Backends: []*meshv1.HTTPBackendRef{{Backend: &meshv1.BackendRef{Name: "v1", Port: 80, InvalidReason: "RefNotPermitted"}, Weight: 1}}}
	h.update([]*meshv1.HTTPRoute{httpRoute("r", epoch,
		to("v1", exactM("/ok")),
		to("empty", exactM("/empty")),
		to("missing", exactM("/missing")),
		badRef,
		&meshv1.HTTPRouteRule{Matches: []*meshv1.HTTPRouteMatch{exactM("/nobackend")}},
		&meshv1.HTTPRouteRule{Matches: []*meshv1.HTTPRouteMatch{exactM("/zero")}, Backends: []*meshv1.HTTPBackendRef{backendRef("v1", 80, 0)}},
		&meshv1.HTTPRouteRule{Matches: []*meshv1.HTTPRouteMatch{exactM("/broken")}, InvalidReason: "ExtensionRef filter not supported", Backends: []*meshv1.HTTPBackendRef{backendRef("v1", 80, 1)}},
	)}, nil)
	c := h1Client(h.front(webInfo(trust.Unauthenticated())))
	// /missing names a Service the gateway does not know and the control
	// plane did not refuse (an Ingress's backend may come later): 503, as
	// for one without endpoints. A refused reference (/invalid) is 500.
	for path, want := range map[string]int{
		"/ok": 200, "/nothing": 404, "/empty": 503, "/missing": 503, "/invalid": 500,
		"/nobackend": 500, "/zero": 500, "/broken": 500,
	} {
		if res := get(t, c, path, nil); res.status != want {
			t.Errorf("GET %s = %d %q, want %d", path, res.status, res.body, want)
		}
	}
	if n := h.backends["v1"].count.Load(); n != 1 {
		t.Errorf("v1 got %d requests, want 1 (only /ok)", n)
	}
	// A service with no route at all goes to its own endpoints: none here.
	h.update(nil, nil)
	if res := get(t, c, "/ok", nil); res.status != 503 {
		t.Errorf("implicit route to a service without endpoints = %d", res.status)
	}
}

func TestWeightsAndInvalidShare(t *testing.T) {
	h := newHarness(t)
	h.addService("web", "http")
	for _, n := range []string{"v1", "v2", "v3"} {
		h.backend(n, "http", false)
	}
	invalid := &meshv1.HTTPBackendRef{Backend: &meshv1.BackendRef{Name: "v3", Port: 80, InvalidReason: "RefNotPermitted"}, Weight: 1}
	h.update([]*meshv1.HTTPRoute{httpRoute("r", epoch,
		&meshv1.HTTPRouteRule{Matches: []*meshv1.HTTPRouteMatch{prefixM("/split")},
			Backends: []*meshv1.HTTPBackendRef{backendRef("v1", 80, 1), backendRef("v2", 80, 2), backendRef("v3", 80, 7), backendRef("web", 80, 0)}},
		&meshv1.HTTPRouteRule{Matches: []*meshv1.HTTPRouteMatch{prefixM("/half")},
			Backends: []*meshv1.HTTPBackendRef{backendRef("v1", 80, 1), invalid}},
	)}, nil)
	c := h1Client(h.front(webInfo(trust.Unauthenticated())))
	const n = 1000
	got := map[string]int{}
	for i := 0; i < n; i++ {
		res := get(t, c, "/split", nil)
		got[res.echo.Backend]++
	}
	for name, weight := range map[string]int{"v1": 1, "v2": 2, "v3": 7} {
		want := n * weight / 10
		if d := got[name] - want; d > n/20 || d < -n/20 {
			t.Errorf("%s got %d of %d, want %d±%d", name, got[name], n, want, n/20)
		}
	}
	if got["web"] != 0 {
		t.Errorf("weight 0 backend got %d requests", got["web"])
	}
	// Keep-alive: one tunnel per endpoint carried all its requests.
	for _, name := range []string{"v1", "v2", "v3"} {
		if n := h.dialer.count(h.backends[name].addr); n != 1 {
			t.Errorf("%s dialed %d times for sequential requests, want 1", name, n)
		}
	}
	errs := 0
	for i := 0; i < n; i++ {
		switch res := get(t, c, "/half", nil); res.status {
		case 500:
			errs++
		case 200:
		default:
			t.Fatalf("unexpected %d", res.status)
		}
	}
	if errs < n/2-n/20 || errs > n/2+n/20 {
		t.Errorf("invalid backend share: %d of %d got 500, want about half", errs, n)
	}
}

func TestConnectFailureRetriedAndEjected(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.EjectionTime = time.Minute })
	h.addService("web", "http")
	live := h.backend("live", "http", false)
	dead := deadAddr(t)
	h.addService("flaky", "http", dead, live.addr)
	h.addService("down", "http", deadAddr(t))
	h.update([]*meshv1.HTTPRoute{httpRoute("r", epoch, to("flaky", prefixM("/flaky")), to("down", prefixM("/down")))}, nil)
	c := h1Client(h.front(webInfo(trust.Unauthenticated())))
	for i := 0; i < 60; i++ {
		if res := get(t, c, "/flaky", nil); res.status != 200 || res.echo.Backend != "live" {
			t.Fatalf("request %d: %d %q", i, res.status, res.body)
		}
	}
	// Power of two choices tries the dead endpoint sooner or later; one
	// connect failure ejects it for the ejection time.
	if n := h.dialer.count(dead); n != 1 {
		t.Errorf("dead endpoint dialed %d times, want exactly 1", n)
	}
	if res := get(t, c, "/down", nil); res.status != 503 {
		t.Errorf("only endpoint unreachable: %d, want 503", res.status)
	}
}

func dur(d time.Duration) *durationpb.Duration { return durationpb.New(d) }

func TestTimeoutsAndRetries(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.MaxBufferedBody = 64 })
	h.addService("web", "http")
	slow := h.backend("slow", "http", false)
	slow.setBehave(func(_ int64, w http.ResponseWriter, r *http.Request) bool { stall(w, r); return true })
	flaky := h.backend("flaky", "http", false)
	rule := func(path, dest string, req, backend time.Duration, retry *meshv1.HTTPRouteRetry) *meshv1.HTTPRouteRule {
		r := to(dest, prefixM(path))
		if req > 0 {
			r.RequestTimeout = dur(req)
		}
		if backend > 0 {
			r.BackendRequestTimeout = dur(backend)
		}
		r.Retry = retry
		return r
	}
	h.update([]*meshv1.HTTPRoute{httpRoute("r", epoch,
		rule("/request-timeout", "slow", 300*time.Millisecond, 0, nil),
		rule("/backend-timeout", "slow", 0, 300*time.Millisecond, nil),
		rule("/retry", "flaky", 10*time.Second, 300*time.Millisecond, &meshv1.HTTPRouteRetry{Attempts: 2, Backoff: dur(10 * time.Millisecond)}),
		rule("/retry-one", "flaky", 0, 0, &meshv1.HTTPRouteRetry{Attempts: 1, Backoff: dur(time.Millisecond)}),
		rule("/retry-502-only", "flaky", 0, 0, &meshv1.HTTPRouteRetry{Attempts: 3, Codes: []uint32{502}}),
		rule("/no-retry", "flaky", 0, 0, nil),
		rule("/bounded", "flaky", time.Second, 0, &meshv1.HTTPRouteRetry{Attempts: 5, Backoff: dur(10 * time.Second)}),
		rule("/all-slow", "slow", 800*time.Millisecond, 100*time.Millisecond, &meshv1.HTTPRouteRetry{Attempts: 100, Backoff: dur(10 * time.Millisecond)}),
	)}, nil)
	c := h1Client(h.front(webInfo(trust.Unauthenticated())))

	if res := get(t, c, "/request-timeout", nil); res.status != 504 {
		t.Errorf("request timeout: %d, want 504", res.status)
	}
	if res := get(t, c, "/backend-timeout", nil); res.status != 504 {
		t.Errorf("backendRequest timeout: %d, want 504", res.status)
	}

	// failFirst answers 503 to the first n requests, then stalls the next
	// one once when stallNext, then echoes.
	failFirst := func(n int64, stallAt int64) {
		flaky.count.Store(0)
		flaky.setBehave(func(i int64, w http.ResponseWriter, r *http.Request) bool {
			switch {
			case i <= n:
				w.WriteHeader(503)
				return true
			case i == stallAt:
				stall(w, r)
				return true
			}
			return false
		})
	}

	failFirst(1, 2) // 503, then a stalled attempt cut by backendRequest, then success
	res := do(t, c, "POST", "/retry", []byte("payload"), nil)
	if res.status != 200 || res.echo.Body != "payload" || flaky.count.Load() != 3 {
		t.Errorf("retry: %d %q after %d attempts, want 200 with the body replayed after 3", res.status, res.body, flaky.count.Load())
	}

	failFirst(2, 0)
	if res := get(t, c, "/retry-one", nil); res.status != 503 || flaky.count.Load() != 2 {
		t.Errorf("attempts 1: %d after %d attempts, want 503 after 2", res.status, flaky.count.Load())
	}
	failFirst(1, 0)
	if res := get(t, c, "/retry-502-only", nil); res.status != 503 || flaky.count.Load() != 1 {
		t.Errorf("503 not in codes: %d after %d attempts", res.status, flaky.count.Load())
	}
	failFirst(1, 0)
	if res := get(t, c, "/no-retry", nil); res.status != 503 || flaky.count.Load() != 1 {
		t.Errorf("no retry stanza: %d after %d attempts", res.status, flaky.count.Load())
	}
	// A body beyond the buffer limit streams and cannot be replayed.
	failFirst(1, 0)
	big := bytes.Repeat([]byte("x"), 1000)
	if res := do(t, c, "POST", "/retry", big, nil); res.status != 503 || flaky.count.Load() != 1 {
		t.Errorf("unbuffered body: %d after %d attempts, want 503 after 1", res.status, flaky.count.Load())
	}
	if res := do(t, c, "POST", "/retry", big, nil); res.status != 200 || res.echo.Body != string(big) {
		t.Errorf("streamed body: %d, %d bytes arrived", res.status, len(res.echo.Body))
	}
	// The backoff would outlast the request timeout: no retry, the
	// backend's answer stands.
	failFirst(100, 0)
	if res := get(t, c, "/bounded", nil); res.status != 503 || flaky.count.Load() != 1 {
		t.Errorf("retry beyond the request timeout: %d after %d attempts", res.status, flaky.count.Load())
	}
	// Retries stop at the request timeout.
	slow.count.Store(0)
	if res := get(t, c, "/all-slow", nil); res.status != 504 || slow.count.Load() < 2 {
		t.Errorf("retries until the request timeout: %d after %d attempts", res.status, slow.count.Load())
		for _, e := range h.logs.All() {
			t.Logf("log: %s %v", e.Message, e.ContextMap())
		}
	}
}

// An attempt whose backendRequest timeout ends it while its tunnel is
// still being dialed timed out (504), like any other attempt that outlives
// it; the endpoint is not ejected for it.
func TestBackendTimeoutDuringDial(t *testing.T) {
	h := newHarness(t)
	h.addService("web", "http")
	h.backend("v1", "http", false)
	r := to("v1")
	r.BackendRequestTimeout = dur(100 * time.Millisecond)
	h.update([]*meshv1.HTTPRoute{httpRoute("r", epoch, r)}, nil)
	c := h1Client(h.front(webInfo(trust.Unauthenticated())))
	h.dialer.mu.Lock()
	h.dialer.slow = 2 * time.Second
	h.dialer.mu.Unlock()
	if res := get(t, c, "/", nil); res.status != http.StatusGatewayTimeout {
		t.Fatalf("dial outlasting the backendRequest timeout: %d %q, want 504", res.status, res.body)
	}
	h.dialer.mu.Lock()
	h.dialer.slow = 0
	h.dialer.mu.Unlock()
	if res := get(t, c, "/", nil); res.status != http.StatusOK {
		t.Fatalf("after a timed-out dial: %d %q, want 200 (endpoint not ejected)", res.status, res.body)
	}
}

func TestConfigUpdateWhileServing(t *testing.T) {
	h := newHarness(t)
	h.addService("web", "http")
	h.backend("v1", "http", false)
	h.backend("v2", "http", false)
	h.update([]*meshv1.HTTPRoute{httpRoute("r", epoch, to("v1"))}, nil)
	c := h1Client(h.front(webInfo(trust.Unauthenticated())))
	if res := get(t, c, "/", nil); res.echo.Backend != "v1" {
		t.Fatalf("before: %q", res.echo.Backend)
	}
	h.update([]*meshv1.HTTPRoute{httpRoute("r", epoch, to("v2"))}, nil)
	if res := get(t, c, "/", nil); res.echo.Backend != "v2" {
		t.Fatalf("after: %q", res.echo.Backend)
	}
}

func TestNoConfigYet(t *testing.T) {
	h := newHarness(t)
	c := h1Client(h.front(webInfo(trust.Unauthenticated())))
	if res := get(t, c, "/", nil); res.status != 503 {
		t.Fatalf("before any configuration: %d", res.status)
	}
}

func TestWorkloadAddressed(t *testing.T) {
	h := newHarness(t)
	ln, err := net.Listen("tcp", "127.0.0.77:0")
	if err != nil {
		t.Skipf("127.0.0.77 unavailable: %v", err)
	}
	b := &testBackend{name: "pod"}
	b.srv = httptest.NewUnstartedServer(b)
	b.srv.Listener.Close()
	b.srv.Listener = ln
	b.srv.Start()
	t.Cleanup(b.srv.Close)
	addr := netip.MustParseAddrPort(ln.Addr().String())
	h.works = append(h.works, &meshv1.Workload{Uid: "pod-1", Name: "pod", Namespace: testNS,
		Identity: "spiffe://cluster.local/ns/default/sa/pod", Addresses: []string{"127.0.0.77"}})
	h.update(nil, nil)
	info := ConnInfo{Peer: trust.Unauthenticated(), Source: callerAddr, Destination: addr, Protocol: ProtocolHTTP}
	res := get(t, h1Client(h.front(info)), "/direct", nil)
	if res.status != 200 || res.echo.Backend != "pod" || res.echo.Path != "/direct" {
		t.Fatalf("workload-addressed: %d %q", res.status, res.body)
	}
	unknown := info
	unknown.Destination = netip.MustParseAddrPort("127.0.0.78:80")
	if res := get(t, h1Client(h.front(unknown)), "/", nil); res.status != 503 {
		t.Fatalf("unknown workload: %d", res.status)
	}
}

func TestLeastOutstandingPrefersIdle(t *testing.T) {
	busy := &endpoint{}
	idle := &endpoint{}
	busy.outstanding.Store(5)
	for i := 0; i < 100; i++ {
		if got := pickEndpoint(endpointTiers{{busy, idle}}, nil); got != idle {
			t.Fatal("power of two choices over two endpoints must take the idle one")
		}
	}
	ejected := &endpoint{}
	ejected.ejectedTill.Store(time.Now().Add(time.Hour).UnixNano())
	for i := 0; i < 100; i++ {
		if got := pickEndpoint(endpointTiers{{ejected, busy}}, nil); got != busy {
			t.Fatal("an ejected endpoint is skipped while another is healthy")
		}
	}
	if got := pickEndpoint(endpointTiers{{ejected}}, nil); got != ejected {
		t.Fatal("with every endpoint ejected, all are candidates again")
	}
	if got := pickEndpoint(nil, nil); got != nil {
		t.Fatal("no endpoints: nil")
	}
	// Over many endpoints the busiest is never chosen.
	eps := make([]*endpoint, 10)
	for i := range eps {
		eps[i] = &endpoint{}
		eps[i].outstanding.Store(int64(i))
	}
	for i := 0; i < 1000; i++ {
		if pickEndpoint(endpointTiers{eps}, nil) == eps[9] {
			t.Fatal("the most loaded endpoint can never win a pair")
		}
	}
}

func TestForwardedElement(t *testing.T) {
	for in, want := range map[string]string{
		"10.1.2.3:45678":          `for="10.1.2.3:45678"`,
		"[::ffff:10.1.2.3]:45678": `for="10.1.2.3:45678"`,
		"[2001:db8::1]:443":       `for="[2001:db8::1]:443"`,
	} {
		if got := forwardedElement(netip.MustParseAddrPort(in)); got != want {
			t.Errorf("forwardedElement(%s) = %s, want %s", in, got, want)
		}
	}
}

// deadlineOnly is a context whose deadline has passed but whose timer has
// not fired yet: the moment a dial's own timeout can end it. (A real
// context is only in that state for microseconds.)
type deadlineOnly struct {
	context.Context
	at time.Time
}

func (c deadlineOnly) Deadline() (time.Time, bool) { return c.at, true }

// A dial cut short by our own deadline, even before the context knows, is
// a timeout: it neither counts against the endpoint nor reads as a
// connect failure.
func TestDeadlinePassedBeforeTheContextKnows(t *testing.T) {
	ctx := deadlineOnly{Context: context.Background(), at: time.Now().Add(-time.Millisecond)}
	if ctx.Err() != nil || !pastDeadline(ctx) {
		t.Fatal("pastDeadline must see a passed deadline before ctx.Err does")
	}
	if pastDeadline(context.Background()) {
		t.Fatal("no deadline has not passed")
	}
	refused := netip.MustParseAddrPort("127.0.0.1:1") // nothing listens there
	ep := &endpoint{pool: &pools{dialer: &testDialer{}, ejection: time.Minute}}
	ep.target.Store(&Target{Address: refused})
	if _, err := ep.dial(ctx, "http/1.1"); err == nil {
		t.Fatal("dial to a closed port succeeded")
	}
	if !ep.healthy(time.Now().UnixNano()) {
		t.Fatal("endpoint ejected for a dial our own deadline ended")
	}
	if _, err := ep.dial(context.Background(), "http/1.1"); err == nil {
		t.Fatal("dial to a closed port succeeded")
	}
	if ep.healthy(time.Now().UnixNano()) {
		t.Fatal("a refused connection did not eject the endpoint")
	}
}
