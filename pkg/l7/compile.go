package l7

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/causeway-mesh/causeway/pkg/backendtls"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// Config is compiled routing state: route tables per (service, port) and
// per (service, port, consumer namespace), the services' endpoints and the
// workloads behind them. It is immutable; the
// waypoint compiles a new one on every configuration change and hands it to
// Engine.Update, which swaps it in atomically.
type Config struct {
	services  map[ServiceRef]*serviceInfo
	workloads map[string]*meshv1.Workload // by uid
	byAddress map[netip.Addr]*meshv1.Workload
	tables    map[tableKey]*routeTable // producer routes, or the implicit route
	// consumers holds the routes of namespaces other than the service's
	// (GEP-1294 consumer routes): they apply to callers from that namespace only.
	consumers map[consumerKey]*routeTable
	problems  []string
	// An ingress gateway's (CompileGateway): the listeners of each port,
	// and the waypoints bound destinations are reached through (nil for
	// a waypoint's Config: it is the waypoint).
	listeners map[uint32][]*listenerTable
	waypoints map[string]*meshv1.Waypoint
}

// listenerTable is one listener of an ingress gateway and its routes.
type listenerTable struct {
	name     string
	hostname string
	table    *routeTable
}

// consumerKey names the consumer routes of namespace ns for a service port.
type consumerKey struct {
	tableKey
	ns string
}

// table is the routing of a service port for a caller from namespace from
// ("" for an unauthenticated caller): the consumer routes of that
// namespace when it has any for the port, else the service's own
// (producer) routes. The groups never merge (GEP-1294).
func (c *Config) table(k tableKey, from string) *routeTable {
	if len(c.consumers) > 0 && from != "" && from != k.svc.Namespace {
		if t := c.consumers[consumerKey{k, from}]; t != nil {
			return t
		}
	}
	return c.tables[k]
}

type serviceInfo struct {
	ref     ServiceRef
	svc     *meshv1.Service
	ports   map[uint32]*meshv1.ServicePort
	targets map[uint32][]Target // service port -> endpoints serving it
}

// routeMeta is what precedence and logs need from an HTTPRoute or GRPCRoute.
type routeMeta struct {
	kind      string // "HTTPRoute" or "GRPCRoute"
	namespace string
	name      string
	fullName  string // "{namespace}/{name}"
	created   time.Time
	hosts     hostnames
}

func (m *routeMeta) String() string { return m.fullName }

// compareAge orders routes by the spec's cross-route tie-breakers: the oldest
// creation timestamp, then "{namespace}/{name}" alphabetically.
func (m *routeMeta) compareAge(o *routeMeta) int {
	if c := m.created.Compare(o.created); c != 0 {
		return c
	}
	return cmp.Compare(m.String(), o.String())
}

// rule is what a matched request does.
type rule struct {
	route    *routeMeta // nil for a service's implicit route
	index    int
	name     string
	invalid  string // non-empty: every request gets 500 with this reason
	filters  []filter
	backends []*backend
	wrr      *wrr
	// requestTimeout covers the whole request including retries,
	// backendTimeout each attempt; 0 disables.
	requestTimeout    time.Duration
	requestTimeoutSet bool // an explicit 0 disables the default too
	backendTimeout    time.Duration
	retry             retryPolicy
	grpc              bool
	// prefix is the rule's single PathPrefix match, for ReplacePrefixMatch.
	prefix    string
	hasPrefix bool
}

// routeName is the route's "{namespace}/{name}", or "" for the implicit route.
func (r *rule) routeName() string {
	if r.route == nil {
		return ""
	}
	return r.route.String()
}

// backend is one backendRef of a rule: its destination, its share of the
// rule's requests and its own filters.
type backend struct {
	backendDest
	weight  uint32
	filters []filter
}

// retryPolicy says when a failed attempt is tried again.
type retryPolicy struct {
	retries     int          // attempts after the first
	codes       map[int]bool // retried status codes
	backoff     time.Duration
	connectOnly bool // no retry stanza: only connect failures are retried
}

const defaultRetryBackoff = 25 * time.Millisecond

// defaultRetry applies to rules without a retry stanza: a connect failure
// sent nothing to the backend, so one more endpoint is tried.
var defaultRetry = retryPolicy{retries: 1, connectOnly: true, backoff: 0}

