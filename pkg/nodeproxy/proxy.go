package nodeproxy

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"maps"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/causeway-mesh/causeway/pkg/admin"
	"github.com/causeway-mesh/causeway/pkg/cancelgroup"
	"github.com/causeway-mesh/causeway/pkg/capture"
	"github.com/causeway-mesh/causeway/pkg/connpolicy"
	"github.com/causeway-mesh/causeway/pkg/hbone"
	"github.com/causeway-mesh/causeway/pkg/locality"
	"github.com/causeway-mesh/causeway/pkg/policy"
	"github.com/causeway-mesh/causeway/pkg/telemetry"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/certmanager"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// Certificates is what the proxy needs of the certificate manager.
type Certificates interface {
	Get(ctx context.Context, id trust.Identity) (*tls.Certificate, error)
	Prefetch(id trust.Identity)
	Forget(id trust.Identity)
	Snapshot() []certmanager.CertificateStatus
}

// Options configure a Proxy.
type Options struct {
	Node string
	// Bundle verifies peers (mesh roots).
	Bundle       *trust.Bundle
	Certificates Certificates
	Logger       *zap.Logger
	// AccessLog receives one line per connection (default: Logger).
	AccessLog *zap.Logger
	Registry  prometheus.Registerer
	// HBONEPort is where pods (and this proxy, for its pods) take HBONE.
	HBONEPort uint16
	// AllowPassthrough lets connections to destinations unknown to the mesh,
	// and from sources that are no local workload, go out as plain TCP.
	AllowPassthrough bool
	// AllowPlaintext delivers plaintext from outside the mesh to pods
	// without a waypoint (pods with one always hairpin through it).
	AllowPlaintext bool
	// CertWait bounds how long a connection waits for its source
	// identity's certificate (default 10s).
	CertWait time.Duration
	// ConnectTimeout bounds each upstream connect attempt (default 5s).
	ConnectTimeout time.Duration
	// IdleTimeout closes a relayed connection on which nothing moved either
	// way for this long (default 1h, as Envoy's tcp_proxy; < 0: never).
	IdleTimeout time.Duration
	// PodListeners opens a pod's listeners (HBONE and, in local mode, its
	// serving ports); default net.Listen on the pod IP.
	Listen func(ctx context.Context, addr netip.AddrPort) (net.Listener, error)
	// InPod: pods are served inside their own network namespaces by
	// in-pod capture (package capture/inpod), which opens their listeners
	// as the node agent hands them over; the registry opens none.
	InPod bool
	// Dial opens every upstream TCP connection, from local when it is
	// valid (in-pod mode: a pod's address, dialled inside that pod);
	// default hbone.DialFrom.
	Dial func(ctx context.Context, local netip.Addr, remote netip.AddrPort) (net.Conn, error)
	// Pool options for outbound tunnels (Bundle and Logger are filled in).
	Pool hbone.PoolOptions
	// Server options for inbound tunnels (TLS, Handler and Logger are filled in).
	Server hbone.ServerOptions
	// PolicyDecisionLog receives the connection policies' decisions.
	PolicyDecisionLog *policy.DecisionLogger
}

// Proxy is a node proxy.
type Proxy struct {
	opts    Options
	log     *zap.Logger
	access  *zap.Logger
	metrics *metrics
	pool    *hbone.Pool
	server  *hbone.Server

	reg atomic.Pointer[Registry]

	// policies are the connection policies in force; open follows the
	// inbound connections they admitted, re-checked after every change.
	policies *connpolicy.Enforcer
	open     *connpolicy.Tracker

	// active counts open connections per endpoint for least-connections.
	activeMu sync.Mutex
	active   map[netip.AddrPort]int
	outliers *outliers

	mu         sync.Mutex
	ctx        context.Context // set by Run
	pods       map[netip.Addr]*podListeners
	podErrs    map[netip.Addr]error // pods whose listeners could not open
	identities map[trust.Identity]bool
	// updated is closed, and replaced, by every Update.
	updated chan struct{}
	wg      sync.WaitGroup

	// relays is the context of outbound relays: it ends when the drain
	// does, not when Run is told to stop, so that captured connections
	// in progress keep flowing while the proxy drains.
	relays     *cancelgroup.Context // a burst of relays' registrations does not stay
	stopRelays context.CancelFunc
	outbound   sync.WaitGroup
}

type podListeners struct {
	uid   string
	hbone net.Listener
	plain []net.Listener
}

