// Package xdsserver serves the mesh model (pkg/xds/meshv1) over delta ADS
// to the clients of package xds: the control plane's Server, built on
// go-control-plane's delta server. It is a package of its own so that node
// proxies and waypoints do not link the server, its cache and every Envoy
// resource type go-control-plane registers.
package xdsserver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/delta/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/authn"
	"github.com/causeway-mesh/causeway/pkg/xds"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// Limits on what one client may ask for.
const (
	// maxNamesPerRequest bounds the names in one request (a reconnecting
	// node proxy lists every resource it holds).
	maxNamesPerRequest = 200000
	// maxRequestBytes bounds one request message.
	maxRequestBytes = 16 << 20
	// maxErrorDetail bounds how much of a NACK's message is logged.
	maxErrorDetail = 4096
)

// ServerOptions configure a Server.
type ServerOptions struct {
	// Authenticator establishes the caller of each stream (bearer token or
	// mesh certificate, as for the CA). Required: no stream is served to an
	// unauthenticated caller.
	Authenticator authn.Authenticator
	// TrustedNodeAccounts may subscribe to every resource (node proxies
	// route for every workload on their node). Every other caller reads its
	// own namespace, as istiod ties a proxy to its identity's namespace, and
	// beyond it only what its namespace's routes send traffic to (grants.go).
	TrustedNodeAccounts []trust.Identity
	// Logger (default: none).
	Logger *zap.Logger
	// Registerer receives the server's metrics (default: not registered).
	Registerer prometheus.Registerer
}

// Server serves the mesh resources over delta ADS
// (envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources).
// Clients subscribe per type to everything ("*"), to names, or to
// namespaces ("<ns>/*"). Resource versions are content hashes. A NACK is
// logged with the client's node id and error and changes nothing for anyone
// else. Nothing is answered before the first Update.
type Server struct {
	discovery.UnimplementedAggregatedDiscoveryServiceServer

	cache   *deltaCache
	delta   delta.Server
	auth    authn.Authenticator
	trusted map[trust.Identity]bool
	log     *zap.Logger
	metrics *serverMetrics

	mu      sync.Mutex
	streams map[int64]*streamInfo
}

type streamInfo struct {
	caller authn.Caller
	reader reader
	remote string
	nodeID string
	opened time.Time
	// stamped: a request of the stream carried the reader to the cache.
	stamped bool
	// sync: each type's exchange, by type URL.
	sync map[string]*xds.TypeSync
}

type callerKey struct{}

