// Package waypoint is the per-namespace L7 proxy: it terminates HBONE,
// treats TLS-only tunnels as unauthenticated, routes and authorizes each
// request (pkg/l7, pkg/policy) and re-tunnels to the destination pods' node
// proxies under its own identity (docs/design.md §5 paths 2 and 3).
package waypoint

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/causeway-mesh/causeway/pkg/admin"
	"github.com/causeway-mesh/causeway/pkg/backendtls"
	"github.com/causeway-mesh/causeway/pkg/connpolicy"
	"github.com/causeway-mesh/causeway/pkg/hbone"
	"github.com/causeway-mesh/causeway/pkg/l7"
	"github.com/causeway-mesh/causeway/pkg/locality"
	"github.com/causeway-mesh/causeway/pkg/policy"
	"github.com/causeway-mesh/causeway/pkg/telemetry"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/certmanager"
	"github.com/causeway-mesh/causeway/pkg/xds"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// Certificates is what the waypoint needs of its certificate manager.
type Certificates interface {
	Get(ctx context.Context, id trust.Identity) (*tls.Certificate, error)
	Prefetch(id trust.Identity)
	Snapshot() []certmanager.CertificateStatus
}

// Options configure a Waypoint.
type Options struct {
	// Namespace and Name of the waypoint's Gateway.
	Namespace, Name string
	// Identity is the waypoint's own identity (its pods' service account).
	Identity     trust.Identity
	Bundle       *trust.Bundle
	Certificates Certificates
	Policy       *policy.Engine
	Logger       *zap.Logger
	// AccessLog receives the per-request and per-connection lines (default:
	// Logger named "access", without caller annotations).
	AccessLog *zap.Logger
	Registry  prometheus.Registerer
	// HBONEPort is where destination pods take HBONE (default 15008).
	HBONEPort uint16
	// ConnectTimeout bounds an upstream connect (default 5 s).
	ConnectTimeout time.Duration
	// TCPIdleTimeout closes a TCP-port tunnel on which nothing moved for
	// this long (default 1 h; negative: never), as the node proxy does.
	TCPIdleTimeout time.Duration
	// ConnectionDecisionLog receives the decisions of the connection
	// policies that target this waypoint (nil: not logged).
	ConnectionDecisionLog *policy.DecisionLogger
	// Ingress runs the gateway in the ingress role (docs/ingress.md): it
	// serves the listeners of ingress Gateway Namespace/Name on
	// IngressAddress instead of HBONE, and is no waypoint (it serves no
	// tunnel). Policy is optional then: a bound destination's waypoint
	// authorizes the gateway's requests.
	Ingress        bool
	IngressAddress netip.Addr
	// Pool, Server and L7 options (required fields are filled in).
	Pool   hbone.PoolOptions
	Server hbone.ServerOptions
	L7     l7.Options
}

// Waypoint serves HBONE for the destinations bound to it.
type Waypoint struct {
	opts   Options
	self   *meshv1.Ref
	log    *zap.Logger
	access *zap.Logger
	pool   *hbone.Pool
	server *hbone.Server
	engine *l7.Engine
	view   atomic.Pointer[view]
	synced atomic.Bool

	// policies are the connection policies targeting this waypoint,
	// checked as each tunnel opens; tunnels follows the tunnels they
	// admitted (tunnels), re-checked after every change until stop.
	policies *connpolicy.Enforcer
	tunnels  *connpolicy.Tracker
	stop     context.CancelFunc
	stopped  chan struct{}

	// backendTLS counts the TLS handshakes with backends by policy and result.
	backendTLS *prometheus.CounterVec

	// ingress holds the listening ports of the ingress role (nil otherwise).
	ingress *ingressPorts
}

// view indexes the destinations the waypoint may serve.
type view struct {
	state *xds.State
	byVIP map[netip.Addr]*meshv1.Service
	byIP  map[netip.Addr]*meshv1.Workload
	// bound: workload uid -> the waypoints it is bound to (own binding and
	// through services it is an endpoint of).
	bound map[string][]*meshv1.Ref
	// tls: the BackendTLSPolicies of the service ports, compiled, by
	// backendtls.Key.
	tls map[string]*backendtls.Policy
	// tlsKeys: each service port's backendtls.Key, made once per view
	// rather than per endpoint of every connection.
	tlsKeys map[*meshv1.BackendTLS]string
	// self is where the waypoint's own pod runs (Options.L7.Pod): TCP
	// connections go to the closest endpoints first, as requests do.
	self locality.Place
	// baggage names the waypoint's own pod in the CONNECTs it opens (as
	// a node proxy names its callers'): the destination's node proxy
	// reports the waypoint as the source, under the waypoint's identity.
	// Never a caller's names: the waypoint cannot vouch for them.
	baggage string
}