// New builds a proxy; Run starts it.
func New(o Options) (*Proxy, error) {
	if o.Node == "" || o.Bundle == nil || o.Certificates == nil {
		return nil, errors.New("nodeproxy: Node, Bundle and Certificates are required")
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.AccessLog == nil {
		o.AccessLog = o.Logger.Named("access")
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	if o.HBONEPort == 0 {
		o.HBONEPort = 15008
	}
	if o.CertWait <= 0 {
		o.CertWait = 10 * time.Second
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 5 * time.Second
	}
	if o.IdleTimeout == 0 {
		o.IdleTimeout = time.Hour
	}
	if o.Dial == nil {
		o.Dial = hbone.DialFrom
	}
	if o.Listen == nil {
		o.Listen = func(ctx context.Context, a netip.AddrPort) (net.Listener, error) {
			var lc net.ListenConfig
			return lc.Listen(ctx, "tcp", a.String())
		}
	}
	p := &Proxy{opts: o, log: o.Logger, access: o.AccessLog, metrics: newMetrics(o.Registry),
		active: map[netip.AddrPort]int{}, outliers: newOutliers(), pods: map[netip.Addr]*podListeners{}, podErrs: map[netip.Addr]error{}, identities: map[trust.Identity]bool{},
		updated: make(chan struct{})}
	p.reg.Store(NewRegistry(o.Node, nil, nil, nil))
	p.relays, p.stopRelays = cancelgroup.New()
	enforcer, err := connpolicy.New(connpolicy.Options{Logger: o.Logger, DecisionLog: o.PolicyDecisionLog, Registerer: o.Registry})
	if err != nil {
		return nil, err
	}
	p.policies, p.open = enforcer, connpolicy.NewTracker(o.Logger)

	po := o.Pool
	po.Bundle, po.Logger, po.Dial = o.Bundle, o.Logger.Named("hbone-client"), o.Dial
	pool, err := hbone.NewPool(po)
	if err != nil {
		return nil, err
	}
	p.pool = pool
	so := o.Server
	so.TLS = trust.ServerConfig(o.Bundle, p.serverCertificate, trust.RequireClientCert)
	so.Handler = hbone.HandlerFunc(p.openInbound)
	so.Logger, so.Registerer = o.Logger.Named("hbone-server"), o.Registry
	srv, err := hbone.NewServer(so)
	if err != nil {
		pool.Close()
		return nil, err
	}
	p.server = srv
	return p, nil
}

// Registry is the proxy's current view of the mesh.
func (p *Proxy) Registry() *Registry { return p.reg.Load() }

// Run serves until ctx ends, then drains tunnels for up to drain.
func (p *Proxy) Run(ctx context.Context, drain time.Duration) error {
	p.mu.Lock()
	p.ctx = ctx
	p.mu.Unlock()
	p.Update(p.reg.Load()) // open listeners for what is already known
	p.wg.Go(func() { p.open.Run(ctx) })
	<-ctx.Done()
	p.mu.Lock()
	for ip, pl := range p.pods {
		pl.close()
		delete(p.pods, ip)
	}
	p.mu.Unlock()
	sctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	err := p.server.Shutdown(sctx)
	relaysDone := make(chan struct{})
	go func() {
		p.outbound.Wait()
		close(relaysDone)
	}()
	select {
	case <-relaysDone:
	case <-sctx.Done():
	}
	p.stopRelays()
	<-relaysDone
	p.pool.Close()
	p.wg.Wait()
	return err
}

// Update installs a new view of the mesh: listeners open for new local pods
// and close for departed ones, certificates are prefetched for new local
// identities and forgotten for those with no workload left on the node.
func (p *Proxy) Update(r *Registry) {
	p.reg.Store(r)
	p.open.Request() // what admitted a connection may have changed
	p.mu.Lock()
	defer p.mu.Unlock()
	ids := map[trust.Identity]bool{}
	want := map[netip.Addr]*meshv1.Workload{}
	for _, w := range r.LocalWorkloads() {
		if id, err := trust.ParseIdentity(w.GetIdentity()); err == nil {
			ids[id] = true
		} else {
			p.log.Warn("local workload has an invalid identity", zap.String("workload", w.GetUid()), zap.Error(err))
		}
		for _, a := range w.GetAddresses() {
			if ip, err := netip.ParseAddr(a); err == nil {
				want[ip.Unmap()] = w
			}
		}
	}
	for id := range ids {
		if !p.identities[id] {
			p.opts.Certificates.Prefetch(id)
		}
	}
	for id := range p.identities {
		if !ids[id] {
			p.opts.Certificates.Forget(id)
			p.log.Info("certificate dropped: no workload of its identity is left on this node", zap.Stringer("identity", id))
		}
	}
	p.identities = ids
	close(p.updated)
	p.updated = make(chan struct{})
	if p.ctx == nil || p.opts.InPod {
		return // not running yet (Run opens listeners), or in-pod capture opens them
	}
	for ip, pl := range p.pods {
		if w, ok := want[ip]; !ok || w.GetUid() != pl.uid {
			pl.close()
			delete(p.pods, ip)
		}
	}
	clear(p.podErrs)
	for ip, w := range want {
		if _, ok := p.pods[ip]; ok {
			continue
		}
		pl, err := p.listenPod(ip, w)
		if err != nil {
			// Retried on the next update; readiness reports it meanwhile.
			p.podErrs[ip] = fmt.Errorf("pod %s (%s): %w", w.GetUid(), ip, err)
			p.log.Error("cannot serve pod", zap.String("workload", w.GetUid()), zap.Stringer("ip", ip), zap.Error(err))
			continue
		}
		p.pods[ip] = pl
	}
}

func (pl *podListeners) close() {
	pl.hbone.Close()
	for _, l := range pl.plain {
		l.Close()
	}
}

// listenPod opens the pod's HBONE listener and, when the pod has an app
// address of its own (local mode), plaintext listeners on its serving
// ports. Called with p.mu held.
func (p *Proxy) listenPod(ip netip.Addr, w *meshv1.Workload) (*podListeners, error) {
	hl, err := p.opts.Listen(p.ctx, netip.AddrPortFrom(ip, p.opts.HBONEPort))
	if err != nil {
		return nil, fmt.Errorf("HBONE listener: %w", err)
	}
	pl := &podListeners{uid: w.GetUid(), hbone: hl}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		if err := p.server.Serve(hl); err != nil && !errors.Is(err, hbone.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
			p.log.Error("HBONE listener stopped", zap.Stringer("ip", ip), zap.Error(err))
		}
	}()
	if w.GetAppAddress() == "" {
		return pl, nil
	}
	for _, port := range w.GetServingPorts() {
		l, err := p.opts.Listen(p.ctx, netip.AddrPortFrom(ip, uint16(port)))
		if err != nil {
			pl.close()
			return nil, fmt.Errorf("plaintext listener on port %d: %w", port, err)
		}
		pl.plain = append(pl.plain, l)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.servePlaintext(l)
		}()
	}
	return pl, nil
}