// matcher is a compiled match of either route kind (httpMatch, grpcMatch).
type matcher[M any] interface {
	*M
	matches(v *reqView) bool
	compare(o *M) int // precedence: -1 when the receiver comes first
}

// entry is one match of a rule, as a route table holds it.
type entry[M any] struct {
	route    *routeMeta
	rule     *rule
	match    M
	matchIdx int
}

type (
	httpEntry = entry[httpMatch]
	grpcEntry = entry[grpcMatch]
)

// routeTable is the compiled routing of one service port, for every caller
// or (consumer set) for the callers of one namespace.
type routeTable struct {
	key       tableKey
	consumer  string
	protocol  Protocol
	http      []*httpEntry // in precedence order, hostnames aside
	grpc      []*grpcEntry
	hostnames bool  // some attached route names hostnames
	implicit  *rule // set when no route is attached: the service's own endpoints
}

// Problems lists what could not be compiled as written (unknown parents,
// invalid matches, invalid filters) in a stable order, for logs and config dumps.
func (c *Config) Problems() []string { return slices.Clone(c.problems) }

// Service returns a service by reference.
func (c *Config) Service(ref ServiceRef) (*meshv1.Service, bool) {
	si, ok := c.services[ref]
	if !ok {
		return nil, false
	}
	return si.svc, true
}

// Compile builds the routing state for a waypoint from its xDS resources.
// Nothing in the input makes it fail: a route, rule or match that cannot be
// compiled is recorded in Problems and either left out (a match that cannot
// be evaluated) or answered with 500 (a rule that cannot be carried out as
// written), never silently widened.
func Compile(routes []*meshv1.HTTPRoute, grpcRoutes []*meshv1.GRPCRoute, services []*meshv1.Service, workloads []*meshv1.Workload) *Config {
	c := newConfig(services, workloads)

	attached := make(map[consumerKey]*attachments) // ns "": producer routes
	attach(c, attached, routes, c.compileHTTPRoute, func(a *attachments, cr *compiledRoute[httpMatch]) { a.http = append(a.http, cr) })
	attach(c, attached, grpcRoutes, c.compileGRPCRoute, func(a *attachments, cr *compiledRoute[grpcMatch]) { a.grpc = append(a.grpc, cr) })

	for ref, si := range c.services {
		for port, sp := range si.ports {
			proto := ProtocolFor(sp.GetAppProtocol())
			if proto == ProtocolTCP {
				continue
			}
			k := tableKey{ref, port}
			t := &routeTable{key: k, protocol: proto}
			if a := attached[consumerKey{k, ""}]; a != nil {
				c.buildTable(t, a)
			} else {
				t.implicit = c.implicitRule(ref, port)
			}
			c.tables[k] = t
		}
	}
	for k, a := range attached {
		if k.ns != "" {
			t := &routeTable{key: k.tableKey, consumer: k.ns, protocol: c.tables[k.tableKey].protocol}
			c.buildTable(t, a)
			c.consumers[k] = t
		}
	}
	sort.Strings(c.problems)
	return c
}

// newConfig is a Config with the services' endpoints and the workloads,
// and no routes yet.
func newConfig(services []*meshv1.Service, workloads []*meshv1.Workload) *Config {
	c := &Config{
		services:  make(map[ServiceRef]*serviceInfo, len(services)),
		workloads: make(map[string]*meshv1.Workload, len(workloads)),
		byAddress: make(map[netip.Addr]*meshv1.Workload, len(workloads)),
		tables:    make(map[tableKey]*routeTable),
		consumers: make(map[consumerKey]*routeTable),
	}
	for _, w := range workloads {
		if w.GetUid() == "" {
			continue
		}
		c.workloads[w.GetUid()] = w
		for _, a := range w.GetAddresses() {
			if ip, err := netip.ParseAddr(a); err == nil {
				c.byAddress[ip.Unmap()] = w
			}
		}
	}
	for _, s := range services {
		c.addService(s)
	}
	return c
}

func (c *Config) problem(format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf(format, args...))
}

// pod is the workload of pod p, or nil.
func (c *Config) pod(p PodRef) *meshv1.Workload {
	if p.Name == "" {
		return nil
	}
	for _, w := range c.workloads {
		if w.GetName() == p.Name && w.GetNamespace() == p.Namespace {
			return w
		}
	}
	return nil
}