// New builds a waypoint; Serve runs it.
func New(o Options) (*Waypoint, error) {
	if o.Namespace == "" || o.Name == "" || o.Identity.IsZero() || o.Bundle == nil || o.Certificates == nil || o.Policy == nil && !o.Ingress {
		return nil, errors.New("waypoint: Namespace, Name, Identity, Bundle, Certificates and Policy are required")
	}
	if o.Ingress && !o.IngressAddress.IsValid() {
		return nil, errors.New("waypoint: the ingress role needs IngressAddress")
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.AccessLog == nil {
		// A line per request: the caller's file and line would be the same
		// on every one, and finding them costs a stack walk each time.
		o.AccessLog = o.Logger.Named("access").WithOptions(zap.WithCaller(false))
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	if o.HBONEPort == 0 {
		o.HBONEPort = 15008
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 5 * time.Second
	}
	if o.TCPIdleTimeout == 0 {
		o.TCPIdleTimeout = time.Hour
	} else if o.TCPIdleTimeout < 0 {
		o.TCPIdleTimeout = 0
	}
	w := &Waypoint{opts: o, self: &meshv1.Ref{Namespace: o.Namespace, Name: o.Name}, log: o.Logger, access: o.AccessLog}
	w.backendTLS = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "backend_tls_handshakes_total",
		Help: "TLS handshakes with backends a BackendTLSPolicy covers, by policy (<namespace>/<name>) and result: ok, verify_failed (the certificate did not verify; refused), handshake_failed, invalid_policy (the policy cannot be carried out; nothing sent).",
	}, []string{"policy", "result"})
	if err := o.Registry.Register(w.backendTLS); err != nil {
		return nil, fmt.Errorf("waypoint metrics: %w", err)
	}
	o.Certificates.Prefetch(o.Identity)
	w.view.Store(newView(&xds.State{}, nil, o.L7.Pod))

	po := o.Pool
	po.Bundle, po.Logger = o.Bundle, o.Logger.Named("hbone-client")
	pool, err := hbone.NewPool(po)
	if err != nil {
		return nil, err
	}
	w.pool = pool
	lo := o.L7
	lo.Dialer, lo.Authorizer, lo.Logger, lo.Registerer = w, l7.AuthorizerFunc(w.authorize), o.AccessLog, o.Registry
	if o.Policy == nil {
		lo.Authorizer = l7.AllowAll()
	}
	engine, err := l7.NewEngine(lo)
	if err != nil {
		pool.Close()
		return nil, err
	}
	w.engine = engine
	so := o.Server
	// TLS-only clients (hairpin) are let in, as unauthenticated peers.
	so.TLS = trust.ServerConfig(o.Bundle, func(net.Addr) (*tls.Certificate, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return o.Certificates.Get(ctx, o.Identity)
	}, trust.VerifyIfGiven)
	so.Handler, so.Logger, so.Registerer = hbone.HandlerFunc(w.open), o.Logger.Named("hbone-server"), o.Registry
	srv, err := hbone.NewServer(so)
	if err != nil {
		engine.Close()
		pool.Close()
		return nil, err
	}
	w.server = srv
	if w.policies, err = connpolicy.New(connpolicy.Options{Logger: o.Logger, DecisionLog: o.ConnectionDecisionLog, Registerer: o.Registry}); err != nil {
		srv.Close()
		engine.Close()
		pool.Close()
		return nil, err
	}
	w.tunnels = connpolicy.NewTracker(o.Logger)
	var ctx context.Context
	ctx, w.stop = context.WithCancel(context.Background())
	if o.Ingress {
		w.ingress = newIngressPorts(ctx, w)
	}
	w.stopped = make(chan struct{})
	go func() {
		defer close(w.stopped)
		w.tunnels.Run(ctx)
	}()
	return w, nil
}