// serverCertificate presents the certificate of the pod whose IP the client dialed.
func (p *Proxy) serverCertificate(local net.Addr) (*tls.Certificate, error) {
	ap, err := netip.ParseAddrPort(local.String())
	if err != nil {
		return nil, err
	}
	w, ok := p.reg.Load().LocalWorkload(ap.Addr())
	if !ok {
		return nil, fmt.Errorf("%s is not a mesh pod on node %s", ap.Addr(), p.opts.Node)
	}
	id, err := trust.ParseIdentity(w.GetIdentity())
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.opts.CertWait)
	defer cancel()
	return p.opts.Certificates.Get(ctx, id)
}

// Ready reports whether every local pod is served and every local
// identity has a usable certificate.
func (p *Proxy) Ready() error {
	p.mu.Lock()
	want := len(p.identities)
	var podErr error
	for _, err := range p.podErrs {
		podErr = err
	}
	p.mu.Unlock()
	if podErr != nil {
		return podErr
	}
	have := 0
	for _, c := range p.opts.Certificates.Snapshot() {
		id, err := trust.ParseIdentity(c.Identity)
		if err != nil {
			continue
		}
		p.mu.Lock()
		local := p.identities[id]
		p.mu.Unlock()
		if !local {
			continue
		}
		if c.State != certmanager.StateAvailable {
			return fmt.Errorf("certificate for %s: %s", c.Identity, c.State)
		}
		have++
	}
	if have < want {
		return fmt.Errorf("%d of %d local identities have certificates", have, want)
	}
	return nil
}

// maxDumpConnections bounds the connections /config_dump lists.
const maxDumpConnections = 10000

// Dump builds the /config_dump document (docs/design.md §8).
func (p *Proxy) Dump() (*admin.ConfigDump, error) {
	r := p.reg.Load()
	d := &admin.ConfigDump{ByAddr: map[string]json.RawMessage{}, ByVIP: map[string]json.RawMessage{},
		Certificates: p.opts.Certificates.Snapshot(), Connections: p.open.Describe(maxDumpConnections)}
	if err := dumpBy(d.ByAddr, maps.Values(r.AllWorkloads()), (*meshv1.Workload).GetAddresses); err != nil {
		return nil, err
	}
	if err := dumpBy(d.ByVIP, slices.Values(r.Services()), (*meshv1.Service).GetVips); err != nil {
		return nil, err
	}
	d.Waypoints = map[string]json.RawMessage{}
	if err := dumpBy(d.Waypoints, maps.Values(r.waypoints), func(wp *meshv1.Waypoint) []string {
		return []string{wp.GetNamespace() + "/" + wp.GetName()}
	}); err != nil {
		return nil, err
	}
	return d, nil
}

// dumpBy puts each of ms, as JSON, into the dump under each of its
// addresses.
func dumpBy[M proto.Message](into map[string]json.RawMessage, ms iter.Seq[M], addrs func(M) []string) error {
	for m := range ms {
		raw, err := protojson.Marshal(m)
		if err != nil {
			return err
		}
		for _, a := range addrs(m) {
			into[a] = raw
		}
	}
	return nil
}

// --- outbound ---

