package l7

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"

	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// reqView is what the matchers look at: the request with its path already
// normalized, and the parts that cost something computed at most once.
type reqView struct {
	r      *http.Request
	path   string // normalized, escaped
	host   string // Host without port, lower case, no trailing dot
	grpc   bool
	svc    string // gRPC service ("pkg.Service"), when grpc
	method string // gRPC method, when grpc

	query       url.Values
	queryParsed bool
}

func newReqView(r *http.Request, path string) reqView {
	v := reqView{r: r, path: path, host: requestHost(r.Host), grpc: isGRPC(r)}
	if v.grpc {
		v.svc, v.method, _ = splitGRPCPath(path)
	}
	return v
}

// queryValue returns the first value of a query parameter, as the spec
// recommends for repeated parameters. Pairs that do not parse are ignored.
func (v *reqView) queryValue(name string) (string, bool) {
	if !v.queryParsed {
		v.query, _ = url.ParseQuery(v.r.URL.RawQuery)
		v.queryParsed = true
	}
	vs, ok := v.query[name]
	if !ok || len(vs) == 0 {
		return "", false
	}
	return vs[0], true
}

// headerValue returns a request header by canonical name. Repeated headers
// are joined with "," (RFC 9110 section 5.3); Host comes from the request line
// or :authority, where Go keeps it.
func (v *reqView) headerValue(canonical string) (string, bool) {
	if canonical == "Host" {
		return v.r.Host, v.r.Host != ""
	}
	vs := v.r.Header[canonical]
	switch len(vs) {
	case 0:
		return "", false
	case 1:
		return vs[0], true
	}
	return strings.Join(vs, ","), true
}

// headersMatch reports whether every one of ms matches a header of the
// request.
func (v *reqView) headersMatch(ms []valueMatch) bool {
	for i := range ms {
		hv, ok := v.headerValue(ms[i].name)
		if !ok || !ms[i].matches(hv) {
			return false
		}
	}
	return true
}

func isGRPC(r *http.Request) bool {
	ct := r.Header.Get("Content-Type")
	return strings.HasPrefix(ct, "application/grpc") &&
		(len(ct) == len("application/grpc") || ct[len("application/grpc")] == '+' || ct[len("application/grpc")] == ';')
}

// splitGRPCPath splits "/pkg.Service/Method".
func splitGRPCPath(p string) (svc, method string, ok bool) {
	if len(p) < 2 || p[0] != '/' {
		return "", "", false
	}
	svc, method, ok = strings.Cut(p[1:], "/")
	if !ok || svc == "" || method == "" || strings.Contains(method, "/") {
		return "", "", false
	}
	return svc, method, true
}

// requestHost reduces a Host header to the name routes are matched against:
// the port is ignored (as the spec requires), case folded, trailing dot dropped.
func requestHost(h string) string {
	if h == "" {
		return ""
	}
	// Only a colon after the last ']' can start a port (SplitHostPort
	// fails, and allocates its error, on every other Host).
	if strings.LastIndexByte(h, ':') > strings.LastIndexByte(h, ']') {
		if host, _, err := net.SplitHostPort(h); err == nil {
			h = host
		}
	} else if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		h = h[1 : len(h)-1]
	}
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

// ---- paths ----

type pathKind uint8

const (
	pathPrefix pathKind = iota
	pathExact
	pathRegex
)

func (k pathKind) String() string {
	switch k {
	case pathExact:
		return "Exact"
	case pathRegex:
		return "RegularExpression"
	}
	return "PathPrefix"
}

type pathMatch struct {
	kind    pathKind
	value   string // as configured (normalized for Exact and PathPrefix)
	trimmed string // PathPrefix without trailing "/"
	re      *regexp.Regexp
}

var defaultPathMatch = pathMatch{kind: pathPrefix, value: "/", trimmed: ""}

func compilePathMatch(pm *meshv1.PathMatch) (pathMatch, error) {
	if pm == nil {
		return defaultPathMatch, nil
	}
	v := pm.GetValue()
	switch pm.GetType() {
	case meshv1.PathMatch_REGULAR_EXPRESSION:
		re, err := compileFullMatch(v)
		if err != nil {
			return pathMatch{}, fmt.Errorf("path regular expression: %w", err)
		}
		return pathMatch{kind: pathRegex, value: v, re: re}, nil
	case meshv1.PathMatch_EXACT, meshv1.PathMatch_PATH_PREFIX:
		n, err := normalizeEscapes(v)
		if err != nil {
			return pathMatch{}, fmt.Errorf("path %q: %w", v, err)
		}
		if removeDotSegments(n) != n {
			// Requests are matched in normal form, which has no dot segments.
			return pathMatch{}, fmt.Errorf("path %q has dot segments", v)
		}
		if pm.GetType() == meshv1.PathMatch_EXACT {
			return pathMatch{kind: pathExact, value: n}, nil
		}
		return pathMatch{kind: pathPrefix, value: n, trimmed: trimPrefixValue(n)}, nil
	}
	return pathMatch{}, fmt.Errorf("unknown path match type %v", pm.GetType())
}

