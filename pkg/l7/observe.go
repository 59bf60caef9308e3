package l7

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/causeway-mesh/causeway/pkg/l7/h1"
)

type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	mirrors  *prometheus.CounterVec
}

var requestLabels = []string{"response_code", "source_principal", "destination_service", "route"}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "requests_total",
			Help: "HTTP and gRPC requests handled by the waypoint.",
		}, requestLabels),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "request_duration_seconds",
			Help:    "Time from a request's arrival to its last response byte.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, requestLabels),
		mirrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "request_mirrors_total",
			Help: "Mirrored requests by outcome (sent, failed, dropped: concurrency limit, skipped: body not buffered).",
		}, []string{"outcome"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	if m.requests, err = register(reg, m.requests); err != nil {
		return nil, err
	}
	if m.duration, err = register(reg, m.duration); err != nil {
		return nil, err
	}
	if m.mirrors, err = register(reg, m.mirrors); err != nil {
		return nil, err
	}
	return m, nil
}

// labelled are requests_total and request_duration_seconds for one label
// set.
type labelled struct {
	requests prometheus.Counter
	duration prometheus.Observer
}

// metricsKey is what varies between a tunnel's requests among the labels
// (source_principal and destination_service are the tunnel's).
type metricsKey struct {
	code  int
	route string
}

// requestMetrics returns the metrics for a request on t, looking the label
// set up in the vectors (hashing four labels, twice) only the first time
// the tunnel sees it.
func (t *tunnel) requestMetrics(m *metrics, code int, route string) labelled {
	k := metricsKey{code, route}
	t.mu.Lock()
	defer t.mu.Unlock()
	// A tunnel's requests mostly repeat the previous one's labels: that
	// needs no hashing of the route.
	if t.lastSet.requests != nil && k == t.last {
		return t.lastSet
	}
	if l, ok := t.metrics[k]; ok {
		t.last, t.lastSet = k, l
		return l
	}
	c := strconv.Itoa(code)
	l := labelled{
		requests: m.requests.WithLabelValues(c, t.principal, t.service, route),
		duration: m.duration.WithLabelValues(c, t.principal, t.service, route),
	}
	if t.metrics == nil {
		t.metrics = make(map[metricsKey]labelled)
	}
	t.metrics[k] = l
	t.last, t.lastSet = k, l
	return l
}

// register registers c, or returns the collector already registered under
// its name (several engines may share one registry).
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing, nil
			}
		}
		return c, fmt.Errorf("l7 metrics: %w", err)
	}
	return c, nil
}

// record is what the access log and the metrics say about one request.
type record struct {
	route     string
	rule      string
	backend   string
	endpoint  string
	decision  string // allow, deny, or "" when no decision was needed
	reason    string
	decID     string
	attempts  int
	grpcCode  int // gRPC status of a local reply to a gRPC request, -1 otherwise
	localCode int // status the engine chose for a local reply (a gRPC one is sent as 200)
}

func (e *Engine) observe(x *exchange, rw *responseRecorder, aborted bool) {
	d := time.Since(x.start)
	status := rw.status
	if x.rec.localCode != 0 {
		status = x.rec.localCode
	}
	if status == 0 {
		if aborted {
			status = http.StatusBadGateway
		} else {
			status = http.StatusOK
		}
	}
	route := x.rec.route
	switch {
	case route != "":
	case x.rule != nil:
		route = "implicit" // a service port without routes, or a workload
	default:
		route = "none"
	}
	m := x.info.requestMetrics(e.metrics, status, route)
	m.requests.Inc()
	m.duration.Observe(d.Seconds())

	if ce := x.info.accessLog.Check(zap.InfoLevel, "request"); ce != nil {
		fp := accessFields.Get().(*[]zap.Field)
		fields := append((*fp)[:0],
			zap.String("method", x.orig.Method),
			zap.String("path", x.origPath()),
			zap.String("protocol", x.orig.Proto),
			zap.String("route", route),
			zap.String("rule", x.rec.rule),
			zap.String("backend", x.rec.backend),
			zap.String("endpoint", x.rec.endpoint),
			zap.String("decision", x.rec.decision),
			zap.String("reason", x.rec.reason),
			zap.Int("status", status),
			zap.Int64("bytes_received", x.bytesIn()),
			zap.Int64("bytes_sent", rw.bytes),
			zap.Duration("duration", d),
			zap.Int("attempts", x.rec.attempts),
		)
		if x.rec.decID != "" {
			fields = append(fields, zap.String("decision_id", x.rec.decID))
		}
		if x.rec.grpcCode >= 0 {
			fields = append(fields, zap.Int("grpc_status", x.rec.grpcCode))
		}
		if aborted {
			fields = append(fields, zap.Bool("aborted", true))
		}
		ce.Write(fields...)
		clear(fields)
		*fp = fields[:0]
		accessFields.Put(fp)
	}
}

// accessFields recycles the access log's field slices (one per request): a
// zap core encodes or copies the fields during Write, so the slice is free
// again once Write returns.
var accessFields = sync.Pool{New: func() any {
	s := make([]zap.Field, 0, 17)
	return &s
}}

// responseRecorder notes the status and size of what the client is sent.
// It exposes the underlying writer through Unwrap, so flushing, hijacking
// (upgrades) and read deadlines work through http.ResponseController.
type responseRecorder struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (w *responseRecorder) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	} else if code == http.StatusSwitchingProtocols {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *responseRecorder) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(p)
	w.bytes += int64(n)
	return n, err
}

func (w *responseRecorder) Flush() {
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *responseRecorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// takeHeader makes h, an upstream response's header used no further, the
// response's: taken as it is when the writer has none yet and can (the
// HTTP/1.1 server's), copied otherwise. It returns the response's header.
func (w *responseRecorder) takeHeader(h http.Header) http.Header {
	if t, ok := w.ResponseWriter.(*h1.ResponseWriter); ok && t.TakeHeader(h) {
		return h
	}
	dst := w.Header()
	maps.Copy(dst, h)
	return dst
}

// canWriteRaw reports whether writeRaw may work: the response goes to the
// HTTP/1.1 server's writer, which has no header yet.
func (w *responseRecorder) canWriteRaw() bool {
	h, ok := w.ResponseWriter.(*h1.ResponseWriter)
	return ok && h.CanWriteRaw()
}

// writeRaw writes the head of a response with Content-Length cl and the
// fields raw as they are, if the writer can (see h1.ResponseWriter.WriteRaw).
func (w *responseRecorder) writeRaw(code int, cl int64, raw *h1.RawFields) bool {
	h, ok := w.ResponseWriter.(*h1.ResponseWriter)
	if !ok || !h.WriteRaw(code, cl, raw) {
		return false
	}
	w.status = code
	return true
}

// countingBody counts the request body bytes read from the client.
type countingBody struct {
	io.ReadCloser
	n atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}
