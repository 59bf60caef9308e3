package l7

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// The engine's metric vectors (requests_total, request_duration_seconds,
// request_mirrors_total, and Istio's standard ones: standard.go) and their
// registration.

type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	mirrors  *prometheus.CounterVec
	std      *standardMetrics
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
		std: newStandardMetrics(),
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
