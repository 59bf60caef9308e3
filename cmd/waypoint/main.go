// Command waypoint is Causeway's per-namespace L7 proxy (docs/design.md §5): it
// terminates HBONE, routes with Gateway API semantics, authorizes every
// request with OPA and re-tunnels to the destination node proxies. With
// --ingress it is an ingress Gateway (docs/ingress.md) instead: it serves
// the Gateway's HTTP and HTTPS listeners and tunnels to the mesh under its
// own identity, through the waypoint of a bound destination.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/causeway-mesh/causeway/pkg/bootstrap"
	"github.com/causeway-mesh/causeway/pkg/l7"
	"github.com/causeway-mesh/causeway/pkg/policy"
	"github.com/causeway-mesh/causeway/pkg/policy/policygit"
	"github.com/causeway-mesh/causeway/pkg/tracing"
	"github.com/causeway-mesh/causeway/pkg/tracing/otlpexport"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/version"
	"github.com/causeway-mesh/causeway/pkg/waypoint"
	"github.com/causeway-mesh/causeway/pkg/xds"
)

type options struct {
	common         bootstrap.Flags
	namespace      string
	name           string
	serviceAccount string
	listen         string
	policyDir      string
	git            policygit.Options
	policyPath     string
	parseBody      bool
	maxBodyBytes   int
	decisionCache  bool
	decisionLog    string
	// preflightFirst answers CORS preflights before the policy.
	preflightFirst bool
	pod            string
	drain          time.Duration
	shutdownDelay  time.Duration
	idleTimeout    time.Duration
	// tracing: the --tracing-* flags, checked by tracing.Parse.
	tracingEndpoint, tracingProtocol, tracingSampling string
	node                                              string
	ingress                                           bool
	ingressAddress                                    string
}