func (m *pathMatch) matches(p string) bool {
	switch m.kind {
	case pathExact:
		return p == m.value
	case pathRegex:
		return m.re.MatchString(p)
	}
	return hasSegmentPrefix(p, m.trimmed)
}

// compileFullMatch compiles an RE2 expression that must match the whole input.
func compileFullMatch(expr string) (*regexp.Regexp, error) {
	if _, err := regexp.Compile(expr); err != nil {
		return nil, err // report the error against the expression as written
	}
	return regexp.Compile(`^(?:` + expr + `)$`)
}

// ---- headers and query parameters ----

type valueMatch struct {
	name  string // canonical header name, or query parameter name as written
	exact string
	re    *regexp.Regexp
}

func (m *valueMatch) matches(v string) bool {
	if m.re != nil {
		return m.re.MatchString(v)
	}
	return v == m.exact
}

func (m *valueMatch) String() string {
	if m.re != nil {
		return m.name + "~" + m.re.String()
	}
	return m.name + "=" + m.exact
}

// compileValueMatches compiles header (canonical=true) or query parameter
// matches. Of several entries with an equivalent name only the first counts,
// as the spec requires.
func compileValueMatches(ms []*meshv1.StringMatch, header bool) ([]valueMatch, error) {
	out := make([]valueMatch, 0, len(ms))
	seen := make(map[string]bool, len(ms))
	for _, m := range ms {
		name := m.GetName()
		if name == "" {
			return nil, fmt.Errorf("match without a name")
		}
		if header {
			name = http.CanonicalHeaderKey(name)
		}
		if seen[name] {
			continue
		}
		seen[name] = true
		vm := valueMatch{name: name}
		switch m.GetType() {
		case meshv1.StringMatch_EXACT:
			vm.exact = m.GetValue()
		case meshv1.StringMatch_REGULAR_EXPRESSION:
			re, err := compileFullMatch(m.GetValue())
			if err != nil {
				return nil, fmt.Errorf("%s: regular expression: %w", m.GetName(), err)
			}
			vm.re = re
		default:
			return nil, fmt.Errorf("%s: unknown match type %v", m.GetName(), m.GetType())
		}
		out = append(out, vm)
	}
	return out, nil
}

// ---- hostnames ----

type hostnames struct {
	exact    []string
	wildcard []string // "*.example.com", as configured (lower case)
}

func compileHostnames(hs []string) (hostnames, error) {
	var h hostnames
	for _, s := range hs {
		s = strings.ToLower(strings.TrimSuffix(s, "."))
		switch {
		case s == "":
			return hostnames{}, fmt.Errorf("empty hostname")
		case strings.HasPrefix(s, "*."):
			if len(s) < 3 || strings.Contains(s[2:], "*") {
				return hostnames{}, fmt.Errorf("hostname %q: the wildcard must be the whole first label", s)
			}
			h.wildcard = append(h.wildcard, s)
		case strings.Contains(s, "*"):
			return hostnames{}, fmt.Errorf("hostname %q: the wildcard must be the whole first label", s)
		default:
			h.exact = append(h.exact, s)
		}
	}
	return h, nil
}

func (h *hostnames) any() bool { return len(h.exact) == 0 && len(h.wildcard) == 0 }

// hostScore orders routes by hostname specificity: characters in a matching
// non-wildcard hostname, then characters in a matching hostname.
type hostScore struct{ exact, total int }

func (a hostScore) better(b hostScore) bool {
	if a.exact != b.exact {
		return a.exact > b.exact
	}
	return a.total > b.total
}

// score reports whether host matches and how specifically. A route without
// hostnames matches every host with the lowest score.
func (h *hostnames) score(host string) (hostScore, bool) {
	if h.any() {
		return hostScore{}, true
	}
	var best hostScore
	ok := false
	for _, e := range h.exact {
		if e == host {
			return hostScore{exact: len(e), total: len(e)}, true
		}
	}
	for _, w := range h.wildcard {
		suffix := w[1:] // ".example.com"
		if len(host) > len(suffix) && strings.HasSuffix(host, suffix) {
			if s := (hostScore{total: len(w)}); !ok || s.better(best) {
				best, ok = s, true
			}
		}
	}
	return best, ok
}

// intersects reports whether some host matches both sets (used to resolve
// HTTPRoute/GRPCRoute conflicts on one parent).
func (h *hostnames) intersects(o *hostnames) bool {
	if h.any() || o.any() {
		return true
	}
	for _, a := range h.exact {
		if _, ok := o.score(a); ok {
			return true
		}
	}
	for _, b := range o.exact {
		if _, ok := h.score(b); ok {
			return true
		}
	}
	for _, a := range h.wildcard {
		for _, b := range o.wildcard {
			if strings.HasSuffix(a, b[1:]) || strings.HasSuffix(b, a[1:]) {
				return true
			}
		}
	}
	return false
}

// ---- route matches ----

type httpMatch struct {
	path    pathMatch
	method  string
	headers []valueMatch
	query   []valueMatch
}