// HandleOutbound carries one captured connection (capture.Handler). ctx
// bounds the connect; the relay afterwards lasts until the drain ends. It
// returns once the relay is started: an idle relay holds no goroutine of
// the caller's.
func (p *Proxy) HandleOutbound(ctx context.Context, c capture.Conn) {
	p.outbound.Add(1)
	if !p.openOutbound(ctx, c) {
		p.outbound.Done()
	}
}

// openOutbound connects a captured connection and starts its relay, which
// ends p.outbound's count; it reports false (having closed c and logged
// why) when the connection is refused or the upstream cannot be reached.
func (p *Proxy) openOutbound(ctx context.Context, c capture.Conn) bool {
	start := time.Now()
	r := p.reg.Load()
	dst := c.Destination()
	rec := newConnRecord(telemetry.ReporterSource, c.Source(), dst)
	src, ok := r.LocalWorkload(c.Source().Addr())
	if pc, inPod := c.(podConn); inPod {
		// The pod is known by its namespace, not by the address it used.
		r, src, ok = p.podWorkload(ctx, c.Source().Addr(), pc.PodUID())
		if !ok {
			c.Answer(capture.Refused)
			c.Close()
			p.finish(&rec, start, 0, 0, fmt.Errorf("pod %s has no mesh workload with address %s on node %s", pc.PodUID(), c.Source().Addr(), p.opts.Node))
			return false
		}
	}
	if ok {
		// The node proxy's own pod: known by its address on this node, or
		// by the network namespace it was captured in.
		rec.srcWorkload, rec.srcIdentity = src.GetUid(), src.GetIdentity()
		rec.std.Source = telemetry.Of(src)
	} else if !p.opts.AllowPassthrough {
		c.Answer(capture.Refused)
		c.Close()
		p.finish(&rec, start, 0, 0, fmt.Errorf("source %s is not a mesh workload on node %s", c.Source().Addr(), p.opts.Node))
		return false
	}
	from := locality.Of(src)
	if from.Node == "" {
		from.Node = p.opts.Node // a source outside the mesh is still on this node
	}
	plan, err := r.planOutbound(dst, from, p.opts.HBONEPort, p.opts.AllowPassthrough)
	if src != nil {
		if rerr := refusedWorkload(src); rerr != nil {
			err = rerr
		}
	}
	if err == nil && src == nil && planNeedsIdentity(plan) {
		err = fmt.Errorf("%w: source %s is not a mesh workload and %s is in the mesh", errRefused, c.Source().Addr(), dst)
	}
	if err != nil {
		switch {
		case errors.Is(err, errHostUnknown):
			c.Answer(capture.HostUnknown)
		case errors.Is(err, errRefused):
			c.Answer(capture.Refused)
		default:
			c.Answer(capture.Unreachable)
		}
		c.Close()
		p.finish(&rec, start, 0, 0, err)
		return false
	}
	rec.describePlan(plan)
	upstream, hop, err := p.connect(ctx, src, plan, c.Source())
	if err != nil {
		c.Answer(capture.Unreachable)
		c.Close()
		p.finish(&rec, start, 0, 0, err)
		return false
	}
	rec.describeHop(hop)
	if hop.Kind == ViaWaypoint || hop.Kind == Direct {
		rec.std.SecurityPolicy = telemetry.MutualTLS
	}
	if err := c.Answer(capture.Connected); err != nil {
		p.release(hop.Address)
		upstream.Close()
		c.Close()
		p.finish(&rec, start, 0, 0, fmt.Errorf("answer client: %w", err))
		return false
	}
	p.opened(&rec)
	relay := hbone.Relay(p.relays, c.NetConn(), upstream, p.idleTimeout(), func(sent, received int64, err error) {
		p.release(rec.hop)
		p.finish(&rec, start, sent, received, err)
		p.outbound.Done()
	})
	p.metrics.std.Bytes.Follow(rec.bytes, relay)
	return true
}

// podConn is a connection captured inside a pod's own network namespace.
type podConn interface{ PodUID() string }

// podWorkload finds the local workload with address ip and the given uid,
// waiting up to CertWait for a registry that knows it: a pod can be handed
// over, and connect, before the control plane has described it.
func (p *Proxy) podWorkload(ctx context.Context, ip netip.Addr, uid string) (*Registry, *meshv1.Workload, bool) {
	ctx, cancel := context.WithTimeout(ctx, p.opts.CertWait)
	defer cancel()
	for {
		p.mu.Lock()
		updated := p.updated
		p.mu.Unlock()
		r := p.reg.Load()
		if w, ok := r.LocalWorkload(ip); ok {
			return r, w, w.GetUid() == uid
		}
		select {
		case <-updated:
		case <-ctx.Done():
			return r, nil, false
		}
	}
}

func planNeedsIdentity(plan Plan) bool {
	for _, h := range plan.Hops {
		if h.Kind == ViaWaypoint || h.Kind == Direct {
			return true
		}
	}
	return false
}

