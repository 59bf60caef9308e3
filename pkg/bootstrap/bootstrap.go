// Package bootstrap holds what every proxy binary needs to join the mesh:
// its common flags, logger, trust bundle, credentials for the control plane,
// and its admin, readiness and metrics servers.
package bootstrap

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"

	"github.com/causeway-mesh/causeway/pkg/admin"
	"github.com/causeway-mesh/causeway/pkg/logging"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/caclient"
	"github.com/causeway-mesh/causeway/pkg/trust/certmanager"
)

// Flags are the options every proxy shares.
type Flags struct {
	TrustDomain          string
	XDSAddress           string
	TokenFile            string
	RootCert             string
	ControlPlaneIdentity string
	Admin                string
	Readiness            string
	Metrics              string
	LogFormat, LogLevel  string
	LogFlushInterval     time.Duration
	GCPercent            int
	ClockOffsetFile      string
}

// Register adds the common flags to fs.
func (f *Flags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.TrustDomain, "trust-domain", trust.DefaultTrustDomain, "mesh trust domain")
	fs.StringVar(&f.XDSAddress, "xds-address", "127.0.0.1:15012", "control plane (xDS and CA) address")
	fs.StringVar(&f.TokenFile, "token-file", "", "file holding the bearer token presented to the control plane")
	fs.StringVar(&f.RootCert, "root-cert", "", "PEM file with the mesh root certificate(s)")
	fs.StringVar(&f.ControlPlaneIdentity, "controlplane-identity", "", "identity the control plane must present (default: its identity in the trust domain)")
	fs.StringVar(&f.Admin, "admin", "127.0.0.1:15000", "admin address (/config_dump, /logging, /debug/pprof/); keep it on localhost")
	fs.StringVar(&f.Readiness, "readiness", "127.0.0.1:15021", "readiness address (/healthz/ready)")
	fs.StringVar(&f.Metrics, "metrics", "127.0.0.1:15020", "Prometheus metrics address (/metrics); may equal --readiness")
	fs.StringVar(&f.LogFormat, "log-format", "json", "log format: json or console")
	fs.StringVar(&f.LogLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.DurationVar(&f.LogFlushInterval, "log-flush-interval", time.Second, "longest time access and decision log lines wait in a buffer before they are written (0: written at once)")
	fs.StringVar(&f.ClockOffsetFile, "clock-offset-file", "", "fault tests only: judge certificates by the system clock plus the duration in this file (\"-1h\"; re-read every 100ms, absent: 0); never set in production")
	fs.IntVar(&f.GCPercent, "gc-percent", DefaultGCPercent, "heap growth between garbage collections, as GOGC (which wins when set); a soft memory limit at 90% of the container's keeps it inside the pod's memory")
}

// Env is a proxy's connection to the mesh.
type Env struct {
	Log                  *logging.Logger
	Bundle               *trust.Bundle
	Token                caclient.TokenSource
	ControlPlaneIdentity trust.Identity
	Metrics              *prometheus.Registry
	// Clock judges certificates (Bundle's already does): the system's,
	// or the one of --clock-offset-file.
	Clock func() time.Time
}

// Setup validates the flags and builds the environment.
func (f *Flags) Setup() (*Env, error) {
	log, err := logging.New(logging.Options{Format: f.LogFormat, Level: f.LogLevel, FlushInterval: f.LogFlushInterval})
	if err != nil {
		return nil, err
	}
	idle, err := tuneMemory(f.GCPercent, log.Logger)
	if err != nil {
		return nil, err
	}
	go idle.run(context.Background()) // for the process's life
	if f.RootCert == "" || f.TokenFile == "" {
		return nil, fmt.Errorf("--root-cert and --token-file are required")
	}
	bundle, err := trust.LoadBundleFile(f.TrustDomain, f.RootCert)
	if err != nil {
		return nil, err
	}
	cpID, err := trust.ControlPlaneIdentity(f.TrustDomain)
	if err != nil {
		return nil, err
	}
	if f.ControlPlaneIdentity != "" {
		if cpID, err = trust.ParseIdentity(f.ControlPlaneIdentity); err != nil {
			return nil, fmt.Errorf("--controlplane-identity: %w", err)
		}
	}
	clock := time.Now
	if f.ClockOffsetFile != "" {
		c, err := startOffsetClock(context.Background(), f.ClockOffsetFile, log.Logger) // for the process's life
		if err != nil {
			return nil, err
		}
		clock = c.Now
		bundle.SetClock(clock)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return &Env{Log: log, Bundle: bundle, Token: caclient.TokenFromFile(f.TokenFile), ControlPlaneIdentity: cpID, Metrics: reg, Clock: clock}, nil
}

// Certificates connects to the control plane's CA and returns the manager
// that keeps the proxy's certificates from it, with the function that
// closes the connection to the CA.
func (f *Flags) Certificates(env *Env, log *zap.Logger) (*certmanager.Manager, func() error, error) {
	ca, err := caclient.New(caclient.Options{Address: f.XDSAddress, Bundle: env.Bundle, ServerIdentity: env.ControlPlaneIdentity, Token: env.Token})
	if err != nil {
		return nil, nil, err
	}
	certs, err := certmanager.New(certmanager.Options{Fetcher: ca, Bundle: env.Bundle, Logger: log, Clock: env.Clock})
	if err != nil {
		ca.Close()
		return nil, nil, err
	}
	return certs, ca.Close, nil
}

// Ops are what a component serves on its operator ports.
type Ops struct {
	// Dump builds /config_dump (admin port).
	Dump func() (*admin.ConfigDump, error)
	// Ready returns nil when the component can serve, with what it serves
	// (shown after "ready", "" for nothing), otherwise why it cannot.
	Ready func() (string, error)
	// Readiness are further routes on the readiness port, which unlike
	// the admin port is reachable from outside the pod.
	Readiness map[string]http.Handler
}

// ServeOps starts the admin server (on Flags.Admin), readiness (on
// Flags.Readiness) and metrics (on Flags.Metrics) until ctx ends. The
// returned function waits for all of them to stop.
func (f *Flags) ServeOps(ctx context.Context, env *Env, ops Ops) (func(), error) {
	log := env.Log.Logger
	if f.Admin == f.Readiness || f.Admin == f.Metrics {
		return nil, fmt.Errorf("--admin %s must differ from --readiness and --metrics: it is for localhost only", f.Admin)
	}
	handlers := admin.StatusHandlers(f.Readiness, ops.Ready, ops.Readiness, f.Metrics, env.Metrics)
	handlers[f.Admin] = admin.Handler(admin.Options{Dump: ops.Dump, Logging: env.Log.Handler()})
	var waits []func() error
	waitAll := func() {
		for _, wait := range waits {
			if err := wait(); err != nil {
				log.Warn("operator server", zap.Error(err))
			}
		}
	}
	for addr, h := range handlers {
		wait, err := admin.Serve(ctx, addr, h, log.Named("ops"))
		if err != nil {
			return nil, err
		}
		waits = append(waits, wait)
	}
	return waitAll, nil
}

// SignalContext is cancelled on SIGINT or SIGTERM.
func SignalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
}

// Fatal reports a startup error and exits.
func Fatal(component string, err error) {
	fmt.Fprintf(os.Stderr, "%s: %v\n", component, err)
	os.Exit(1)
}