func (c *Config) addService(s *meshv1.Service) {
	ref := ServiceRef{s.GetNamespace(), s.GetName()}
	if ref.Namespace == "" || ref.Name == "" {
		c.problem("service %q: namespace and name are required", ref)
		return
	}
	si := &serviceInfo{
		ref:     ref,
		svc:     s,
		ports:   make(map[uint32]*meshv1.ServicePort, len(s.GetPorts())),
		targets: make(map[uint32][]Target, len(s.GetPorts())),
	}
	for _, sp := range s.GetPorts() {
		if sp.GetPort() == 0 || sp.GetPort() > 65535 {
			c.problem("service %s: port %d out of range", ref, sp.GetPort())
			continue
		}
		si.ports[sp.GetPort()] = sp
	}
	tlsKeys := map[uint32]string{}
	for port, sp := range si.ports {
		if bt := sp.GetBackendTls(); bt != nil {
			tlsKeys[port] = backendtls.Key(bt)
		}
	}
	for _, ep := range s.GetEndpoints() {
		addr, err := netip.ParseAddr(ep.GetAddress())
		if err != nil {
			c.problem("service %s: endpoint %q: not an IP address", ref, ep.GetAddress())
			continue
		}
		addr = addr.Unmap()
		w := c.workloads[ep.GetWorkloadUid()]
		var id trust.Identity
		if w != nil {
			if id, err = trust.ParseIdentity(w.GetIdentity()); err != nil {
				c.problem("service %s: endpoint %s: workload %s: %v", ref, addr, w.GetUid(), err)
			}
		}
		for port, sp := range si.ports {
			tp := ep.GetPorts()[port]
			if tp == 0 {
				tp = sp.GetTargetPort()
			}
			if tp == 0 || tp > 65535 {
				continue // named target port this endpoint does not serve
			}
			si.targets[port] = append(si.targets[port], Target{
				Address:  netip.AddrPortFrom(addr, uint16(tp)),
				Identity: id,
				Workload: w,
				Service:  ref,
				TLS:      sp.GetBackendTls(),
				TLSKey:   tlsKeys[port],
			})
		}
	}
	sortTargets(si)
	c.services[ref] = si
}

// sortTargets orders each port's targets by address (then waypoint).
func sortTargets(si *serviceInfo) {
	for _, ts := range si.targets {
		slices.SortFunc(ts, func(a, b Target) int { return cmp.Or(a.Address.Compare(b.Address), a.Via.Compare(b.Via)) })
	}
}

type attachments struct {
	http []*compiledRoute[httpMatch]
	grpc []*compiledRoute[grpcMatch]
}

// route is what attach needs of an HTTPRoute or GRPCRoute.
type route interface {
	GetNamespace() string
	GetName() string
	GetCreationTime() *timestamppb.Timestamp
	GetHostnames() []string
	GetParents() []*meshv1.ParentRef
}

// attach compiles routes in name order and adds each to the tables of the
// service ports it attaches to: the producer table of a service in the
// route's namespace, the consumer table of the route's namespace otherwise.
func attach[R route, M any](c *Config, attached map[consumerKey]*attachments, routes []R,
	compile func(R) *compiledRoute[M], add func(*attachments, *compiledRoute[M])) {
	sorted := slices.Clone(routes)
	slices.SortFunc(sorted, func(a, b R) int {
		return cmp.Compare(a.GetNamespace()+"/"+a.GetName(), b.GetNamespace()+"/"+b.GetName())
	})
	for _, r := range sorted {
		cr := compile(r)
		if cr == nil {
			continue // the route could not be compiled
		}
		meta := cr.meta
		for _, k := range c.parentTables(meta, r.GetParents()) {
			ck := consumerKey{tableKey: k}
			if k.svc.Namespace != meta.namespace {
				ck.ns = meta.namespace
			}
			add(attachedTo(attached, ck), cr)
		}
	}
}

func attachedTo(m map[consumerKey]*attachments, k consumerKey) *attachments {
	a := m[k]
	if a == nil {
		a = &attachments{}
		m[k] = a
	}
	return a
}

