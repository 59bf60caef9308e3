package l7

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/causeway-mesh/causeway/pkg/l7/h1"
)

// SourcePrincipalHeader carries the caller's authenticated identity to the
// destination. The waypoint removes it from every incoming request and sets
// it only from the tunnel's authenticated peer, so the destination can trust
// it because it arrived from the waypoint.
const SourcePrincipalHeader = "X-Causeway-Source-Principal"

// identityHeaders are request headers that claim a client identity. They are
// removed from every request before routing and authorization: an identity
// comes from the tunnel's certificate and nothing else. Headers with the
// X-Causeway- prefix are reserved for the mesh and removed as well.
var identityHeaders = map[string]bool{
	"X-Forwarded-Client-Cert":  true, // Envoy XFCC
	"Client-Cert":              true, // RFC 9440
	"Client-Cert-Chain":        true, // RFC 9440
	"X-Client-Cert":            true,
	"X-Ssl-Client-Cert":        true,
	"Ssl-Client-Cert":          true,
	"X-Ssl-Client-Dn":          true,
	"X-Ssl-Client-Verify":      true,
	"X-Envoy-Peer-Metadata":    true,
	"X-Envoy-Peer-Metadata-Id": true,
	"X-Istio-Attributes":       true,
}

const reservedPrefix = "X-Causeway-"

// sanitizeIdentity removes identity claims from a header map: the identity
// headers, the mesh's reserved ones, and any name that reads as one of
// those, or as a forwarding or framing field, once its '_' are taken for
// '-'. Upstreams that fold '_' into '-' (CGI, WSGI and Rack environments
// make both HTTP_X_...) would take such a field for the real one, which
// the waypoint sets or strips. Other names with '_' pass, as with Envoy's
// default headers_with_underscores_action.
func sanitizeIdentity(h http.Header) {
	for k := range h {
		if claimsIdentity(k) {
			delete(h, k)
		}
	}
}

// claimsIdentity reports whether the canonical header name k is one
// sanitizeIdentity removes.
func claimsIdentity(k string) bool {
	if identityHeaders[k] || strings.HasPrefix(k, reservedPrefix) {
		return true
	}
	if strings.IndexByte(k, '_') < 0 {
		return false
	}
	d := http.CanonicalHeaderKey(strings.ReplaceAll(k, "_", "-"))
	return identityHeaders[d] || strings.HasPrefix(d, reservedPrefix) || isForwarding(d) || h1.IsHopByHop(d) ||
		d == "Content-Length" || d == "Host"
}

// exchange is one request's journey through the engine.
type exchange struct {
	e     *Engine
	info  *tunnel
	snap  *snapshot
	start time.Time
	ctx   context.Context // the request's, with its timeout
	orig  *http.Request   // as received, sanitized and normalized: what policy sees
	// out is what goes upstream, filters applied. It shares orig's header
	// map and URL until a filter changes them (ownOut): the proxy copies
	// the request it sends anyway.
	out      *http.Request
	outReq   http.Request // what out points to: one allocation with the exchange
	outOwned bool
	view     *reqView // &viewData once made
	viewData reqView
	path     string // out's escaped path
	escPath  string // orig.URL.EscapedPath() when known, else ""

	rule      *rule
	backend   *backend
	endpoints []*endpoint
	first     *endpoint
	proto     upstreamProto
	authz     AuthzRequest // what the Authorizer is asked
	// try1 holds the first attempt's request, URL and body wrapper, made
	// with the exchange; a retry makes its own (the first attempt's may
	// still be referenced).
	try1 struct {
		used bool
		req  http.Request
		url  url.URL
		body releaseBody
	}

	in       *countingBody
	body     []byte // buffered body (all of it when bodyDone)
	bodyDone bool
	stream   *trackedBody // the unbuffered rest, when !bodyDone

	deadline    time.Time // request timeout; zero: none
	respMods    []*headerMod
	respHeaders http.Header // CORS and policy headers for the response
	// wantRaw: forward can pass a response's fields on as they came
	// (nothing changes them), so the inline transport leaves them in raw.
	wantRaw bool
	raw     h1.RawFields
	// up is the upstream request's header (outgoing), in upFields while it
	// fits; inlineUp: the inline transport sends it, from up.
	up       h1.Fields
	upFields [8]h1.Field
	inlineUp bool
	// An allow's request header changes, applied to the proxy's copy of
	// the request (rewrite).
	policyRemove []string
	policySet    http.Header
	mirrors      []mirrorShot
	interimState

	rw  responseRecorder // the caller's writer
	rec record
}