// connect tries the plan's hops in balancer order until one connects.
func (p *Proxy) connect(ctx context.Context, src *meshv1.Workload, plan Plan, from netip.AddrPort) (net.Conn, Hop, error) {
	var errs []error
	for _, hop := range p.order(plan.Hops) {
		conn, err := p.dialHop(ctx, src, hop, from)
		if err == nil {
			p.outliers.succeeded(hop.Address)
			return conn, hop, nil
		}
		p.release(hop.Address)
		if dialFailed(err) && ctx.Err() == nil {
			if d, fresh := p.outliers.failed(hop.Address); fresh {
				p.log.Info("hop unreachable: tried last for a while", zap.Stringer("hop", hop.Address), zap.Duration("for", d), zap.Error(err))
			}
		}
		errs = append(errs, fmt.Errorf("%s %s: %w", hop.Kind, hop.Address, err))
		if ctx.Err() != nil {
			break
		}
	}
	if plan.Waypoint != nil {
		return nil, Hop{}, fmt.Errorf("waypoint %s/%s unreachable, failing closed: %w", plan.Waypoint.GetNamespace(), plan.Waypoint.GetName(), errors.Join(errs...))
	}
	return nil, Hop{}, errors.Join(errs...)
}

// order puts the hops in the order to try: those not ejected, closest tier
// first (Hop.Tier), the less loaded of two random choices of the closest
// tier leading (power of two choices, least connections), the rest of each
// tier in random order; then the ejected ones, by tier. So a connection
// leaves its tier only when no hop of it is left or none answers. It
// counts the connection on each hop as it is tried.
func (p *Proxy) order(hops []Hop) []Hop {
	out := append([]Hop(nil), hops...)
	rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	slices.SortStableFunc(out, func(a, b Hop) int { return a.Tier - b.Tier })
	healthy := make([]Hop, 0, len(out))
	var ejected []Hop
	for _, h := range out {
		if p.outliers.ejected(h.Address) {
			ejected = append(ejected, h)
		} else {
			healthy = append(healthy, h)
		}
	}
	p.activeMu.Lock()
	defer p.activeMu.Unlock()
	if len(healthy) > 1 && healthy[1].Tier == healthy[0].Tier && p.active[healthy[1].Address] < p.active[healthy[0].Address] {
		healthy[0], healthy[1] = healthy[1], healthy[0]
	}
	return append(healthy, ejected...)
}

func (p *Proxy) acquire(to netip.AddrPort) {
	p.activeMu.Lock()
	p.active[to]++
	p.activeMu.Unlock()
}

// release ends what acquire counted for a hop's address (its Address); a
// relay keeps the address alone, not the whole hop.
func (p *Proxy) release(to netip.AddrPort) {
	if !to.IsValid() {
		return
	}
	p.activeMu.Lock()
	if p.active[to]--; p.active[to] <= 0 {
		delete(p.active, to)
	}
	p.activeMu.Unlock()
}

// dialHop opens one upstream connection: an HBONE tunnel with the source
// workload's certificate, or plain TCP.
func (p *Proxy) dialHop(ctx context.Context, src *meshv1.Workload, hop Hop, from netip.AddrPort) (net.Conn, error) {
	p.acquire(hop.Address)
	cctx, cancel := context.WithTimeout(ctx, p.opts.ConnectTimeout)
	defer cancel()
	if hop.Kind == PlainTCP || hop.Kind == Passthrough {
		return p.opts.Dial(cctx, p.podSource(from.Addr()), hop.Address)
	}
	id, err := trust.ParseIdentity(src.GetIdentity())
	if err != nil {
		return nil, fmt.Errorf("source identity: %w", err)
	}
	// The certificate may still be on its way: wait for it (the manager
	// raises its priority) up to CertWait.
	wctx, wcancel := context.WithTimeout(ctx, p.opts.CertWait)
	cert, err := p.opts.Certificates.Get(wctx, id)
	wcancel()
	if err != nil {
		return nil, fmt.Errorf("no certificate for %s: %w", id, err)
	}
	return p.pool.Dial(cctx, hbone.Target{
		Address:   hop.Address,
		Authority: hbone.FormatAuthority(hop.Authority),
		Source:    id,
		Cert:      func() (*tls.Certificate, error) { return cert, nil },
		Expected:  []trust.Identity{hop.Expected},
		Forwarded: from,
		// From the pod's own IP, so the next hop (a waypoint's policy, the
		// destination's access log) sees where the traffic comes from.
		LocalAddr: from.Addr().Unmap(),
		// The source's names, for a next hop that cannot read its
		// workload (a waypoint of another namespace): it believes them
		// only within the namespace of the identity this tunnel proves.
		Baggage: telemetry.Baggage(src),
	})
}

// --- inbound ---

