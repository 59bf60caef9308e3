package l7

import (
	"context"
	"maps"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/causeway-mesh/causeway/pkg/l7/h1"
)

// One request's state as it passes through the engine, and the parts that
// state is made of. The files above this one add the exchange's phases:
// observe, reply, attempt, forward, mirror, and proxy, which runs them.

// exchange is one request's journey through the engine: one allocation
// holding the request's state, grouped by the phase that fills it in.
type exchange struct {
	e     *Engine
	info  *tunnel
	snap  *snapshot
	start time.Time
	ctx   context.Context // the request's, with its timeout
	orig  *http.Request   // as received, sanitized and normalized: what policy sees
	// deadline is the request timeout's; zero: none.
	deadline time.Time
	in       *countingBody
	requestBody
	view     *reqView // &viewData once made
	viewData reqView
	escPath  string // orig.URL.EscapedPath() when known, else ""

	// Routing (selectRule, chooseBackend) and the policy's question.
	rule      *rule
	backend   *backend
	endpoints endpointTiers
	first     *endpoint
	proto     upstreamProto
	authz     AuthzRequest // what the Authorizer is asked

	// out is what goes upstream, filters applied. It shares orig's header
	// map and URL until a filter changes them (ownOut): the proxy copies
	// the request it sends anyway.
	out      *http.Request
	outReq   http.Request // what out points to: one allocation with the exchange
	outOwned bool
	path     string // out's escaped path
	// An allow's request header changes, applied to the proxy's copy of
	// the request (rewrite).
	policyRemove []string
	policySet    http.Header
	mirrors      []mirrorShot
	resp         responseChanges

	// The upstream exchange (forward, attempt). up is the upstream
	// request's header (outgoing), in upFields while it fits; inlineUp:
	// the inline transport sends it, from up.
	up       h1.Fields
	upFields [8]h1.Field
	inlineUp bool
	// wantRaw: forward can pass a response's fields on as they came
	// (nothing changes them), so the inline transport leaves them in raw.
	wantRaw bool
	raw     h1.RawFields
	// try1 holds the first attempt's request, URL and body wrapper, made
	// with the exchange; a retry makes its own (the first attempt's may
	// still be referenced).
	try1 struct {
		used bool
		req  http.Request
		url  url.URL
		body releaseBody
	}
	interimState

	rw    responseRecorder // the caller's writer
	rec   record
	spans spans // with Options.Tracer
}

func (x *exchange) bytesIn() int64 {
	if x.in == nil {
		return 0
	}
	return x.in.n.Load()
}

// spans are an exchange's spans (trace.go); server is nil when the request
// is not traced (no tracer). A span that is not sampled still carries the
// trace context upstream, so the upstream keeps the decision.
type spans struct {
	server trace.Span
	client trace.Span // the attempt in progress, or the last one
}

type exchangeKey struct{}

// origPath is the request's escaped path as received (normalized).
func (x *exchange) origPath() string {
	if x.escPath != "" {
		return x.escPath
	}
	return x.orig.URL.EscapedPath()
}

// interimState is what Got1xx needs: set per request in outgoing.
type interimState struct {
	interim     sync.Mutex
	interimDone bool
	interimTo   *responseRecorder
	trace       httptrace.ClientTrace
}

// Got1xx (h1.Interim) passes an informational response on to the caller,
// until the final response has arrived.
func (s *interimState) Got1xx(code int, hdr textproto.MIMEHeader) error {
	if code == http.StatusContinue {
		// The caller's server sent its own when the body was first read
		// (Expect is not forwarded): one 100 Continue per request.
		return nil
	}
	s.interim.Lock()
	defer s.interim.Unlock()
	if s.interimDone {
		return nil
	}
	h := s.interimTo.Header()
	maps.Copy(h, http.Header(hdr))
	s.interimTo.WriteHeader(code)
	clear(h) // a 1xx's headers are not the final response's
	return nil
}

// mirrorShot is a request as it stood when a RequestMirror filter ran.
type mirrorShot struct {
	backend *backendDest
	method  string
	url     url.URL
	host    string
	header  http.Header
}
