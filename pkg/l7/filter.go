package l7

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"

	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

type filterKind uint8

const (
	filterRequestHeaders filterKind = iota
	filterResponseHeaders
	filterRedirect
	filterRewrite
	filterMirror
	filterCORS
)

var filterNames = [...]string{"RequestHeaderModifier", "ResponseHeaderModifier", "RequestRedirect", "URLRewrite", "RequestMirror", "CORS"}

func (k filterKind) String() string { return filterNames[k] }

type filter struct {
	kind     filterKind
	headers  *headerMod
	redirect *redirectSpec
	rewrite  *rewriteSpec
	mirror   *mirrorSpec
	cors     *corsSpec
}

// ---- header modifiers ----

type header struct{ name, value string }

type headerMod struct {
	set    []header
	add    []header
	remove []string
}

func compileHeaderMod(m *meshv1.HeaderModifier) (*headerMod, error) {
	hm := &headerMod{}
	for _, h := range m.GetSet() {
		if strings.EqualFold(h.GetName(), "host") {
			// Setting Host is how a route rewrites the authority; see setHost.
			if err := checkHostname(hostWithoutPort(h.GetValue())); err != nil || h.GetValue() == "" {
				return nil, fmt.Errorf("invalid Host value %q", h.GetValue())
			}
			hm.set = append(hm.set, header{"Host", h.GetValue()})
			continue
		}
		if err := checkHeader(h.GetName(), h.GetValue()); err != nil {
			return nil, err
		}
		hm.set = append(hm.set, header{http.CanonicalHeaderKey(h.GetName()), h.GetValue()})
	}
	for _, h := range m.GetAdd() {
		if err := checkHeader(h.GetName(), h.GetValue()); err != nil {
			return nil, err
		}
		hm.add = append(hm.add, header{http.CanonicalHeaderKey(h.GetName()), h.GetValue()})
	}
	for _, n := range m.GetRemove() {
		if err := checkHeader(n, ""); err != nil {
			return nil, err
		}
		hm.remove = append(hm.remove, http.CanonicalHeaderKey(n))
	}
	return hm, nil
}

func checkHeader(name, value string) error {
	if !httpguts.ValidHeaderFieldName(name) {
		return fmt.Errorf("invalid header name %q", name)
	}
	if !httpguts.ValidHeaderFieldValue(value) {
		return fmt.Errorf("invalid value for header %s", name)
	}
	switch strings.ToLower(name) {
	case "host", "connection", "transfer-encoding", "content-length", "upgrade", "te", "keep-alive", "proxy-connection":
		// Framing and hop-by-hop headers belong to the proxy, not to routes.
		return fmt.Errorf("header %s cannot be modified", name)
	}
	return nil
}

// apply removes, then sets, then appends (Envoy's order). An added value
// joins an existing one with "," as in the Gateway API example
// ("my-header: foo" + add "bar,baz" = "my-header: foo,bar,baz"); Set-Cookie,
// which cannot be joined, gets another field line.
func (m *headerMod) apply(h http.Header) {
	for _, n := range m.remove {
		delete(h, n)
	}
	for _, s := range m.set {
		h[s.name] = []string{s.value}
	}
	for _, a := range m.add {
		old := h[a.name]
		if len(old) == 0 || a.name == "Set-Cookie" {
			h[a.name] = append(old, a.value)
			continue
		}
		h[a.name] = []string{strings.Join(old, ",") + "," + a.value}
	}
}

// ---- path modifiers, redirects, rewrites ----

type pathMod struct {
	prefix bool // ReplacePrefixMatch; otherwise ReplaceFullPath
	value  string
}