// parentTables resolves a route's parentRefs to the service ports it attaches
// to. Port 0 means every HTTP-capable port of the service.
func (c *Config) parentTables(meta *routeMeta, parents []*meshv1.ParentRef) []tableKey {
	var out []tableKey
	for _, p := range parents {
		ns := p.GetNamespace()
		if ns == "" {
			ns = meta.namespace
		}
		ref := ServiceRef{ns, p.GetName()}
		si, ok := c.services[ref]
		if !ok {
			if ns == meta.namespace {
				c.problem("%s %s: parent service %s not found", meta.kind, meta, ref)
			} // else a consumer route for a service another waypoint serves
			continue
		}
		if p.GetPort() == 0 {
			for port, sp := range si.ports {
				if ProtocolFor(sp.GetAppProtocol()) != ProtocolTCP {
					out = append(out, tableKey{ref, port})
				}
			}
			continue
		}
		sp, ok := si.ports[p.GetPort()]
		if !ok {
			c.problem("%s %s: parent service %s has no port %d", meta.kind, meta, ref, p.GetPort())
			continue
		}
		if ProtocolFor(sp.GetAppProtocol()) == ProtocolTCP {
			c.problem("%s %s: parent %s port %d is not an HTTP port (appProtocol %q)", meta.kind, meta, ref, p.GetPort(), sp.GetAppProtocol())
			continue
		}
		out = append(out, tableKey{ref, p.GetPort()})
	}
	slices.SortFunc(out, func(a, b tableKey) int {
		return cmp.Or(cmp.Compare(a.svc.String(), b.svc.String()), cmp.Compare(a.port, b.port))
	})
	return slices.Compact(out)
}

// compiledRoute is a route's rules, one entry a match.
type compiledRoute[M any] struct {
	meta    *routeMeta
	entries []*entry[M]
}

func newRouteMeta(c *Config, kind string, r route) (*routeMeta, bool) {
	var created time.Time
	if r.GetCreationTime() != nil {
		created = r.GetCreationTime().AsTime()
	}
	ns, name := r.GetNamespace(), r.GetName()
	m := &routeMeta{kind: kind, namespace: ns, name: name, fullName: ns + "/" + name, created: created}
	if ns == "" || name == "" {
		c.problem("%s %q: namespace and name are required", kind, m)
		return nil, false
	}
	h, err := compileHostnames(r.GetHostnames())
	if err != nil {
		// Dropping a hostname would widen the route; dropping the route cannot.
		c.problem("%s %s: %v; route ignored", kind, m, err)
		return nil, false
	}
	m.hosts = h
	return m, true
}

// compileMatches compiles rule i's matches for either route kind: a match
// that does not compile is left out with a problem (the rule's other
// matches still apply); a rule without matches matches everything (all).
func compileMatches[P any, M any](c *Config, meta *routeMeta, i int, pms []P, compile func(P) (M, error), all M) []M {
	if len(pms) == 0 {
		return []M{all}
	}
	var matches []M
	for j, pm := range pms {
		m, err := compile(pm)
		if err != nil {
			c.problem("%s %s rule %d match %d: %v; match ignored", meta.kind, meta, i, j, err)
			continue
		}
		matches = append(matches, m)
	}
	return matches
}

// ruleProto is what compileRoute reads of an HTTPRoute or GRPCRoute rule
// whose matches are of type PM.
type ruleProto[PM any] interface {
	GetName() string
	GetMatches() []PM
	GetInvalidReason() string
	GetFilters() []*meshv1.HTTPRouteFilter
	GetBackends() []*meshv1.HTTPBackendRef
}

// compileRoute compiles the rules of a route of either kind: compile
// compiles a match (all: a rule without any), kindRule sets what only the
// route's kind has on a rule before its filters and backends compile.
func compileRoute[PR ruleProto[PM], PM, M any](c *Config, kind string, r route, rules []PR,
	compile func(PM) (M, error), all M, kindRule func(ru *rule, pr PR, matches []M)) *compiledRoute[M] {
	meta, ok := newRouteMeta(c, kind, r)
	if !ok {
		return nil
	}
	cr := &compiledRoute[M]{meta: meta}
	for i, pr := range rules {
		ru := &rule{route: meta, index: i, name: pr.GetName(), retry: defaultRetry, invalid: pr.GetInvalidReason()}
		matches := compileMatches(c, meta, i, pr.GetMatches(), compile, all)
		kindRule(ru, pr, matches)
		c.compileRuleAction(ru, meta, pr.GetFilters(), pr.GetBackends())
		if len(matches) == 0 {
			c.problem("%s %s rule %d: no usable match; rule ignored", kind, meta, i)
			continue
		}
		for j, m := range matches {
			cr.entries = append(cr.entries, &entry[M]{route: meta, rule: ru, match: m, matchIdx: j})
		}
	}
	return cr
}

