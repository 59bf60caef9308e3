package l7

import (
	"context"
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/causeway-mesh/causeway/pkg/l7/h1"
)

// Tracing (Options.Tracer), as Envoy traces in an Istio waypoint: a server
// span per request, named "{service host}:{port}/*", child of the caller's
// W3C trace context when it sent one; a client span per upstream attempt,
// "router {upstream cluster} egress", child of the server span, whose
// context goes upstream in traceparent and tracestate (so a retry is a
// second client span, and the upstream's spans hang from the attempt that
// reached it). Baggage is passed on as the caller sent it. Attribute names
// are Envoy's (http.method, http.status_code, upstream_cluster,
// peer.address, ...) with OpenTelemetry's where Envoy has none; the
// caller's principal is the tunnel's authenticated identity, never a
// header's claim. Without a tracer none of this runs: each hook is one nil
// check.

// traceContext reads and writes traceparent and tracestate.
var traceContext propagation.TraceContext

// The spans' start options, made once (each option is an allocation).
var (
	serverSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer)}
	clientSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}
)

// startServerSpan starts the request's span, continuing the caller's trace
// when its headers carry one. Spans are named when they end, and only
// those sampled: most are not, and their names would be made for nothing.
func (x *exchange) startServerSpan(t trace.Tracer) {
	parent := traceContext.Extract(context.Background(), requestCarrier(x.orig.Header))
	_, x.spans.server = t.Start(parent, "request", serverSpan...)
}

// requestCarrier reads the trace context from a request's (canonical)
// header without canonicalizing the propagator's lower-case names per
// request.
type requestCarrier http.Header

func (c requestCarrier) Get(k string) string {
	switch k {
	case "traceparent":
		k = "Traceparent"
	case "tracestate":
		k = "Tracestate"
	default:
		k = http.CanonicalHeaderKey(k)
	}
	if vs := c[k]; len(vs) > 0 {
		return vs[0]
	}
	return ""
}

func (requestCarrier) Set(string, string) {} // read only

func (c requestCarrier) Keys() []string { return propagation.HeaderCarrier(c).Keys() }

// startClientSpan starts an attempt's span (ending the previous attempt's)
// and sends its context upstream: in the fields it returns for the inline
// transport, or in areq's header, which it replaces, for the others. A
// request that is not sampled gets no span per attempt (nothing of its
// trace is recorded): the upstream is told the request span's context,
// not sampled, so that it does not sample either.
func (x *exchange) startClientSpan(areq *http.Request, ep *endpoint) h1.Fields {
	s := &x.spans
	s.endClient()
	ctx := trace.ContextWithSpan(context.Background(), s.server)
	if s.server.IsRecording() {
		ctx, s.client = x.e.opts.Tracer.Start(ctx, "attempt", clientSpan...)
		cluster := x.upstreamCluster()
		s.client.SetName("router " + cluster + " egress")
		attrs := []attribute.KeyValue{
			attribute.String("component", "proxy"),
			attribute.String("http.method", areq.Method),
			attribute.String("http.url", "http://"+areq.Host+areq.URL.EscapedPath()),
			attribute.String("upstream_cluster", cluster),
			attribute.String("peer.address", ep.addr),
		}
		if ep.key.identity != "" {
			attrs = append(attrs, attribute.String("destination.principal", ep.key.identity))
		}
		if n := x.rec.attempts - 1; n > 0 {
			attrs = append(attrs, attribute.Int("http.request.resend_count", n))
		}
		s.client.SetAttributes(attrs...)
	}
	// The caller's tracestate belongs to its traceparent, which is replaced.
	if !x.inlineUp {
		areq.Header = areq.Header.Clone()
		delete(areq.Header, "Tracestate")
		traceContext.Inject(ctx, propagation.HeaderCarrier(areq.Header))
		return x.up
	}
	up := make(h1.Fields, len(x.up), len(x.up)+2)
	copy(up, x.up)
	up.Del("Tracestate")
	traceContext.Inject(ctx, fieldsCarrier{&up})
	up.Sort()
	return up
}

