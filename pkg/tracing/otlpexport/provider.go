// Package otlpexport ships a waypoint's request spans to an OpenTelemetry
// (OTLP) receiver over gRPC or HTTP: the OpenTelemetry SDK's provider built
// from tracing.Settings, with a bounded export queue whose drops are
// counted. It links the SDK and the OTLP exporters, so only the waypoint
// imports it; pkg/l7 makes the spans.
package otlpexport

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/causeway-mesh/causeway/pkg/tracing"
)

// Options configures a Provider.
type Options struct {
	tracing.Settings
	// ServiceName is the resource's service.name (a waypoint's is
	// "<gateway>.<namespace>", as Istio names its proxies').
	ServiceName string
	// Pod, Namespace and Node are the k8s.* resource attributes, from the
	// downward API; empty ones are left out.
	Pod, Namespace, Node string
	// Registerer receives causeway_tracing_spans_exported_total and
	// causeway_tracing_spans_dropped_total. Default: not exported.
	Registerer prometheus.Registerer
	// Logger hears when exports start and stop failing. Default: nothing.
	Logger *zap.Logger
	// QueueSize bounds the spans waiting for export (default 2048): more
	// are dropped, and counted. BatchSize spans go in one export (default
	// 512), at least every BatchTimeout (default 5 s); one export may take
	// ExportTimeout (default 10 s).
	QueueSize     int
	BatchSize     int
	BatchTimeout  time.Duration
	ExportTimeout time.Duration
}

// Provider is the OpenTelemetry SDK's tracer provider with an OTLP
// exporter behind a bounded queue.
type Provider struct {
	tp *sdktrace.TracerProvider
}

// New builds a provider for enabled settings. Nothing connects yet: an
// unreachable receiver shows as failed exports, never as a start failure
// or a slower request.
func New(o Options) (*Provider, error) {
	if !o.Enabled() {
		return nil, errors.New("tracing: no endpoint (tracing is off)")
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.QueueSize <= 0 {
		o.QueueSize = 2048
	}
	if o.BatchSize <= 0 {
		o.BatchSize = 512
	}
	if o.BatchTimeout <= 0 {
		o.BatchTimeout = 5 * time.Second
	}
	if o.ExportTimeout <= 0 {
		o.ExportTimeout = 10 * time.Second
	}
	exp, err := newExporter(o)
	if err != nil {
		return nil, err
	}
	q, err := newQueue(exp, o)
	if err != nil {
		return nil, err
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", o.ServiceName)}
	for k, v := range map[string]string{"k8s.pod.name": o.Pod, "k8s.namespace.name": o.Namespace, "k8s.node.name": o.Node} {
		if v != "" {
			attrs = append(attrs, attribute.String(k, v))
		}
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithResource(resource.NewSchemaless(attrs...)),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(o.Sampling/100))),
		sdktrace.WithSpanProcessor(q),
	)
	return &Provider{tp: tp}, nil
}

// newExporter makes the OTLP exporter for the protocol. Its own retries
// are off: a failed batch is dropped and counted, so that one export never
// holds the queue for longer than ExportTimeout.
func newExporter(o Options) (sdktrace.SpanExporter, error) {
	ctx := context.Background() // the exporters connect lazily; nothing waits on it
	if o.Protocol == tracing.HTTP {
		return otlptracehttp.New(ctx, otlptracehttp.WithEndpoint(o.Endpoint), otlptracehttp.WithInsecure(),
			otlptracehttp.WithTimeout(o.ExportTimeout), otlptracehttp.WithRetry(otlptracehttp.RetryConfig{Enabled: false}))
	}
	return otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(o.Endpoint), otlptracegrpc.WithInsecure(),
		otlptracegrpc.WithTimeout(o.ExportTimeout), otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig{Enabled: false}))
}

// Tracer is the tracer requests' spans are made with.
func (p *Provider) Tracer() trace.Tracer {
	return p.tp.Tracer("github.com/causeway-mesh/causeway/pkg/l7")
}

// Shutdown exports what is queued, within ctx, and stops.
func (p *Provider) Shutdown(ctx context.Context) error { return p.tp.Shutdown(ctx) }
