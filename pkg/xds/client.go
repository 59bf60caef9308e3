package xds

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"go.uber.org/zap"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/proto"

	"github.com/causeway-mesh/causeway/pkg/reconnect"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/caclient"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// Subscription says which resources of one type a client wants. No names
// means every resource of the type (wildcard); otherwise exact resource
// names and namespaces ("<ns>/*").
type Subscription struct {
	TypeURL string
	Names   []string
}

// NodeProxySubscriptions is what a node proxy follows: every workload,
// service and waypoint (it resolves any destination address).
func NodeProxySubscriptions() []Subscription {
	return []Subscription{
		{TypeURL: meshv1.WorkloadTypeURL}, {TypeURL: meshv1.ServiceTypeURL}, {TypeURL: meshv1.WaypointTypeURL},
	}
}

// Node id prefixes: the control plane checks an id of these forms against
// the caller's credential (the node a token names, the namespace of the
// account).
const (
	NodeProxyIDPrefix = "nodeproxy~"
	WaypointIDPrefix  = "waypoint~"
	IngressIDPrefix   = "ingress~"
)

// NodeProxyID is the node id of the node proxy of node.
func NodeProxyID(node string) string { return NodeProxyIDPrefix + node }

// WaypointID is the node id of the waypoint namespace/name.
func WaypointID(namespace, name string) string { return WaypointIDPrefix + namespace + "/" + name }

// WaypointSubscriptions is what the waypoint namespace/name follows: the
// services, routes and workloads (endpoint identities) of its namespace,
// the consumer routes of other namespaces attached to its Services, and
// its own Waypoint resource and the connection policies of its namespace
// (those naming it authorize its tunnels). Backends of its routes in other namespaces are
// added by RouteBackends as the routes name them.
func WaypointSubscriptions(namespace, name string) []Subscription {
	ns := namespace + NamespaceWildcardSuffix
	return []Subscription{
		{TypeURL: meshv1.WorkloadTypeURL, Names: []string{ns}},
		{TypeURL: meshv1.ServiceTypeURL, Names: []string{ns}},
		{TypeURL: meshv1.WaypointTypeURL, Names: []string{namespace + "/" + name}},
		{TypeURL: meshv1.HTTPRouteTypeURL, Names: []string{ns}},
		{TypeURL: meshv1.GRPCRouteTypeURL, Names: []string{ns}},
		{TypeURL: meshv1.ConnectionPolicyTypeURL, Names: []string{ns}},
	}
}

// IngressID is the node id of ingress gateway namespace/name.
func IngressID(namespace, name string) string { return IngressIDPrefix + namespace + "/" + name }

// IngressSubscriptions are what ingress gateway namespace/name reads: its
// own IngressGateway (its listeners, routes and TLS keys: served to its
// identity alone), and its namespace's Services, Workloads and Waypoints;
// what its routes reach elsewhere follows (NewIngressBackends).
func IngressSubscriptions(namespace, name string) []Subscription {
	ns := namespace + NamespaceWildcardSuffix
	return []Subscription{
		{TypeURL: meshv1.WorkloadTypeURL, Names: []string{ns}},
		{TypeURL: meshv1.ServiceTypeURL, Names: []string{ns}},
		{TypeURL: meshv1.WaypointTypeURL, Names: []string{ns}},
		{TypeURL: meshv1.IngressGatewayTypeURL, Names: []string{namespace + "/" + name}},
	}
}