// attemptDone notes an attempt's outcome on its span.
func (s *spans) attemptDone(resp *http.Response, err error) {
	if !s.client.IsRecording() {
		return
	}
	if err != nil {
		s.client.SetStatus(codes.Error, err.Error())
		return
	}
	s.client.SetAttributes(attribute.Int("http.status_code", resp.StatusCode))
	if resp.StatusCode >= 500 {
		s.client.SetStatus(codes.Error, "")
	}
}

func (s *spans) endClient() {
	if s.client != nil {
		s.client.End()
		s.client = nil
	}
}

// endSpans ends the request's spans, the last attempt's first.
func (x *exchange) endSpans(status int, rw *responseRecorder) {
	s := &x.spans
	s.endClient()
	if !s.server.IsRecording() {
		s.server.End()
		return
	}
	s.server.SetName(x.operationName())
	attrs := []attribute.KeyValue{
		attribute.String("component", "proxy"),
		attribute.String("http.method", x.orig.Method),
		attribute.String("http.url", "http://"+x.orig.Host+x.origPath()),
		attribute.String("http.protocol", x.orig.Proto),
		attribute.Int("http.status_code", status),
		attribute.String("peer.address", x.info.source),
		attribute.Int64("request_size", x.bytesIn()),
		attribute.Int64("response_size", rw.bytes),
	}
	if id, ok := x.info.Peer.Identity(); ok {
		attrs = append(attrs, attribute.String("source.principal", id.String()))
	}
	if x.rec.route != "" {
		attrs = append(attrs, attribute.String("http.route", x.rec.route))
	}
	if x.backend != nil && x.backend.invalid == "" {
		attrs = append(attrs, attribute.String("upstream_cluster", x.upstreamCluster()))
	}
	if x.rec.decision != "" {
		attrs = append(attrs, attribute.String("authz.decision", x.rec.decision))
	}
	s.server.SetAttributes(attrs...)
	if status >= 500 {
		s.server.SetStatus(codes.Error, x.rec.reason)
	}
	s.server.End()
}

// operationName is the server span's name, Envoy's in an Istio
// waypoint: "{service host}:{port}/*", or "{ip}:{port}/*" for a
// workload-addressed destination.
func (x *exchange) operationName() string {
	if x.info.Service.IsZero() {
		return x.info.service + "/*"
	}
	return x.serviceHost(x.info.Service) + ":" + strconv.Itoa(int(x.info.Port)) + "/*"
}

// serviceHost is a service's host name from the configuration, or
// "{name}.{namespace}" when the configuration does not know it.
func (x *exchange) serviceHost(ref ServiceRef) string {
	if x.snap != nil {
		if si := x.snap.cfg.services[ref]; si != nil && si.svc.GetHostname() != "" {
			return si.svc.GetHostname()
		}
	}
	return ref.Name + "." + ref.Namespace
}

// upstreamCluster is Istio's name for the backend's cluster,
// "outbound|{port}||{service host}", or the endpoint's address for a
// workload-addressed destination.
func (x *exchange) upstreamCluster() string {
	b := x.backend
	if b == nil || b.svc.IsZero() {
		return x.rec.backend
	}
	return "outbound|" + strconv.Itoa(int(b.port)) + "||" + x.serviceHost(b.svc)
}

// fieldsCarrier carries a trace context in upstream fields.
type fieldsCarrier struct{ l *h1.Fields }

func (c fieldsCarrier) Get(k string) string { return c.l.First(http.CanonicalHeaderKey(k)) }

func (c fieldsCarrier) Set(k, v string) { c.l.Set(http.CanonicalHeaderKey(k), []string{v}) }

func (c fieldsCarrier) Keys() []string {
	keys := make([]string, len(*c.l))
	for i, f := range *c.l {
		keys[i] = f.Name
	}
	return keys
}