// Update installs a new configuration from the control plane.
func (w *Waypoint) Update(s *xds.State) {
	v := newView(s, w.view.Load().tls, w.opts.L7.Pod)
	// Policies first: a destination that arrives with its policy is never
	// served without it.
	w.policies.Update(context.Background(), values(s.ConnectionPolicies))
	w.view.Store(v)
	w.tunnels.Request() // the policies, or the destinations they read, may have changed
	if w.ingress != nil {
		g := s.IngressGateways[w.opts.Namespace+"/"+w.opts.Name]
		w.engine.Update(l7.CompileGateway(g.GetListeners(), values(s.Services), values(s.Workloads), values(s.Waypoints)))
		w.ingress.update(g.GetListeners()) // the routes first: a port opens with its listeners' routes in place
	} else {
		w.engine.Update(l7.Compile(values(s.HTTPRoutes), values(s.GRPCRoutes), values(s.Services), values(s.Workloads)))
	}
	w.synced.Store(true)
}

// newView indexes s for the waypoint whose pod is self; prevTLS are the
// previous view's compiled BackendTLSPolicies, reused where their settings
// did not change.
func newView(s *xds.State, prevTLS map[string]*backendtls.Policy, self l7.PodRef) *view {
	v := &view{state: s, byVIP: map[netip.Addr]*meshv1.Service{}, byIP: map[netip.Addr]*meshv1.Workload{}, bound: map[string][]*meshv1.Ref{},
		tls: map[string]*backendtls.Policy{}, tlsKeys: map[*meshv1.BackendTLS]string{}}
	for _, wl := range s.Workloads {
		for _, a := range wl.GetAddresses() {
			if ip, err := netip.ParseAddr(a); err == nil {
				v.byIP[ip.Unmap()] = wl
			}
		}
		if wl.GetWaypoint() != nil {
			v.bound[wl.GetUid()] = append(v.bound[wl.GetUid()], wl.GetWaypoint())
		}
		if self.Name != "" && wl.GetName() == self.Name && wl.GetNamespace() == self.Namespace {
			v.self, v.baggage = locality.Of(wl), telemetry.Baggage(wl)
		}
	}
	for _, svc := range s.Services {
		for _, sp := range svc.GetPorts() {
			if bt := sp.GetBackendTls(); bt != nil {
				k := backendtls.Key(bt)
				v.tlsKeys[bt] = k
				if p := prevTLS[k]; p != nil {
					v.tls[k] = p
				} else if v.tls[k] == nil {
					v.tls[k] = backendtls.Compile(bt)
				}
			}
		}
		for _, a := range svc.GetVips() {
			if ip, err := netip.ParseAddr(a); err == nil {
				v.byVIP[ip.Unmap()] = svc
			}
		}
		if svc.GetWaypoint() != nil {
			for _, ep := range svc.GetEndpoints() {
				v.bound[ep.GetWorkloadUid()] = append(v.bound[ep.GetWorkloadUid()], svc.GetWaypoint())
			}
		}
	}
	return v
}

func sameRef(a, b *meshv1.Ref) bool {
	return a != nil && b != nil && a.GetNamespace() == b.GetNamespace() && a.GetName() == b.GetName()
}

// Serve takes HBONE connections on ln until Shutdown.
func (w *Waypoint) Serve(ln net.Listener) error { return w.server.Serve(ln) }

// Shutdown drains until ctx ends, then closes everything: HBONE
// connections are told GOAWAY and the HTTP connections inside their
// tunnels, or on the ingress ports, end as l7's Engine.Drain ends them
// (idle ones at once, busy ones after their response). It returns as
// soon as every connection has closed; at ctx's end it cuts the rest
// (logged with their number) and returns ctx's error.
func (w *Waypoint) Shutdown(ctx context.Context) error {
	w.engine.Drain()
	var err error
	if w.ingress != nil {
		err = w.ingress.shutdown(ctx)
	}
	err = errors.Join(err, w.server.Shutdown(ctx))
	w.stop()
	<-w.stopped
	w.engine.Close()
	w.pool.Close()
	return err
}

// Ready reports whether the waypoint can serve: configuration synced, its
// certificate available and a policy active.
func (w *Waypoint) Ready() error {
	if !w.synced.Load() {
		return errors.New("waiting for the first configuration")
	}
	if w.opts.Policy != nil {
		if err := w.opts.Policy.Ready(); err != nil {
			return err
		}
	}
	for _, c := range w.opts.Certificates.Snapshot() {
		if c.Identity == w.opts.Identity.String() {
			if c.State != certmanager.StateAvailable {
				return fmt.Errorf("certificate for %s: %s", c.Identity, c.State)
			}
			return nil
		}
	}
	return fmt.Errorf("no certificate for %s yet", w.opts.Identity)
}

