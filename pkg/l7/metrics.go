package l7

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/causeway-mesh/causeway/pkg/telemetry"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// The engine's metric vectors (requests_total, request_duration_seconds,
// request_mirrors_total, and Istio's standard ones) and their registration.

type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	mirrors  *prometheus.CounterVec
	std      *standardMetrics
	// baggage counts the tunnels whose CONNECT baggage did not name the
	// caller (telemetry.Caller), by reason.
	baggage *prometheus.CounterVec
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
		std:     newStandardMetrics(),
		baggage: telemetry.NewBaggageIgnored(),
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
	if m.baggage, err = register(reg, m.baggage); err != nil {
		return nil, err
	}
	if err := m.std.register(reg); err != nil {
		return nil, err
	}
	return m, nil
}

// labelled are requests_total and request_duration_seconds, and the
// standard metrics, for one label set.
type labelled struct {
	requests prometheus.Counter
	duration prometheus.Observer
	std      standardSeries
}

// metricsKey is what varies between a tunnel's requests among the labels
// (source_principal and destination_service are the tunnel's; std holds
// the response code).
type metricsKey struct {
	route string
	std   standardKey
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

// Istio's standard request metrics (istio_requests_total and the request
// duration and size histograms), reported as a waypoint reports them, with
// the labels of pkg/telemetry plus response_code and grpc_response_status.

// standardBuckets are Envoy's default histogram buckets, which Istio's
// duration (milliseconds) and size (bytes) histograms use.
var standardBuckets = []float64{0.5, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000, 600000, 1800000, 3600000}

var standardLabels = append(append([]string(nil), telemetry.Labels...), "response_code", "grpc_response_status")

type standardMetrics struct {
	requests                      *prometheus.CounterVec
	duration, reqBytes, respBytes *prometheus.HistogramVec
}

func newStandardMetrics() *standardMetrics {
	hist := func(name, help string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: standardBuckets}, standardLabels)
	}
	return &standardMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "istio_requests_total",
			Help: "Requests handled by the waypoint (Istio standard metric)."}, standardLabels),
		duration:  hist("istio_request_duration_milliseconds", "Time from a request's arrival to its last response byte, in milliseconds (Istio standard metric)."),
		reqBytes:  hist("istio_request_bytes", "Request body sizes in bytes (Istio standard metric; Envoy also counts the headers)."),
		respBytes: hist("istio_response_bytes", "Response body sizes in bytes (Istio standard metric; Envoy also counts the headers)."),
	}
}

func (s *standardMetrics) register(reg prometheus.Registerer) error {
	var err error
	if s.requests, err = register(reg, s.requests); err != nil {
		return err
	}
	for _, h := range []**prometheus.HistogramVec{&s.duration, &s.reqBytes, &s.respBytes} {
		if *h, err = register(reg, *h); err != nil {
			return err
		}
	}
	return nil
}

// standardSeries are the standard metrics for one label set.
type standardSeries struct {
	requests                      prometheus.Counter
	duration, reqBytes, respBytes prometheus.Observer
}

func (s *standardMetrics) series(c *telemetry.Connection, code int, grpcStatus string) standardSeries {
	v := c.Values(make([]string, 0, len(standardLabels)))
	v = append(v, strconv.Itoa(code), grpcStatus)
	return standardSeries{
		requests:  s.requests.WithLabelValues(v...),
		duration:  s.duration.WithLabelValues(v...),
		reqBytes:  s.reqBytes.WithLabelValues(v...),
		respBytes: s.respBytes.WithLabelValues(v...),
	}
}

// standardKey is what varies between a tunnel's requests among the
// standard labels.
type standardKey struct {
	code        int
	grpc        bool
	grpcStatus  string
	flags       string
	destination *meshv1.Workload
}