// openInbound admits an HBONE tunnel to a local pod and connects to its app.
func (p *Proxy) openInbound(ctx context.Context, req *hbone.Request) (hbone.Stream, error) {
	start := time.Now()
	rec := newConnRecord(telemetry.ReporterDestination, req.Remote, capture.Destination{Addr: req.Authority})
	rec.srcIdentity = req.Peer.String()
	reg := p.reg.Load()
	// The caller is who the tunnel authenticated; the workload at its
	// address names it only when it holds that identity.
	caller, _ := reg.WorkloadByIP(req.Remote.Addr())
	var err error
	rec.std.Source, err = telemetry.Caller(req.Peer, caller, req.Baggage)
	if be := (*telemetry.BaggageError)(nil); errors.As(err, &be) {
		p.metrics.baggage.WithLabelValues(be.Reason).Inc()
		p.log.Debug("connect baggage ignored", zap.Stringer("src", req.Remote), zap.Stringer("src_identity", req.Peer), zap.Error(err))
	}
	rec.std.SecurityPolicy = telemetry.SecurityPolicy(req.Peer)
	if !req.Authority.IsValid() {
		err = hbone.BadRequest("authority must be ip:port")
		p.finish(&rec, start, 0, 0, err)
		return nil, err
	}
	conn := &inboundConn{local: req.Local.Addr(), authority: req.Authority, peer: req.Peer, remote: req.Remote}
	adm, verdict, err := p.admit(ctx, conn, false)
	if err == nil && !verdict.Allowed {
		err = errors.New(verdict.Reason)
	}
	if err != nil {
		err = hbone.Deny(err.Error())
		p.finish(&rec, start, 0, 0, err)
		return nil, err
	}
	rec.dstWorkload, rec.dstIdentity = adm.Workload.GetUid(), adm.Workload.GetIdentity()
	rec.describeDestination(reg, adm.Workload, req.Authority.Port())
	if adm.FromWaypoint && req.Forwarded.IsValid() {
		// Only the destination's own authenticated waypoint may say who
		// the original client was; it is for logs and metrics only.
		rec.src, rec.via = req.Forwarded, req.Peer.String()
	}
	to, err := deliveryAddress(adm.Workload, req.Authority.Addr(), req.Authority.Port())
	if err != nil {
		err = hbone.Unavailable(err.Error())
		p.finish(&rec, start, 0, 0, err)
		return nil, err
	}
	// ctx is the stream's: registering with it (not asking for its done
	// channel) leaves the open tunnel nothing of the connect to keep.
	cctx, cancel := cancelgroup.WithTimeout(ctx, p.opts.ConnectTimeout)
	defer cancel()
	upstream, err := p.opts.Dial(cctx, p.podSource(req.Local.Addr()), to)
	if err != nil {
		err = hbone.Unavailable(fmt.Sprintf("connect %s: %v", to, err))
		p.finish(&rec, start, 0, 0, err)
		return nil, err
	}
	p.opened(&rec)
	// Tracked before the relay starts (which is after this returns): a
	// re-check that denies it aborts the relay, resetting the tunnel and
	// the upstream connection.
	var tracked *connpolicy.Open
	var untrack func()
	relay := hbone.RelayTo(upstream, p.idleTimeout(), func(sent, received int64, err error) {
		untrack()
		p.finish(&rec, start, sent, received, tracked.Result(err))
	})
	tracked, untrack = p.track(ctx, conn, func() { relay.Abort(connpolicy.ErrRevoked) })
	p.metrics.std.Bytes.Follow(rec.bytes, relay)
	return relay, nil
}

// servePlaintext takes connections from outside the mesh on a pod's serving
// port (local mode's stand-in for in-pod port 15006).
func (p *Proxy) servePlaintext(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				p.log.Error("plaintext listener stopped", zap.Stringer("addr", l.Addr()), zap.Error(err))
			}
			return
		}
		p.mu.Lock()
		ctx := p.ctx
		p.mu.Unlock()
		dst, _ := netip.ParseAddrPort(c.LocalAddr().String())
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.HandleInbound(ctx, c, dst)
		}()
	}
}