func (x *exchange) bytesIn() int64 {
	if x.in == nil {
		return 0
	}
	return x.in.n.Load()
}

type exchangeKey struct{}

// serveHTTP handles one request on a tunnel.
func (e *Engine) serveHTTP(w http.ResponseWriter, r *http.Request, info *tunnel) {
	x := &exchange{e: e, info: info, start: time.Now(), ctx: r.Context(), orig: r, rec: record{grpcCode: -1}}
	x.rw.ResponseWriter = w
	rw := &x.rw
	completed := false
	defer func() {
		// A response that fails midway is aborted with http.ErrAbortHandler
		// (the client sees a reset); it is still logged and counted.
		e.observe(x, rw, !completed)
	}()
	e.handle(x, rw)
	completed = true
}

func (e *Engine) handle(x *exchange, w *responseRecorder) {
	r := x.orig
	sanitizeIdentity(r.Header)
	r.RemoteAddr = x.info.source
	if r.Body != nil && r.Body != http.NoBody {
		x.in = &countingBody{ReadCloser: r.Body}
		r.Body = x.in
	}

	esc := r.URL.EscapedPath()
	path, err := normalizePath(esc)
	if err != nil {
		x.reply(w, http.StatusBadRequest, "bad request path: "+err.Error(), nil)
		return
	}
	if path != esc {
		if err := setEscapedPath(r.URL, path); err != nil {
			x.reply(w, http.StatusBadRequest, "bad request path: "+err.Error(), nil)
			return
		}
	} else {
		x.escPath = esc
	}
	x.path = path
	x.viewData = newReqView(r, path)
	x.view = &x.viewData

	x.snap = e.snap.Load()
	if x.snap == nil {
		x.reply(w, http.StatusServiceUnavailable, "no configuration yet", nil)
		return
	}
	// The policy decides before anything is answered locally, as Envoy
	// runs ext_authz before its router: a caller it denies learns nothing
	// of routes, redirects or endpoint health (only the request's own
	// framing errors, above and in readBody, come first).
	local := x.selectRule()
	if x.rule != nil {
		x.rec.route, x.rec.rule = x.rule.routeName(), x.rule.name
	}
	ctx := x.ctx
	timeout := e.opts.DefaultRequestTimeout
	if ru := x.rule; ru != nil && (ru.requestTimeout != 0 || ru.requestTimeoutSet) {
		timeout = ru.requestTimeout
	}
	if timeout > 0 {
		x.deadline = x.start.Add(timeout)
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, x.deadline)
		defer cancel()
		x.ctx = ctx
	}
	// Same context as r unless a timeout was added: the upstream exchange
	// can then watch it cheaply (h1.Client watches a request's own
	// context without context.AfterFunc).
	x.outReq = *r.WithContext(ctx)
	x.out = &x.outReq
	x.dropConnectionOptions()
	if local == nil {
		x.chooseBackend()
	}
	if status, err := x.readBody(w); err != nil {
		x.reply(w, status, err.Error(), nil)
		return
	}
	if e.opts.PreflightBeforePolicy && local == nil && x.rule.invalid == "" && x.answerPreflight(w) {
		return
	}
	if !x.authorize(w) {
		return
	}
	if local != nil {
		x.reply(w, local.status, local.reason, nil)
		return
	}
	ru := x.rule
	if ru.invalid != "" {
		x.reply(w, http.StatusInternalServerError, "invalid rule: "+ru.invalid, nil)
		return
	}
	if x.applyFilters(w, ru.filters) {
		return
	}
	b := x.backend
	if b == nil {
		x.reply(w, http.StatusInternalServerError, "rule has no backend with a weight above 0", nil)
		return
	}
	if b.invalid != "" {
		x.reply(w, http.StatusInternalServerError, "invalid backend: "+b.invalid, nil)
		return
	}
	if x.applyFilters(w, b.filters) {
		return
	}
	if x.first == nil {
		x.reply(w, http.StatusServiceUnavailable, "no healthy upstream: backend "+x.rec.backend+" has no endpoints", nil)
		return
	}
	x.rec.endpoint = x.first.addr
	x.fireMirrors()
	if upgradeRequested(x.out.Header) {
		e.proxy.ServeHTTP(w, x.out.WithContext(context.WithValue(x.out.Context(), exchangeKey{}, x)))
		return
	}
	x.forward(w)
}

