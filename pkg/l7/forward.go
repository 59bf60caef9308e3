package l7

import (
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"go.uber.org/zap"
	"golang.org/x/net/http/httpguts"

	"github.com/causeway-mesh/causeway/pkg/l7/h1"
)

// forward sends the request upstream (roundTrip: endpoint, retries,
// timeouts) and copies the response to the caller, as httputil.ReverseProxy
// in its Rewrite mode would: same headers removed and added, 1xx responses
// and trailers passed on, streamed responses flushed as they arrive. The
// engine keeps ReverseProxy for upgrades (it hijacks the connection); every
// other request comes here, which spares the proxy's request clone, its
// header copies and passes, and its per-request flush and trace setup.
func (x *exchange) forward(w *responseRecorder) {
	out := x.outgoing(w)
	x.wantRaw = x.resp.none() && w.canWriteRaw()
	resp, err := x.roundTrip(out)
	x.interim.Lock()
	x.interimDone = true
	x.interim.Unlock()
	if err != nil {
		x.upstreamFailed(w, err)
		return
	}
	defer resp.Body.Close()
	if x.raw.OK {
		// A final response with a Content-Length and nothing to change in
		// its fields: written with them as they came.
		if w.writeRaw(resp.StatusCode, resp.ContentLength, &x.raw) {
			if err := x.copyBody(w, resp, isEventStreamType(x.raw.ContentType)); err != nil {
				panic(http.ErrAbortHandler)
			}
			return
		}
		resp.Header = x.raw.Header()
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		x.upstreamFailed(w, fmt.Errorf("upstream switched protocols (%q) for a request that asked for no upgrade", resp.Header.Get("Upgrade")))
		return
	}
	h1.RemoveHopByHop(resp.Header)
	x.resp.apply(resp.Header)
	h := w.takeHeader(resp.Header)
	announced := len(resp.Trailer)
	if announced > 0 {
		h["Trailer"] = []string{strings.Join(slices.Sorted(maps.Keys(resp.Trailer)), ", ")}
	}
	w.WriteHeader(resp.StatusCode)
	if err := x.copyBody(w, resp, resp.ContentLength == -1 || isEventStream(resp.Header)); err != nil {
		// Midway through a response all that is left is to abort it: the
		// server resets the stream or closes the connection.
		panic(http.ErrAbortHandler)
	}
	resp.Body.Close() // now: reading to the end filled resp.Trailer
	x.noteGRPCStatus(resp)
	if len(resp.Trailer) == 0 {
		return
	}
	w.Flush() // chunked, so that trailers can follow
	for k, vv := range resp.Trailer {
		if announced != len(resp.Trailer) {
			k = http.TrailerPrefix + k // trailers the header did not announce
		}
		h[k] = vv
	}
}

// outgoing is the request sent upstream: x.out with its header made by
// the header rules (x.up, sorted): without hop-by-hop fields and the
// caller's forwarding headers, with the waypoint's forwarding, policy and
// identity headers. Its Header is that as a map, except when the inline
// transport will send it (x.inlineUp): that writes x.up, and Header is nil.
// 1xx responses are reported to w.
func (x *exchange) outgoing(w *responseRecorder) *http.Request {
	in := x.out.Header
	l := upstreamBase(in, x.upFields[:0])
	// Tell the upstream trailers are welcome when the caller said so
	// (ReverseProxy does the same).
	if httpguts.HeaderValuesContainsToken(in["Te"], "trailers") {
		l.Set("Te", teTrailers)
	}
	x.setUpstreamHeaders(&l, in)
	if !l.Has("User-Agent") {
		l = append(l, h1.Field{Name: "User-Agent", Values: noUserAgent})
	}
	l.Sort()
	x.up = l

	x.interimTo = w // attempt hands 1xx responses to Got1xx
	// x.out is the exchange's own request, used no more after this; its
	// header map and URL may still be orig's, so they are replaced, never
	// changed.
	out := x.out
	out.Close = false
	if out.ContentLength == 0 {
		out.Body = nil
	}
	x.inlineUp = x.proto != upstreamH2 && x.first != nil && x.first.inlinable() && h1.Inlinable(out, l)
	if x.inlineUp {
		out.Header = nil
	} else {
		out.Header = l.Header()
	}
	if q := cleanQuery(out.URL.RawQuery); q != out.URL.RawQuery {
		u := *out.URL
		u.RawQuery = q
		out.URL = &u
	}
	return out
}

var teTrailers = []string{"trailers"}

// noUserAgent keeps an upstream request without a User-Agent without one
// (Go would send its own).
var noUserAgent = []string{""}

// copyBody copies the response body to w, flushing after each read when
// flush is set (the response is a stream: no length, or server-sent
// events).
func (x *exchange) copyBody(w *responseRecorder, resp *http.Response, flush bool) error {
	bp := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(bp)
	buf := *bp
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if _, err := w.Write(buf[:n]); err != nil {
				return err
			}
			if flush {
				w.Flush()
			}
		}
		switch {
		case rerr == io.EOF:
			return nil
		case rerr != nil:
			if x.ctx.Err() == nil {
				x.rec.reason = "upstream error: reading the response body: " + rerr.Error()
				x.e.log.Debug("response body copy failed", zap.Error(rerr))
			}
			return rerr
		}
	}
}

func isEventStream(h http.Header) bool { return isEventStreamType(h.Get("Content-Type")) }

func isEventStreamType(contentType string) bool {
	ct, _, _ := strings.Cut(contentType, ";")
	return strings.EqualFold(strings.TrimSpace(ct), "text/event-stream")
}

// setUpstreamHeaders adds the waypoint's headers to l, the upstream fields
// of the headers in: forwarding, then an allow's changes, then the identity.
func (x *exchange) setUpstreamHeaders(l *h1.Fields, in http.Header) {
	setForwarding(l, in, x.info)
	applyPolicyHeaders(l, x.policyRemove, x.policySet)
	setIdentity(l, x.info)
}

// cleanQuery returns a raw query unchanged when every parameter in it
// parses, and otherwise re-encodes the ones that do (a ';' separator or a
// bad %-escape), as ReverseProxy does: an upstream must not read parameters
// differently from what routing and policy saw.
func cleanQuery(q string) string {
	for i := 0; i < len(q); i++ {
		switch q[i] {
		case ';':
			return reencodeQuery(q)
		case '%':
			if i+2 >= len(q) || !isHex(q[i+1]) || !isHex(q[i+2]) {
				return reencodeQuery(q)
			}
			i += 2
		}
	}
	return q
}

func reencodeQuery(q string) string {
	v, _ := url.ParseQuery(q) // the parameters that parse, despite the error
	return v.Encode()
}

// upgradeRequested reports whether h asks to switch protocols (Connection:
// upgrade with an Upgrade protocol), which ReverseProxy serves.
func upgradeRequested(h http.Header) bool {
	return httpguts.HeaderValuesContainsToken(h["Connection"], "Upgrade") && h.Get("Upgrade") != ""
}
