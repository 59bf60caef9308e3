package l7

import (
	"bytes"
	"context"
	"net/http"

	"go.uber.org/zap"

	"github.com/causeway-mesh/causeway/pkg/l7/h1"
)

// Request mirrors (RequestMirror filters): fire and forget, bounded.

func (x *exchange) mirrorShot(b *backendDest) mirrorShot {
	return mirrorShot{backend: b, method: x.out.Method, url: *x.out.URL, host: x.out.Host, header: x.out.Header.Clone()}
}

// fireMirrors sends the mirror copies, fire and forget: they never delay or
// change the main response. A copy needs the whole body; streamed bodies are
// not mirrored.
func (x *exchange) fireMirrors() {
	for _, m := range x.mirrors {
		if !x.bodyDone {
			x.e.metrics.mirrors.WithLabelValues("skipped").Inc()
			continue
		}
		eps := x.snap.eps[tableKey{m.backend.svc, m.backend.port}]
		ep := pickEndpoint(eps, nil)
		if ep == nil {
			x.e.metrics.mirrors.WithLabelValues("failed").Inc()
			continue
		}
		select {
		case x.e.mirrorSem <- struct{}{}:
		default:
			x.e.metrics.mirrors.WithLabelValues("dropped").Inc()
			continue
		}
		proto := m.backend.proto
		if proto == upstreamAuto {
			proto = x.proto
		}
		l := upstreamBase(m.header, nil)
		setForwarding(&l, m.header, x.info)
		setIdentity(&l, x.info)
		x.e.wg.Add(1)
		go x.e.mirror(m, l, x.body, ep, proto)
	}
}

func (e *Engine) mirror(m mirrorShot, fields h1.Fields, body []byte, ep *endpoint, proto upstreamProto) {
	defer e.wg.Done()
	defer func() { <-e.mirrorSem }()
	ctx, cancel := context.WithTimeout(e.ctx, e.opts.MirrorTimeout)
	defer cancel()
	u := m.url
	u.Scheme, u.Host = "http", ep.addr
	req, err := http.NewRequestWithContext(ctx, m.method, u.String(), bytes.NewReader(body))
	if err != nil {
		e.metrics.mirrors.WithLabelValues("failed").Inc()
		return
	}
	if len(body) == 0 {
		req.Body, req.ContentLength = nil, 0
	}
	req.Header, req.Host = fields.Header(), m.host
	resp, err := ep.roundTripper(proto, h1.Inlinable(req, fields)).RoundTrip(req)
	if err != nil {
		e.metrics.mirrors.WithLabelValues("failed").Inc()
		e.log.Debug("mirror failed", zap.Error(err), zap.String("backend", m.backend.String()))
		return
	}
	discard(resp.Body)
	e.metrics.mirrors.WithLabelValues("sent").Inc()
}