// open decides about one CONNECT: the authority must be a destination
// bound to this waypoint.
func (w *Waypoint) open(ctx context.Context, req *hbone.Request) (hbone.Stream, error) {
	if !req.Authority.IsValid() {
		return nil, hbone.BadRequest("authority must be ip:port")
	}
	v := w.view.Load()
	dst := req.Authority
	info := l7.ConnInfo{Peer: req.Peer, Source: req.Remote, Destination: dst, Port: uint32(dst.Port()), Baggage: req.Baggage}
	var targets []l7.Target
	if svc, ok := v.byVIP[dst.Addr().Unmap()]; ok {
		if !sameRef(svc.GetWaypoint(), w.self) {
			return nil, hbone.Deny(fmt.Sprintf("service %s/%s is not bound to waypoint %s/%s", svc.GetNamespace(), svc.GetName(), w.opts.Namespace, w.opts.Name))
		}
		sp := servicePort(svc, uint32(dst.Port()))
		if sp == nil {
			return nil, hbone.Unavailable(fmt.Sprintf("service %s/%s has no port %d", svc.GetNamespace(), svc.GetName(), dst.Port()))
		}
		info.Service = l7.ServiceRef{Namespace: svc.GetNamespace(), Name: svc.GetName()}
		info.Protocol = l7.ProtocolFor(sp.GetAppProtocol())
		if info.Protocol == l7.ProtocolTCP {
			targets = v.serviceTargets(svc, sp)
		}
	} else if wl, ok := v.byIP[dst.Addr().Unmap()]; ok {
		bound := false
		for _, ref := range v.bound[wl.GetUid()] {
			bound = bound || sameRef(ref, w.self)
		}
		if !bound {
			return nil, hbone.Deny(fmt.Sprintf("workload %s/%s is not bound to waypoint %s/%s", wl.GetNamespace(), wl.GetName(), w.opts.Namespace, w.opts.Name))
		}
		info.Protocol = v.workloadProtocol(wl, uint32(dst.Port()))
		targets = []l7.Target{workloadTarget(wl, dst)}
	} else {
		return nil, hbone.Unavailable(fmt.Sprintf("unknown destination %s", dst))
	}
	// The tunnel itself, before any byte of it is parsed.
	table := w.policies.Current()
	if verdict := w.authorizeTunnel(ctx, v, table, req, false); !verdict.Allowed {
		w.access.Info("connection", zap.String("src", req.Remote.String()), zap.String("src_identity", req.Peer.String()),
			zap.String("dst", dst.String()), zap.String("policy", verdict.Policy), zap.String("policy_revision", verdict.Revision),
			zap.String("decision_id", verdict.DecisionID), zap.String("result", "denied by connection policy"))
		return nil, hbone.Deny(verdict.Reason)
	}
	var stream hbone.Stream
	if info.Protocol != l7.ProtocolTCP {
		stream = hbone.StreamFunc(func(ctx context.Context, tunnel net.Conn) {
			if err := w.engine.ServeConn(ctx, tunnel, info); err != nil {
				w.log.Debug("tunnel ended", zap.Stringer("dst", dst), zap.Error(err))
			}
		})
	} else {
		var err error
		if stream, err = w.openTCP(ctx, req, info, targets); err != nil {
			return nil, err
		}
	}
	return hbone.StreamFunc(func(ctx context.Context, tunnel net.Conn) {
		// The stream is served in a context a denying re-check cancels,
		// which ends HTTP serving and TCP relaying alike.
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		_, untrack := w.tunnels.Track(ctx,
			func(ctx context.Context) (connpolicy.Verdict, error) {
				return w.authorizeTunnel(ctx, w.view.Load(), w.policies.Current(), req, true), nil
			},
			func() bool { return w.view.Load() != v || w.policies.Current() != table },
			cancel,
			func() []zap.Field {
				return []zap.Field{zap.String("src", req.Remote.String()), zap.String("src_identity", req.Peer.String()), zap.String("dst", dst.String())}
			})
		defer untrack()
		stream.Serve(ctx, tunnel)
	}), nil
}

