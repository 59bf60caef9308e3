package h1

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/http/httpguts"
)

// Client sends replayable HTTP/1.1 requests without a body (see Inlinable)
// over an endpoint's keep-alive connections (each over its own tunnel),
// writing the request and reading the response in the caller's goroutine.
// http.Transport hands each exchange to a writer and a reader goroutine per
// connection, which cost the waypoint about a sixth of its CPU per request
// (bench/README.md, "Waypoint"); it keeps the other requests, and its own
// connections. Responses are parsed by net/http (ReadResponse) unless
// plainResponse takes them; request heads are written by writeHead, byte
// for byte as Request.Write writes them.
type Client struct {
	Dial           func(context.Context) (net.Conn, error)
	IdleTimeout    time.Duration
	MaxHeaderBytes int64

	mu    sync.Mutex
	idle  []*inlineConn // most recently used last
	sweep *time.Timer
}

// maxIdleInline bounds the idle connections kept per endpoint (as
// http.Transport's MaxIdleConnsPerHost in upstream.go).
const maxIdleInline = 64

// max1xx bounds the informational responses read before the final one.
const max1xx = 5

// errHeaderTooLarge: the upstream's response header exceeded maxHeader.
var errHeaderTooLarge = errors.New("upstream response header too large")

// inlineConn is one keep-alive connection.
type inlineConn struct {
	nc        net.Conn
	lim       budgetReader
	br        *bufio.Reader
	bw        *bufio.Writer
	idleSince time.Time
	interrupt func()      // ends what is blocked on nc; made once, run when an exchange's context ends
	readable  func() bool // nc received something (readinessProbe); nil: cannot tell
	watch     ctxWatch    // the exchange in flight's watch on its context
}

// Interim takes the informational (1xx) responses of an exchange.
type Interim interface {
	Got1xx(code int, hdr textproto.MIMEHeader) error
}

// got1xxFunc is an httptrace Got1xxResponse hook as an Interim.
type got1xxFunc func(int, textproto.MIMEHeader) error

func (f got1xxFunc) Got1xx(code int, hdr textproto.MIMEHeader) error { return f(code, hdr) }

// budgetReader reads from r while budget lasts; a negative budget is
// unlimited. It bounds what a response header may take.
type budgetReader struct {
	r      io.Reader
	budget int64
}

func (b *budgetReader) Read(p []byte) (int, error) {
	if b.budget == 0 {
		return 0, errHeaderTooLarge
	}
	if b.budget > 0 && int64(len(p)) > b.budget {
		p = p[:b.budget]
	}
	n, err := b.r.Read(p)
	if b.budget > 0 {
		b.budget -= int64(n)
	}
	return n, err
}

// Inlinable reports whether a Client may send req with the header
// fields: no body, no upgrade, and replayable. Without a reader goroutine
// an idle connection that the upstream closed is only found by using it; a
// replayable request then goes again on a new connection, and the rest
// keep http.Transport, whose reader notices such closes while the
// connection is idle.
func Inlinable(req *http.Request, fields Fields) bool {
	return (req.Body == nil || req.Body == http.NoBody) && req.ContentLength == 0 &&
		fields.First("Upgrade") == "" && len(req.TransferEncoding) == 0 && replayable(req.Method, fields)
}

// RoundTrip sends req on an idle connection or a new one. A reused
// connection that the upstream had closed fails before any response byte;
// a replayable request then goes once more on a new connection, as
// http.Transport does.
func (h *Client) RoundTrip(req *http.Request) (*http.Response, error) {
	var interim Interim
	if trace := httptrace.ContextClientTrace(req.Context()); trace != nil && trace.Got1xxResponse != nil {
		interim = got1xxFunc(trace.Got1xxResponse)
	}
	return h.RoundTripFields(req, FieldsOf(req.Header), nil, interim)
}