// ClientOptions configure a Client.
type ClientOptions struct {
	// Address of the control plane, host:port (its 15012).
	Address string
	// Bundle holds the roots the control plane's certificate must chain to.
	Bundle *trust.Bundle
	// ServerIdentity is the identity the control plane must present
	// (default: spiffe://<bundle's trust domain>/ns/causeway-system/sa/controlplane).
	ServerIdentity trust.Identity
	// Token, if set, is sent as "authorization: Bearer <token>" on the stream.
	Token caclient.TokenSource
	// ClientCertificate, if set, is presented as a mesh client certificate.
	ClientCertificate func() (*tls.Certificate, error)
	// NodeID identifies this client in the control plane's logs (NACKs).
	NodeID string
	// Subscriptions made at start; Ready waits for the first complete sync
	// of each. At least one.
	Subscriptions []Subscription
	// OnChange, if set, is called after accepted updates with the new state
	// and the types that changed, and once more when the first sync
	// completes (the state then Synced; its type is named even if nothing
	// of it changed). Calls are serial and come from a goroutine of Run;
	// several updates may be folded into one call. It may call Subscribe
	// and Unsubscribe.
	OnChange func(s *State, changedTypes []string)
	// Logger (default: none).
	Logger *zap.Logger
	// Reconnection backoff: waits doubling from InitialBackoff (default
	// 100ms) up to MaxBackoff (default 15s), each drawn in [b/2, b]; it
	// starts over once a stream stayed up for MaxBackoff (a control plane
	// that fails streams right after accepting them is not retried in a
	// tight loop).
	InitialBackoff, MaxBackoff time.Duration
	// DialOptions are added to the gRPC connection's options.
	DialOptions []grpc.DialOption
}

// The reconnection backoff's defaults.
const (
	DefaultInitialBackoff = 100 * time.Millisecond
	DefaultMaxBackoff     = 15 * time.Second
)

// maxResponseBytes bounds one xDS response (a full wildcard sync of a large mesh).
const maxResponseBytes = 64 << 20

// Client subscribes to mesh resources over delta ADS and keeps the latest
// accepted State. It reconnects with backoff and keeps serving its last
// state while the control plane is away; on reconnection it tells the
// server which versions it holds, so only differences travel. A response
// whose resources do not decode or validate is rejected as a whole (NACK)
// and the state stays as it was.
type Client struct {
	opts ClientOptions
	conn *reconnect.Conn
	log  *zap.Logger

	state     atomic.Pointer[State]
	connected atomic.Bool

	subMu  sync.Mutex
	subs   map[string]*subState
	stream *clientStream // the open stream, nil between connections
	synced map[string]bool

	readyOnce sync.Once
	readyCh   chan struct{}

	changeMu sync.Mutex
	changed  map[string]bool
	changeCh chan struct{}

	running atomic.Bool
}

type subState struct {
	wildcard bool
	names    map[string]bool
	initial  bool // part of the first-sync readiness condition
}

type clientStream struct {
	mu sync.Mutex
	st discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
}

func (s *clientStream) send(req *discovery.DeltaDiscoveryRequest) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st.Send(req)
}

// NewClient checks the options and prepares the connection (it connects in Run).
func NewClient(o ClientOptions) (*Client, error) {
	if o.Address == "" {
		return nil, errors.New("xds client: no control plane address")
	}
	if o.Bundle == nil {
		return nil, errors.New("xds client: no trust bundle to verify the control plane with")
	}
	if o.ServerIdentity.IsZero() {
		id, err := trust.ControlPlaneIdentity(o.Bundle.TrustDomain().Name())
		if err != nil {
			return nil, fmt.Errorf("xds client: %w", err)
		}
		o.ServerIdentity = id
	}
	if len(o.Subscriptions) == 0 {
		return nil, errors.New("xds client: no subscriptions")
	}
	if o.InitialBackoff <= 0 {
		o.InitialBackoff = DefaultInitialBackoff
	}
	if o.MaxBackoff < o.InitialBackoff {
		o.MaxBackoff = max(DefaultMaxBackoff, o.InitialBackoff)
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	c := &Client{
		opts:     o,
		log:      o.Logger.Named("xds-client").With(zap.String("control_plane", o.Address)),
		subs:     map[string]*subState{},
		synced:   map[string]bool{},
		readyCh:  make(chan struct{}),
		changed:  map[string]bool{},
		changeCh: make(chan struct{}, 1),
	}
	c.state.Store(emptyState())
	for _, s := range o.Subscriptions {
		if _, err := meshv1.NewResource(s.TypeURL); err != nil {
			return nil, fmt.Errorf("xds client: %w", err)
		}
		if _, dup := c.subs[s.TypeURL]; dup {
			return nil, fmt.Errorf("xds client: type %s subscribed twice", s.TypeURL)
		}
		ss := &subState{names: map[string]bool{}, initial: true}
		ss.add(s.Names)
		if len(s.Names) == 0 {
			ss.wildcard = true
		}
		c.subs[s.TypeURL] = ss
	}
	tlsConf := trust.ClientConfig(o.Bundle, o.ClientCertificate, []trust.Identity{o.ServerIdentity})
	dial := []grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(tlsConf)),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxResponseBytes)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
	}
	if o.Token != nil {
		dial = append(dial, grpc.WithPerRPCCredentials(bearerToken(o.Token)))
	}
	dial = append(dial, o.DialOptions...)
	conn, err := reconnect.NewConn(o.Address, dial...)
	if err != nil {
		return nil, fmt.Errorf("xds client for %s: %w", o.Address, err)
	}
	c.conn = conn
	return c, nil
}

