package l7

import (
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/causeway-mesh/causeway/pkg/telemetry"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// requestMetrics returns the metrics for a request on t, looking the label
// sets up in the vectors (hashing them) only the first time the tunnel
// sees them.
func (t *tunnel) requestMetrics(m *metrics, route string, std standardKey) labelled {
	k := metricsKey{route, std}
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
	c := strconv.Itoa(std.code)
	l := labelled{
		requests: m.requests.WithLabelValues(c, t.principal, t.service, route),
		duration: m.duration.WithLabelValues(c, t.principal, t.service, route),
		std:      t.standardSeries(m.std, std),
	}
	if t.metrics == nil {
		t.metrics = make(map[metricsKey]labelled)
	}
	t.metrics[k] = l
	t.last, t.lastSet = k, l
	return l
}

// observe logs and counts a finished request; it returns the status it
// counted.
func (e *Engine) observe(x *exchange, rw *responseRecorder, aborted bool) int {
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
	m := x.info.requestMetrics(e.metrics, route, x.standardKey(status, aborted))
	m.requests.Inc()
	m.duration.Observe(d.Seconds())
	m.std.requests.Inc()
	m.std.duration.Observe(float64(d.Microseconds()) / 1000)
	m.std.reqBytes.Observe(float64(x.bytesIn()))
	m.std.respBytes.Observe(float64(rw.bytes))

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
		if x.rec.listener != "" {
			fields = append(fields, zap.String("listener", x.rec.listener))
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
	return status
}

// accessFields recycles the access log's field slices (one per request): a
// zap core encodes or copies the fields during Write, so the slice is free
// again once Write returns.
var accessFields = sync.Pool{New: func() any {
	s := make([]zap.Field, 0, 17)
	return &s
}}

// identify sets what t's requests say of the caller and the service, from
// cfg: the caller is who the tunnel authenticated (telemetry.Caller: the
// workload at its address only when it holds that identity, else the
// CONNECT's baggage within the identity's namespace). Baggage not believed
// is counted in m and logged at debug level.
func (t *tunnel) identify(cfg *Config, m *metrics) {
	var src *meshv1.Workload
	var svc *meshv1.Service
	if cfg != nil {
		src = cfg.byAddress[t.Source.Addr().Unmap()]
		if si := cfg.services[t.Service]; si != nil {
			svc = si.svc
		}
	}
	source, err := telemetry.Caller(t.Peer, src, t.Baggage)
	if be := (*telemetry.BaggageError)(nil); errors.As(err, &be) {
		m.baggage.WithLabelValues(be.Reason).Inc()
		t.accessLog.Debug("connect baggage ignored", zap.Error(err))
	}
	t.std = telemetry.Connection{
		Reporter:       telemetry.ReporterWaypoint,
		Source:         source,
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