// RoundTripFields is RoundTrip for the engine's forward, with the request's
// header as fields (sorted; req.Header is not read): with raw set, a
// response whose fields can be passed on as they are comes without a
// header map, its fields in raw (rawResponse); interim (may be nil) is
// given the informational responses.
func (h *Client) RoundTripFields(req *http.Request, fields Fields, raw *RawFields, interim Interim) (*http.Response, error) {
	if raw != nil {
		raw.OK = false
	}
	if err := validHeaders(fields); err != nil {
		return nil, err
	}
	for {
		c := h.take()
		reused := c != nil
		if c == nil {
			nc, err := h.Dial(req.Context())
			if err != nil {
				return nil, err
			}
			c = &inlineConn{nc: nc, readable: readinessProbe(nc)}
			c.interrupt = func() { nc.SetDeadline(time.Unix(1, 0)) }
			c.lim.r = nc
			c.br = bufio.NewReader(&c.lim)
			c.bw = bufio.NewWriter(nc)
		}
		resp, err := h.exchange(c, req, fields, raw, interim)
		if err == nil {
			return resp, nil
		}
		c.nc.Close()
		var fresh *freshConnError
		if reused && errors.As(err, &fresh) && replayable(req.Method, fields) && req.Context().Err() == nil {
			continue
		}
		if errors.As(err, &fresh) {
			err = fresh.err
		}
		return nil, err
	}
}

// freshConnError is a failure before any response byte arrived.
type freshConnError struct{ err error }

func (e *freshConnError) Error() string { return e.err.Error() }
func (e *freshConnError) Unwrap() error { return e.err }

func replayable(method string, fields Fields) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return fields.First("Idempotency-Key") != "" || fields.First("X-Idempotency-Key") != ""
}

// exchange writes req on c and reads the response header. The request's
// context ending interrupts c until the body is done.
func (h *Client) exchange(c *inlineConn, req *http.Request, fields Fields, raw *RawFields, interim Interim) (*http.Response, error) {
	ctx := req.Context()
	c.watch.start(ctx, c.interrupt)
	fail := func(err error) (*http.Response, error) {
		c.watch.end()
		if ctxErr := ctx.Err(); ctxErr != nil {
			err = fmt.Errorf("%w (%v)", ctxErr, err)
		}
		return nil, err
	}
	if err := writeHead(c.bw, req, fields); err != nil {
		return fail(&freshConnError{fmt.Errorf("writing the request: %w", err)})
	}
	if err := c.bw.Flush(); err != nil {
		return fail(&freshConnError{fmt.Errorf("writing the request: %w", err)})
	}
	c.lim.budget = h.MaxHeaderBytes
	if _, err := c.br.Peek(1); err != nil {
		return fail(&freshConnError{fmt.Errorf("reading the response: %w", err)})
	}
	var resp *http.Response
	for n := 0; ; n++ {
		var size int
		if raw != nil {
			if resp, size = rawResponse(buffered(c.br), c.br, req, raw); resp != nil {
				_, _ = c.br.Discard(size)
				break // a final response
			}
		}
		if resp, size = plainResponse(buffered(c.br), c.br, req); resp != nil {
			_, _ = c.br.Discard(size)
			break // a final response
		}
		var err error
		if resp, err = http.ReadResponse(c.br, req); err != nil {
			return fail(fmt.Errorf("reading the response: %w", err))
		}
		code := resp.StatusCode
		if code < 100 || code > 199 {
			break
		}
		if code == http.StatusSwitchingProtocols || n == max1xx {
			return fail(fmt.Errorf("upstream answered %s to a request that did not ask for it", resp.Status))
		}
		if interim != nil {
			if err := interim.Got1xx(code, textproto.MIMEHeader(resp.Header)); err != nil {
				return fail(err)
			}
		}
		c.lim.budget = h.MaxHeaderBytes
	}
	c.lim.budget = -1
	keep := !resp.Close && !req.Close
	if resp.Body == http.NoBody {
		h.release(c, keep)
		return resp, nil
	}
	resp.Body = &inlineBody{r: resp.Body, h: h, c: c, keep: keep}
	return resp, nil
}