// hasPrefix: the rule has exactly one PathPrefix match (ReplacePrefixMatch
// needs it).
func compilePathMod(p *meshv1.PathModifier, hasPrefix bool) (*pathMod, error) {
	if p == nil {
		return nil, nil
	}
	v := p.GetValue()
	switch p.GetType() {
	case meshv1.PathModifier_REPLACE_FULL_PATH:
		if v == "" || v[0] != '/' {
			v = "/" + v
		}
	case meshv1.PathModifier_REPLACE_PREFIX_MATCH:
		if !hasPrefix {
			return nil, errors.New("ReplacePrefixMatch needs exactly one PathPrefix match in the rule")
		}
	default:
		return nil, fmt.Errorf("unknown path modifier %v", p.GetType())
	}
	if _, err := url.PathUnescape(v); err != nil {
		return nil, fmt.Errorf("path %q: %w", v, err)
	}
	if strings.ContainsAny(v, "?#") || !httpguts.ValidHeaderFieldValue(v) {
		return nil, fmt.Errorf("path %q: not a path", v)
	}
	return &pathMod{prefix: p.GetType() == meshv1.PathModifier_REPLACE_PREFIX_MATCH, value: v}, nil
}

// rewritten applies the modifier to the escaped path p of a request the rule
// matched with its PathPrefix rulePrefix.
func (m *pathMod) rewritten(p, rulePrefix string) string {
	if !m.prefix {
		return m.value
	}
	return replacePrefix(p, rulePrefix, m.value)
}

// hostPath is what redirects and rewrites both replace: the hostname
// ("": kept) and the path (nil: kept).
type hostPath struct {
	hostname string
	path     *pathMod
}

func compileHostPath(hostname string, p *meshv1.PathModifier, hasPrefix bool) (hostPath, error) {
	if err := checkHostname(hostname); err != nil {
		return hostPath{}, err
	}
	pm, err := compilePathMod(p, hasPrefix)
	return hostPath{hostname: hostname, path: pm}, err
}

type redirectSpec struct {
	hostPath
	scheme string
	port   uint32
	status int
}

func compileRedirect(r *meshv1.RequestRedirect, hasPrefix bool) (*redirectSpec, error) {
	s := &redirectSpec{scheme: strings.ToLower(r.GetScheme()), port: r.GetPort(), status: int(r.GetStatusCode())}
	switch s.scheme {
	case "", "http", "https":
	default:
		return nil, fmt.Errorf("scheme %q not supported", r.GetScheme())
	}
	switch s.status {
	case 0:
		s.status = http.StatusFound
	case 301, 302, 303, 307, 308:
	default:
		return nil, fmt.Errorf("status %d not supported", s.status)
	}
	if s.port > 65535 {
		return nil, fmt.Errorf("port %d out of range", s.port)
	}
	var err error
	if s.hostPath, err = compileHostPath(r.GetHostname(), r.GetPath(), hasPrefix); err != nil {
		return nil, err
	}
	return s, nil
}

func checkHostname(h string) error {
	if h == "" {
		return nil
	}
	if strings.ContainsAny(h, "/?#@:[] ") || !httpguts.ValidHostHeader(h) {
		return fmt.Errorf("invalid hostname %q", h)
	}
	return nil
}

// location builds the Location of a redirect. Without a configured scheme
// it is the request's own: http inside a tunnel (cleartext), https on an
// ingress listener that terminated TLS (tls). Without a configured port
// the port is the scheme's well-known port when a scheme is configured,
// otherwise the listener's (the service port); 80 for http and 443 for https
// are left out, as the spec says they should be.
func (s *redirectSpec) location(r *http.Request, path, rulePrefix string, listenerPort uint32, tls bool) string {
	scheme := s.scheme
	var port uint32
	switch {
	case s.port != 0:
		port = s.port
	case scheme == "https":
		port = 443
	case scheme == "http":
		port = 80
	default:
		port = listenerPort
	}
	switch {
	case scheme != "":
	case tls:
		scheme = "https"
	default:
		scheme = "http"
	}
	host := s.hostname
	if host == "" {
		host = hostWithoutPort(r.Host)
	}
	if scheme == "http" && port == 80 || scheme == "https" && port == 443 || port == 0 {
		if strings.Contains(host, ":") {
			host = "[" + host + "]"
		}
	} else {
		host = net.JoinHostPort(host, strconv.FormatUint(uint64(port), 10))
	}
	if s.path != nil {
		path = s.path.rewritten(path, rulePrefix)
	}
	loc := scheme + "://" + host + path
	if r.URL.RawQuery != "" {
		loc += "?" + r.URL.RawQuery
	}
	return loc
}