func (s *subState) add(names []string) {
	for _, n := range names {
		if n == Wildcard {
			s.wildcard = true
			continue
		}
		s.names[n] = true
	}
}

// covers reports whether a held resource is still wanted.
func (s *subState) covers(name string, m proto.Message) bool {
	if s.wildcard || s.names[name] {
		return true
	}
	return s.names[meshv1.ResourceNamespace(m)+NamespaceWildcardSuffix]
}

func (s *subState) request(typeURL string) []string {
	out := make([]string, 0, len(s.names)+1)
	if s.wildcard {
		out = append(out, Wildcard)
	}
	for n := range s.names {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// State returns the latest accepted state (never nil).
func (c *Client) State() *State { return c.state.Load() }

// Ready reports whether every initial subscription has completed its first sync.
func (c *Client) Ready() bool {
	select {
	case <-c.readyCh:
		return true
	default:
		return false
	}
}

// WaitReady blocks until Ready or ctx ends.
func (c *Client) WaitReady(ctx context.Context) error {
	select {
	case <-c.readyCh:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("xds client: not synced with %s: %w", c.opts.Address, ctx.Err())
	}
}

// Connected reports whether a stream to the control plane is up and has
// delivered at least one response.
func (c *Client) Connected() bool { return c.connected.Load() }

// Subscribe adds names (or Wildcard, or "<ns>/*") to the subscription of a
// type, at once if connected, else on the next connection.
func (c *Client) Subscribe(typeURL string, names ...string) error {
	if _, err := meshv1.NewResource(typeURL); err != nil {
		return fmt.Errorf("xds client: %w", err)
	}
	c.subMu.Lock()
	defer c.subMu.Unlock()
	s := c.subs[typeURL]
	if s == nil {
		s = &subState{names: map[string]bool{}}
		c.subs[typeURL] = s
	}
	s.add(names)
	if c.stream != nil {
		req := &discovery.DeltaDiscoveryRequest{TypeUrl: typeURL, ResourceNamesSubscribe: names}
		if err := c.stream.send(req); err != nil {
			c.log.Debug("subscription change not sent; it goes with the next connection", zap.Error(err))
		}
	}
	return nil
}

// Unsubscribe removes names from the subscription of a type and drops the
// resources no longer covered.
func (c *Client) Unsubscribe(typeURL string, names ...string) error {
	c.subMu.Lock()
	s := c.subs[typeURL]
	if s == nil {
		c.subMu.Unlock()
		return nil
	}
	for _, n := range names {
		if n == Wildcard {
			s.wildcard = false
		}
		delete(s.names, n)
	}
	if c.stream != nil {
		req := &discovery.DeltaDiscoveryRequest{TypeUrl: typeURL, ResourceNamesUnsubscribe: names}
		if err := c.stream.send(req); err != nil {
			c.log.Debug("subscription change not sent; it goes with the next connection", zap.Error(err))
		}
	}
	old := c.state.Load()
	var drop []string
	for name := range old.versions[typeURL].all() {
		if m, ok := old.Get(typeURL, name); !ok || !s.covers(name, m) {
			drop = append(drop, name)
		}
	}
	if len(drop) > 0 {
		c.state.Store(old.with(typeURL, nil, nil, drop))
	}
	c.subMu.Unlock()
	if len(drop) > 0 {
		c.notify(typeURL)
	}
	return nil
}

// Run connects and keeps the subscriptions up until ctx ends, reconnecting
// with jittered, capped exponential backoff. It returns nil when ctx ends.
// A Client runs once.
func (c *Client) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("xds client: Run called twice")
	}
	defer c.conn.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	nctx, stopNotify := context.WithCancel(ctx)
	defer stopNotify()
	if c.opts.OnChange != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.notifyLoop(nctx)
		}()
	}
	retry := reconnect.Backoff{Initial: c.opts.InitialBackoff, Max: c.opts.MaxBackoff}
	for {
		opened, err := c.runStream(ctx)
		c.connected.Store(false)
		if ctx.Err() != nil {
			return nil
		}
		if !opened.IsZero() && time.Since(opened) >= c.opts.MaxBackoff {
			retry.Reset() // it was stable
		}
		wait := retry.Next()
		c.log.Warn("xDS stream ended; keeping the last state and reconnecting",
			zap.Error(err), zap.Duration("retry_in", wait), zap.Bool("ready", c.Ready()))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// runStream runs one ADS stream until it fails; opened is when the stream
// was open (on a connected channel), zero if it never was.
func (c *Client) runStream(ctx context.Context) (opened time.Time, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := discovery.NewAggregatedDiscoveryServiceClient(c.conn.Get()).DeltaAggregatedResources(sctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("open stream: %w", err)
	}
	opened = time.Now()
	cs := &clientStream{st: st}

	// The initial requests and later subscription changes are serialized
	// by subMu, so the server sees them in order.
	c.subMu.Lock()
	state := c.state.Load()
	types := make([]string, 0, len(c.subs))
	for t := range c.subs {
		types = append(types, t)
	}
	sort.Slice(types, func(i, j int) bool { return typeOrder(types[i]) < typeOrder(types[j]) })
	node := &core.Node{Id: c.opts.NodeID, UserAgentName: "causeway"}
	for _, t := range types {
		req := &discovery.DeltaDiscoveryRequest{
			Node:                    node,
			TypeUrl:                 t,
			ResourceNamesSubscribe:  c.subs[t].request(t),
			InitialResourceVersions: state.Versions(t),
		}
		node = nil // only on the first request
		if err := cs.send(req); err != nil {
			c.subMu.Unlock()
			return opened, fmt.Errorf("send subscription: %w", err)
		}
	}
	c.stream = cs
	c.subMu.Unlock()
	defer func() {
		c.subMu.Lock()
		if c.stream == cs {
			c.stream = nil
		}
		c.subMu.Unlock()
	}()

	for {
		resp, err := st.Recv()
		if err != nil {
			return opened, fmt.Errorf("receive: %w", err)
		}
		if !c.connected.Load() {
			c.connected.Store(true)
			c.log.Info("xDS stream established")
		}
		if err := c.handle(cs, resp); err != nil {
			return opened, err
		}
	}
}

func typeOrder(t string) int {
	for i, u := range meshv1.TypeURLs {
		if u == t {
			return i
		}
	}
	return len(meshv1.TypeURLs)
}

// handle validates a response, applies it and ACKs, or NACKs it.
func (c *Client) handle(cs *clientStream, resp *discovery.DeltaDiscoveryResponse) error {
	typeURL := resp.GetTypeUrl()
	c.subMu.Lock()
	_, subscribed := c.subs[typeURL]
	c.subMu.Unlock()

	updated := make(map[string]proto.Message, len(resp.GetResources()))
	versions := make(map[string]string, len(resp.GetResources()))
	var problems []string
	if !subscribed {
		problems = append(problems, fmt.Sprintf("not subscribed to type %q", typeURL))
	}
	for _, r := range resp.GetResources() {
		if subscribed {
			m, err := decodeResource(typeURL, r)
			if err != nil {
				problems = append(problems, err.Error())
				continue
			}
			updated[r.GetName()] = m
			versions[r.GetName()] = r.GetVersion()
		}
		if len(problems) >= 10 {
			problems = append(problems, "...")
			break
		}
	}
	if len(problems) > 0 {
		detail := strings.Join(problems, "; ")
		c.log.Warn("rejecting xDS update (NACK); keeping the previous state",
			zap.String("type", TypeName(typeURL)), zap.String("nonce", resp.GetNonce()), zap.String("reason", detail))
		return cs.send(&discovery.DeltaDiscoveryRequest{
			TypeUrl:       typeURL,
			ResponseNonce: resp.GetNonce(),
			ErrorDetail:   &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: detail},
		})
	}

	c.subMu.Lock()
	old := c.state.Load()
	var removed []string
	for _, name := range resp.GetRemovedResources() {
		if _, held := old.versions[typeURL].get(name); held {
			removed = append(removed, name)
		}
	}
	becameReady := false
	if s := c.subs[typeURL]; s != nil && s.initial && !c.synced[typeURL] {
		c.synced[typeURL] = true
		becameReady = true
		for t, s := range c.subs {
			if s.initial && !c.synced[t] {
				becameReady = false
			}
		}
	}
	changed := len(updated) > 0 || len(removed) > 0
	if changed || becameReady {
		next := old
		if changed {
			next = old.with(typeURL, updated, versions, removed)
		}
		if becameReady {
			// A copy: old may be held by readers.
			n := *next
			n.synced = true
			next = &n
		}
		c.state.Store(next)
	}
	c.subMu.Unlock()

	if err := cs.send(&discovery.DeltaDiscoveryRequest{TypeUrl: typeURL, ResponseNonce: resp.GetNonce()}); err != nil {
		return fmt.Errorf("send ACK: %w", err)
	}
	if changed {
		c.log.Debug("xDS update applied", zap.String("type", TypeName(typeURL)),
			zap.Int("updated", len(updated)), zap.Int("removed", len(removed)))
	}
	if changed || becameReady {
		// Also when the first sync completes without a change: OnChange
		// then sees the state Synced.
		c.notify(typeURL)
	}
	if becameReady {
		c.readyOnce.Do(func() {
			close(c.readyCh)
			c.log.Info("xDS initial sync complete")
		})
	}
	return nil
}