// localAnswer is a response the waypoint makes itself, held until the
// policy has allowed the request.
type localAnswer struct {
	status int
	reason string
}

// chooseBackend picks the rule's backend and the endpoint the request goes
// to first, so that the policy knows the destination. Nothing is answered
// here: a rule without a usable backend is answered after the policy.
func (x *exchange) chooseBackend() {
	if x.backend == nil {
		b := x.rule.wrr.next()
		if b == nil {
			return
		}
		x.backend = b
		x.rec.backend = b.name
		if b.invalid != "" {
			return
		}
		x.endpoints = x.snap.eps[tableKey{b.svc, b.port}]
	}
	x.proto = x.backend.proto
	if x.proto == upstreamAuto {
		x.proto = upstreamH1
		if x.orig.ProtoMajor == 2 {
			x.proto = upstreamH2
		}
	}
	x.first = pickEndpoint(x.endpoints, nil)
}

// answerPreflight answers a CORS preflight from the rule's CORS filter
// before the policy (Options.PreflightBeforePolicy): browsers send
// preflights without credentials, so a policy that requires them would
// refuse every cross-origin call. A redirect ahead of the CORS filter
// takes precedence, as in applyFilters.
func (x *exchange) answerPreflight(w *responseRecorder) bool {
	if !isPreflight(x.orig) {
		return false
	}
	for i := range x.rule.filters {
		switch f := &x.rule.filters[i]; f.kind {
		case filterRedirect:
			return false
		case filterCORS:
			x.rec.reason = "cors preflight (before policy)"
			f.cors.preflight(w, x.orig)
			return true
		}
	}
	return false
}

// origPath is the request's escaped path as received (normalized).
func (x *exchange) origPath() string {
	if x.escPath != "" {
		return x.escPath
	}
	return x.orig.URL.EscapedPath()
}

// workloadRule serves a workload-addressed destination: no routes, the
// workload itself.
var workloadRule = &rule{retry: defaultRetry}

// selectRule finds the rule (and for workload destinations, the endpoint).
// Without one it returns what to answer once the policy has allowed it.
func (x *exchange) selectRule() *localAnswer {
	if x.info.Service.IsZero() {
		t, ok := x.snap.workloadTarget(x.info.Destination)
		if !ok {
			return &localAnswer{http.StatusServiceUnavailable, "unknown destination workload " + x.info.Destination.String()}
		}
		x.rule = workloadRule
		x.backend = &backend{proto: upstreamFor(x.info.Protocol.String()), weight: 1}
		if x.info.Protocol == ProtocolHTTP {
			x.backend.proto = upstreamAuto
		}
		x.rec.backend = t.Address.String()
		x.endpoints = []*endpoint{x.e.pools.get(t)}
		return nil
	}
	table := x.snap.cfg.table(tableKey{x.info.Service, x.info.Port}, x.info.callerNS)
	if table == nil {
		return &localAnswer{http.StatusServiceUnavailable, fmt.Sprintf("unknown destination %s port %d", x.info.Service, x.info.Port)}
	}
	x.rule = table.route(x.view)
	if x.rule == nil {
		return &localAnswer{http.StatusNotFound, "no matching route"}
	}
	return nil
}

