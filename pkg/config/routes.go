package config

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// Route translation mirrors Gateway API v1 HTTPRoute and GRPCRoute into
// meshv1 with the spec's defaults written out (PathPrefix "/", Exact
// matches, weight 1, redirect 302, CORS max-age 5), so the waypoint never
// has to know a default. Parents are Services (GAMMA); routes without a
// Service parent attach to no mesh traffic and are not served.

const gatewayGroup = gwv1.GroupName

// routeCtx is what every part of one route's translation needs to know.
type routeCtx struct {
	origin, obj, ns, kind string
	parents               []*meshv1.ParentRef
}

func newRouteCtx(origin, kind string, m *metav1.ObjectMeta) routeCtx {
	return routeCtx{origin: origin, obj: kind + " " + m.Namespace + "/" + m.Name, ns: m.Namespace, kind: kind}
}

// isParent reports whether the Service ns/name is one of the route's parents.
func (c routeCtx) isParent(ns, name string) bool {
	for _, p := range c.parents {
		if p.GetNamespace() == ns && p.GetName() == name {
			return true
		}
	}
	return false
}

// translateRoutes programs every route the mesh accepts. A refused route
// is not programmed (its status says why); a parentRef that does not
// resolve leaves only that parent out.
func (t *translator) translateRoutes() {
	for _, r := range t.httpRoutes {
		s := &r.route.Spec
		if o := translateRoute(t, r.origin, "HTTPRoute", &r.route.ObjectMeta, s.ParentRefs, s.Hostnames, s.Rules, t.httpRule); o != nil && !t.refused("HTTPRoute "+o.key()) {
			t.out.HTTPRoutes[o.key()] = &meshv1.HTTPRoute{Name: o.name, Namespace: o.namespace, CreationTime: o.created, Parents: o.parents, Hostnames: o.hostnames, Rules: o.rules}
		}
	}
	for _, r := range t.grpcRoutes {
		s := &r.route.Spec
		if o := translateRoute(t, r.origin, "GRPCRoute", &r.route.ObjectMeta, s.ParentRefs, s.Hostnames, s.Rules, t.grpcRule); o != nil && !t.refused("GRPCRoute "+o.key()) {
			t.out.GRPCRoutes[o.key()] = &meshv1.GRPCRoute{Name: o.name, Namespace: o.namespace, CreationTime: o.created, Parents: o.parents, Hostnames: o.hostnames, Rules: o.rules}
		}
	}
}

// meshRoute is a translated route of either kind, with rules of type R.
type meshRoute[R any] struct {
	name, namespace string
	created         *timestamppb.Timestamp
	parents         []*meshv1.ParentRef
	hostnames       []string
	rules           []R
}

func (r *meshRoute[R]) key() string { return r.namespace + "/" + r.name }

// translateRoute translates an HTTPRoute or GRPCRoute, whose rules (of type
// GR) rule translates. It returns nil when no parent is a mesh Service: the
// route attaches to no mesh traffic.
func translateRoute[GR, R any](t *translator, origin, kind string, m *metav1.ObjectMeta, refs []gwv1.ParentReference, hs []gwv1.Hostname,
	rules []GR, rule func(routeCtx, int, GR) R) *meshRoute[R] {
	c := newRouteCtx(origin, kind, m)
	c.parents = t.parents(c, refs)
	if len(c.parents) == 0 {
		return nil
	}
	return translateRules(c, m, hs, rules, rule)
}

// translateRules translates a route's rules for the parents c names (none
// for an ingress Gateway's routes, whose listeners attach them).
func translateRules[GR, R any](c routeCtx, m *metav1.ObjectMeta, hs []gwv1.Hostname, rules []GR, rule func(routeCtx, int, GR) R) *meshRoute[R] {
	out := &meshRoute[R]{
		name:      m.Name,
		namespace: m.Namespace,
		created:   creationTime(m.CreationTimestamp.Time),
		parents:   c.parents,
		hostnames: hostnames(hs),
	}
	for i, r := range rules {
		out.rules = append(out.rules, rule(c, i, r))
	}
	return out
}