// authorizeTunnel evaluates the connection policies targeting this
// waypoint for a tunnel, under view v: the destination is a Service
// (by VIP) or a workload (by pod IP). A destination v no longer knows is
// denied.
func (w *Waypoint) authorizeTunnel(ctx context.Context, v *view, t *connpolicy.Table, req *hbone.Request, recheck bool) connpolicy.Verdict {
	selected := t.ForWaypoint(w.opts.Namespace, w.opts.Name)
	if len(selected) == 0 {
		return connpolicy.Verdict{Allowed: true}
	}
	in := &policy.ConnectionRequest{Source: req.Peer, SourceAddr: req.Remote, DestAddr: req.Authority}
	addr := req.Authority.Addr().Unmap()
	if svc, ok := v.byVIP[addr]; ok {
		in.DestinationServices = []string{svc.GetHostname()}
	} else if wl, ok := v.byIP[addr]; ok {
		in.DestinationWorkload = &policy.Workload{Namespace: wl.GetNamespace(), Name: wl.GetName(), UID: wl.GetUid(),
			ServiceAccount: wl.GetServiceAccount(), Labels: wl.GetLabels()}
		if id, err := trust.ParseIdentity(wl.GetIdentity()); err == nil {
			in.Destination = id
		}
	} else {
		return connpolicy.Verdict{Reason: fmt.Sprintf("unknown destination %s", req.Authority)}
	}
	if recheck {
		return w.policies.Recheck(ctx, selected, in)
	}
	return w.policies.Authorize(ctx, selected, in)
}

// openTCP authorizes a TCP destination as a whole and connects to the
// first of its endpoints (in order) that answers before the tunnel is
// accepted.
func (w *Waypoint) openTCP(ctx context.Context, req *hbone.Request, info l7.ConnInfo, targets []l7.Target) (hbone.Stream, error) {
	start := time.Now()
	// The policy first: a caller it refuses does not learn whether the
	// destination has endpoints.
	var dest trust.Identity
	if len(targets) > 0 {
		dest = targets[0].Identity
	}
	d := w.opts.Policy.DecideConnection(ctx, &policy.ConnectionRequest{Source: req.Peer, SourceAddr: req.Remote,
		DestAddr: info.Destination, Destination: dest})
	log := w.access.With(zap.String("protocol", "tcp"), zap.String("src", req.Remote.String()), zap.String("src_identity", req.Peer.String()),
		zap.String("dst", info.Destination.String()), zap.String("service", info.Service.Namespace+"/"+info.Service.Name),
		zap.Bool("allowed", d.Allowed), zap.String("decision_id", d.ID), zap.String("reason", d.Reason))
	if !d.Allowed {
		log.Info("connection", zap.String("result", "denied by policy"))
		return nil, hbone.Deny("denied by policy: " + d.Reason)
	}
	if len(targets) == 0 {
		log.Info("connection", zap.String("result", "no endpoint"))
		return nil, hbone.Unavailable(fmt.Sprintf("no endpoint for %s", info.Destination))
	}
	var errs []error
	for _, t := range targets {
		conn, err := w.DialEndpoint(ctx, t)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		return hbone.StreamFunc(func(ctx context.Context, tunnel net.Conn) {
			sent, received, err := hbone.JoinIdle(ctx, tunnel, conn, w.opts.TCPIdleTimeout)
			result := "ok"
			if err != nil {
				result = err.Error()
			}
			log.Info("connection", zap.String("endpoint", t.Address.String()), zap.Int64("bytes_sent", sent),
				zap.Int64("bytes_received", received), zap.Duration("duration", time.Since(start)), zap.String("result", result))
		}), nil
	}
	err := errors.Join(errs...)
	log.Info("connection", zap.String("result", err.Error()))
	return nil, hbone.Unavailable(err.Error())
}

func servicePort(svc *meshv1.Service, port uint32) *meshv1.ServicePort {
	for _, p := range svc.GetPorts() {
		if p.GetPort() == port {
			return p
		}
	}
	return nil
}

