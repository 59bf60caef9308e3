// Package admin serves the operator endpoints every Causeway proxy exposes:
// the admin port (/config_dump, /logging, /debug/pprof/), readiness and
// Prometheus metrics (docs/design.md §2, §8).
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// ConfigDump is the /config_dump document (docs/design.md §8). Workloads and
// services are the proxy's current view; Certificates its certificate
// manager's snapshot; Policies and Routes what a waypoint enforces;
// Connections the inbound connections a node proxy holds to its pods.
type ConfigDump struct {
	ByAddr map[string]json.RawMessage `json:"by_addr"`
	ByVIP  map[string]json.RawMessage `json:"by_vip"`
	// Waypoints a node proxy knows, by "<namespace>/<name>": the
	// addresses it sends their traffic to.
	Waypoints    map[string]json.RawMessage `json:"waypoints,omitempty"`
	Certificates any                        `json:"certificates"`
	Policies     any                        `json:"policies,omitempty"`
	Routes       any                        `json:"routes,omitempty"`
	// Listeners are an ingress gateway's, private keys redacted.
	Listeners any `json:"listeners,omitempty"`
	// Connections are the open connections a node proxy tracks.
	Connections any `json:"connections,omitempty"`
}

// Options are what the admin handler exposes.
type Options struct {
	// Dump builds the current /config_dump document.
	Dump func() (*ConfigDump, error)
	// Logging serves GET/PUT of the log level (logging.Logger.Handler()).
	Logging http.Handler
}

// Handler is the admin port's handler. Bind it to localhost only.
func Handler(o Options) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /config_dump", func(w http.ResponseWriter, _ *http.Request) {
		d, err := o.Dump()
		if err != nil {
			http.Error(w, "config dump: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(d)
	})
	mux.Handle("/logging", o.Logging)
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// StatusHandlers maps each address to its handler: /healthz/ready (200
// with "ready" and what ready describes when it returns no error, 503 with
// the reason otherwise) and the extra routes on readinessAddr, and /metrics
// from reg on metricsAddr (docs/design.md §2: 15021 and 15020). Equal addresses
// share one handler, so a host short of ports can use one.
func StatusHandlers(readinessAddr string, ready func() (string, error), extra map[string]http.Handler, metricsAddr string, reg prometheus.Gatherer) map[string]http.Handler {
	readiness := http.NewServeMux()
	readiness.HandleFunc("GET /healthz/ready", func(w http.ResponseWriter, _ *http.Request) {
		detail, err := ready()
		if err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		if detail != "" {
			fmt.Fprintln(w, "ready: "+detail)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	for pattern, h := range extra {
		readiness.Handle(pattern, h)
	}
	metrics := readiness
	if metricsAddr != readinessAddr {
		metrics = http.NewServeMux()
	}
	metrics.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return map[string]http.Handler{readinessAddr: readiness, metricsAddr: metrics}
}

// Serve runs an HTTP server for h on addr until ctx ends. Listening errors
// are returned at once so a port in use is reported clearly.
func Serve(ctx context.Context, addr string, h http.Handler, log *zap.Logger) (func() error, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 64 << 10}
	errc := make(chan error, 1)
	go func() {
		err := srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		errc <- err
	}()
	log.Info("serving", zap.String("addr", ln.Addr().String()))
	return func() error {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		return <-errc
	}, nil
}