func creationTime(ts time.Time) *timestamppb.Timestamp {
	if ts.IsZero() {
		return nil
	}
	return timestamppb.New(ts)
}

func hostnames(hs []gwv1.Hostname) []string {
	out := make([]string, 0, len(hs))
	for _, h := range hs {
		out = append(out, strings.ToLower(string(h)))
	}
	return out
}

// parents keeps the Service parentRefs; each must name an existing
// Service (and port, when given).
func (t *translator) parents(c routeCtx, refs []gwv1.ParentReference) []*meshv1.ParentRef {
	var out []*meshv1.ParentRef
	for i, ref := range refs {
		group, kind := gatewayGroup, "Gateway"
		if ref.Group != nil {
			group = string(*ref.Group)
		}
		if ref.Kind != nil {
			kind = string(*ref.Kind)
		}
		if !isCoreGroup(group) || kind != "Service" {
			continue // an ingress Gateway or another parent: not mesh traffic
		}
		ns := c.ns
		if ref.Namespace != nil && *ref.Namespace != "" {
			ns = string(*ref.Namespace)
		}
		s := t.services[nsName{ns, string(ref.Name)}]
		if s == nil {
			t.parentProblem(c, i, "dangling reference: parentRef Service %s/%s does not exist", ns, ref.Name)
			continue
		}
		if s.svc.Spec.Type == corev1.ServiceTypeExternalName {
			t.parentProblem(c, i, "parentRef Service %s/%s is an ExternalName service", ns, ref.Name)
			continue
		}
		p := &meshv1.ParentRef{Namespace: ns, Name: string(ref.Name)}
		if ref.Port != nil {
			p.Port = uint32(*ref.Port)
			if svcPort(s.svc, p.Port) == nil {
				t.parentProblem(c, i, "parentRef Service %s/%s has no port %d", ns, ref.Name, p.Port)
				continue
			}
		}
		t.reports.route(c.obj).addParent(i, "", ns+"/"+string(ref.Name))
		out = append(out, p)
	}
	return out
}

func isCoreGroup(g string) bool { return g == "" || g == "core" }

func (t *translator) httpRule(c routeCtx, i int, rule gwv1.HTTPRouteRule) *meshv1.HTTPRouteRule {
	where := fmt.Sprintf("rule %d", i)
	out := &meshv1.HTTPRouteRule{Name: ruleName(rule.Name), Matches: translateMatches(c, where, rule.Matches, t.httpMatch, func() *meshv1.HTTPRouteMatch {
		return &meshv1.HTTPRouteMatch{Path: &meshv1.PathMatch{Type: meshv1.PathMatch_PATH_PREFIX, Value: "/"}}
	})}
	out.Filters, out.InvalidReason = translateFilters(t, c, where, rule.Filters, t.httpFilter, func(mf *meshv1.HTTPRouteFilter) string {
		if usesPrefixRewrite(mf) && !singlePrefixMatch(out.Matches) {
			t.problem(c.origin, c.obj, "%s: ReplacePrefixMatch needs exactly one PathPrefix match", where)
		}
		return ""
	})
	for _, b := range rule.BackendRefs {
		out.Backends = append(out.Backends, translateBackend(t, c, where, b.BackendRef, b.Filters, t.httpFilter, notOnBackends))
	}
	if to := rule.Timeouts; to != nil {
		out.RequestTimeout = t.duration(c, where+" timeouts.request", to.Request)
		out.BackendRequestTimeout = t.duration(c, where+" timeouts.backendRequest", to.BackendRequest)
		if out.RequestTimeout != nil && out.BackendRequestTimeout != nil && out.RequestTimeout.AsDuration() != 0 &&
			out.BackendRequestTimeout.AsDuration() > out.RequestTimeout.AsDuration() {
			t.problem(c.origin, c.obj, "%s: backendRequest timeout cannot be longer than request timeout", where)
		}
	}
	if r := rule.Retry; r != nil {
		rt := &meshv1.HTTPRouteRetry{Attempts: 1}
		if r.Attempts != nil {
			if *r.Attempts < 0 {
				t.problem(c.origin, c.obj, "%s: retry attempts %d is negative", where, *r.Attempts)
			} else {
				rt.Attempts = uint32(*r.Attempts)
			}
		}
		for _, code := range r.Codes {
			if code < 400 || code > 599 {
				t.problem(c.origin, c.obj, "%s: retry code %d is not in 400-599", where, code)
				continue
			}
			rt.Codes = append(rt.Codes, uint32(code))
		}
		rt.Backoff = t.duration(c, where+" retry.backoff", r.Backoff)
		out.Retry = rt
	}
	return out
}