// applyFilters runs filters in order on the outgoing request. It reports
// whether the exchange is finished (a redirect or a CORS preflight answered).
func (x *exchange) applyFilters(w *responseRecorder, fs []filter) bool {
	for i := range fs {
		if fs[i].kind == filterResponseHeaders {
			x.respMods = append(x.respMods, fs[i].headers)
		}
	}
	for i := range fs {
		f := &fs[i]
		switch f.kind {
		case filterRequestHeaders:
			x.ownOut()
			f.headers.apply(x.out.Header)
			if h, ok := x.out.Header["Host"]; ok {
				x.out.Host = h[0]
				delete(x.out.Header, "Host")
			}
		case filterRewrite:
			if f.rewrite.hostname != "" {
				x.out.Host = f.rewrite.hostname
			}
			if f.rewrite.path != nil {
				x.ownOut()
				p := f.rewrite.path.rewritten(x.path, x.rule.prefix)
				if err := setEscapedPath(x.out.URL, p); err != nil {
					x.reply(w, http.StatusInternalServerError, "path rewrite: "+err.Error(), nil)
					return true
				}
				x.path = p
			}
		case filterRedirect:
			loc := f.redirect.location(x.out, x.path, x.rule.prefix, x.info.Port)
			x.rec.reason = "redirect"
			h := w.Header()
			h.Set("Location", loc)
			x.applyResponseHeaders(h)
			w.WriteHeader(f.redirect.status)
			return true
		case filterMirror:
			if f.mirror.backend.invalid == "" && (f.mirror.percent >= 100 || rand.Float64()*100 < f.mirror.percent) {
				x.mirrors = append(x.mirrors, x.mirrorShot(f.mirror.backend))
			}
		case filterCORS:
			if isPreflight(x.orig) {
				x.rec.reason = "cors preflight"
				f.cors.preflight(w, x.orig)
				return true
			}
			if h := f.cors.responseHeaders(x.orig); h != nil {
				x.addResponseHeaders(h, true)
			}
		}
	}
	return false
}

// dropConnectionOptions removes from the outgoing request the fields its
// Connection header names (RFC 9110 section 7.6.1: they were meant for the
// waypoint), and those names from the Connection header, keeping the
// tokens the proxy acts on itself (close, upgrade, ...). It runs before route
// filters: the proxy's own removal by Connection happens later, and a
// client must not be able to strip the headers filters and policies add.
func (x *exchange) dropConnectionOptions() {
	var options, keep []string
	for _, v := range x.out.Header["Connection"] {
		for tok := range strings.SplitSeq(v, ",") {
			if tok = strings.TrimSpace(tok); tok == "" {
				continue
			}
			if k := http.CanonicalHeaderKey(tok); k == "Close" || h1.IsHopByHop(k) {
				keep = append(keep, tok)
			} else {
				options = append(options, k)
			}
		}
	}
	if len(options) == 0 {
		return
	}
	x.ownOut()
	h := x.out.Header
	for _, k := range options {
		delete(h, k)
	}
	if len(keep) == 0 {
		delete(h, "Connection")
	} else {
		h["Connection"] = []string{strings.Join(keep, ", ")}
	}
}

// ownOut gives the outgoing request its own header map and URL before a
// filter changes them.
func (x *exchange) ownOut() {
	if x.outOwned {
		return
	}
	x.outOwned = true
	x.out.Header = x.out.Header.Clone()
	u := *x.out.URL
	x.out.URL = &u
}

func (x *exchange) addResponseHeaders(h http.Header, set bool) {
	if x.respHeaders == nil {
		x.respHeaders = make(http.Header, len(h))
	}
	for k, vs := range h {
		k = http.CanonicalHeaderKey(k)
		if set {
			x.respHeaders[k] = append([]string(nil), vs...)
		} else {
			x.respHeaders[k] = append(x.respHeaders[k], vs...)
		}
	}
}

// applyResponseHeaders applies ResponseHeaderModifiers, then CORS and
// policy headers, to a response's headers.
func (x *exchange) applyResponseHeaders(h http.Header) {
	for _, m := range x.respMods {
		m.apply(h)
	}
	for k, vs := range x.respHeaders {
		if k == "Vary" {
			h[k] = append(h[k], vs...)
			continue
		}
		h[k] = vs
	}
}