func hostWithoutPort(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		return host
	}
	return strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
}

type rewriteSpec struct{ hostPath }

func compileRewrite(r *meshv1.URLRewrite, hasPrefix bool) (*rewriteSpec, error) {
	hp, err := compileHostPath(r.GetHostname(), r.GetPath(), hasPrefix)
	if err != nil {
		return nil, err
	}
	return &rewriteSpec{hp}, nil
}

// ---- mirror ----

type mirrorSpec struct {
	backend *backendDest
	percent float64
}

// ---- CORS ----

type originPattern struct {
	any    bool // "*"
	scheme string
	prefix string // host text before "*" (or the whole host)
	suffix string // host text after "*"
	star   bool
	port   string
}

type corsSpec struct {
	origins     []originPattern
	credentials bool
	methods     []string
	anyMethod   bool
	headers     []string
	anyHeader   bool
	expose      []string
	anyExpose   bool
	maxAge      int32
}

func compileCORS(m *meshv1.CORS) (*corsSpec, error) {
	s := &corsSpec{credentials: m.GetAllowCredentials(), maxAge: m.GetMaxAgeSeconds()}
	for _, o := range m.GetAllowOrigins() {
		p, err := parseOriginPattern(o)
		if err != nil {
			return nil, err
		}
		s.origins = append(s.origins, p)
	}
	for _, v := range m.GetAllowMethods() {
		if v == "*" {
			s.anyMethod = true
			continue
		}
		if !httpguts.ValidHeaderFieldName(v) {
			return nil, fmt.Errorf("invalid method %q", v)
		}
		s.methods = append(s.methods, v)
	}
	var err error
	if s.headers, s.anyHeader, err = headerNameList(m.GetAllowHeaders()); err != nil {
		return nil, err
	}
	if s.expose, s.anyExpose, err = headerNameList(m.GetExposeHeaders()); err != nil {
		return nil, err
	}
	if s.maxAge < 0 {
		return nil, fmt.Errorf("negative max age")
	}
	return s, nil
}

func headerNameList(names []string) ([]string, bool, error) {
	var out []string
	anyName := false
	for _, n := range names {
		if n == "*" {
			anyName = true
			continue
		}
		if !httpguts.ValidHeaderFieldName(n) {
			return nil, false, fmt.Errorf("invalid header name %q", n)
		}
		out = append(out, n)
	}
	return out, anyName, nil
}

// parseOriginPattern parses "*" or "<scheme>://<host>[:<port>]" where the host
// may hold one "*" that matches one or more characters, dots included.
func parseOriginPattern(o string) (originPattern, error) {
	if o == "*" {
		return originPattern{any: true}, nil
	}
	scheme, host, port, ok := splitOrigin(o)
	if !ok {
		return originPattern{}, fmt.Errorf("invalid origin %q", o)
	}
	p := originPattern{scheme: scheme, port: port}
	if i := strings.IndexByte(host, '*'); i >= 0 {
		if strings.Count(host, "*") > 1 {
			return originPattern{}, fmt.Errorf("invalid origin %q: more than one wildcard", o)
		}
		p.star, p.prefix, p.suffix = true, host[:i], host[i+1:]
	} else {
		p.prefix = host
	}
	return p, nil
}

// splitOrigin splits a serialized origin, filling in the scheme's default port.
func splitOrigin(o string) (scheme, host, port string, ok bool) {
	scheme, rest, ok := strings.Cut(o, "://")
	if !ok || rest == "" || strings.ContainsAny(rest, "/?#@ ") {
		return "", "", "", false
	}
	scheme = strings.ToLower(scheme)
	switch scheme {
	case "http":
		port = "80"
	case "https":
		port = "443"
	default:
		return "", "", "", false
	}
	host = rest
	if h, p, err := net.SplitHostPort(rest); err == nil {
		if n, err := strconv.ParseUint(p, 10, 16); err != nil || n == 0 {
			return "", "", "", false
		}
		host, port = h, p
	}
	if host == "" {
		return "", "", "", false
	}
	return scheme, strings.ToLower(host), port, true
}

