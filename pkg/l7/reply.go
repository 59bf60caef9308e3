package l7

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// What the waypoint answers itself: local replies (gRPC statuses to gRPC
// callers) and the answers to failed or cancelled upstream exchanges.

// proxyErr is a failed upstream exchange and the status it gets.
type proxyErr struct {
	status int
	reason string
	err    error
}

func (e *proxyErr) Error() string {
	if e.err == nil {
		return e.reason
	}
	return e.reason + ": " + e.err.Error()
}

func (e *proxyErr) Unwrap() error { return e.err }

// upstreamFailed answers a request whose upstream exchange failed.
func (x *exchange) upstreamFailed(rw *responseRecorder, err error) {
	var pe *proxyErr
	switch {
	case errors.As(err, &pe):
		x.reply(rw, pe.status, pe.Error(), nil)
	case x.ctx.Err() != nil:
		x.cancelled(rw, "")
	default:
		x.reply(rw, http.StatusBadGateway, "upstream error: "+err.Error(), nil)
	}
}

// cancelled ends a request whose context ended (during names the step it
// was in, for the log): past its timeout it is answered 504; otherwise its
// client went away or its tunnel is ending, and nothing is sent: the
// response is aborted (the server resets the stream or closes the
// connection) and logged as 499. No status is made up for it.
func (x *exchange) cancelled(w *responseRecorder, during string) {
	if !x.deadline.IsZero() && !time.Now().Before(x.deadline) {
		x.reply(w, http.StatusGatewayTimeout, "request timeout"+during, nil)
		return
	}
	x.rec.localCode = 499
	x.rec.reason = "client cancelled" + during
	panic(http.ErrAbortHandler)
}

// publicMessage is what the caller is told for a local reply; details stay
// in the access log.
func publicMessage(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "bad request"
	case http.StatusNotFound:
		return "no route"
	case http.StatusInternalServerError:
		return "route configuration error"
	case http.StatusBadGateway:
		return "upstream error"
	case http.StatusServiceUnavailable:
		return "no healthy upstream"
	case http.StatusGatewayTimeout:
		return "upstream request timeout"
	}
	return http.StatusText(status)
}

// reply answers locally. reason goes to the log; the caller sees body, or a
// generic message. A gRPC caller gets a trailers-only gRPC error instead.
func (x *exchange) reply(w *responseRecorder, status int, reason string, hdr http.Header, body ...byte) {
	if reason != "" {
		x.rec.reason = reason
	}
	x.rec.localCode = status
	if len(body) == 0 {
		body = []byte(publicMessage(status) + "\n")
	}
	h := w.Header()
	for k, vs := range hdr {
		h[http.CanonicalHeaderKey(k)] = append([]string(nil), vs...)
	}
	if x.view != nil && x.view.grpc {
		code := grpcCodeFor(status)
		x.rec.grpcCode = code
		h.Set("Content-Type", "application/grpc")
		h.Set("Grpc-Status", strconv.Itoa(code))
		h.Set("Grpc-Message", grpcEncodeMessage(strings.TrimSpace(string(body))))
		h.Del("Content-Length")
		w.WriteHeader(http.StatusOK)
		return
	}
	if h.Get("Content-Type") == "" {
		h.Set("Content-Type", "text/plain; charset=utf-8")
	}
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	if x.orig.Method != http.MethodHead {
		_, _ = w.Write(body)
	}
}

// grpcCodeFor maps an HTTP status to a gRPC code as gRPC's own HTTP mapping
// does (and Envoy for its local replies).
func grpcCodeFor(status int) int {
	switch status {
	case http.StatusBadRequest:
		return 13 // INTERNAL
	case http.StatusUnauthorized:
		return 16 // UNAUTHENTICATED
	case http.StatusForbidden:
		return 7 // PERMISSION_DENIED
	case http.StatusNotFound:
		return 12 // UNIMPLEMENTED
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable:
		return 14 // UNAVAILABLE
	case http.StatusGatewayTimeout:
		return 4 // DEADLINE_EXCEEDED
	}
	return 2 // UNKNOWN
}

// grpcEncodeMessage percent-encodes a grpc-message value (gRPC HTTP/2 spec).
func grpcEncodeMessage(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c <= 0x7e && c != '%' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}