func main() {
	var o options
	fs := flag.NewFlagSet("waypoint", flag.ExitOnError)
	o.common.Register(fs)
	fs.StringVar(&o.namespace, "namespace", os.Getenv("POD_NAMESPACE"), "namespace of the waypoint's Gateway")
	fs.StringVar(&o.name, "name", "", "name of the waypoint's Gateway")
	fs.StringVar(&o.pod, "pod", os.Getenv("POD_NAME"), "name of this waypoint's own pod (in --namespace): Services' trafficDistribution prefers the endpoints closest to it")
	fs.StringVar(&o.serviceAccount, "service-account", "", "service account of the waypoint's pods (default: the Gateway name)")
	fs.StringVar(&o.listen, "listen", "0.0.0.0:15008", "HBONE listen address (the waypoint pod's IP and 15008); unused with --ingress")
	fs.BoolVar(&o.ingress, "ingress", false, "run as the ingress Gateway --namespace/--name (class causeway): serve its listeners, no HBONE; the policy flags are then optional (a bound destination's waypoint authorizes)")
	fs.StringVar(&o.ingressAddress, "ingress-address", "0.0.0.0", "with --ingress: the IP address the listeners' ports are opened on")
	fs.StringVar(&o.policyDir, "policy-dir", "", "directory of Rego policies (e.g. a git-sync checkout); this or --policy-git-url is required")
	fs.StringVar(&o.git.URL, "policy-git-url", "", "Git repository of Rego policies, fetched in process: https://, ssh://, user@host:path, file:// or a path; every commit of --policy-git-ref is a revision")
	fs.StringVar(&o.git.Ref, "policy-git-ref", "HEAD", "branch, tag, full reference name or commit SHA to follow")
	fs.StringVar(&o.git.Dir, "policy-git-dir", "", "sub-directory of the repository holding the policies")
	fs.DurationVar(&o.git.Poll, "policy-git-poll", time.Minute, "how often the ref is checked (POST /policy/refresh on the readiness port checks at once, e.g. from a push webhook)")
	fs.StringVar(&o.git.TokenFile, "policy-git-token-file", "", "file holding a token for https (basic auth with --policy-git-username), re-read at every fetch")
	fs.StringVar(&o.git.Username, "policy-git-username", "git", "user name sent with the https token")
	fs.StringVar(&o.git.SSHKeyFile, "policy-git-ssh-key-file", "", "file holding an unencrypted private key for ssh URLs")
	fs.StringVar(&o.git.KnownHostsFile, "policy-git-known-hosts", "", "known_hosts file with the ssh server's host keys (required for ssh)")
	fs.StringVar(&o.git.CAFile, "policy-git-ca-file", "", "PEM certificates trusted for https besides the system's")
	// The policy settings are defaults: a policy directory's
	// causeway-policy.yaml overrides them for its policy.
	fs.StringVar(&o.policyPath, "policy-path", "envoy/authz/allow", "decision path in the policies (default for policies whose "+policy.SettingsFile+" does not set decisionPath)")
	fs.BoolVar(&o.parseBody, "policy-parse-body", false, "give policies the request body (parsed_body: JSON, URL-encoded and multipart forms) as OPA-Envoy does with with_request_body (default for parseBody)")
	fs.IntVar(&o.maxBodyBytes, "policy-max-body-bytes", policy.DefaultMaxBodyBytes, fmt.Sprintf("body bytes placed in the input when bodies are parsed, at most %d; longer bodies are truncated and not parsed (default for maxBodyBytes)", policy.MaxBodyLimit))
	fs.BoolVar(&o.decisionCache, "policy-decision-cache", true, "reuse a policy's decision for requests that agree on every input value it reads, and evaluate other requests on those values alone (off for policies that read the whole input, call nondeterministic built-ins or print)")
	fs.StringVar(&o.decisionLog, "decision-log", "denied", "which decisions the decision log records with their (masked) input: all, denied or none (the access log names every request's decision and its id either way; default for decisionLog)")
	fs.BoolVar(&o.preflightFirst, "cors-preflight-before-policy", false, "answer CORS preflights of a route's CORS filter before the policy runs (browsers send them without credentials); by default every answer, redirects, 404s, 503s and preflights included, waits for the policy's allow")
	fs.DurationVar(&o.idleTimeout, "idle-timeout", time.Hour, "close TCP-port tunnels idle for this long (0: never)")
	fs.DurationVar(&o.drain, "drain", 10*time.Second, "how long tunnels may drain on shutdown")
	fs.DurationVar(&o.shutdownDelay, "shutdown-delay", 5*time.Second, "on SIGTERM, how long the waypoint still accepts tunnels (readiness failing) before it says GOAWAY and drains: the time its pod's removal takes to reach every node proxy, which until then may dial it")
	fs.StringVar(&o.tracingEndpoint, "tracing-endpoint", "", "host:port of an OTLP trace receiver (e.g. a Jaeger or OpenTelemetry Collector); unset: tracing off")
	fs.StringVar(&o.tracingProtocol, "tracing-protocol", string(tracing.GRPC), "OTLP protocol to the receiver: grpc or http")
	fs.StringVar(&o.tracingSampling, "tracing-sampling", fmt.Sprint(tracing.DefaultSampling), "percentage (0 to 100) of the traces the waypoint starts that are sampled; requests with a trace context keep their caller's decision")
	fs.StringVar(&o.node, "node", os.Getenv("NODE_NAME"), "name of the node this waypoint runs on, for the spans' k8s.node.name")
	version.RegisterFlag(fs, "waypoint")
	fs.Parse(os.Args[1:])
	if o.namespace == "" || o.name == "" {
		bootstrap.Fatal("waypoint", fmt.Errorf("--namespace and --name are required"))
	}
	if o.policyDir != "" && o.git.URL != "" || !o.ingress && o.policyDir == "" && o.git.URL == "" {
		bootstrap.Fatal("waypoint", fmt.Errorf("give one policy source: --policy-dir or --policy-git-url"))
	}
	if o.serviceAccount == "" {
		o.serviceAccount = o.name
	}
	traces, err := tracing.Parse(o.tracingEndpoint, o.tracingProtocol, o.tracingSampling)
	if err != nil {
		bootstrap.Fatal("waypoint", err)
	}
	if err := run(&o, traces); err != nil {
		bootstrap.Fatal("waypoint", err)
	}
}