// ruleName is a rule's optional name.
func ruleName(n *gwv1.SectionName) string {
	if n == nil {
		return ""
	}
	return string(*n)
}

// translateMatches translates a rule's matches; a rule without any matches
// every request (all).
func translateMatches[GM, M any](c routeCtx, where string, ms []GM, match func(routeCtx, string, GM) M, all func() M) []M {
	out := make([]M, 0, max(len(ms), 1))
	for _, m := range ms {
		out = append(out, match(c, where, m))
	}
	if len(out) == 0 {
		out = append(out, all())
	}
	return out
}

// filterFunc translates one HTTPRoute or GRPCRoute filter; see httpFilter.
type filterFunc[F any] func(c routeCtx, where string, f F) (*meshv1.HTTPRouteFilter, string)

// translateFilters translates the filters of a rule or of one of its
// backends. check, when given, sees each translated filter and says why it
// cannot stand here ("": it can). What the mesh cannot carry out is reported
// and joined into the reason that marks the rule or backend invalid
// (requests get 500, as the spec requires).
func translateFilters[F any](t *translator, c routeCtx, where string, fs []F, filter filterFunc[F],
	check func(*meshv1.HTTPRouteFilter) string) ([]*meshv1.HTTPRouteFilter, string) {
	var out []*meshv1.HTTPRouteFilter
	var unsupported []string
	for _, f := range fs {
		mf, reason := filter(c, where, f)
		if reason == "" && mf != nil && check != nil {
			reason = check(mf)
		}
		if reason != "" {
			unsupported = append(unsupported, t.unsupported(c, where, reason))
		} else if mf != nil {
			out = append(out, mf)
		}
	}
	return out, strings.Join(unsupported, "; ")
}

func usesPrefixRewrite(f *meshv1.HTTPRouteFilter) bool {
	if rw := f.GetUrlRewrite(); rw != nil && rw.GetPath() != nil && rw.GetPath().GetType() == meshv1.PathModifier_REPLACE_PREFIX_MATCH {
		return true
	}
	if rd := f.GetRequestRedirect(); rd != nil && rd.GetPath() != nil && rd.GetPath().GetType() == meshv1.PathModifier_REPLACE_PREFIX_MATCH {
		return true
	}
	return false
}

func singlePrefixMatch(ms []*meshv1.HTTPRouteMatch) bool {
	return len(ms) == 1 && ms[0].GetPath().GetType() == meshv1.PathMatch_PATH_PREFIX
}