func (c *Config) compileHTTPRoute(r *meshv1.HTTPRoute) *compiledRoute[httpMatch] {
	return compileRoute(c, "HTTPRoute", r, r.GetRules(), compileHTTPMatch, httpMatch{path: defaultPathMatch}, func(ru *rule, pr *meshv1.HTTPRouteRule, matches []httpMatch) {
		if len(pr.GetMatches()) == 0 || len(pr.GetMatches()) == 1 && len(matches) == 1 && matches[0].path.kind == pathPrefix {
			ru.prefix, ru.hasPrefix = matches[0].path.value, true
		}
		meta, i := ru.route, ru.index
		ru.requestTimeout = c.duration(meta, i, "request timeout", pr.GetRequestTimeout().AsDuration(), pr.GetRequestTimeout() != nil)
		ru.requestTimeoutSet = pr.GetRequestTimeout() != nil
		ru.backendTimeout = c.duration(meta, i, "backendRequest timeout", pr.GetBackendRequestTimeout().AsDuration(), pr.GetBackendRequestTimeout() != nil)
		if rt := pr.GetRetry(); rt != nil {
			ru.retry = compileRetry(rt)
		}
	})
}

func (c *Config) compileGRPCRoute(r *meshv1.GRPCRoute) *compiledRoute[grpcMatch] {
	return compileRoute(c, "GRPCRoute", r, r.GetRules(), compileGRPCMatch, grpcMatch{}, func(ru *rule, _ *meshv1.GRPCRouteRule, _ []grpcMatch) {
		ru.grpc = true
	})
}

func (c *Config) duration(meta *routeMeta, rule int, what string, d time.Duration, set bool) time.Duration {
	if !set {
		return 0
	}
	if d < 0 {
		c.problem("%s %s rule %d: negative %s; disabled", meta.kind, meta, rule, what)
		return 0
	}
	return d
}

func compileRetry(rt *meshv1.HTTPRouteRetry) retryPolicy {
	p := retryPolicy{retries: int(min(rt.GetAttempts(), 100)), codes: make(map[int]bool), backoff: defaultRetryBackoff}
	if rt.GetAttempts() == 0 {
		p.retries = 1 // the number is implementation-specific when unset
	}
	if b := rt.GetBackoff(); b != nil && b.AsDuration() >= 0 {
		p.backoff = b.AsDuration()
	}
	codes := rt.GetCodes()
	if len(codes) == 0 {
		codes = []uint32{500, 502, 503, 504}
	}
	for _, code := range codes {
		p.codes[int(code)] = true
	}
	return p
}

// compileRuleAction compiles a rule's filters and backends. A rule that
// cannot be carried out as written is marked invalid (500), never trimmed.
func (c *Config) compileRuleAction(ru *rule, meta *routeMeta, filters []*meshv1.HTTPRouteFilter, backends []*meshv1.HTTPBackendRef) {
	var err error
	if ru.filters, err = c.compileFilters(filters, ru, meta, ru.grpc); err != nil && ru.invalid == "" {
		ru.invalid = err.Error()
	}
	for _, hb := range backends {
		b := &backend{backendDest: c.resolveBackend(hb.GetBackend(), meta.namespace), weight: hb.GetWeight()}
		if b.filters, err = c.compileFilters(hb.GetFilters(), ru, meta, ru.grpc); err != nil && b.invalid == "" {
			b.invalid = err.Error()
		}
		ru.backends = append(ru.backends, b)
	}
	if ru.invalid != "" {
		c.problem("%s %s rule %d: %s; requests it matches get 500", meta.kind, meta, ru.index, ru.invalid)
	}
	ru.wrr = newWRR(ru.backends)
}

// resolveBackend resolves a backendRef against the known services.
func (c *Config) resolveBackend(ref *meshv1.BackendRef, routeNS string) backendDest {
	ns := ref.GetNamespace()
	if ns == "" {
		ns = routeNS
	}
	b := backendDest{svc: ServiceRef{ns, ref.GetName()}, port: ref.GetPort(), invalid: ref.GetInvalidReason()}
	b.name = fmt.Sprintf("%s:%d", b.svc, b.port)
	if b.invalid != "" {
		return b
	}
	si, ok := c.services[b.svc]
	switch {
	case !ok:
		b.missing = true
		c.problem("backend service %s not found; requests for it get 503", b.svc)
	case b.port == 0:
		b.invalid = fmt.Sprintf("backend service %s: port is required", b.svc)
	default:
		sp, ok := si.ports[b.port]
		if !ok {
			b.invalid = fmt.Sprintf("backend service %s has no port %d", b.svc, b.port)
		} else {
			b.proto = upstreamFor(sp.GetAppProtocol())
		}
	}
	return b
}