// serviceTargets lists the endpoints serving a service port in the order
// to try them: the closest to the waypoint first (the Service's
// trafficDistribution, pkg/locality), in random order within a tier.
func (v *view) serviceTargets(svc *meshv1.Service, sp *meshv1.ServicePort) []l7.Target {
	var out []l7.Target
	bt := sp.GetBackendTls()
	tlsKey, ok := v.tlsKeys[bt]
	if !ok && bt != nil {
		tlsKey = backendtls.Key(bt)
	}
	for _, ep := range svc.GetEndpoints() {
		ip, err := netip.ParseAddr(ep.GetAddress())
		if err != nil {
			continue
		}
		port := ep.GetPorts()[sp.GetPort()]
		if port == 0 {
			port = sp.GetTargetPort()
		}
		if port == 0 {
			port = sp.GetPort()
		}
		wl := v.state.Workloads[ep.GetWorkloadUid()]
		t := workloadTarget(wl, netip.AddrPortFrom(ip, uint16(port)))
		t.Service = l7.ServiceRef{Namespace: svc.GetNamespace(), Name: svc.GetName()}
		t.TLS, t.TLSKey = bt, tlsKey
		out = append(out, t)
	}
	rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	if td := svc.GetTrafficDistribution(); td != meshv1.TrafficDistribution_ANY {
		slices.SortStableFunc(out, func(a, b l7.Target) int {
			return locality.Rank(td, v.self, locality.Of(a.Workload)) - locality.Rank(td, v.self, locality.Of(b.Workload))
		})
	}
	return out
}

// workloadProtocol is the protocol of a workload port: the appProtocol of a
// service port bound to a waypoint that targets it, else TCP.
func (v *view) workloadProtocol(wl *meshv1.Workload, port uint32) l7.Protocol {
	for _, svc := range v.state.Services {
		for _, ep := range svc.GetEndpoints() {
			if ep.GetWorkloadUid() != wl.GetUid() {
				continue
			}
			for _, sp := range svc.GetPorts() {
				target := ep.GetPorts()[sp.GetPort()]
				if target == 0 {
					target = sp.GetTargetPort()
				}
				if target == port {
					return l7.ProtocolFor(sp.GetAppProtocol())
				}
			}
		}
	}
	return l7.ProtocolTCP
}

func workloadTarget(wl *meshv1.Workload, addr netip.AddrPort) l7.Target {
	t := l7.Target{Address: addr, Workload: wl}
	if id, err := trust.ParseIdentity(wl.GetIdentity()); err == nil {
		t.Identity = id
	}
	return t
}

// DialEndpoint opens an HBONE tunnel to an endpoint's pod under the
// waypoint's own identity (l7.Dialer). Endpoints outside the mesh get plain
// TCP. When a BackendTLSPolicy covers the endpoint's port, TLS to the
// endpoint runs over either, verified as the policy says; a policy that
// cannot be carried out, or a certificate that does not verify, fails the
// connection: nothing is ever sent unverified.
func (w *Waypoint) DialEndpoint(ctx context.Context, t l7.Target) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, w.opts.ConnectTimeout)
	defer cancel()
	if t.TLS == nil {
		return w.dialEndpoint(ctx, t)
	}
	p := w.view.Load().tls[t.TLSKey]
	if p == nil { // a target of a configuration older or newer than the view
		p = backendtls.Compile(t.TLS)
	}
	if why := p.Invalid(); why != "" {
		w.backendTLS.WithLabelValues(p.Name(), "invalid_policy").Inc()
		return nil, fmt.Errorf("endpoint %s: BackendTLSPolicy %s cannot be carried out, nothing sent: %s", t.Address, p.Name(), why)
	}
	raw, err := w.dialEndpoint(ctx, t)
	if err != nil {
		return nil, err
	}
	conn, err := p.Client(ctx, raw, t.ALPN)
	if err != nil {
		result := "handshake_failed"
		var te *backendtls.Error
		if errors.As(err, &te) && te.Verify {
			result = "verify_failed"
		}
		w.backendTLS.WithLabelValues(p.Name(), result).Inc()
		w.log.Warn("backend TLS refused", zap.String("policy", p.Name()), zap.Stringer("endpoint", t.Address),
			zap.String("service", t.Service.Namespace+"/"+t.Service.Name), zap.Error(err))
		return nil, fmt.Errorf("endpoint %s: %w", t.Address, err)
	}
	w.backendTLS.WithLabelValues(p.Name(), "ok").Inc()
	return conn, nil
}