func run(o *options, traces tracing.Settings) error {
	env, err := o.common.Setup()
	if err != nil {
		return err
	}
	wpField := zap.String("waypoint", o.namespace+"/"+o.name)
	log := env.Log.Logger.With(wpField)
	defer env.Log.Sync()
	self, err := trust.NewIdentity(o.common.TrustDomain, o.namespace, o.serviceAccount)
	if err != nil {
		return err
	}
	// A signal starts the shutdown (serveUntil); the components run on
	// until the tunnels have drained.
	sig, stop := bootstrap.SignalContext()
	defer stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	mode, err := policy.ParseDecisionLogMode(o.decisionLog)
	if err != nil {
		return err
	}
	decisions, err := policy.NewDecisionLogger(env.Log.Buffered("decisions", wpField), policy.DecisionLogOptions{Mode: mode, Registerer: env.Metrics})
	if err != nil {
		return err
	}
	var git policy.Remote
	if o.git.URL != "" {
		if git, err = policygit.New(o.git, policy.Limits{}); err != nil {
			return err
		}
	}
	var engine *policy.Engine // nil: an ingress gateway without a policy of its own
	if o.policyDir != "" || git != nil {
		engine, err = policy.NewEngine(policy.Options{Dir: o.policyDir, Remote: git, DecisionPath: o.policyPath, Logger: log.Named("policy"),
			DecisionLog: decisions, Registerer: env.Metrics, Input: policy.InputOptions{ParseBody: o.parseBody, MaxBodyBytes: o.maxBodyBytes},
			NoDecisionCache: !o.decisionCache})
		if err != nil {
			return err
		}
	}
	certs, closeCA, err := o.common.Certificates(env, log)
	if err != nil {
		return err
	}
	defer closeCA()
	// A policy's body limit is at most MaxBodyLimit.
	lo := l7.Options{MaxBufferedBody: policy.MaxBodyLimit, PreflightBeforePolicy: o.preflightFirst, Pod: l7.PodRef{Namespace: o.namespace, Name: o.pod}}
	if traces.Enabled() {
		tp, err := otlpexport.New(otlpexport.Options{Settings: traces, ServiceName: o.name + "." + o.namespace,
			Pod: o.pod, Namespace: o.namespace, Node: o.node, Registerer: env.Metrics, Logger: log})
		if err != nil {
			return err
		}
		defer func() {
			// What is queued goes out within a moment; an absent receiver
			// does not hold the exit.
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = tp.Shutdown(sctx)
		}()
		lo.Tracer = tp.Tracer()
		log.Info("tracing", zap.String("endpoint", traces.Endpoint), zap.String("protocol", string(traces.Protocol)), zap.Float64("sampling_percent", traces.Sampling))
	}
	tcpIdle := o.idleTimeout
	if tcpIdle == 0 {
		tcpIdle = -1 // the option's "never"
	}
	wo := waypoint.Options{Namespace: o.namespace, Name: o.name, Identity: self, Bundle: env.Bundle,
		Certificates: certs, Policy: engine, ConnectionDecisionLog: decisions, Logger: log, AccessLog: env.Log.Buffered("access", wpField), Registry: env.Metrics, TCPIdleTimeout: tcpIdle,
		L7: lo}
	nodeID, subs := xds.WaypointID(o.namespace, o.name), xds.WaypointSubscriptions(o.namespace, o.name)
	if o.ingress {
		if wo.IngressAddress, err = netip.ParseAddr(o.ingressAddress); err != nil {
			return fmt.Errorf("--ingress-address: %w", err)
		}
		wo.Ingress = true
		nodeID, subs = xds.IngressID(o.namespace, o.name), xds.IngressSubscriptions(o.namespace, o.name)
	}
	wp, err := waypoint.New(wo)
	if err != nil {
		return err
	}
	// Backends in other namespaces are subscribed to as routes name them.
	var backends atomic.Pointer[xds.RouteBackends]
	xc, err := xds.NewClient(xds.ClientOptions{
		Address: o.common.XDSAddress, Bundle: env.Bundle, ServerIdentity: env.ControlPlaneIdentity, Token: env.Token,
		NodeID: nodeID, Logger: log,
		Subscriptions: subs,
		OnChange: func(s *xds.State, _ []string) {
			if err := backends.Load().Update(s); err != nil {
				log.Error("following the routes' backends in other namespaces", zap.Error(err))
			}
			wp.Update(s)
		},
	})
	if err != nil {
		return err
	}
	if o.ingress {
		backends.Store(xds.NewIngressBackends(xc, o.namespace, o.name))
	} else {
		backends.Store(xds.NewRouteBackends(xc, o.namespace))
	}
	ready := func() (string, error) {
		if sig.Err() != nil {
			return "", errors.New("shutting down")
		}
		if !xc.Ready() {
			return "", fmt.Errorf("waiting for the first configuration from %s", o.common.XDSAddress)
		}
		if err := wp.Ready(); err != nil {
			return "", err
		}
		if engine == nil {
			return "ingress gateway without a policy of its own", nil
		}
		return engine.Describe(), nil
	}
	ops := bootstrap.Ops{Dump: wp.Dump, Ready: ready}
	if git != nil {
		ops.Readiness = map[string]http.Handler{"POST /policy/refresh": engine.RefreshHandler()}
	}
	waitOps, err := o.common.ServeOps(ctx, env, ops)
	if err != nil {
		return err
	}
	var ln net.Listener // none in the ingress role: its listeners come over xDS
	if !o.ingress {
		if ln, err = net.Listen("tcp", o.listen); err != nil {
			return fmt.Errorf("HBONE listener: %w", err)
		}
	}

	errc := make(chan error, 5)
	go func() { decisions.Run(ctx); errc <- nil }()
	go func() { errc <- certs.Run(ctx) }()
	go func() { errc <- xc.Run(ctx) }()
	go func() {
		if engine == nil {
			errc <- nil
			return
		}
		errc <- engine.Run(ctx)
	}()
	go func() {
		errc <- serveUntil(sig, wp, ln, o.shutdownDelay, o.drain, log)
		cancel()
	}()
	if o.ingress {
		log.Info("ingress gateway started", zap.String("address", o.ingressAddress), zap.String("identity", self.String()))
	} else {
		log.Info("waypoint started", zap.String("hbone", ln.Addr().String()), zap.String("identity", self.String()))
	}
	var firstErr error
	for range 5 {
		if err := <-errc; err != nil && firstErr == nil && sig.Err() == nil {
			firstErr = err
			log.Error("waypoint component failed", zap.Error(err))
			stop()
		}
	}
	waitOps()
	log.Info("waypoint stopped")
	return firstErr
}