func (t *translator) httpMatch(c routeCtx, where string, m gwv1.HTTPRouteMatch) *meshv1.HTTPRouteMatch {
	out := &meshv1.HTTPRouteMatch{Path: &meshv1.PathMatch{Type: meshv1.PathMatch_PATH_PREFIX, Value: "/"}}
	if p := m.Path; p != nil {
		out.Path.Type = matchType(t, c, where, "path", p.Type, pathMatchTypes)
		if p.Value != nil {
			out.Path.Value = *p.Value
		}
		switch out.Path.Type {
		case meshv1.PathMatch_REGULAR_EXPRESSION:
			t.checkRegex(c, where+" path", out.Path.Value)
		default:
			if !strings.HasPrefix(out.Path.Value, "/") {
				t.problem(c.origin, c.obj, "%s: path %q must start with /", where, out.Path.Value)
			}
			if strings.Contains(out.Path.Value, "//") || strings.Contains(out.Path.Value, "/./") ||
				strings.Contains(out.Path.Value, "/../") || strings.HasSuffix(out.Path.Value, "/..") ||
				strings.HasSuffix(out.Path.Value, "/.") || strings.ContainsAny(out.Path.Value, "#?") {
				t.problem(c.origin, c.obj, "%s: path %q is not a normalized path", where, out.Path.Value)
			}
		}
	}
	out.Headers = stringMatches(t, c, where+" header", m.Headers, func(h gwv1.HTTPHeaderMatch) (string, string, *gwv1.HeaderMatchType) {
		return strings.ToLower(string(h.Name)), h.Value, h.Type
	}, gwv1.HeaderMatchExact, gwv1.HeaderMatchRegularExpression)
	out.QueryParams = stringMatches(t, c, where+" query", m.QueryParams, func(q gwv1.HTTPQueryParamMatch) (string, string, *gwv1.QueryParamMatchType) {
		return string(q.Name), q.Value, q.Type // query parameter names are case-sensitive
	}, gwv1.QueryParamMatchExact, gwv1.QueryParamMatchRegularExpression)
	if m.Method != nil {
		out.Method = string(*m.Method)
	}
	return out
}

// stringMatches translates header or query parameter matches; entry gives
// a match's name as compared (header names fold case), value and type (nil:
// Exact). Of entries with equal names only the first counts, as the spec
// says.
func stringMatches[M any, T comparable](t *translator, c routeCtx, where string, ms []M, entry func(M) (string, string, *T), exact, regex T) []*meshv1.StringMatch {
	var out []*meshv1.StringMatch
	seen := map[string]bool{}
	for _, m := range ms {
		name, value, typ := entry(m)
		if seen[name] {
			continue
		}
		seen[name] = true
		where := where + " " + name
		if typ != nil && *typ != exact && *typ != regex {
			t.problem(c.origin, c.obj, "%s: unknown match type", where)
		}
		if name == "" {
			t.problem(c.origin, c.obj, "%s: empty name", where)
		}
		sm := &meshv1.StringMatch{Type: meshv1.StringMatch_EXACT, Name: name, Value: value}
		if typ != nil && *typ == regex {
			sm.Type = meshv1.StringMatch_REGULAR_EXPRESSION
			t.checkRegex(c, where, value)
		}
		out = append(out, sm)
	}
	return out
}

var (
	pathMatchTypes = map[gwv1.PathMatchType]meshv1.PathMatch_Type{
		gwv1.PathMatchPathPrefix:        meshv1.PathMatch_PATH_PREFIX,
		gwv1.PathMatchExact:             meshv1.PathMatch_EXACT,
		gwv1.PathMatchRegularExpression: meshv1.PathMatch_REGULAR_EXPRESSION,
	}
	methodMatchTypes = map[gwv1.GRPCMethodMatchType]meshv1.GRPCMethodMatch_Type{
		gwv1.GRPCMethodMatchExact:             meshv1.GRPCMethodMatch_EXACT,
		gwv1.GRPCMethodMatchRegularExpression: meshv1.GRPCMethodMatch_REGULAR_EXPRESSION,
	}
)

// matchType maps a path or method match type to meshv1's; nil, or a type
// this mesh does not know (reported), is the spec's default, the zero value.
func matchType[G ~string, M comparable](t *translator, c routeCtx, where, what string, g *G, types map[G]M) M {
	var m M
	if g != nil {
		var ok bool
		if m, ok = types[*g]; !ok {
			t.problem(c.origin, c.obj, "%s: unknown %s match type %q", where, what, *g)
		}
	}
	return m
}

func (t *translator) checkRegex(c routeCtx, where, re string) {
	if _, err := regexp.Compile(re); err != nil {
		t.problem(c.origin, c.obj, "%s: regular expression %q: %v", where, re, err)
	}
}