// readBody buffers the request body for authorization and retries, within
// the limit and the request timeout. gRPC bodies are streams: they are never
// waited for.
func (x *exchange) readBody(w *responseRecorder) (int, error) {
	r := x.orig
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		x.bodyDone = true
		return 0, nil
	}
	limit := x.e.opts.MaxBufferedBody
	if limit < 0 || x.view.grpc {
		x.stream = &trackedBody{r: r.Body}
		return 0, nil
	}
	if !x.deadline.IsZero() {
		// Best effort: bounds a slow client by the request timeout.
		_ = http.NewResponseController(w).SetReadDeadline(x.deadline)
		defer func() { _ = http.NewResponseController(w).SetReadDeadline(time.Time{}) }()
	}
	n := limit
	if r.ContentLength > 0 && r.ContentLength < n {
		n = r.ContentLength
	}
	buf := make([]byte, 0, min(n+1, 64<<10))
	b := bytes.NewBuffer(buf)
	_, err := io.Copy(b, io.LimitReader(r.Body, limit+1))
	if err != nil {
		if !x.deadline.IsZero() && !time.Now().Before(x.deadline) {
			return http.StatusGatewayTimeout, errors.New("request timeout while reading the request body")
		}
		return http.StatusBadRequest, fmt.Errorf("reading request body: %w", err)
	}
	x.body = b.Bytes()
	if int64(len(x.body)) <= limit {
		x.bodyDone = true
		// Trailers arrive with the body and could claim an identity too.
		sanitizeIdentity(r.Trailer)
		x.out.Trailer = r.Trailer
		return 0, nil
	}
	// Over the limit: what was read goes first, the rest streams.
	x.stream = &trackedBody{r: io.MultiReader(bytes.NewReader(x.body), r.Body)}
	x.body = x.body[:limit]
	return 0, nil
}

// authorize asks the Authorizer and applies its decision.
func (x *exchange) authorize(w *responseRecorder) bool {
	x.authz = AuthzRequest{
		Request:       x.orig,
		Body:          x.body,
		BodyTruncated: !x.bodyDone,
		Peer:          x.info.Peer,
		Source:        x.info.Source,
		Destination:   x.info.Destination,
		Service:       x.info.Service,
		Port:          x.info.Port,
	}
	if x.first != nil {
		t := x.first.target.Load()
		x.authz.Destination, x.authz.DestinationIdentity = t.Address, t.Identity
	}
	if x.rule != nil {
		x.authz.Route, x.authz.Rule = x.rule.routeName(), x.rule.name
	}
	d := x.e.decide(x.ctx, &x.authz)
	x.rec.decID = d.ID
	if !d.Allowed && x.ctx.Err() != nil {
		// The request ended while it was decided: the denial is an
		// evaluation cut short, not the policy's answer.
		x.cancelled(w, " during authorization")
		return false
	}
	x.rec.reason = d.Reason
	if !d.Allowed {
		x.rec.decision = "deny"
		status := d.Status
		if status < 300 || status > 599 {
			status = http.StatusForbidden
		}
		body := d.Body
		if len(body) == 0 {
			body = []byte("RBAC: access denied\n")
		}
		x.reply(w, status, "", d.Headers, body...)
		return false
	}
	x.rec.decision = "allow"
	x.policyRemove, x.policySet = d.RequestHeadersToRemove, d.Headers
	if len(d.ResponseHeadersToAdd) > 0 {
		x.addResponseHeaders(d.ResponseHeadersToAdd, false)
	}
	return true
}

// decide asks the Authorizer; one that panics denies with 500 (fail closed)
// instead of taking the connection down.
func (e *Engine) decide(ctx context.Context, req *AuthzRequest) (d Decision) {
	defer func() {
		if p := recover(); p != nil {
			e.log.Error("authorizer panicked", zap.Any("panic", p), zap.String("route", req.Route))
			d = Decision{Allowed: false, Status: http.StatusInternalServerError, Reason: fmt.Sprintf("authorizer panicked: %v", p)}
		}
	}()
	return e.opts.Authorizer.Authorize(ctx, req)
}

