package l7

import (
	"context"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"golang.org/x/net/http2"

	"github.com/causeway-mesh/causeway/pkg/l7/h1"
	"github.com/causeway-mesh/causeway/pkg/locality"
	"github.com/causeway-mesh/causeway/pkg/trust"
)

// Options configures an Engine. Zero values get the documented defaults.
type Options struct {
	// Dialer opens tunnels to endpoints. Required.
	Dialer Dialer
	// Authorizer decides every request. Required: use AllowAll() to run
	// without a policy.
	Authorizer Authorizer
	// Logger receives the access log (info level, message "request") and
	// errors. Default: no logging.
	Logger *zap.Logger
	// Registerer receives requests_total, request_duration_seconds,
	// request_mirrors_total and Istio's standard istio_requests_total,
	// istio_request_duration_milliseconds, istio_request_bytes and
	// istio_response_bytes. Default: metrics are kept but not exported.
	Registerer prometheus.Registerer

	// MaxBufferedBody bounds the request body buffered for authorization and
	// retries (default 64 KiB; negative: never buffer). Larger bodies stream
	// and are not retried.
	MaxBufferedBody int64
	// MaxHeaderBytes bounds request and response headers (default 64 KiB).
	MaxHeaderBytes int
	// ReadHeaderTimeout bounds reading a request's headers, and the protocol
	// sniff (default 10 s).
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes client connections idle this long (default 5 min).
	IdleTimeout time.Duration
	// UpstreamIdleTimeout closes pooled upstream connections idle this long
	// (default 90 s; short values avoid reusing a tunnel to a recycled pod IP).
	UpstreamIdleTimeout time.Duration
	// EjectionTime is how long a connect failure takes an endpoint out of
	// rotation (default 5 s, doubled per consecutive failure up to 8x).
	EjectionTime time.Duration
	// MaxConcurrentStreams bounds the streams of one client HTTP/2
	// connection (default 1000).
	MaxConcurrentStreams uint32
	// DefaultRequestTimeout applies to rules without a request timeout of
	// their own, and to services without routes (default none: streams such
	// as gRPC watches may legitimately last; clients bound them).
	DefaultRequestTimeout time.Duration
	// PreflightBeforePolicy answers CORS preflights of a route's CORS
	// filter before the Authorizer runs (as Envoy's CORS filter does when
	// placed ahead of ext_authz): browsers send preflights without
	// credentials. Default off: every answer, preflights included, waits
	// for the policy.
	PreflightBeforePolicy bool
	// Pod is the waypoint's own pod: a service's trafficDistribution
	// prefers the endpoints closest to it (its node, zone, region; see
	// pkg/locality). Unset, or not among the configuration's workloads:
	// no endpoint is closer than another.
	Pod PodRef
	// MaxMirrorsInFlight bounds concurrent mirrored requests; more are
	// dropped (default 64). MirrorTimeout bounds each (default 10 s).
	MaxMirrorsInFlight int
	MirrorTimeout      time.Duration
	// Tracer, when set, traces every request (trace.go): a server span and
	// a client span per upstream attempt. Nil: tracing off, at no cost.
	Tracer trace.Tracer
}

func (o *Options) defaults() {
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.MaxBufferedBody == 0 {
		o.MaxBufferedBody = 64 << 10
	}
	if o.MaxHeaderBytes <= 0 {
		o.MaxHeaderBytes = 64 << 10
	}
	if o.ReadHeaderTimeout <= 0 {
		o.ReadHeaderTimeout = 10 * time.Second
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 5 * time.Minute
	}
	if o.UpstreamIdleTimeout <= 0 {
		o.UpstreamIdleTimeout = 90 * time.Second
	}
	if o.EjectionTime <= 0 {
		o.EjectionTime = 5 * time.Second
	}
	if o.MaxConcurrentStreams == 0 {
		o.MaxConcurrentStreams = 1000
	}
	if o.MaxMirrorsInFlight <= 0 {
		o.MaxMirrorsInFlight = 64
	}
	if o.MirrorTimeout <= 0 {
		o.MirrorTimeout = 10 * time.Second
	}
}

// Engine serves HTTP inside tunnels. It is safe for concurrent use.
type Engine struct {
	opts    Options
	log     *zap.Logger
	metrics *metrics
	pools   *pools
	proxy   *httputil.ReverseProxy // upgrades; the rest goes through forward
	h2      *http2.Server
	// h2base is every HTTP/2 connection's http.Server: configured with h2
	// (http2.ConfigureServer), its Shutdown says GOAWAY on them all.
	h2base *http.Server
	snap   atomic.Pointer[snapshot]

	// drainer drains the HTTP/1.1 connections (Drain).
	drainer h1.Drainer

	// Mirrors and connection watchers belong to the engine: ctx ends them,
	// wg waits for them.
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	mirrorSem chan struct{}
	closeOnce sync.Once
}

