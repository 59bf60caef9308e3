package l7

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/causeway-mesh/causeway/pkg/l7/h1"
)

// serveHTTP handles one request on a tunnel.
func (e *Engine) serveHTTP(w http.ResponseWriter, r *http.Request, info *tunnel) {
	x := &exchange{e: e, info: info, start: time.Now(), ctx: r.Context(), orig: r, rec: record{grpcCode: -1}}
	x.rw.ResponseWriter = w
	rw := &x.rw
	if e.opts.Tracer != nil {
		x.startServerSpan(e.opts.Tracer)
	}
	completed := false
	defer func() {
		// A response that fails midway is aborted with http.ErrAbortHandler
		// (the client sees a reset); it is still logged and counted.
		status := e.observe(x, rw, !completed)
		if x.spans.server != nil {
			x.endSpans(status, rw)
		}
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
		why := " has no endpoints"
		if b.missing {
			why = ": service not found"
		}
		x.reply(w, http.StatusServiceUnavailable, "no healthy upstream: backend "+x.rec.backend+why, nil)
		return
	}
	x.rec.endpoint, x.rec.ep = x.first.addr, x.first
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
		x.proto = x.autoProto()
	}
	x.first = pickEndpoint(x.endpoints, nil)
}

// autoProto is the protocol spoken to a backend port that declares none.
// In the mesh, as the caller spoke: it addressed the backend itself. At an
// ingress gateway the client spoke to the gateway (HTTP/2 is what TLS
// clients negotiate there), which says nothing of the backend: HTTP/1.1,
// which every HTTP backend speaks, but HTTP/2 for gRPC, which has no
// other.
func (x *exchange) autoProto() upstreamProto {
	switch {
	case x.orig.ProtoMajor != 2:
		return upstreamH1
	case x.info.Ingress && !x.view.grpc:
		return upstreamH1
	}
	return upstreamH2
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

// workloadRule serves a workload-addressed destination: no routes, the
// workload itself.
var workloadRule = &rule{retry: defaultRetry}

// selectRule finds the rule (and for workload destinations, the endpoint).
// Without one it returns what to answer once the policy has allowed it.
func (x *exchange) selectRule() *localAnswer {
	if x.info.Ingress {
		return x.selectListenerRule()
	}
	if x.info.Service.IsZero() {
		t, ok := x.snap.workloadTarget(x.info.Destination)
		if !ok {
			return &localAnswer{http.StatusServiceUnavailable, "unknown destination workload " + x.info.Destination.String()}
		}
		x.rule = workloadRule
		x.backend = &backend{backendDest: backendDest{proto: upstreamFor(x.info.Protocol.String())}, weight: 1}
		if x.info.Protocol == ProtocolHTTP {
			x.backend.proto = upstreamAuto
		}
		x.rec.backend = t.Address.String()
		x.endpoints = endpointTiers{{x.e.pools.get(t)}}
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

// selectListenerRule routes a request that came to an ingress gateway:
// the listener of its port that its host selects (listener isolation: a
// host a more specific listener names is never served by a broader one),
// then that listener's routes. A TLS connection belongs to the listener
// its server name chose; a request on it for a host another listener
// serves is misdirected (421, as GEP-3567 has it), so a connection coalesced
// by an HTTP/2 client never reaches the other listener's routes.
func (x *exchange) selectListenerRule() *localAnswer {
	l, ok := x.snap.cfg.listenerFor(x.info.Port, x.view.host)
	switch {
	case !ok:
		return &localAnswer{http.StatusNotFound, fmt.Sprintf("no listener of port %d serves host %q", x.info.Port, x.view.host)}
	case x.info.Listener != "" && l.name != x.info.Listener:
		return &localAnswer{http.StatusMisdirectedRequest, fmt.Sprintf("host %q is served by listener %s, the connection's server name chose %s", x.view.host, l.name, x.info.Listener)}
	}
	x.rec.listener = l.name
	if x.rule = l.table.route(x.view); x.rule == nil {
		return &localAnswer{http.StatusNotFound, "no matching route on listener " + l.name}
	}
	return nil
}

// applyFilters runs filters in order on the outgoing request. It reports
// whether the exchange is finished (a redirect or a CORS preflight answered).
func (x *exchange) applyFilters(w *responseRecorder, fs []filter) bool {
	for i := range fs {
		if fs[i].kind == filterResponseHeaders {
			x.resp.mods = append(x.resp.mods, fs[i].headers)
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
			loc := f.redirect.location(x.out, x.path, x.rule.prefix, x.info.Port, x.info.TLS)
			x.rec.reason = "redirect"
			h := w.Header()
			h.Set("Location", loc)
			x.resp.apply(h)
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
				x.resp.add(h, true)
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
		x.resp.add(d.ResponseHeadersToAdd, false)
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
