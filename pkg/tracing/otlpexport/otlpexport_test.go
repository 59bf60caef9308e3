package otlpexport

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/causeway-mesh/causeway/pkg/tracing"
	"github.com/causeway-mesh/causeway/pkg/tracing/otlptest"
)

// Both protocols reach a real OTLP receiver with the spans and the
// resource's Kubernetes attributes.
func TestExportsToReceiver(t *testing.T) {
	rcv := otlptest.Start(t)
	for _, c := range []struct {
		proto    tracing.Protocol
		endpoint string
	}{{tracing.GRPC, rcv.GRPCAddr}, {tracing.HTTP, rcv.HTTPAddr}} {
		t.Run(string(c.proto), func(t *testing.T) {
			reg := prometheus.NewRegistry()
			p, err := New(Options{Settings: tracing.Settings{Endpoint: c.endpoint, Protocol: c.proto, Sampling: 100},
				ServiceName: "waypoint.shop", Pod: "waypoint-abc", Namespace: "shop", Node: "node-1", Registerer: reg})
			if err != nil {
				t.Fatal(err)
			}
			_, span := p.Tracer().Start(context.Background(), "via-"+string(c.proto), trace.WithSpanKind(trace.SpanKindServer))
			span.End()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := p.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			var got *otlptest.Span
			for _, s := range rcv.Spans() {
				if s.GetName() == "via-"+string(c.proto) {
					got = &s
				}
			}
			if got == nil {
				t.Fatalf("receiver has no span via-%s: %v", c.proto, rcv.Spans())
			}
			want := map[string]string{"service.name": "waypoint.shop", "k8s.pod.name": "waypoint-abc", "k8s.namespace.name": "shop", "k8s.node.name": "node-1"}
			for k, v := range want {
				if got.Resource[k] != v {
					t.Errorf("resource %s = %q, want %q", k, got.Resource[k], v)
				}
			}
			if n := value(t, reg, "causeway_tracing_spans_exported_total", ""); n != 1 {
				t.Errorf("spans exported: %v, want 1", n)
			}
		})
	}
}

// A receiver that accepts connections and never answers holds the export;
// ending spans meanwhile never waits: a full queue drops them, and the
// held batch is dropped when its export times out. Both are counted.
func TestStalledReceiverDropsAndCounts(t *testing.T) {
	stalled := otlptest.StartStalled(t)
	reg := prometheus.NewRegistry()
	p, err := New(Options{Settings: tracing.Settings{Endpoint: stalled, Protocol: tracing.HTTP, Sampling: 100}, Registerer: reg,
		QueueSize: 4, BatchSize: 2, BatchTimeout: time.Millisecond, ExportTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	tr := p.Tracer()
	const spans = 200
	ended := make(chan struct{})
	go func() {
		for range spans {
			_, s := tr.Start(context.Background(), "s")
			s.End()
		}
		close(ended)
	}()
	select {
	case <-ended:
	case <-time.After(20 * time.Second):
		t.Fatal("ending spans waited for the stalled receiver")
	}
	if n := value(t, reg, "causeway_tracing_spans_dropped_total", "queue_full"); n < spans-4-2*2 {
		t.Errorf("queue_full drops: %v of %d spans, want all but the queue's and the batches'", n, spans)
	}
	deadline := time.Now().Add(20 * time.Second)
	for value(t, reg, "causeway_tracing_spans_dropped_total", "export_failed") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no export_failed drops after the export timed out")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := value(t, reg, "causeway_tracing_spans_exported_total", ""); n != 0 {
		t.Errorf("spans exported to a receiver that never answered: %v", n)
	}
}

// Spans that are not sampled are not exported.
func TestUnsampledNotQueued(t *testing.T) {
	rcv := otlptest.Start(t)
	reg := prometheus.NewRegistry()
	p, err := New(Options{Settings: tracing.Settings{Endpoint: rcv.GRPCAddr, Protocol: tracing.GRPC, Sampling: 0}, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		_, s := p.Tracer().Start(context.Background(), "s")
		s.End()
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := rcv.Spans(); len(got) != 0 {
		t.Errorf("sampling 0: %d spans exported", len(got))
	}
}

func TestNewRefusesBadSettings(t *testing.T) {
	for _, s := range []tracing.Settings{{}, {Endpoint: "nohost", Protocol: tracing.GRPC}, {Endpoint: "c:4317", Sampling: 101}} {
		if _, err := New(Options{Settings: s}); err == nil {
			t.Errorf("New(%+v): no error", s)
		}
	}
}

// value reads a counter from reg by name and reason label ("" for none);
// a counter that is not there fails the test.
func value(t *testing.T, reg *prometheus.Registry, name, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			got := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" {
					got = l.GetValue()
				}
			}
			if got == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no counter %s{reason=%q}", name, reason)
	return 0
}