// dialEndpoint opens the tunnel or TCP connection to an endpoint. An
// endpoint that is no pod (an EndpointSlice address outside the cluster)
// is reached only under a BackendTLSPolicy, whose certificate check is
// then what authenticates it.
func (w *Waypoint) dialEndpoint(ctx context.Context, t l7.Target) (net.Conn, error) {
	if t.Via.IsValid() {
		// A bound destination of an ingress gateway: through its waypoint,
		// which authorizes the gateway's identity and re-tunnels.
		return w.pool.Dial(ctx, hbone.Target{
			Address:   t.Via,
			Authority: hbone.FormatAuthority(t.Address),
			Source:    w.opts.Identity,
			Cert:      func() (*tls.Certificate, error) { return w.opts.Certificates.Get(ctx, w.opts.Identity) },
			Expected:  []trust.Identity{t.Identity},
		})
	}
	if t.Workload == nil && t.TLS == nil {
		return nil, fmt.Errorf("endpoint %s: unknown workload", t.Address)
	}
	if t.Workload == nil || !t.Workload.GetHbone() {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", t.Address.String())
	}
	if t.Identity.IsZero() {
		return nil, fmt.Errorf("endpoint %s: workload %s has no valid identity", t.Address, t.Workload.GetUid())
	}
	return w.pool.Dial(ctx, hbone.Target{
		Address:   netip.AddrPortFrom(t.Address.Addr(), w.opts.HBONEPort),
		Authority: hbone.FormatAuthority(t.Address),
		Source:    w.opts.Identity,
		Cert:      func() (*tls.Certificate, error) { return w.opts.Certificates.Get(ctx, w.opts.Identity) },
		Expected:  []trust.Identity{t.Identity},
		Baggage:   w.view.Load().baggage,
	})
}

// authorize adapts the policy engine to the L7 engine.
func (w *Waypoint) authorize(ctx context.Context, r *l7.AuthzRequest) l7.Decision {
	d := w.opts.Policy.Decide(ctx, &policy.Request{HTTP: r.Request, Body: r.Body, BodyTruncated: r.BodyTruncated,
		Source: r.Peer, SourceAddr: r.Source, DestAddr: r.Destination, Destination: r.DestinationIdentity})
	out := l7.Decision{Allowed: d.Allowed, Status: d.Status, Headers: d.Headers, ResponseHeadersToAdd: d.ResponseHeadersToAdd,
		RequestHeadersToRemove: d.RequestHeadersToRemove, Reason: d.Reason, ID: d.ID}
	if d.Body != "" {
		out.Body = []byte(d.Body)
	}
	return out
}

// Dump builds the /config_dump document: the destinations, routes,
// certificates and policy the waypoint works with.
func (w *Waypoint) Dump() (*admin.ConfigDump, error) {
	v := w.view.Load()
	d := &admin.ConfigDump{ByAddr: map[string]json.RawMessage{}, ByVIP: map[string]json.RawMessage{},
		Certificates: w.opts.Certificates.Snapshot()}
	if w.opts.Policy != nil {
		d.Policies = w.opts.Policy.Status()
	}
	if g := v.state.IngressGateways[w.opts.Namespace+"/"+w.opts.Name]; g != nil {
		raw, err := protojson.Marshal(meshv1.Redacted(g)) // the keys never leave the process
		if err != nil {
			return nil, err
		}
		d.Listeners = json.RawMessage(raw)
	}
	for ip, wl := range v.byIP {
		raw, err := protojson.Marshal(wl)
		if err != nil {
			return nil, err
		}
		d.ByAddr[ip.String()] = raw
	}
	for ip, svc := range v.byVIP {
		raw, err := protojson.Marshal(svc)
		if err != nil {
			return nil, err
		}
		d.ByVIP[ip.String()] = raw
	}
	var routes []json.RawMessage
	for _, name := range slices.Sorted(maps.Keys(v.state.HTTPRoutes)) {
		raw, err := protojson.Marshal(v.state.HTTPRoutes[name])
		if err != nil {
			return nil, err
		}
		routes = append(routes, raw)
	}
	for _, name := range slices.Sorted(maps.Keys(v.state.GRPCRoutes)) {
		raw, err := protojson.Marshal(v.state.GRPCRoutes[name])
		if err != nil {
			return nil, err
		}
		routes = append(routes, raw)
	}
	d.Routes = routes
	return d, nil
}

func values[M any](m map[string]M) []M {
	out := make([]M, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, m[k])
	}
	return out
}