// httpFilter translates one filter. A filter this mesh cannot carry out
// returns a reason instead: the caller marks the rule or backend invalid so
// that requests get 500, as the spec requires, rather than skipping it.
func (t *translator) httpFilter(c routeCtx, where string, f gwv1.HTTPRouteFilter) (*meshv1.HTTPRouteFilter, string) {
	missing := func(field string) (*meshv1.HTTPRouteFilter, string) {
		t.problem(c.origin, c.obj, "%s: filter type %s needs field %s", where, f.Type, field)
		return nil, ""
	}
	switch f.Type {
	case gwv1.HTTPRouteFilterRequestHeaderModifier:
		if f.RequestHeaderModifier == nil {
			return missing("requestHeaderModifier")
		}
		return &meshv1.HTTPRouteFilter{Filter: &meshv1.HTTPRouteFilter_RequestHeaderModifier{RequestHeaderModifier: headerModifier(f.RequestHeaderModifier)}}, ""
	case gwv1.HTTPRouteFilterResponseHeaderModifier:
		if f.ResponseHeaderModifier == nil {
			return missing("responseHeaderModifier")
		}
		return &meshv1.HTTPRouteFilter{Filter: &meshv1.HTTPRouteFilter_ResponseHeaderModifier{ResponseHeaderModifier: headerModifier(f.ResponseHeaderModifier)}}, ""
	case gwv1.HTTPRouteFilterRequestRedirect:
		r := f.RequestRedirect
		if r == nil {
			return missing("requestRedirect")
		}
		out := &meshv1.RequestRedirect{StatusCode: 302}
		if r.Scheme != nil {
			s := strings.ToLower(*r.Scheme)
			if s != "http" && s != "https" {
				t.problem(c.origin, c.obj, "%s: redirect scheme %q: want http or https", where, *r.Scheme)
			}
			out.Scheme = s
		}
		if r.Hostname != nil {
			out.Hostname = strings.ToLower(string(*r.Hostname))
		}
		if r.Path != nil {
			out.Path = t.pathModifier(c, where, r.Path)
		}
		if r.Port != nil {
			if *r.Port < 1 || *r.Port > 65535 {
				t.problem(c.origin, c.obj, "%s: redirect port %d out of range", where, *r.Port)
			}
			out.Port = uint32(*r.Port)
		}
		if r.StatusCode != nil {
			switch *r.StatusCode {
			case 301, 302, 303, 307, 308:
				out.StatusCode = uint32(*r.StatusCode)
			default:
				t.problem(c.origin, c.obj, "%s: redirect status %d: want 301, 302, 303, 307 or 308", where, *r.StatusCode)
			}
		}
		return &meshv1.HTTPRouteFilter{Filter: &meshv1.HTTPRouteFilter_RequestRedirect{RequestRedirect: out}}, ""
	case gwv1.HTTPRouteFilterURLRewrite:
		r := f.URLRewrite
		if r == nil {
			return missing("urlRewrite")
		}
		out := &meshv1.URLRewrite{}
		if r.Hostname != nil {
			out.Hostname = strings.ToLower(string(*r.Hostname))
		}
		if r.Path != nil {
			out.Path = t.pathModifier(c, where, r.Path)
		}
		return &meshv1.HTTPRouteFilter{Filter: &meshv1.HTTPRouteFilter_UrlRewrite{UrlRewrite: out}}, ""
	case gwv1.HTTPRouteFilterRequestMirror:
		if f.RequestMirror == nil {
			return missing("requestMirror")
		}
		return t.mirror(c, where, f.RequestMirror), ""
	case gwv1.HTTPRouteFilterCORS:
		r := f.CORS
		if r == nil {
			return missing("cors")
		}
		out := &meshv1.CORS{MaxAgeSeconds: r.MaxAge}
		if out.MaxAgeSeconds == 0 {
			out.MaxAgeSeconds = 5 // the spec's default
		}
		if r.AllowCredentials != nil {
			out.AllowCredentials = *r.AllowCredentials
		}
		for _, o := range r.AllowOrigins {
			out.AllowOrigins = append(out.AllowOrigins, string(o))
		}
		for _, m := range r.AllowMethods {
			out.AllowMethods = append(out.AllowMethods, string(m))
		}
		for _, h := range r.AllowHeaders {
			out.AllowHeaders = append(out.AllowHeaders, strings.ToLower(string(h)))
		}
		for _, h := range r.ExposeHeaders {
			out.ExposeHeaders = append(out.ExposeHeaders, strings.ToLower(string(h)))
		}
		return &meshv1.HTTPRouteFilter{Filter: &meshv1.HTTPRouteFilter_Cors{Cors: out}}, ""
	case gwv1.HTTPRouteFilterExtensionRef:
		name := ""
		if f.ExtensionRef != nil {
			name = fmt.Sprintf(" %s/%s %s", f.ExtensionRef.Group, f.ExtensionRef.Kind, f.ExtensionRef.Name)
		}
		return nil, "unsupported filter ExtensionRef" + name
	case gwv1.HTTPRouteFilterExternalAuth:
		return nil, "unsupported filter ExternalAuth"
	}
	return nil, fmt.Sprintf("unsupported filter type %q", f.Type)
}

