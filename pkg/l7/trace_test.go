package l7

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/causeway-mesh/causeway/pkg/tracing"
	"github.com/causeway-mesh/causeway/pkg/tracing/otlpexport"
	"github.com/causeway-mesh/causeway/pkg/tracing/otlptest"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// tracedHarness is a harness whose engine traces to a real OTLP receiver
// over gRPC; flush exports what is queued.
func tracedHarness(t *testing.T, sampling float64) (*harness, *otlptest.Receiver, func()) {
	t.Helper()
	rcv := otlptest.Start(t)
	p, err := otlpexport.New(otlpexport.Options{Settings: tracing.Settings{Endpoint: rcv.GRPCAddr, Protocol: tracing.GRPC, Sampling: sampling},
		ServiceName: "waypoint." + testNS, BatchTimeout: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	h := newHarness(t, func(o *Options) { o.Tracer = p.Tracer() })
	return h, rcv, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := p.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func spansOfKind(spans []otlptest.Span, kind string) []otlptest.Span {
	var out []otlptest.Span
	for _, s := range spans {
		if s.GetKind().String() == kind {
			out = append(out, s)
		}
	}
	return out
}

// One request is one trace: the server span, child of the caller's span
// (traceparent continued), and the client span, child of the server span,
// whose context the upstream receives; baggage goes upstream as sent.
func TestTraceOneRequest(t *testing.T) {
	h, rcv, flush := tracedHarness(t, 0) // the caller's sampled flag decides
	h.addService("web", "http")
	h.backend("reviews", "http", false)
	h.update([]*meshv1.HTTPRoute{httpRoute("r", epoch, to("reviews", prefixM("/")))}, nil)
	ca := trusttest.NewCA(t, "cluster.local")
	alice := trusttest.Identity(t, "spiffe://cluster.local/ns/web/sa/frontend")
	c := h1Client(h.front(webInfo(ca.Peer(t, ca.Certificate(t, alice, 0)))))

	const callerTrace, callerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	res := get(t, c, "/reviews/1?q=x", map[string]string{
		"Traceparent": "00-" + callerTrace + "-" + callerSpan + "-01",
		"Tracestate":  "vendor=opaque",
		"Baggage":     "user=alice",
		// A header's claim is no principal.
		"X-Forwarded-Client-Cert": "By=spiffe://cluster.local/ns/x/sa/y",
	})
	if res.status != 200 {
		t.Fatalf("status %d", res.status)
	}
	flush()
	spans := rcv.Spans()
	servers, clients := spansOfKind(spans, "SPAN_KIND_SERVER"), spansOfKind(spans, "SPAN_KIND_CLIENT")
	if len(servers) != 1 || len(clients) != 1 || len(spans) != 2 {
		t.Fatalf("spans: %d server, %d client, %d in all; want one of each", len(servers), len(clients), len(spans))
	}
	srv, cli := servers[0], clients[0]
	if srv.TraceID() != callerTrace || srv.ParentID() != callerSpan {
		t.Errorf("server span in trace %s under %s, want the caller's %s under %s", srv.TraceID(), srv.ParentID(), callerTrace, callerSpan)
	}
	if cli.TraceID() != callerTrace || cli.ParentID() != srv.SpanID() {
		t.Errorf("client span in trace %s under %s, want %s under the server span %s", cli.TraceID(), cli.ParentID(), callerTrace, srv.SpanID())
	}
	if want := "00-" + callerTrace + "-" + cli.SpanID() + "-01"; res.echo.Header.Get("Traceparent") != want {
		t.Errorf("upstream traceparent %q, want the client span's %q", res.echo.Header.Get("Traceparent"), want)
	}
	if got := res.echo.Header.Get("Tracestate"); got != "vendor=opaque" {
		t.Errorf("upstream tracestate %q, want the caller's", got)
	}
	if got := res.echo.Header.Get("Baggage"); got != "user=alice" {
		t.Errorf("upstream baggage %q, want the caller's", got)
	}
	if got, want := srv.GetName(), "web.default.svc.cluster.local:80/*"; got != want {
		t.Errorf("server span name %q, want %q", got, want)
	}
	cluster := "outbound|80||reviews.default.svc.cluster.local"
	if got, want := cli.GetName(), "router "+cluster+" egress"; got != want {
		t.Errorf("client span name %q, want %q", got, want)
	}
	for k, want := range map[string]string{
		"http.method": "GET", "http.status_code": "200", "http.route": testNS + "/r", "upstream_cluster": cluster,
		"source.principal": alice.String(), "peer.address": callerAddr.String(), "http.url": "http://web/reviews/1",
		"http.protocol": "HTTP/1.1", "authz.decision": "allow",
	} {
		if got := srv.Attr(k); got != want {
			t.Errorf("server span %s = %q, want %q", k, got, want)
		}
	}
	for k, want := range map[string]string{
		"http.method": "GET", "http.status_code": "200", "upstream_cluster": cluster,
		"peer.address": h.backends["reviews"].addr.String(), "destination.principal": "spiffe://cluster.local/ns/default/sa/reviews",
	} {
		if got := cli.Attr(k); got != want {
			t.Errorf("client span %s = %q, want %q", k, got, want)
		}
	}
	if srv.Resource["service.name"] != "waypoint.default" {
		t.Errorf("resource service.name %q", srv.Resource["service.name"])
	}
}

// A retried request is one server span with a client span per attempt,
// each sending its own context upstream.
func TestTraceRetriesAreClientSpans(t *testing.T) {
	h, rcv, flush := tracedHarness(t, 100)
	h.addService("web", "http")
	flaky := h.backend("flaky", "http", false)
	flaky.got = make(chan echo, 4)
	flaky.setBehave(func(n int64, w http.ResponseWriter, _ *http.Request) bool {
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return true
		}
		return false
	})
	r := to("flaky", prefixM("/"))
	r.Retry = &meshv1.HTTPRouteRetry{Attempts: 1, Backoff: dur(time.Millisecond)}
	h.update([]*meshv1.HTTPRoute{httpRoute("r", epoch, r)}, nil)
	c := h1Client(h.front(webInfo(trust.Unauthenticated())))
	if res := get(t, c, "/", nil); res.status != 200 {
		t.Fatalf("status %d, want 200 after a retry", res.status)
	}
	flush()
	spans := rcv.Spans()
	servers, clients := spansOfKind(spans, "SPAN_KIND_SERVER"), spansOfKind(spans, "SPAN_KIND_CLIENT")
	if len(servers) != 1 || len(clients) != 2 {
		t.Fatalf("spans: %d server, %d client; want 1 and 2", len(servers), len(clients))
	}
	sent := map[string]bool{}
	for range 2 {
		e := <-flaky.got
		sent[e.Header.Get("Traceparent")] = true
	}
	codes := map[string]bool{}
	for _, cl := range clients {
		if cl.TraceID() != servers[0].TraceID() || cl.ParentID() != servers[0].SpanID() {
			t.Errorf("client span %s not a child of the server span", cl.SpanID())
		}
		if !sent["00-"+cl.TraceID()+"-"+cl.SpanID()+"-01"] {
			t.Errorf("attempt %s: its context never went upstream (sent %v)", cl.SpanID(), sent)
		}
		codes[cl.Attr("http.status_code")+"/"+cl.Attr("http.request.resend_count")] = true
	}
	if !codes["503/"] || !codes["200/1"] {
		t.Errorf("attempts (status/resend count): %v, want 503/ and 200/1", codes)
	}
	if got := servers[0].Attr("source.principal"); got != "" {
		t.Errorf("unauthenticated tunnel: source.principal %q", got)
	}
}

// Sampling 0 with no caller context: nothing is exported, but the
// upstream still gets a (not sampled) context, so it does not sample
// either; the inline HTTP/1.1 transport, net/http's (a body too large to
// buffer) and HTTP/2's all carry it.
func TestTraceNotSampled(t *testing.T) {
	h, rcv, flush := tracedHarness(t, 0)
	h.addService("web", "http")
	h.backend("reviews", "http", false)
	h.backend("reviews2", "http2", true)
	h.update([]*meshv1.HTTPRoute{httpRoute("r", epoch, to("reviews2", prefixM("/h2")), to("reviews", prefixM("/")))}, nil)
	front := h.front(webInfo(trust.Unauthenticated()))
	for _, c := range []struct {
		client *http.Client
		path   string
		body   []byte
		proto  string
	}{
		{h1Client(front), "/", nil, "HTTP/1.1"},
		{h1Client(front), "/", []byte(strings.Repeat("x", 100<<10)), "HTTP/1.1"},
		{h1Client(front), "/h2", nil, "HTTP/2.0"},
	} {
		res := do(t, c.client, "POST", c.path, c.body, nil)
		tp := res.echo.Header.Get("Traceparent")
		if res.status != 200 || res.echo.Proto != c.proto || len(tp) != 55 || !strings.HasSuffix(tp, "-00") {
			t.Errorf("%s, body %d bytes: %d upstream %s, traceparent %q; want a context not sampled", c.proto, len(c.body), res.status, res.echo.Proto, tp)
		}
	}
	flush()
	if got := rcv.Spans(); len(got) != 0 {
		t.Errorf("sampling 0: %d spans exported", len(got))
	}
}

// A receiver that never answers costs requests nothing: they complete
// while its export hangs, and the spans it does not take are counted.
func TestTraceStalledReceiver(t *testing.T) {
	stalled := otlptest.StartStalled(t)
	reg := prometheus.NewRegistry()
	p, err := otlpexport.New(otlpexport.Options{Settings: tracing.Settings{Endpoint: stalled, Protocol: tracing.GRPC, Sampling: 100},
		Registerer: reg, QueueSize: 8, BatchSize: 4, BatchTimeout: time.Millisecond, ExportTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = p.Shutdown(ctx) // the receiver never answers: no more waiting

	}()
	h := newHarness(t, func(o *Options) { o.Tracer = p.Tracer() })
	h.addService("web", "http")
	h.backend("reviews", "http", false)
	h.update([]*meshv1.HTTPRoute{httpRoute("r", epoch, to("reviews", prefixM("/")))}, nil)
	c := h1Client(h.front(webInfo(trust.Unauthenticated())))
	// 50 requests are 100 spans: past the queue and the held batch, while
	// the one export in flight waits for its timeout.
	for i := range 50 {
		if res := get(t, c, "/", nil); res.status != 200 {
			t.Fatalf("request %d: %d", i, res.status)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var dropped float64
	for _, mf := range mfs {
		if mf.GetName() == "causeway_tracing_spans_dropped_total" {
			for _, m := range mf.GetMetric() {
				dropped += m.GetCounter().GetValue()
			}
		}
	}
	if dropped < 100-8-2*4 {
		t.Errorf("dropped %v of 100 spans, want all but the queue's and the batches'", dropped)
	}
}

// A workload-addressed request is named by its address, as Envoy names it.
func TestTraceWorkloadAddressed(t *testing.T) {
	h, rcv, flush := tracedHarness(t, 100)
	b := h.backend("pod", "http", false)
	h.update(nil, nil)
	info := ConnInfo{Peer: trust.Unauthenticated(), Source: callerAddr, Destination: b.addr, Protocol: ProtocolHTTP}
	if res := get(t, h1Client(h.front(info)), "/direct", nil); res.status != 200 || res.echo.Backend != "pod" {
		t.Fatalf("workload-addressed: %d %q", res.status, res.body)
	}
	flush()
	servers, clients := spansOfKind(rcv.Spans(), "SPAN_KIND_SERVER"), spansOfKind(rcv.Spans(), "SPAN_KIND_CLIENT")
	if len(servers) != 1 || len(clients) != 1 {
		t.Fatalf("spans: %d server, %d client; want one of each", len(servers), len(clients))
	}
	if got, want := servers[0].GetName(), b.addr.String()+"/*"; got != want {
		t.Errorf("server span %q, want %q", got, want)
	}
	if got, want := clients[0].Attr("upstream_cluster"), b.addr.String(); got != want {
		t.Errorf("client span upstream_cluster %q, want the workload's address %q", got, want)
	}
}
