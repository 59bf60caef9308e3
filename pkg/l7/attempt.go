package l7

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"time"

	"github.com/causeway-mesh/causeway/pkg/l7/h1"
)

// Upstream attempts: the first on the endpoint the request was authorized
// for, retries (by the rule's policy, within the request's deadline) on
// other endpoints of the same identity, each with its backendRequest
// timeout, and the bodies that release an attempt's resources.

// roundTrip runs req's attempts (upstreamTransport).
func (x *exchange) roundTrip(req *http.Request) (*http.Response, error) {
	pol := x.rule.retry
	ctx := req.Context()
	tried := make([]*endpoint, 0, 2)
	ep := x.first
	for attempt := 0; ; attempt++ {
		if ep == nil {
			return nil, &proxyErr{status: http.StatusServiceUnavailable, reason: "no healthy upstream left to retry on"}
		}
		tried = append(tried, ep)
		x.rec.attempts++
		x.rec.endpoint, x.rec.ep = ep.addr, ep
		resp, err := x.attempt(req, ep)
		last := attempt >= pol.retries
		backoff := pol.backoffFor(attempt + 1)
		if !last && !x.deadline.IsZero() && time.Until(x.deadline) <= backoff {
			last = true // a retry would not finish inside the request timeout
		}
		if err == nil {
			if last || pol.connectOnly || !pol.codes[resp.StatusCode] || !x.bodyDone {
				return resp, nil
			}
			discard(resp.Body)
		} else {
			switch {
			case pastDeadline(ctx):
				return nil, &proxyErr{status: http.StatusGatewayTimeout, reason: "request timeout", err: err}
			case ctx.Err() != nil:
				return nil, err
			}
			var ce *connectError
			connect := errors.As(err, &ce)
			replayable := x.bodyDone || connect && x.stream != nil && x.stream.n.Load() == 0
			if last || !replayable || pol.connectOnly && !connect {
				return nil, classify(err, connect)
			}
		}
		if backoff > 0 {
			tm := time.NewTimer(backoff)
			select {
			case <-tm.C:
			case <-ctx.Done():
				tm.Stop()
				return nil, &proxyErr{status: http.StatusGatewayTimeout, reason: "request timeout during retry backoff", err: ctx.Err()}
			}
		}
		ep = x.retryEndpoint(tried)
	}
}

// attemptTimeout is an attempt ended by its backendRequest timeout.
type attemptTimeout struct{ err error }

func (e *attemptTimeout) Error() string { return "backendRequest timeout: " + e.err.Error() }

func (e *attemptTimeout) Unwrap() error { return e.err }

func classify(err error, connect bool) error {
	var timeout *attemptTimeout
	switch {
	case errors.As(err, &timeout):
		return &proxyErr{status: http.StatusGatewayTimeout, reason: "upstream (backendRequest) timeout", err: err}
	case connect:
		return &proxyErr{status: http.StatusServiceUnavailable, reason: "upstream connect error", err: err}
	case errors.Is(err, context.DeadlineExceeded):
		return &proxyErr{status: http.StatusGatewayTimeout, reason: "upstream (backendRequest) timeout", err: err}
	}
	return &proxyErr{status: http.StatusBadGateway, reason: "upstream error", err: err}
}

// backoffFor is the wait before retry n (1-based): the configured minimum,
// doubled per retry up to ten times the minimum, plus up to 50% jitter.
func (p *retryPolicy) backoffFor(n int) time.Duration {
	if p.backoff <= 0 {
		return 0
	}
	d := p.backoff << min(n-1, 10)
	if d > 10*p.backoff || d <= 0 {
		d = 10 * p.backoff
	}
	return d + rand.N(d/2+1)
}

// retryEndpoint picks another endpoint with the identity the request was
// authorized for, preferring ones not tried yet.
func (x *exchange) retryEndpoint(tried []*endpoint) *endpoint {
	id := x.first.key.identity
	sameID := func(ep *endpoint) bool { return ep.key.identity != id }
	ep := pickEndpoint(x.endpoints, func(ep *endpoint) bool {
		if sameID(ep) {
			return true
		}
		for _, t := range tried {
			if t == ep {
				return true
			}
		}
		return false
	})
	if ep == nil {
		ep = pickEndpoint(x.endpoints, sameID)
	}
	return ep
}

// attempt sends the request once to ep.
func (x *exchange) attempt(req *http.Request, ep *endpoint) (*http.Response, error) {
	ctx := req.Context()
	cancel := context.CancelFunc(func() {})
	if x.rule.backendTimeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, x.rule.backendTimeout)
	}
	var areq *http.Request
	var u *url.URL
	var rb *releaseBody
	if x.try1.used {
		areq, u, rb = new(http.Request), new(url.URL), new(releaseBody)
	} else {
		x.try1.used = true
		areq, u, rb = &x.try1.req, &x.try1.url, &x.try1.body
	}
	*areq = *req.WithContext(ctx)
	*u = *req.URL
	u.Scheme, u.Host = "http", ep.addr
	areq.URL = u
	switch {
	case x.bodyDone && len(x.body) == 0:
		areq.Body, areq.ContentLength, areq.GetBody = nil, 0, nil
	case x.bodyDone:
		body := x.body
		areq.ContentLength = int64(len(body))
		areq.Body = io.NopCloser(bytes.NewReader(body))
		areq.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	default:
		areq.Body, areq.GetBody = x.stream, nil
	}
	up := x.up
	if x.spans.server != nil {
		up = x.startClientSpan(areq, ep)
	}
	ep.outstanding.Add(1)
	var resp *http.Response
	var err error
	// forward's requests (interimTo set) pass 1xx responses on: directly
	// from the inline transport, through the trace from net/http's. The
	// upgrade path's (ReverseProxy's) come here without either.
	x.raw.OK = false // set by the inline transport when it takes the response raw
	if x.inlineUp {
		var raw *h1.RawFields
		if x.wantRaw {
			raw = &x.raw
		}
		resp, err = ep.inlineH1(true).RoundTripFields(areq, up, raw, &x.interimState)
	} else {
		if x.interimTo != nil && x.trace.Got1xxResponse == nil {
			x.trace.Got1xxResponse = x.interimState.Got1xx
		}
		resp, err = ep.roundTripper(x.proto, false).RoundTrip(areq.WithContext(httptrace.WithClientTrace(ctx, &x.trace)))
	}
	if x.spans.client != nil {
		x.spans.attemptDone(resp, err)
	}
	if err != nil {
		ep.outstanding.Add(-1)
		if pastDeadline(ctx) && !pastDeadline(req.Context()) {
			// The attempt's own timeout ended it, perhaps while the tunnel
			// was still being dialed: a timeout, whatever the dial said.
			err = &attemptTimeout{err}
		}
		cancel()
		return nil, err
	}
	if rwc, ok := resp.Body.(io.ReadWriteCloser); ok && resp.StatusCode == http.StatusSwitchingProtocols {
		resp.Body = &releaseRWBody{releaseBody: releaseBody{ReadCloser: rwc, attemptDone: attemptDone{ep: ep, cancel: cancel}}, Writer: rwc}
	} else {
		rb.ReadCloser, rb.ep, rb.cancel = resp.Body, ep, cancel
		resp.Body = rb
	}
	return resp, nil
}
