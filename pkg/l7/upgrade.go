package l7

import (
	"errors"
	"net/http"
	"net/http/httputil"

	"github.com/causeway-mesh/causeway/pkg/l7/h1"
)

// Upgrades (101 Switching Protocols) go through httputil.ReverseProxy,
// which hijacks the connection; these are its hooks into the exchange.

// upstreamTransport runs a request's attempts: the first on the endpoint
// the request was authorized for, retries on others of the same identity.
type upstreamTransport struct{ e *Engine }

func (t upstreamTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	x, _ := req.Context().Value(exchangeKey{}).(*exchange)
	if x == nil {
		return nil, errors.New("l7: request without an exchange")
	}
	return x.roundTrip(req)
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
		x.resp.apply(resp.Header)
	}
	return nil
}

// proxyError is the ReverseProxy's error hook (upgrades).
func (e *Engine) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	x, _ := r.Context().Value(exchangeKey{}).(*exchange)
	rw, _ := w.(*responseRecorder)
	if x == nil || rw == nil {
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	x.upstreamFailed(rw, err)
}