func compileHTTPMatch(m *meshv1.HTTPRouteMatch) (httpMatch, error) {
	var hm httpMatch
	var err error
	if hm.path, err = compilePathMatch(m.GetPath()); err != nil {
		return httpMatch{}, err
	}
	if hm.headers, err = compileValueMatches(m.GetHeaders(), true); err != nil {
		return httpMatch{}, fmt.Errorf("header match: %w", err)
	}
	if hm.query, err = compileValueMatches(m.GetQueryParams(), false); err != nil {
		return httpMatch{}, fmt.Errorf("query parameter match: %w", err)
	}
	hm.method = m.GetMethod()
	return hm, nil
}

func (m *httpMatch) matches(v *reqView) bool {
	if m.method != "" && v.r.Method != m.method {
		return false
	}
	if !m.path.matches(v.path) || !v.headersMatch(m.headers) {
		return false
	}
	for i := range m.query {
		qv, ok := v.queryValue(m.query[i].name)
		if !ok || !m.query[i].matches(qv) {
			return false
		}
	}
	return true
}

// compare orders two HTTPRoute matches as the spec does: Exact path, then the
// longest PathPrefix, then method, header count, query parameter count.
// RegularExpression precedence is implementation-specific: here a regular
// expression ranks with prefixes by its length, after a prefix of equal length.
// It returns -1 when m comes first, 1 when o does, 0 on a tie.
func (m *httpMatch) compare(o *httpMatch) int {
	if (m.path.kind == pathExact) != (o.path.kind == pathExact) {
		return boolOrder(m.path.kind == pathExact)
	}
	if m.path.kind != pathExact {
		if len(m.path.value) != len(o.path.value) {
			return intOrder(len(m.path.value), len(o.path.value))
		}
		if m.path.kind != o.path.kind {
			return boolOrder(m.path.kind == pathPrefix)
		}
	}
	if (m.method != "") != (o.method != "") {
		return boolOrder(m.method != "")
	}
	if len(m.headers) != len(o.headers) {
		return intOrder(len(m.headers), len(o.headers))
	}
	if len(m.query) != len(o.query) {
		return intOrder(len(m.query), len(o.query))
	}
	return 0
}

type grpcMatch struct {
	service, method     string // as configured; "" matches any
	serviceRe, methodRe *regexp.Regexp
	headers             []valueMatch
}

func compileGRPCMatch(m *meshv1.GRPCRouteMatch) (grpcMatch, error) {
	var gm grpcMatch
	var err error
	if mm := m.GetMethod(); mm != nil {
		gm.service, gm.method = mm.GetService(), mm.GetMethod()
		switch mm.GetType() {
		case meshv1.GRPCMethodMatch_EXACT:
			if strings.Contains(gm.service, "/") || strings.Contains(gm.method, "/") {
				return grpcMatch{}, fmt.Errorf("exact gRPC service and method must not contain /")
			}
		case meshv1.GRPCMethodMatch_REGULAR_EXPRESSION:
			if gm.service != "" {
				if gm.serviceRe, err = compileFullMatch(gm.service); err != nil {
					return grpcMatch{}, fmt.Errorf("gRPC service regular expression: %w", err)
				}
			}
			if gm.method != "" {
				if gm.methodRe, err = compileFullMatch(gm.method); err != nil {
					return grpcMatch{}, fmt.Errorf("gRPC method regular expression: %w", err)
				}
			}
		default:
			return grpcMatch{}, fmt.Errorf("unknown gRPC method match type %v", mm.GetType())
		}
	}
	if gm.headers, err = compileValueMatches(m.GetHeaders(), true); err != nil {
		return grpcMatch{}, fmt.Errorf("header match: %w", err)
	}
	return gm, nil
}

func (m *grpcMatch) matches(v *reqView) bool {
	if !v.grpc {
		return false
	}
	if m.service != "" || m.method != "" {
		if v.svc == "" {
			return false // not a well-formed gRPC path
		}
		if !matchPart(m.service, m.serviceRe, v.svc) || !matchPart(m.method, m.methodRe, v.method) {
			return false
		}
	}
	return v.headersMatch(m.headers)
}

func matchPart(exact string, re *regexp.Regexp, v string) bool {
	switch {
	case re != nil:
		return re.MatchString(v)
	case exact != "":
		return v == exact
	}
	return true
}

// compare orders GRPCRoute matches: characters in the service, in the
// method, then header count.
func (m *grpcMatch) compare(o *grpcMatch) int {
	if len(m.service) != len(o.service) {
		return intOrder(len(m.service), len(o.service))
	}
	if len(m.method) != len(o.method) {
		return intOrder(len(m.method), len(o.method))
	}
	if len(m.headers) != len(o.headers) {
		return intOrder(len(m.headers), len(o.headers))
	}
	return 0
}

// intOrder returns -1 when a should come first (is larger), 1 otherwise.
func intOrder(a, b int) int {
	if a > b {
		return -1
	}
	return 1
}

// boolOrder returns -1 when the first operand has the property.
func boolOrder(firstHas bool) int {
	if firstHas {
		return -1
	}
	return 1
}