// hboneServer is what serveUntil runs: the waypoint's HBONE server (and,
// in the ingress role, the gateway's listeners, which it opens itself).
type hboneServer interface {
	Serve(net.Listener) error
	Shutdown(context.Context) error
}

// serveUntil serves HBONE on ln (none: the ingress role) until ctx ends,
// goes on accepting for delay, then drains (Waypoint.Shutdown) for at
// most drain: it returns as soon as every connection has closed. The delay covers the time the pod's removal from the waypoint's
// addresses takes to reach every node proxy: one that has not heard of it
// yet still dials this pod, and once the process is gone its address leads
// nowhere (the dial hangs until it times out) instead of being refused.
func serveUntil(ctx context.Context, srv hboneServer, ln net.Listener, delay, drain time.Duration, log *zap.Logger) error {
	errc := make(chan error, 1)
	if ln != nil {
		go func() { errc <- srv.Serve(ln) }()
	}
	select {
	case err := <-errc:
		return fmt.Errorf("HBONE server: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down: accepting tunnels, then draining", zap.Duration("accepting", delay), zap.Duration("drain", drain))
	select {
	case err := <-errc:
		return fmt.Errorf("HBONE server: %w", err)
	case <-time.After(delay):
	}
	log.Info("draining: GOAWAY on HBONE and HTTP/2, idle HTTP/1.1 connections closed, busy ones after their response")
	start := time.Now()
	sctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	err := srv.Shutdown(sctx)
	if ln != nil {
		<-errc
	}
	if err == nil {
		log.Info("drained: every connection closed", zap.Duration("took", time.Since(start)))
	}
	return err
}