func decodeResource(typeURL string, r *discovery.Resource) (proto.Message, error) {
	if r.GetResource() == nil {
		return nil, fmt.Errorf("resource %q has no body", r.GetName())
	}
	if got := r.GetResource().GetTypeUrl(); got != typeURL {
		return nil, fmt.Errorf("resource %q has type %q in a %q response", r.GetName(), got, typeURL)
	}
	m, err := meshv1.NewResource(typeURL)
	if err != nil {
		return nil, err
	}
	if err := proto.Unmarshal(r.GetResource().GetValue(), m); err != nil {
		return nil, fmt.Errorf("resource %q: %w", r.GetName(), err)
	}
	if err := meshv1.Validate(m); err != nil {
		return nil, fmt.Errorf("resource %q: %w", r.GetName(), err)
	}
	if n := meshv1.ResourceName(m); n != r.GetName() {
		return nil, fmt.Errorf("resource %q describes %q", r.GetName(), n)
	}
	return m, nil
}

// notify records a changed type and wakes the notifier.
func (c *Client) notify(typeURL string) {
	if c.opts.OnChange == nil {
		return
	}
	c.changeMu.Lock()
	c.changed[typeURL] = true
	c.changeMu.Unlock()
	select {
	case c.changeCh <- struct{}{}:
	default:
	}
}

func (c *Client) notifyLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.changeCh:
		}
		c.changeMu.Lock()
		types := make([]string, 0, len(c.changed))
		for t := range c.changed {
			types = append(types, t)
		}
		clear(c.changed)
		c.changeMu.Unlock()
		sort.Slice(types, func(i, j int) bool { return typeOrder(types[i]) < typeOrder(types[j]) })
		c.opts.OnChange(c.state.Load(), types)
	}
}

// bearerToken sends a TokenSource's token as per-RPC credentials.
type bearerToken caclient.TokenSource

func (b bearerToken) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	tok, err := b(ctx)
	if err != nil {
		return nil, fmt.Errorf("xds client token: %w", err)
	}
	return map[string]string{"authorization": "Bearer " + tok}, nil
}

func (bearerToken) RequireTransportSecurity() bool { return true }
