package otlpexport

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.uber.org/zap"
)

// queue is a span processor that batches ended spans for the exporter, as
// the SDK's batch span processor does, and counts what it exports and
// drops: that one drops a full queue's spans and a failed export's batch
// without a count the waypoint can export. Ending a span never waits: a
// full queue drops it, and one goroutine does all exporting.
type queue struct {
	exp      sdktrace.SpanExporter
	spans    chan sdktrace.ReadOnlySpan
	batch    int
	interval time.Duration
	timeout  time.Duration
	log      *zap.Logger

	exported  prometheus.Counter
	queueFull prometheus.Counter
	failed    prometheus.Counter

	flush    chan chan struct{}
	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

func newQueue(exp sdktrace.SpanExporter, o Options) (*queue, error) {
	exported := prometheus.NewCounter(prometheus.CounterOpts{Name: "causeway_tracing_spans_exported_total",
		Help: "Spans the tracing receiver accepted."})
	dropped := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "causeway_tracing_spans_dropped_total",
		Help: "Spans dropped: the export queue was full (queue_full), or the receiver did not take their batch (export_failed)."},
		[]string{"reason"})
	if o.Registerer != nil {
		for _, c := range []prometheus.Collector{exported, dropped} {
			if err := o.Registerer.Register(c); err != nil {
				return nil, err
			}
		}
	}
	q := &queue{exp: exp, spans: make(chan sdktrace.ReadOnlySpan, o.QueueSize), batch: o.BatchSize,
		interval: o.BatchTimeout, timeout: o.ExportTimeout, log: o.Logger.Named("tracing"),
		exported: exported, queueFull: dropped.WithLabelValues("queue_full"), failed: dropped.WithLabelValues("export_failed"),
		flush: make(chan chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	go q.run()
	return q, nil
}

func (q *queue) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

func (q *queue) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return
	}
	select {
	case q.spans <- s:
	default:
		q.queueFull.Inc()
	}
}

// run exports batches until stopped, then what is still queued.
func (q *queue) run() {
	defer close(q.done)
	batch := make([]sdktrace.ReadOnlySpan, 0, q.batch)
	tick := time.NewTicker(q.interval)
	defer tick.Stop()
	failing := false
	send := func() {
		if len(batch) > 0 {
			failing = q.export(batch, failing)
			clear(batch)
			batch = batch[:0]
		}
	}
	for {
		select {
		case s := <-q.spans:
			if batch = append(batch, s); len(batch) >= q.batch {
				send()
			}
		case <-tick.C:
			send()
		case ack := <-q.flush:
			q.drain(&batch, send)
			close(ack)
		case <-q.stop:
			q.drain(&batch, send)
			return
		}
	}
}

// drain exports every span queued so far.
func (q *queue) drain(batch *[]sdktrace.ReadOnlySpan, send func()) {
	for {
		select {
		case s := <-q.spans:
			if *batch = append(*batch, s); len(*batch) >= q.batch {
				send()
			}
		default:
			send()
			return
		}
	}
}

// export sends one batch and counts it; failing says whether the previous
// export failed, so that a receiver that stays away is logged once, not
// once per batch. It returns whether this one failed.
func (q *queue) export(batch []sdktrace.ReadOnlySpan, failing bool) bool {
	ctx, cancel := context.WithTimeout(context.Background(), q.timeout)
	defer cancel()
	if err := q.exp.ExportSpans(ctx, batch); err != nil {
		q.failed.Add(float64(len(batch)))
		if !failing {
			q.log.Warn("exporting spans failed; dropping them until the receiver takes them again", zap.Int("spans", len(batch)), zap.Error(err))
		}
		return true
	}
	q.exported.Add(float64(len(batch)))
	if failing {
		q.log.Info("exporting spans again")
	}
	return false
}

// ForceFlush exports what is queued now.
func (q *queue) ForceFlush(ctx context.Context) error {
	ack := make(chan struct{})
	select {
	case q.flush <- ack:
	case <-q.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-ack:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Shutdown exports what is queued and closes the exporter, within ctx.
func (q *queue) Shutdown(ctx context.Context) error {
	q.stopOnce.Do(func() { close(q.stop) })
	select {
	case <-q.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	return q.exp.Shutdown(ctx)
}