// writeHead writes the head of a request without a body, whose header is
// fields (sorted), exactly as Request.Write does (Host, User-Agent,
// Connection: close, Content-Length and the header in key order;
// FuzzWriteHead compares the two), without its per-request transfer
// writer, formatted prints and sorted copy of the header. The fields must
// have passed validHeaders. Nothing in the engine sets the write hooks of
// httptrace, which Request.Write would call.
func writeHead(w *bufio.Writer, req *http.Request, fields Fields) error {
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	host, err := httpguts.PunycodeHostPort(host)
	if err != nil {
		return err
	}
	if !httpguts.ValidHostHeader(host) {
		host = "" // Request.Write's choice when not talking to a proxy
	}
	host = removeZone(host)
	method := cmp.Or(req.Method, http.MethodGet)
	ruri := req.URL.RequestURI()
	if method == http.MethodConnect && req.URL.Path == "" {
		ruri = cmp.Or(req.URL.Opaque, host)
	}
	if containsCTL(ruri) {
		return errors.New("can't write control character in the request target")
	}
	w.WriteString(method)
	w.WriteByte(' ')
	w.WriteString(ruri)
	w.WriteString(" HTTP/1.1\r\nHost: ")
	w.WriteString(host)
	w.WriteString("\r\n")
	ua := "Go-http-client/1.1" // Request.Write's default
	if i := fields.Index("User-Agent"); i >= 0 {
		vv := fields[i].Values
		ua = ""
		if len(vv) > 0 {
			ua = vv[0]
		}
	}
	if ua != "" { // tested before trimming, as Request.Write does
		w.WriteString("User-Agent: ")
		w.WriteString(textproto.TrimString(ua))
		w.WriteString("\r\n")
	}
	if req.Close && !hasToken(fields.First("Connection"), "close") {
		w.WriteString("Connection: close\r\n")
	}
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch:
		w.WriteString("Content-Length: 0\r\n") // as Request.Write: servers expect one
	}
	for _, f := range fields {
		if !writtenAbove(f.Name) {
			writeField(w, f.Name, f.Values)
		}
	}
	_, err = w.WriteString("\r\n")
	return err
}

// writtenAbove: the fields writeHead writes itself, or not at all.
func writtenAbove(k string) bool {
	switch k {
	case "Host", "User-Agent", "Content-Length", "Transfer-Encoding", "Trailer":
		return true
	}
	return false
}

func containsCTL(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] == 0x7f {
			return true
		}
	}
	return false
}

// hasToken reports whether token appears in v as Request.Write looks for
// "close" in a Connection header: case-insensitive, between spaces, tabs
// or commas.
func hasToken(v, token string) bool {
	for i := 0; i+len(token) <= len(v); i++ {
		end := i + len(token)
		if strings.EqualFold(v[i:end], token) && (i == 0 || isTokenBoundary(v[i-1])) && (end == len(v) || isTokenBoundary(v[end])) {
			return true
		}
	}
	return false
}

func isTokenBoundary(b byte) bool { return b == ' ' || b == ',' || b == '\t' }

// removeZone removes an IPv6 zone from a host ("[fe80::1%en0]:80"), which
// means nothing to the peer.
func removeZone(host string) string {
	if !strings.HasPrefix(host, "[") {
		return host
	}
	i := strings.LastIndex(host, "]")
	if i < 0 {
		return host
	}
	j := strings.LastIndex(host[:i], "%")
	if j < 0 {
		return host
	}
	return host[:j] + host[i:]
}

// validHeaders refuses what http.Transport refuses to send: header names
// and values that are not valid HTTP (Request.Write would silently drop or
// rewrite them; filters and policy results add headers).
func validHeaders(fields Fields) error {
	switch k, name, bad := invalidField(fields); {
	case bad && name:
		return fmt.Errorf("invalid header field name %q", k)
	case bad:
		return fmt.Errorf("invalid header field value for %q", k)
	}
	return nil
}

// invalidField finds a field whose name (name true) or one of whose values
// is not valid HTTP.
func invalidField(fields Fields) (key string, name, bad bool) {
	for _, f := range fields {
		if !httpguts.ValidHeaderFieldName(f.Name) {
			return f.Name, true, true
		}
		for _, v := range f.Values {
			if !httpguts.ValidHeaderFieldValue(v) {
				return f.Name, false, true
			}
		}
	}
	return "", false, false
}