func headerModifier(h *gwv1.HTTPHeaderFilter) *meshv1.HeaderModifier {
	out := &meshv1.HeaderModifier{}
	for _, s := range h.Set {
		out.Set = append(out.Set, &meshv1.Header{Name: strings.ToLower(string(s.Name)), Value: s.Value})
	}
	for _, a := range h.Add {
		out.Add = append(out.Add, &meshv1.Header{Name: strings.ToLower(string(a.Name)), Value: a.Value})
	}
	for _, r := range h.Remove {
		out.Remove = append(out.Remove, strings.ToLower(r))
	}
	return out
}

func (t *translator) pathModifier(c routeCtx, where string, p *gwv1.HTTPPathModifier) *meshv1.PathModifier {
	switch p.Type {
	case gwv1.FullPathHTTPPathModifier:
		if p.ReplaceFullPath == nil {
			t.problem(c.origin, c.obj, "%s: ReplaceFullPath needs replaceFullPath", where)
			return nil
		}
		return &meshv1.PathModifier{Type: meshv1.PathModifier_REPLACE_FULL_PATH, Value: *p.ReplaceFullPath}
	case gwv1.PrefixMatchHTTPPathModifier:
		if p.ReplacePrefixMatch == nil {
			t.problem(c.origin, c.obj, "%s: ReplacePrefixMatch needs replacePrefixMatch", where)
			return nil
		}
		return &meshv1.PathModifier{Type: meshv1.PathModifier_REPLACE_PREFIX_MATCH, Value: *p.ReplacePrefixMatch}
	}
	t.problem(c.origin, c.obj, "%s: unknown path modifier type %q", where, p.Type)
	return nil
}

func (t *translator) mirror(c routeCtx, where string, m *gwv1.HTTPRequestMirrorFilter) *meshv1.HTTPRouteFilter {
	out := &meshv1.RequestMirror{Backend: t.backendRef(c, m.BackendRef)}
	switch {
	case m.Percent != nil && m.Fraction != nil:
		t.problem(c.origin, c.obj, "%s: only one of percent or fraction may be set", where)
	case m.Percent != nil:
		if *m.Percent < 0 || *m.Percent > 100 {
			t.problem(c.origin, c.obj, "%s: mirror percent %d out of range", where, *m.Percent)
		}
		p := float64(*m.Percent)
		out.Percent = &p
	case m.Fraction != nil:
		den := int32(100)
		if m.Fraction.Denominator != nil {
			den = *m.Fraction.Denominator
		}
		if den < 1 || m.Fraction.Numerator < 0 || m.Fraction.Numerator > den {
			t.problem(c.origin, c.obj, "%s: mirror fraction %d/%d is not between 0 and 1", where, m.Fraction.Numerator, den)
			break
		}
		p := float64(m.Fraction.Numerator) * 100 / float64(den)
		out.Percent = &p
	}
	return &meshv1.HTTPRouteFilter{Filter: &meshv1.HTTPRouteFilter_RequestMirror{RequestMirror: out}}
}