// NewServer returns a server whose streams end when ctx ends.
func NewServer(ctx context.Context, o ServerOptions) (*Server, error) {
	if o.Authenticator == nil {
		return nil, errors.New("xds server: no authenticator")
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	s := &Server{
		cache:   newDeltaCache(),
		auth:    o.Authenticator,
		trusted: map[trust.Identity]bool{},
		log:     o.Logger.Named("xds"),
		streams: map[int64]*streamInfo{},
	}
	for _, a := range o.TrustedNodeAccounts {
		s.trusted[a] = true
	}
	m, err := newServerMetrics(o.Registerer)
	if err != nil {
		return nil, err
	}
	s.metrics = m
	s.delta = delta.NewServer(ctx, s.cache, s,
		delta.DeactivateLegacyWildcard(), // "*" must be asked for: an empty request subscribes to nothing
		delta.WithLogger(zapAdapter{s.log.Named("server")}))
	return s, nil
}

// Register puts the ADS service on a gRPC server (the control plane's,
// which must use TLS: bearer tokens travel on it).
func (s *Server) Register(r grpc.ServiceRegistrar) {
	discovery.RegisterAggregatedDiscoveryServiceServer(r, s)
}

// Update replaces the served resources (type URL -> resource name ->
// message; a type left out is emptied) and pushes what changed to the
// clients that subscribed to it. A message must not be modified once
// given: one given again (the same pointer) is taken as unchanged and not
// marshalled again.
func (s *Server) Update(res map[string]map[string]proto.Message) error {
	return s.UpdateFrom(res, time.Time{})
}

// UpdateFrom is Update for a configuration that includes changes made
// since changedAt (zero: unknown, measured from now): the push latency
// metric counts from then until every waiting client has its response.
func (s *Server) UpdateFrom(res map[string]map[string]proto.Message, changedAt time.Time) error {
	if changedAt.IsZero() {
		changedAt = time.Now()
	}
	changed, err := s.cache.set(res)
	if err != nil {
		return fmt.Errorf("xds update: %w", err)
	}
	if len(changed) > 0 {
		total := 0
		for _, n := range changed {
			total += n
		}
		s.metrics.updates.Inc()
		s.metrics.changed.Observe(float64(total))
		s.metrics.latency.Observe(time.Since(changedAt).Seconds())
	}
	for t, n := range s.cache.resourceCounts() {
		s.metrics.resources.WithLabelValues(xds.TypeName(t)).Set(float64(n))
	}
	if len(changed) > 0 {
		fields := make([]zap.Field, 0, len(changed))
		for t, n := range changed {
			fields = append(fields, zap.Int(xds.TypeName(t), n))
		}
		s.log.Info("resources changed", fields...)
	}
	return nil
}

// StreamAggregatedResources refuses state-of-the-world ADS.
func (s *Server) StreamAggregatedResources(discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	return status.Error(codes.Unimplemented, "causeway serves delta ADS only (DeltaAggregatedResources)")
}

// DeltaAggregatedResources authenticates the caller, then runs the
// go-control-plane delta stream.
func (s *Server) DeltaAggregatedResources(st discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	ctx := st.Context()
	caller, err := s.auth.Authenticate(ctx)
	if err != nil {
		s.log.Warn("xDS stream refused", zap.String("remote", remoteAddr(ctx)), zap.Error(err))
		return authn.StatusError(err)
	}
	return s.delta.DeltaStreamHandler(&callerStream{
		AggregatedDiscoveryService_DeltaAggregatedResourcesServer: st,
		ctx: context.WithValue(ctx, callerKey{}, caller),
	}, resource.AnyType)
}

type callerStream struct {
	discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer
	ctx context.Context
}

func (c *callerStream) Context() context.Context { return c.ctx }

// OnDeltaStreamOpen implements delta.Callbacks.
func (s *Server) OnDeltaStreamOpen(ctx context.Context, id int64, _ string) error {
	caller, _ := ctx.Value(callerKey{}).(authn.Caller)
	s.mu.Lock()
	s.streams[id] = &streamInfo{caller: caller, remote: remoteAddr(ctx), opened: time.Now(),
		reader: reader{stream: id, trusted: s.trusted[caller.Account], namespace: caller.Account.Namespace(), identity: caller.Account.String()},
		sync:   map[string]*xds.TypeSync{}}
	s.mu.Unlock()
	s.metrics.clients.Inc()
	s.log.Info("xDS client connected", zap.Int64("stream", id), zap.Stringer("caller", caller), zap.String("remote", remoteAddr(ctx)))
	return nil
}

// OnDeltaStreamClosed implements delta.Callbacks.
func (s *Server) OnDeltaStreamClosed(id int64, node *core.Node) {
	s.mu.Lock()
	info := s.streams[id]
	delete(s.streams, id)
	s.mu.Unlock()
	s.cache.forget(id)
	s.metrics.clients.Dec()
	if info != nil {
		s.log.Info("xDS client disconnected", zap.Int64("stream", id), zap.String("node_id", node.GetId()),
			zap.Stringer("caller", info.caller), zap.Duration("connected_for", time.Since(info.opened)))
	}
}

// OnStreamDeltaRequest implements delta.Callbacks: it bounds requests and
// logs NACKs.
func (s *Server) OnStreamDeltaRequest(id int64, req *discovery.DeltaDiscoveryRequest) error {
	if n := len(req.GetResourceNamesSubscribe()) + len(req.GetResourceNamesUnsubscribe()) + len(req.GetInitialResourceVersions()); n > maxNamesPerRequest {
		return status.Errorf(codes.ResourceExhausted, "request names %d resources; at most %d per request", n, maxNamesPerRequest)
	}
	s.mu.Lock()
	info := s.streams[id]
	if info != nil && info.nodeID == "" && req.GetNode().GetId() != "" {
		info.nodeID = req.GetNode().GetId()
	}
	if info != nil && (req.GetNode() != nil || !info.stamped) {
		// The delta server reuses the last node for requests without one,
		// so the stamp reaches every request's watch in the cache.
		stampReader(req, info.reader)
		info.stamped = true
	}
	s.mu.Unlock()
	if info == nil {
		return status.Error(codes.Internal, "unknown stream")
	}
	if err := s.authorize(info.caller, info.nodeID, req); err != nil {
		s.metrics.refusals.Inc()
		s.log.Warn("xDS request refused", zap.Int64("stream", id), zap.Stringer("caller", info.caller),
			zap.String("node_id", info.nodeID), zap.String("type", xds.TypeName(req.GetTypeUrl())), zap.Error(err))
		return status.Error(codes.PermissionDenied, err.Error())
	}
	s.mu.Lock()
	info.answered(req, time.Now())
	s.mu.Unlock()
	if ed := req.GetErrorDetail(); ed != nil {
		s.metrics.nacks.WithLabelValues(xds.TypeName(req.GetTypeUrl())).Inc()
		fields := []zap.Field{
			zap.Int64("stream", id),
			zap.String("type", xds.TypeName(req.GetTypeUrl())),
			zap.String("nonce", req.GetResponseNonce()),
			zap.String("error_detail", truncate(ed.GetMessage(), maxErrorDetail)),
		}
		if info != nil {
			fields = append(fields, zap.String("node_id", info.nodeID), zap.Stringer("caller", info.caller))
		}
		s.log.Warn("xDS client rejected an update (NACK)", fields...)
	}
	return nil
}

// authorize checks a request against its caller: the node id must agree
// with the caller's credential, and only trusted node accounts may
// subscribe to whole collections beyond their own namespace.
func (s *Server) authorize(c authn.Caller, nodeID string, req *discovery.DeltaDiscoveryRequest) error {
	if node, ok := strings.CutPrefix(nodeID, xds.NodeProxyIDPrefix); ok && c.Node != "" && node != c.Node {
		return fmt.Errorf("node id %q names node %s, but the credential is for node %s", nodeID, node, c.Node)
	}
	if ref, ok := strings.CutPrefix(nodeID, xds.WaypointIDPrefix); ok && !strings.HasPrefix(ref, c.Account.Namespace()+"/") {
		return fmt.Errorf("node id %q names a waypoint outside the caller's namespace %s", nodeID, c.Account.Namespace())
	}
	if ref, ok := strings.CutPrefix(nodeID, xds.IngressIDPrefix); ok && !strings.HasPrefix(ref, c.Account.Namespace()+"/") {
		return fmt.Errorf("node id %q names an ingress gateway outside the caller's namespace %s", nodeID, c.Account.Namespace())
	}
	if s.trusted[c.Account] {
		return nil
	}
	// Beyond its namespace a caller may name single resources, which the
	// cache serves only while the namespace's routes send traffic to them
	// (grants.go); whole collections it may not ask for.
	own := c.Account.Namespace()
	for _, name := range req.GetResourceNamesSubscribe() {
		if ns, ok := strings.CutSuffix(name, xds.NamespaceWildcardSuffix); name == xds.Wildcard || ok && ns != own {
			return fmt.Errorf("%s may subscribe only to resources of namespace %s and single resources its routes use, not %q", c.Account, own, name)
		}
	}
	return nil
}

// reader is what the cache needs to know about a stream and its caller.
type reader struct {
	stream    int64  // the delta server's stream id (0: none)
	trusted   bool   // reads everything (node proxies)
	namespace string // otherwise: its namespace, plus the namespace's grants
	identity  string // the caller's identity: it alone reads what it owns
}

// Node metadata keys that carry the reader from the server's request
// callback to the cache. Whatever a client sends under them is overwritten.
const (
	readerStreamKey    = "causeway.reader.stream"
	readerTrustedKey   = "causeway.reader.trusted"
	readerNamespaceKey = "causeway.reader.namespace"
	readerIdentityKey  = "causeway.reader.identity"
)

func stampReader(req *discovery.DeltaDiscoveryRequest, r reader) {
	if req.Node == nil {
		req.Node = &core.Node{}
	}
	if req.Node.Metadata == nil {
		req.Node.Metadata = &structpb.Struct{}
	}
	if req.Node.Metadata.Fields == nil {
		req.Node.Metadata.Fields = map[string]*structpb.Value{}
	}
	req.Node.Metadata.Fields[readerStreamKey] = structpb.NewNumberValue(float64(r.stream))
	req.Node.Metadata.Fields[readerTrustedKey] = structpb.NewBoolValue(r.trusted)
	req.Node.Metadata.Fields[readerNamespaceKey] = structpb.NewStringValue(r.namespace)
	req.Node.Metadata.Fields[readerIdentityKey] = structpb.NewStringValue(r.identity)
}

// readerOf reads the stamp; a request without one reads nothing.
func readerOf(req *discovery.DeltaDiscoveryRequest) reader {
	f := req.GetNode().GetMetadata().GetFields()
	return reader{stream: int64(f[readerStreamKey].GetNumberValue()), trusted: f[readerTrustedKey].GetBoolValue(),
		namespace: f[readerNamespaceKey].GetStringValue(), identity: f[readerIdentityKey].GetStringValue()}
}

// OnStreamDeltaResponse implements delta.Callbacks.
func (s *Server) OnStreamDeltaResponse(id int64, _ *discovery.DeltaDiscoveryRequest, resp *discovery.DeltaDiscoveryResponse) {
	s.mu.Lock()
	if info := s.streams[id]; info != nil {
		info.sent(resp, time.Now())
	}
	s.mu.Unlock()
	s.metrics.pushes.WithLabelValues(xds.TypeName(resp.GetTypeUrl())).Inc()
	s.metrics.pushResources.WithLabelValues(xds.TypeName(resp.GetTypeUrl())).Observe(float64(len(resp.GetResources()) + len(resp.GetRemovedResources())))
	if ce := s.log.Check(zap.DebugLevel, "xDS push"); ce != nil {
		ce.Write(zap.Int64("stream", id), zap.String("type", xds.TypeName(resp.GetTypeUrl())),
			zap.Int("resources", len(resp.GetResources())), zap.Int("removed", len(resp.GetRemovedResources())),
			zap.String("nonce", resp.GetNonce()))
	}
}

// Clients returns the connected clients and, per type each asked for,
// where its exchange stands.
func (s *Server) Clients() []xds.ClientSync {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]xds.ClientSync, 0, len(s.streams))
	for _, i := range s.streams {
		c := xds.ClientSync{NodeID: i.nodeID, Caller: i.caller.String(), Pod: i.caller.Pod, Remote: i.remote, Since: i.opened}
		for _, t := range meshv1.TypeURLs {
			if ts := i.sync[t]; ts != nil {
				c.Types = append(c.Types, snapshot(ts))
			}
		}
		out = append(out, c)
	}
	return out
}