// release ends an exchange on c: back to the idle list when the response
// was read whole, the connection may stay open and the request's context
// did not interrupt it; closed otherwise.
func (h *Client) release(c *inlineConn, reuse bool) {
	if !c.watch.end() {
		reuse = false // the context ended: c's deadline is in the past
	}
	if !reuse || c.br.Buffered() > 0 {
		c.nc.Close()
		return
	}
	c.idleSince = time.Now()
	h.mu.Lock()
	if len(h.idle) >= maxIdleInline {
		h.mu.Unlock()
		c.nc.Close()
		return
	}
	h.idle = append(h.idle, c)
	if h.sweep == nil && h.IdleTimeout > 0 {
		h.sweep = time.AfterFunc(h.IdleTimeout, h.closeExpired)
	}
	h.mu.Unlock()
}

// take returns the most recently used idle connection, closing expired ones
// and those that received anything while idle.
func (h *Client) take() *inlineConn {
	for {
		c := h.pop()
		if c == nil {
			return nil
		}
		if h.IdleTimeout > 0 && time.Since(c.idleSince) >= h.IdleTimeout || c.readable == nil || c.readable() {
			c.nc.Close()
			continue
		}
		return c
	}
}

// pop takes the most recently used idle connection off the idle list.
func (h *Client) pop() *inlineConn {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := len(h.idle)
	if n == 0 {
		return nil
	}
	c := h.idle[n-1]
	h.idle[n-1] = nil
	h.idle = h.idle[:n-1]
	return c
}

// readinessReporter is a tunnel that tells, without blocking, whether a
// Read would return at once (bytes arrived, the peer ended its direction,
// or the tunnel failed): hbone's streams.
type readinessReporter interface {
	Readable() bool
}

// readinessProbe returns what tells whether nc received anything since its
// last response was read whole: bytes (an extra response, a body after a
// HEAD answer or a 204), its end or a failure; nil when nc cannot tell.
// An idle connection that received anything is never reused: the bytes
// would be read as the next request's response, which may be another
// client's (net/http's Transport and nginx discard such connections too).
func readinessProbe(nc net.Conn) func() bool {
	switch c := nc.(type) {
	case readinessReporter:
		return c.Readable
	case syscall.Conn:
		return socketProbe(c)
	}
	return nil
}

// closeExpired closes the connections idle for the idle timeout and runs
// again while any are left.
func (h *Client) closeExpired() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sweep = nil
	keep := h.idle[:0]
	for _, c := range h.idle {
		if time.Since(c.idleSince) >= h.IdleTimeout {
			c.nc.Close()
		} else {
			keep = append(keep, c)
		}
	}
	clear(h.idle[len(keep):])
	h.idle = keep
	if len(h.idle) > 0 {
		h.sweep = time.AfterFunc(h.IdleTimeout-time.Since(h.idle[0].idleSince), h.closeExpired)
	}
}

// CloseIdleConnections closes the idle connections. Exchanges in flight
// finish; their connections then idle out.
func (h *Client) CloseIdleConnections() {
	h.mu.Lock()
	idle := h.idle
	h.idle = nil
	h.mu.Unlock()
	for _, c := range idle {
		c.nc.Close()
	}
}

// inlineBody releases its connection once the response body ended: read
// to EOF (the connection can be reused) or closed early or failed (it
// cannot).
type inlineBody struct {
	r     io.ReadCloser
	h     *Client
	c     *inlineConn
	keep  bool // the connection may stay open
	ended atomic.Bool
}

func (b *inlineBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil {
		b.end(err == io.EOF)
	}
	return n, err
}

func (b *inlineBody) Close() error {
	b.end(false)
	return nil
}

func (b *inlineBody) end(reuse bool) {
	if b.ended.CompareAndSwap(false, true) {
		b.h.release(b.c, b.keep && reuse)
	}
}