// translateBackend translates one backendRef of a rule with its filters
// (see translateFilters).
func translateBackend[F any](t *translator, c routeCtx, where string, b gwv1.BackendRef, fs []F, filter filterFunc[F],
	check func(*meshv1.HTTPRouteFilter) string) *meshv1.HTTPBackendRef {
	out := &meshv1.HTTPBackendRef{Backend: t.backendRef(c, b.BackendObjectReference), Weight: 1}
	if b.Weight != nil {
		if *b.Weight < 0 {
			t.problem(c.origin, c.obj, "%s: backend weight %d is negative", where, *b.Weight)
		} else {
			out.Weight = uint32(*b.Weight)
		}
	}
	var invalid string
	out.Filters, invalid = translateFilters(t, c, where+" backend "+string(b.Name), fs, filter, check)
	if invalid != "" && out.Backend.InvalidReason == "" {
		out.Backend.InvalidReason = invalid
	}
	return out
}

// notOnBackends refuses the filters that have no match to act on at the
// level of a backend: redirects and prefix rewrites.
func notOnBackends(f *meshv1.HTTPRouteFilter) string {
	switch {
	case f.GetRequestRedirect() != nil:
		return "unsupported backend filter RequestRedirect"
	case usesPrefixRewrite(f):
		return "unsupported backend filter URLRewrite with ReplacePrefixMatch"
	}
	return ""
}

// backendRef resolves a reference to a Service port. What cannot be served
// (another kind, a missing Service or port, a cross-namespace reference no
// ReferenceGrant permits) is carried with its reason: the waypoint answers
// that backend's share of requests with 500, as the spec requires. A
// route's own parent Service needs no grant (GEP-1294: a consumer route
// sends its callers on to the Service they asked for, which they reach
// anyway); any other Service in another namespace does, since the
// waypoint would reach it under its own identity.
func (t *translator) backendRef(c routeCtx, b gwv1.BackendObjectReference) *meshv1.BackendRef {
	out := &meshv1.BackendRef{Namespace: c.ns, Name: string(b.Name)}
	if b.Namespace != nil && *b.Namespace != "" {
		out.Namespace = string(*b.Namespace)
	}
	if b.Port != nil {
		out.Port = uint32(*b.Port)
	}
	group, kind := "", "Service"
	if b.Group != nil {
		group = string(*b.Group)
	}
	if b.Kind != nil {
		kind = string(*b.Kind)
	}
	if !isCoreGroup(group) || kind != "Service" {
		t.invalidRef(c, out, gwv1.RouteReasonInvalidKind, "unsupported backend kind %s (group %q): only Services are supported", kind, group)
		return out
	}
	if out.Namespace != c.ns && !c.isParent(out.Namespace, out.Name) && !t.granted(c, out.Namespace, out.Name) {
		t.invalidRef(c, out, gwv1.RouteReasonRefNotPermitted, "reference from %s in namespace %s to Service %s/%s is not permitted by a ReferenceGrant",
			c.kind, c.ns, out.Namespace, out.Name)
		return out
	}
	s := t.services[nsName{out.Namespace, out.Name}]
	switch {
	case s == nil:
		t.invalidRef(c, out, gwv1.RouteReasonBackendNotFound, "Service %s/%s not found", out.Namespace, out.Name)
	case s.svc.Spec.Type == corev1.ServiceTypeExternalName:
		t.invalidRef(c, out, gwv1.RouteReasonInvalidKind, "Service %s/%s is an ExternalName service, which is not supported", out.Namespace, out.Name)
	case b.Port == nil:
		t.invalidRef(c, out, gwv1.RouteReasonBackendNotFound, "port is required for a Service backend")
	case svcPort(s.svc, out.Port) == nil:
		t.invalidRef(c, out, gwv1.RouteReasonBackendNotFound, "Service %s/%s has no port %d", out.Namespace, out.Name, out.Port)
	}
	return out
}

// granted: a ReferenceGrant in the target namespace lets routes of this kind
// from the route's namespace refer to the Service.
func (t *translator) granted(c routeCtx, ns, name string) bool {
	return grantAllows(t.grants[ns], c.kind, c.ns, "", "Service", name)
}