// setForwarding adds the caller's address to X-Forwarded-For and Forwarded
// (after what earlier proxies wrote: that part is informational only), and
// passes X-Forwarded-Host and -Proto on from in.
func setForwarding(out *h1.Fields, in http.Header, t *tunnel) {
	if prior := in.Values("X-Forwarded-For"); len(prior) > 0 {
		out.Set("X-Forwarded-For", []string{strings.Join(prior, ", ") + ", " + t.forwardedFor})
	} else {
		out.Set("X-Forwarded-For", t.xffValues)
	}
	if prior := in.Values("Forwarded"); len(prior) > 0 {
		out.Set("Forwarded", []string{strings.Join(prior, ", ") + ", " + t.forwarded})
	} else {
		out.Set("Forwarded", t.forwardValues)
	}
	for _, k := range []string{"X-Forwarded-Host", "X-Forwarded-Proto"} {
		if v, ok := in[k]; ok {
			out.Set(k, v)
		}
	}
}

// setIdentity sets the identity header from the tunnel's peer, or removes
// it. Route filters and policy headers were applied after the request was
// sanitized: identity claims must not survive them either.
func setIdentity(l *h1.Fields, t *tunnel) {
	l.DeleteFunc(claimsIdentity)
	if t.identityValues != nil {
		l.Set(SourcePrincipalHeader, t.identityValues)
	}
}

// applyPolicyHeaders applies an allow's request header changes, last, as
// Envoy applies ext_authz's after its own forwarding headers. Hop-by-hop
// names are skipped: they describe the upstream connection, which is the
// proxy's. The values are shared, not copied (h1.Fields).
func applyPolicyHeaders(l *h1.Fields, remove []string, set http.Header) {
	for _, k := range remove {
		l.Del(http.CanonicalHeaderKey(k))
	}
	for k, vs := range set {
		k = http.CanonicalHeaderKey(k)
		if !h1.IsHopByHop(k) {
			l.Set(k, vs)
		}
	}
}

// forwardedElement is the caller's Forwarded (RFC 7239) element.
func forwardedElement(a netip.AddrPort) string {
	if a.Addr().Unmap().Is6() {
		return `for="[` + a.Addr().String() + "]:" + strconv.Itoa(int(a.Port())) + `"`
	}
	return `for="` + a.Addr().Unmap().String() + ":" + strconv.Itoa(int(a.Port())) + `"`
}

// rewrite is the ReverseProxy's request hook (upgrades). The request it
// receives is already the outgoing one, a copy; the proxy has stripped
// hop-by-hop and forwarding headers from it.
func (e *Engine) rewrite(pr *httputil.ProxyRequest) {
	x, _ := pr.In.Context().Value(exchangeKey{}).(*exchange)
	if x == nil {
		return
	}
	l := h1.FieldsOf(pr.Out.Header)
	x.setUpstreamHeaders(&l, pr.In.Header)
	pr.Out.Header = l.Header()
}

func (e *Engine) modifyResponse(resp *http.Response) error {
	x, _ := resp.Request.Context().Value(exchangeKey{}).(*exchange)
	if x != nil {
		x.applyResponseHeaders(resp.Header)
	}
	return nil
}

// upstreamBase appends to l the fields of in that an upstream request
// carries on: not hop-by-hop, not named by in's Connection header, not the
// forwarding headers the waypoint sets itself, not Expect (the caller's
// server answers 100-continue itself when the body is read, as Envoy does;
// the upstream gets the body without having to ask for it).
func upstreamBase(in http.Header, l h1.Fields) h1.Fields {
	for k, vv := range in {
		if !h1.IsHopByHop(k) && !isForwarding(k) && k != "Expect" {
			l = append(l, h1.Field{Name: k, Values: vv})
		}
	}
	for k := range h1.ConnectionOptions(in["Connection"]) {
		l.Del(k)
	}
	return l
}