// snapshot is a Config bound to the engine's endpoint state.
type snapshot struct {
	cfg *Config
	eps map[tableKey]endpointTiers
}

// Update installs a new configuration. Requests already routed finish on the
// previous one; endpoints that are gone lose their idle connections.
func (e *Engine) Update(cfg *Config) {
	if cfg == nil {
		cfg = Compile(nil, nil, nil, nil)
	}
	s := &snapshot{cfg: cfg, eps: make(map[tableKey]endpointTiers)}
	keep := make(map[endpointKey]bool)
	self := locality.Of(cfg.pod(e.opts.Pod))
	for ref, si := range cfg.services {
		td := si.svc.GetTrafficDistribution()
		for port, ts := range si.targets {
			var byTier [locality.TierAny + 1][]*endpoint
			for _, t := range ts {
				ep := e.pools.get(t)
				keep[ep.key] = true
				tier := locality.Rank(td, self, locality.Of(t.Workload))
				byTier[tier] = append(byTier[tier], ep)
			}
			var tiers endpointTiers
			for _, eps := range byTier {
				if len(eps) > 0 {
					tiers = append(tiers, eps)
				}
			}
			s.eps[tableKey{ref, port}] = tiers
		}
	}
	e.snap.Store(s)
	e.pools.retain(func(k endpointKey) bool {
		if keep[k] {
			return true
		}
		// Workload-addressed endpoints live as long as their workload.
		w := cfg.byAddress[k.addr.Addr()]
		return w != nil && w.GetIdentity() == k.identity
	})
}

// Config returns the configuration in use (nil before the first Update).
func (e *Engine) Config() *Config {
	if s := e.snap.Load(); s != nil {
		return s.cfg
	}
	return nil
}

// Drain starts ending the client connections ServeConn serves, gently, as
// a server that stops does (net/http's Server.Shutdown, Envoy's drain):
// HTTP/1.1 connections idle between requests are closed at once; one with
// a request in flight answers it with Connection: close and closes once
// the response is written whole; HTTP/2 connections are told GOAWAY with
// the last stream they will serve, finish those streams and close.
// Connections that ServeConn starts serving afterwards are served as
// much (a request, the streams the client opened first); one that has not
// sent its first request yet is left the header timeout to send it
// (closed, it could lose a request already on its way, which a client
// does not retry on a fresh connection). Drain returns at
// once: each ServeConn returns as its connection closes, and whoever
// waits for them cuts the rest when it stops waiting (by their contexts).
func (e *Engine) Drain() {
	e.drainer.Drain()
	e.drainH2()
}

// drainH2 says GOAWAY on the HTTP/2 connections being served. (The
// Server serves no connection of its own: its Shutdown only runs the
// hook http2.ConfigureServer registered.)
func (e *Engine) drainH2() { _ = e.h2base.Shutdown(context.Background()) }

// h2ConnState: an HTTP/2 connection whose serving began as the drain did
// may have been missed by its GOAWAY; on its first stream it is told.
func (e *Engine) h2ConnState(_ net.Conn, s http.ConnState) {
	if s == http.StateActive && e.drainer.Draining() {
		e.drainH2()
	}
}

// Close stops mirrored requests and closes idle upstream connections. It
// does not close tunnels being served: their contexts do.
func (e *Engine) Close() error {
	e.closeOnce.Do(func() {
		e.cancel()
		e.wg.Wait()
		e.pools.closeAll()
	})
	return nil
}

// workloadTarget resolves a workload-addressed destination.
func (s *snapshot) workloadTarget(addr netip.AddrPort) (Target, bool) {
	w := s.cfg.byAddress[addr.Addr().Unmap()]
	if w == nil {
		return Target{}, false
	}
	t := Target{Address: netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port()), Workload: w}
	if id, err := trust.ParseIdentity(w.GetIdentity()); err == nil {
		t.Identity = id
	}
	return t, true
}

type zapWriter struct{ l *zap.Logger }

func (w zapWriter) Write(p []byte) (int, error) {
	w.l.Debug("proxy", zap.ByteString("message", p))
	return len(p), nil
}

type bufferPool struct{}

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (bufferPool) Get() []byte  { return *(copyBuffers.Get().(*[]byte)) }
func (bufferPool) Put(b []byte) { copyBuffers.Put(&b) }