// compileFilters compiles a rule's (or a backendRef's) filters. Any filter
// that cannot be carried out exactly as written makes the error, and the
// caller answers the rule's requests with 500 rather than skip it.
func (c *Config) compileFilters(fs []*meshv1.HTTPRouteFilter, ru *rule, meta *routeMeta, grpc bool) ([]filter, error) {
	out := make([]filter, 0, len(fs))
	seen := map[filterKind]bool{}
	for _, f := range fs {
		var cf filter
		var err error
		switch {
		case f.GetRequestHeaderModifier() != nil:
			cf.kind = filterRequestHeaders
			cf.headers, err = compileHeaderMod(f.GetRequestHeaderModifier())
		case f.GetResponseHeaderModifier() != nil:
			cf.kind = filterResponseHeaders
			cf.headers, err = compileHeaderMod(f.GetResponseHeaderModifier())
		case f.GetRequestRedirect() != nil:
			cf.kind = filterRedirect
			cf.redirect, err = compileRedirect(f.GetRequestRedirect(), ru.hasPrefix)
		case f.GetUrlRewrite() != nil:
			cf.kind = filterRewrite
			cf.rewrite, err = compileRewrite(f.GetUrlRewrite(), ru.hasPrefix)
		case f.GetRequestMirror() != nil:
			cf.kind = filterMirror
			cf.mirror, err = c.compileMirror(f.GetRequestMirror(), meta)
		case f.GetCors() != nil:
			cf.kind = filterCORS
			cf.cors, err = compileCORS(f.GetCors())
		default:
			return nil, errors.New("unsupported filter")
		}
		if err != nil {
			return nil, fmt.Errorf("%s filter: %w", cf.kind, err)
		}
		if grpc && cf.kind != filterRequestHeaders && cf.kind != filterResponseHeaders && cf.kind != filterMirror {
			return nil, fmt.Errorf("%s filter is not supported on a GRPCRoute", cf.kind)
		}
		if seen[cf.kind] && cf.kind != filterMirror {
			return nil, fmt.Errorf("%s filter repeated", cf.kind)
		}
		seen[cf.kind] = true
		out = append(out, cf)
	}
	if seen[filterRedirect] && seen[filterRewrite] {
		return nil, errors.New("RequestRedirect and URLRewrite filters cannot be combined")
	}
	return out, nil
}

func (c *Config) compileMirror(m *meshv1.RequestMirror, meta *routeMeta) (*mirrorSpec, error) {
	if m.GetBackend() == nil {
		return nil, errors.New("no backend")
	}
	ref := c.resolveBackend(m.GetBackend(), meta.namespace)
	s := &mirrorSpec{backend: &ref, percent: 100}
	if m.Percent != nil {
		if p := m.GetPercent(); p >= 0 && p <= 100 {
			s.percent = p
		} else {
			return nil, fmt.Errorf("percent %v out of range", p)
		}
	}
	if s.backend.invalid != "" {
		// The spec drops an unresolvable mirror; the rule itself still works.
		c.problem("%s %s: mirror %s: %s; not mirrored", meta.kind, meta, s.backend, s.backend.invalid)
	}
	return s, nil
}

// implicitRule sends a service port's traffic to the service's own endpoints
// when no route is attached to it.
func (c *Config) implicitRule(ref ServiceRef, port uint32) *rule {
	b := &backend{backendDest: c.resolveBackend(&meshv1.BackendRef{Namespace: ref.Namespace, Name: ref.Name, Port: port}, ref.Namespace), weight: 1}
	ru := &rule{backends: []*backend{b}, retry: defaultRetry}
	ru.wrr = newWRR(ru.backends)
	return ru
}