// HandleInbound carries plaintext from outside the mesh to dst, a local
// pod's address (capture.InboundHandler).
func (p *Proxy) HandleInbound(ctx context.Context, c net.Conn, dst netip.AddrPort) {
	start := time.Now()
	src, _ := netip.ParseAddrPort(c.RemoteAddr().String())
	rec := newConnRecord(telemetry.ReporterDestination, src, capture.Destination{Addr: dst})
	dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
	reg := p.reg.Load()
	w, hop, err := reg.planPlaintextInbound(dst, p.opts.AllowPlaintext)
	conn := &inboundConn{local: dst.Addr(), authority: dst, peer: trust.Unauthenticated(), remote: src, plaintext: true}
	if err == nil && hop == nil {
		// Delivered directly: the policies see a caller without identity.
		// A hairpin is checked by the waypoint (its connection policies
		// see no identity either), then here as it comes back from it.
		if _, v, aerr := p.admit(ctx, conn, false); aerr != nil {
			err = aerr
		} else if !v.Allowed {
			err = errors.New(v.Reason)
		}
	}
	if err != nil {
		abort(c)
		p.finish(&rec, start, 0, 0, err)
		return
	}
	rec.dstWorkload, rec.dstIdentity = w.GetUid(), w.GetIdentity()
	rec.describeDestination(reg, w, dst.Port())
	var upstream net.Conn
	cctx, cancel := context.WithTimeout(ctx, p.opts.ConnectTimeout)
	if hop != nil {
		// Hairpin: the proxy cannot vouch for this caller, so the tunnel to
		// the waypoint is TLS-only and carries no identity. The standard
		// metrics report the local destination, not the hop.
		rec.describeHop(*hop)
		rec.std.Destination = telemetry.Of(w)
		upstream, err = p.pool.Dial(cctx, hbone.Target{
			Address: hop.Address, Authority: hbone.FormatAuthority(hop.Authority),
			Expected: []trust.Identity{hop.Expected}, Forwarded: src,
		})
		if err != nil {
			err = fmt.Errorf("waypoint unreachable, failing closed: %w", err)
		}
	} else {
		var to netip.AddrPort
		if to, err = deliveryAddress(w, dst.Addr(), dst.Port()); err == nil {
			upstream, err = p.opts.Dial(cctx, p.podSource(dst.Addr()), to)
		}
	}
	cancel()
	if err != nil {
		abort(c)
		p.finish(&rec, start, 0, 0, err)
		return
	}
	p.opened(&rec)
	if hop != nil {
		sent, received, err := p.join(ctx, c, upstream)
		p.finish(&rec, start, sent, received, err)
		return
	}
	tracked, untrack := p.track(ctx, conn, func() { abort(upstream); abort(c) })
	sent, received, err := p.join(ctx, c, upstream)
	untrack()
	p.finish(&rec, start, sent, received, tracked.Result(err))
}

// ServeHBONE serves inbound HBONE on ln (a listener in-pod capture opened
// inside a pod) until ln is closed.
func (p *Proxy) ServeHBONE(ln net.Listener) error { return p.server.Serve(ln) }

// DrainInbound stops taking HBONE tunnels (inpod.Proxy): the listeners
// close and every connection gets a GOAWAY, so that its peer opens new
// tunnels elsewhere (in-pod: at the pods' new node proxy, listening beside
// this one) while those in flight finish. It returns once they have, or
// when ctx ends, having then closed what was left.
func (p *Proxy) DrainInbound(ctx context.Context) { _ = p.server.Shutdown(ctx) }

