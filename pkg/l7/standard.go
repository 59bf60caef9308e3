package l7

import (
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/causeway-mesh/causeway/pkg/telemetry"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

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

// identify sets what t's requests say of the caller and the service, from
// cfg: the caller is who the tunnel authenticated (telemetry.Caller: the
// workload at its address only when it holds that identity).
func (t *tunnel) identify(cfg *Config) {
	var src *meshv1.Workload
	var svc *meshv1.Service
	if cfg != nil {
		src = cfg.byAddress[t.Source.Addr().Unmap()]
		if si := cfg.services[t.Service]; si != nil {
			svc = si.svc
		}
	}
	t.std = telemetry.Connection{
		Reporter:       telemetry.ReporterWaypoint,
		Source:         telemetry.Caller(t.Peer, src),
		Service:        telemetry.UnknownService,
		SecurityPolicy: telemetry.SecurityPolicy(t.Peer),
	}
	if !t.Service.IsZero() {
		t.std.Service = telemetry.ServiceOf(svc)
		if svc == nil {
			t.std.Service.Name, t.std.Service.Namespace = t.Service.Name, t.Service.Namespace
		}
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

// standardKeyOf is x's standard labels that vary per request.
func (x *exchange) standardKey(code int, aborted bool) standardKey {
	k := standardKey{code: code, grpc: x.view != nil && x.view.grpc, flags: "-"}
	if x.rec.ep != nil {
		k.destination = x.rec.ep.target.Load().Workload
	}
	if k.grpc && x.rec.grpcCode >= 0 {
		k.grpcStatus = strconv.Itoa(x.rec.grpcCode)
	}
	switch {
	case x.rec.decision == "deny":
		k.flags = "UAEX" // Envoy's flag for a request the external authorizer denied
	case x.rule == nil && code == http.StatusNotFound:
		k.flags = "NR" // no route
	case aborted:
		k.flags = "DC" // the response broke off
	}
	return k
}

func (t *tunnel) standardSeries(m *standardMetrics, k standardKey) standardSeries {
	c := t.std
	c.Destination = telemetry.Of(k.destination)
	c.Flags = k.flags
	c.Protocol = "http"
	if k.grpc {
		c.Protocol = "grpc"
	}
	return m.series(&c, k.code, k.grpcStatus)
}

// noteGRPCStatus records the grpc-status of a gRPC request's upstream
// response: in its trailers, or its header (a trailers-only response).
func (x *exchange) noteGRPCStatus(resp *http.Response) {
	if x.view == nil || !x.view.grpc {
		return
	}
	s := resp.Trailer.Get("Grpc-Status")
	if s == "" {
		s = resp.Header.Get("Grpc-Status")
	}
	if code, err := strconv.Atoi(s); err == nil && code >= 0 && code <= 16 {
		x.rec.grpcCode = code
	}
}