// buildTable orders the rules attached to one service port.
func (c *Config) buildTable(t *routeTable, a *attachments) {
	// An HTTPRoute and a GRPCRoute with intersecting hostnames on one parent:
	// only the older (then alphabetically first) is accepted.
	type candidate struct {
		meta *routeMeta
		h    *compiledRoute[httpMatch]
		g    *compiledRoute[grpcMatch]
	}
	var all []candidate
	for _, r := range a.http {
		all = append(all, candidate{meta: r.meta, h: r})
	}
	for _, r := range a.grpc {
		all = append(all, candidate{meta: r.meta, g: r})
	}
	slices.SortStableFunc(all, func(x, y candidate) int { return x.meta.compareAge(y.meta) })
	var acceptedHTTP, acceptedGRPC []*routeMeta
	for _, r := range all {
		others := acceptedGRPC
		if r.g != nil {
			others = acceptedHTTP
		}
		conflict := ""
		for _, o := range others {
			if r.meta.hosts.intersects(&o.hosts) {
				conflict = o.kind + " " + o.String()
				break
			}
		}
		if conflict != "" {
			c.problem("%s %s: not accepted on %s port %d%s: hostnames intersect those of older %s", r.meta.kind, r.meta, t.key.svc, t.key.port, t.consumerNote(), conflict)
			continue
		}
		if !r.meta.hosts.any() {
			t.hostnames = true
		}
		if r.h != nil {
			acceptedHTTP = append(acceptedHTTP, r.meta)
			t.http = append(t.http, r.h.entries...)
		} else {
			acceptedGRPC = append(acceptedGRPC, r.meta)
			t.grpc = append(t.grpc, r.g.entries...)
		}
	}
	sortEntries(t.http)
	sortEntries(t.grpc)
}

// sortEntries orders a table's entries by match precedence, then the
// cross-route tie-breakers, then rule and match order.
func sortEntries[M any, PM matcher[M]](es []*entry[M]) {
	slices.SortStableFunc(es, func(x, y *entry[M]) int {
		return cmp.Or(PM(&x.match).compare(&y.match), x.route.compareAge(y.route),
			cmp.Compare(x.rule.index, y.rule.index), cmp.Compare(x.matchIdx, y.matchIdx))
	})
}

// consumerNote names the consumer namespace of a consumer table, for messages.
func (t *routeTable) consumerNote() string {
	if t.consumer == "" {
		return ""
	}
	return " (consumer routes of namespace " + t.consumer + ")"
}

// route finds the rule for a request: the most specific matching hostname
// first, then the match precedence the table is sorted by. gRPC requests are
// matched against GRPCRoutes and HTTPRoutes alike (both can be attached to a
// port whose hostnames do not intersect); on a tie the GRPCRoute wins.
func (t *routeTable) route(v *reqView) *rule {
	if t.implicit != nil {
		return t.implicit
	}
	// Two loops rather than one generic scan: a match called through a
	// type parameter is an indirect call, and v would escape to the heap.
	var b bestRule
	if v.grpc {
		for _, e := range t.grpc {
			if s, ok := e.route.hosts.score(v.host); ok && b.beaten(s) && e.match.matches(v) {
				if b.rule, b.score = e.rule, s; !t.hostnames {
					return b.rule // no route names hostnames: the first match wins
				}
			}
		}
	}
	for _, e := range t.http {
		if s, ok := e.route.hosts.score(v.host); ok && b.beaten(s) && e.match.matches(v) {
			if b.rule, b.score = e.rule, s; !t.hostnames {
				return b.rule
			}
		}
	}
	return b.rule
}

// bestRule is the best rule a route scan has found, with its host's score.
type bestRule struct {
	rule  *rule
	score hostScore
}

// beaten reports whether a rule whose host scores s would beat the best so far.
func (b *bestRule) beaten(s hostScore) bool { return b.rule == nil || s.better(b.score) }

// wrr is smooth weighted round robin (as nginx does it): over any window of
// sum(weights) picks, each backend gets exactly its share, interleaved.
type wrr struct {
	mu      sync.Mutex
	items   []*backend
	current []int64
	total   int64
}

func newWRR(bs []*backend) *wrr {
	w := &wrr{}
	for _, b := range bs {
		if b.weight > 0 {
			w.items = append(w.items, b)
			w.total += int64(b.weight)
		}
	}
	w.current = make([]int64, len(w.items))
	return w
}

// next returns the next backend, or nil when every weight is 0.
func (w *wrr) next() *backend {
	switch len(w.items) {
	case 0:
		return nil
	case 1:
		return w.items[0]
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	best := 0
	for i, b := range w.items {
		w.current[i] += int64(b.weight)
		if w.current[i] > w.current[best] {
			best = i
		}
	}
	w.current[best] -= w.total
	return w.items[best]
}