// WaitOutbound waits until every outbound relay has ended, or ctx ends
// (inpod.Proxy). Call it once no outbound connection can arrive any more
// (the capturing listeners closed and their handlers returned).
func (p *Proxy) WaitOutbound(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		p.outbound.Wait() // ends at the latest when Run stops the relays
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// PodGone closes the pooled tunnels dialled from a departed pod's
// addresses (in-pod mode: from inside its namespace).
func (p *Proxy) PodGone(ips []netip.Addr) {
	for _, ip := range ips {
		p.pool.CloseFrom(ip)
	}
}

// podSource is the local address for a connection made on behalf of the
// pod at ip: the pod's own address in in-pod mode (dialled inside the pod),
// none otherwise.
func (p *Proxy) podSource(ip netip.Addr) netip.Addr {
	if p.opts.InPod {
		return ip.Unmap()
	}
	return netip.Addr{}
}

// join relays between a and b until both are done, cutting idle pairs.
func (p *Proxy) join(ctx context.Context, a, b net.Conn) (int64, int64, error) {
	return hbone.JoinIdle(ctx, a, b, p.idleTimeout())
}

// idleTimeout is how long a relayed pair may stay idle (0: forever).
func (p *Proxy) idleTimeout() time.Duration { return max(p.opts.IdleTimeout, 0) }

func abort(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// --- access log ---

// connRecord is what the access log and metrics say about one connection.
// A relayed connection keeps it until it ends, so it holds values, not
// the strings the log line is made of (issue 36: memory per idle
// connection).
type connRecord struct {
	src netip.AddrPort
	dst capture.Destination
	// hop is the next hop taken (outbound, or a hairpin), of kind hopKind
	// when hasHop.
	hop                      netip.AddrPort
	via                      string // waypoint that forwarded it (inbound)
	srcWorkload, srcIdentity string
	dstWorkload, dstIdentity string
	service, waypoint        string
	inbound, hasHop          bool
	hopKind                  HopKind
	// std is what Istio's standard metrics say of it; opened: they counted
	// it opened (refused and failed connections they do not count), and
	// bytes counts its bytes as they flow.
	std    telemetry.Connection
	opened bool
	bytes  *telemetry.OpenBytes
}

// newConnRecord starts the record of a connection the node proxy reports
// as reporter (telemetry.ReporterSource or ReporterDestination), with src
// its source address, nothing known of either side yet.
func newConnRecord(reporter string, src netip.AddrPort, dst capture.Destination) connRecord {
	return connRecord{src: src, dst: dst, srcIdentity: "unauthenticated", inbound: reporter == telemetry.ReporterDestination,
		std: telemetry.Connection{Reporter: reporter, Source: telemetry.UnknownPeer, Destination: telemetry.UnknownPeer,
			Service: telemetry.UnknownService, Protocol: "tcp", SecurityPolicy: telemetry.None}}
}

func (r *connRecord) describePlan(p Plan) {
	if p.Service != nil {
		r.service = p.Service.GetNamespace() + "/" + p.Service.GetName()
		r.std.Service = telemetry.ServiceOf(p.Service)
	}
	if p.Waypoint != nil {
		r.waypoint = p.Waypoint.GetNamespace() + "/" + p.Waypoint.GetName()
	}
}

func (r *connRecord) describeHop(h Hop) {
	r.hop, r.hopKind, r.hasHop = h.Address, h.Kind, true
	if h.Workload != nil {
		r.dstWorkload, r.dstIdentity = h.Workload.GetUid(), h.Workload.GetIdentity()
		r.std.Destination = telemetry.Of(h.Workload)
	} else if !h.Expected.IsZero() {
		r.dstIdentity = h.Expected.String()
		r.std.Destination.Principal = r.dstIdentity
	}
}

// describeDestination notes w, a local workload, as the destination, and
// the service its port tells.
func (r *connRecord) describeDestination(reg *Registry, w *meshv1.Workload, port uint16) {
	r.std.Destination = telemetry.Of(w)
	if s := reg.InboundService(w.GetUid(), port); s != nil {
		r.std.Service = telemetry.ServiceOf(s)
	}
}

// opened counts r's connection opened.
func (p *Proxy) opened(r *connRecord) {
	p.metrics.opened.WithLabelValues(r.labels()...).Inc()
	std := r.std.Values(make([]string, 0, len(telemetry.Labels)))
	p.metrics.std.Opened.WithLabelValues(std...).Inc()
	r.opened, r.bytes = true, p.metrics.std.Bytes.Open(std)
}

func (r *connRecord) direction() string {
	if r.inbound {
		return "inbound"
	}
	return "outbound"
}

func (r *connRecord) labels() []string {
	return []string{r.direction(), orUnknown(r.srcIdentity), orUnknown(r.dstIdentity), orUnknown(r.service)}
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// finish writes the access log line and the close metrics of a
// connection that carried sent and received bytes.
func (p *Proxy) finish(r *connRecord, start time.Time, sent, received int64, err error) {
	reason := "ok"
	if err != nil {
		reason = err.Error()
	}
	hop := ""
	if r.hasHop {
		hop = r.hopKind.String() + " " + r.hop.String()
	}
	labels := r.labels()
	p.metrics.closed.WithLabelValues(append(labels, closeReason(err))...).Inc()
	p.metrics.sent.WithLabelValues(labels...).Add(float64(sent))
	p.metrics.received.WithLabelValues(labels...).Add(float64(received))
	if r.opened {
		std := r.std.Values(make([]string, 0, len(telemetry.Labels)))
		p.metrics.std.Closed.WithLabelValues(std...).Inc()
		// Istio's received bytes are the request's: what went toward the
		// destination.
		p.metrics.std.Bytes.Close(r.bytes, sent, received)
	}
	fields := []zap.Field{
		zap.String("direction", r.direction()), zap.String("src", r.src.String()), zap.String("src_workload", r.srcWorkload),
		zap.String("src_identity", r.srcIdentity), zap.String("dst", r.dst.String()), zap.String("dst_workload", r.dstWorkload),
		zap.String("dst_identity", r.dstIdentity), zap.String("service", r.service), zap.String("waypoint", r.waypoint),
		zap.String("hop", hop), zap.Int64("bytes_sent", sent), zap.Int64("bytes_received", received),
		zap.Duration("duration", time.Since(start)), zap.String("result", reason),
	}
	if r.via != "" {
		fields = append(fields, zap.String("via", r.via))
	}
	p.access.Info("connection", fields...)
}

// closeReason is a low-cardinality metric label for how a connection ended.
func closeReason(err error) string {
	var se *hbone.StatusError
	var te *trust.CertificateTimeError
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &te):
		return te.Reason() // a peer's or our own certificate, by our clock
	case errors.As(err, &se):
		return "status_" + strconv.Itoa(se.Code)
	case errors.Is(err, errRefused), errors.Is(err, errHostUnknown):
		return "refused"
	case errors.Is(err, connpolicy.ErrRevoked):
		return "policy_revoked"
	default:
		return "error"
	}
}