// Version is the configuration version the server holds: the
// system_version_info of the responses it sends now ("0" before the first
// Update).
func (s *Server) Version() string { return s.cache.currentVersion() }

// GRPCServerOptions are the options the xDS server needs from its gRPC
// server: keepalive so that dead clients are noticed, and a policy that
// admits the Client's pings.
func GRPCServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.MaxConcurrentStreams(1000),
		grpc.MaxRecvMsgSize(maxRequestBytes),
	}
}

func remoteAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

type serverMetrics struct {
	clients       prometheus.Gauge
	updates       prometheus.Counter
	changed       prometheus.Histogram
	latency       prometheus.Histogram
	pushes        *prometheus.CounterVec
	pushResources *prometheus.HistogramVec
	nacks         *prometheus.CounterVec
	refusals      prometheus.Counter
	resources     *prometheus.GaugeVec
}

func newServerMetrics(r prometheus.Registerer) (*serverMetrics, error) {
	m := &serverMetrics{
		clients: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "causeway_xds_connected_clients", Help: "xDS streams currently open.",
		}),
		updates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "causeway_xds_updates_total", Help: "Configuration updates that changed served resources (each one pushed to the clients subscribed to what changed).",
		}),
		changed: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "causeway_xds_update_changed_resources", Help: "Resources added, changed or removed by one configuration update.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 9),
		}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "causeway_xds_push_latency_seconds", Help: "From the first configuration change an update includes until its responses are handed to every waiting xDS stream.",
			Buckets: []float64{.005, .01, .025, .05, .1, .15, .2, .3, .5, 1, 2.5, 5, 10},
		}),
		pushes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "causeway_xds_pushes_total", Help: "xDS responses sent, by resource type.",
		}, []string{"type"}),
		pushResources: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "causeway_xds_push_resources", Help: "Resources (updated and removed) in one xDS response, by resource type.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 9),
		}, []string{"type"}),
		nacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "causeway_xds_nacks_total", Help: "xDS responses rejected by clients, by resource type.",
		}, []string{"type"}),
		refusals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "causeway_xds_refused_requests_total", Help: "xDS requests refused: node id or subscriptions beyond what the caller may read.",
		}),
		resources: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "causeway_xds_resources", Help: "Resources served, by type.",
		}, []string{"type"}),
	}
	for _, t := range meshv1.TypeURLs { // every series exists from the start, at zero
		m.pushes.WithLabelValues(xds.TypeName(t))
		m.pushResources.WithLabelValues(xds.TypeName(t))
		m.nacks.WithLabelValues(xds.TypeName(t))
		m.resources.WithLabelValues(xds.TypeName(t))
	}
	if r != nil {
		for _, c := range []prometheus.Collector{m.clients, m.updates, m.changed, m.latency, m.pushes, m.pushResources, m.nacks, m.refusals, m.resources} {
			if err := r.Register(c); err != nil {
				return nil, fmt.Errorf("xds metrics: %w", err)
			}
		}
	}
	return m, nil
}

// zapAdapter lets go-control-plane log through zap.
type zapAdapter struct{ l *zap.Logger }

func (z zapAdapter) Debugf(f string, a ...any) { z.l.Sugar().Debugf(f, a...) }
func (z zapAdapter) Infof(f string, a ...any)  { z.l.Sugar().Debugf(f, a...) } // its info is our debug
func (z zapAdapter) Warnf(f string, a ...any)  { z.l.Sugar().Warnf(f, a...) }
func (z zapAdapter) Errorf(f string, a ...any) { z.l.Sugar().Errorf(f, a...) }