func (s *corsSpec) allows(origin string) bool {
	for _, p := range s.origins {
		if p.any {
			return true
		}
	}
	scheme, host, port, ok := splitOrigin(origin)
	if !ok {
		return false
	}
	for _, p := range s.origins {
		if p.scheme != scheme || p.port != port {
			continue
		}
		if !p.star {
			if host == p.prefix {
				return true
			}
			continue
		}
		if len(host) > len(p.prefix)+len(p.suffix) && strings.HasPrefix(host, p.prefix) && strings.HasSuffix(host, p.suffix) {
			return true
		}
	}
	return false
}

// preflight answers a CORS preflight request: 204, with the CORS headers
// only when the origin is allowed. Access-Control-Expose-Headers goes on
// it too, as Envoy sends it and the Gateway API's CORS filter wants on
// every allowed response: browsers read it from the actual response only,
// and it costs nothing here.
func (s *corsSpec) preflight(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	origin := r.Header.Get("Origin")
	h.Add("Vary", "Origin")
	if s.allows(origin) {
		h.Set("Access-Control-Allow-Origin", origin)
		if s.credentials {
			h.Set("Access-Control-Allow-Credentials", "true")
		}
		if reqMethod := r.Header.Get("Access-Control-Request-Method"); reqMethod != "" && (s.anyMethod || len(s.methods) > 0) {
			switch {
			case s.anyMethod && s.credentials:
				h.Set("Access-Control-Allow-Methods", reqMethod)
			case s.anyMethod:
				h.Set("Access-Control-Allow-Methods", "*")
			default:
				h.Set("Access-Control-Allow-Methods", strings.Join(s.methods, ", "))
			}
		}
		if reqHeaders := r.Header.Values("Access-Control-Request-Headers"); len(reqHeaders) > 0 && (s.anyHeader || len(s.headers) > 0) {
			switch {
			case s.anyHeader && s.credentials:
				h.Set("Access-Control-Allow-Headers", strings.Join(reqHeaders, ", "))
			case s.anyHeader:
				h.Set("Access-Control-Allow-Headers", "*")
			default:
				h.Set("Access-Control-Allow-Headers", strings.Join(s.headers, ", "))
			}
		}
		s.setExpose(h)
		if s.maxAge > 0 {
			h.Set("Access-Control-Max-Age", strconv.Itoa(int(s.maxAge)))
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// responseHeaders returns the headers an actual cross-origin request's
// response gets, or nil when the request is not cross-origin or not allowed.
func (s *corsSpec) responseHeaders(r *http.Request) http.Header {
	origin := r.Header.Get("Origin")
	if origin == "" || !s.allows(origin) {
		return nil
	}
	h := http.Header{"Access-Control-Allow-Origin": {origin}, "Vary": {"Origin"}}
	if s.credentials {
		h.Set("Access-Control-Allow-Credentials", "true")
	}
	s.setExpose(h)
	return h
}

// setExpose sets Access-Control-Expose-Headers: "*" means every header
// only without credentials (with them the browser reads it as a name), so
// it is sent only then.
func (s *corsSpec) setExpose(h http.Header) {
	switch {
	case s.anyExpose && !s.credentials:
		h.Set("Access-Control-Expose-Headers", "*")
	case len(s.expose) > 0:
		h.Set("Access-Control-Expose-Headers", strings.Join(s.expose, ", "))
	}
}

func isPreflight(r *http.Request) bool {
	return r.Method == http.MethodOptions && r.Header.Get("Origin") != "" && r.Header.Get("Access-Control-Request-Method") != ""
}