// duration parses a Gateway API Duration (GEP-2257: up to four
// number+unit pairs of h, m, s, ms).
func (t *translator) duration(c routeCtx, where string, d *gwv1.Duration) *durationpb.Duration {
	if d == nil {
		return nil
	}
	if !gatewayDuration.MatchString(string(*d)) {
		t.problem(c.origin, c.obj, "%s: %q is not a Gateway API duration (e.g. 10s, 1m30s, 500ms)", where, *d)
		return nil
	}
	v, err := time.ParseDuration(string(*d))
	if err != nil {
		t.problem(c.origin, c.obj, "%s: %v", where, err)
		return nil
	}
	return durationpb.New(v)
}

var gatewayDuration = regexp.MustCompile(`^([0-9]{1,5}(h|m|s|ms)){1,4}$`)

func (t *translator) grpcRule(c routeCtx, i int, rule gwv1.GRPCRouteRule) *meshv1.GRPCRouteRule {
	where := fmt.Sprintf("rule %d", i)
	out := &meshv1.GRPCRouteRule{Name: ruleName(rule.Name), Matches: translateMatches(c, where, rule.Matches, t.grpcMatch, func() *meshv1.GRPCRouteMatch {
		return &meshv1.GRPCRouteMatch{} // matches every request
	})}
	out.Filters, out.InvalidReason = translateFilters(t, c, where, rule.Filters, t.grpcFilter, nil)
	for _, b := range rule.BackendRefs {
		out.Backends = append(out.Backends, translateBackend(t, c, where, b.BackendRef, b.Filters, t.grpcFilter, nil))
	}
	return out
}

func (t *translator) grpcMatch(c routeCtx, where string, m gwv1.GRPCRouteMatch) *meshv1.GRPCRouteMatch {
	out := &meshv1.GRPCRouteMatch{}
	if mm := m.Method; mm != nil {
		out.Method = &meshv1.GRPCMethodMatch{Type: matchType(t, c, where, "method", mm.Type, methodMatchTypes)}
		if mm.Service != nil {
			out.Method.Service = *mm.Service
		}
		if mm.Method != nil {
			out.Method.Method = *mm.Method
		}
		if out.Method.Service == "" && out.Method.Method == "" {
			t.problem(c.origin, c.obj, "%s: a method match needs service or method", where)
		}
		if out.Method.Type == meshv1.GRPCMethodMatch_REGULAR_EXPRESSION {
			t.checkRegex(c, where+" service", out.Method.Service)
			t.checkRegex(c, where+" method", out.Method.Method)
		}
	}
	out.Headers = stringMatches(t, c, where+" header", m.Headers, func(h gwv1.GRPCHeaderMatch) (string, string, *gwv1.GRPCHeaderMatchType) {
		return strings.ToLower(string(h.Name)), h.Value, h.Type
	}, gwv1.GRPCHeaderMatchExact, gwv1.GRPCHeaderMatchRegularExpression)
	return out
}

func (t *translator) grpcFilter(c routeCtx, where string, f gwv1.GRPCRouteFilter) (*meshv1.HTTPRouteFilter, string) {
	switch f.Type {
	case gwv1.GRPCRouteFilterRequestHeaderModifier:
		return t.httpFilter(c, where, gwv1.HTTPRouteFilter{Type: gwv1.HTTPRouteFilterRequestHeaderModifier, RequestHeaderModifier: f.RequestHeaderModifier})
	case gwv1.GRPCRouteFilterResponseHeaderModifier:
		return t.httpFilter(c, where, gwv1.HTTPRouteFilter{Type: gwv1.HTTPRouteFilterResponseHeaderModifier, ResponseHeaderModifier: f.ResponseHeaderModifier})
	case gwv1.GRPCRouteFilterRequestMirror:
		return t.httpFilter(c, where, gwv1.HTTPRouteFilter{Type: gwv1.HTTPRouteFilterRequestMirror, RequestMirror: f.RequestMirror})
	case gwv1.GRPCRouteFilterExtensionRef:
		return t.httpFilter(c, where, gwv1.HTTPRouteFilter{Type: gwv1.HTTPRouteFilterExtensionRef, ExtensionRef: f.ExtensionRef})
	}
	return nil, fmt.Sprintf("unsupported filter type %q", f.Type)
}
