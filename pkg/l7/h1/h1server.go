package h1

import (
	"bufio"
	"context"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"net/textproto"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/net/http/httpguts"
)

// The waypoint's HTTP/1.1 server for one tunnel. Requests are parsed by
// net/http's own parser (http.ReadRequest), or by plainRequest into the
// same request when the head is plain (h1head.go), and checked as
// net/http's server checks them (one valid Host, valid field names and
// values, Expect, the header size limit); the rest is ours: the
// response's framing, keep-alive and noticing a client that went away.
// That spares each request the server's goroutine and read-ahead, its
// context plumbing and its copies of the response header
// (pkg/l7/DESIGN-NOTE.md has the measurements). FuzzServeH1 holds it to
// net/http's server on what reaches the handler and what is refused.

// Limits are the server's bounds (Options).
type Limits struct {
	ReadHeaderTimeout time.Duration // from a request's first byte to its last header
	IdleTimeout       time.Duration // between requests
	MaxHeaderBytes    int
}

// h1Conn is the server state of one tunnel.
type h1Conn struct {
	conn net.Conn
	ctx  context.Context // the tunnel's
	// state is connIdle while the connection waits between requests, and
	// has connDraining once the server drains (drain).
	state   atomic.Uint32
	handler http.Handler
	limits  Limits
	log     *zap.Logger

	lr    io.LimitedReader // bounds a request head: net/http's allowance, MaxHeaderBytes plus 4 KiB
	scan  framingScan      // under lr: the framing fields of a head net/http parses
	br    *bufio.Reader
	bw    *bufio.Writer
	timer *time.Timer // the header and idle timeouts: closes conn
	gone  goneWatch
	scope requestScope // the requests' contexts
	// plain is filled by plainRequest; a request is its copy with the
	// request's context (http.Request.WithContext copies anyway).
	plain http.Request
	// afterPost: RFC 9112 §2.2 tolerance, as net/http: stray CRLF after a
	// POST body are skipped.
	afterPost bool
}

// The bits of h1Conn.state.
const (
	connIdle     = 1 << iota // between requests: nothing of the next one read
	connDraining             // the server drains: no keep-alive
)

// Serve serves requests on conn until the client closes it, it idles out,
// a request cannot be read or a response ends the connection. peer is what
// conn reads from, which reports when reading would no longer block
// (hbone streams do; see AheadConn for other connections).
//
// When d (nil: none) drains, the server is stopping, and the connection
// ends gently (RFC 9112 §9.6), as net/http's Server.Shutdown ends its own: closed at
// once while idle between requests; else the response in progress, or
// the next one when its header went out already, says Connection: close
// and the connection closes once it is written whole. A request that
// arrives after the drain began is still served, and closes the
// connection. (A client may send a request at the moment its idle
// connection is closed; HTTP/1.1 cannot tell it apart from one sent on a
// closed connection, and clients retry it when it is idempotent.)
func Serve(ctx context.Context, d *Drainer, conn net.Conn, peer PeerDoner, h http.Handler, limits Limits, log *zap.Logger) {
	c := &h1Conn{conn: conn, ctx: ctx, handler: h, limits: limits, log: log}
	c.scope.parent = ctx
	c.gone.scope = &c.scope
	c.gone.peer = peer
	c.scan.r = conn
	c.lr.R = &c.scan
	c.br = bufio.NewReaderSize(&c.lr, 4<<10)
	c.bw = bufio.NewWriterSize(conn, 4<<10)
	stop := context.AfterFunc(peer.PeerDone(), c.gone.peerEnded)
	defer stop()
	stopScope := context.AfterFunc(ctx, c.scope.endCurrent)
	defer stopScope()
	if d != nil {
		d.add(c)
		defer d.remove(c)
	}
	c.timer = time.AfterFunc(limits.ReadHeaderTimeout, func() { conn.Close() })
	defer c.timer.Stop()
	for c.serveOne() {
		// The connection idles until the next request's first bytes (four,
		// as net/http waits for: less, then the end, is no request), unless
		// the server drains: then it ends after the response, and drain
		// closes it should the drain begin while it idles.
		if c.state.Or(connIdle)&connDraining != 0 {
			return
		}
		c.timer.Reset(limits.IdleTimeout)
		if _, err := c.br.Peek(4); err != nil {
			return
		}
		if c.state.And(^uint32(connIdle))&connDraining != 0 {
			return // closed by drain, with whatever arrived
		}
		c.timer.Reset(limits.ReadHeaderTimeout)
	}
}

// drain starts the connection's drain: true when it idles, and is to be
// closed now; else it ends with the response being served.
func (c *h1Conn) drain() bool { return c.state.Or(connDraining)&connIdle != 0 }

// Drainer drains the connections Serve serves with it.
type Drainer struct {
	mu       sync.Mutex
	draining bool
	conns    map[*h1Conn]struct{}
}

// Drain drains the connections being served, and those served after:
// when it returns, every response whose header was not written yet says
// Connection: close.
func (d *Drainer) Drain() {
	d.mu.Lock()
	d.draining = true
	var idle []*h1Conn
	for c := range d.conns {
		if c.drain() {
			idle = append(idle, c)
		}
	}
	d.mu.Unlock()
	for _, c := range idle {
		c.conn.Close()
	}
}

// Draining: Drain was called.
func (d *Drainer) Draining() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.draining
}

// add follows c, draining from the start when the drain has begun.
func (d *Drainer) add(c *h1Conn) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.draining {
		c.drain() // busy: its first request is being read
		return
	}
	if d.conns == nil {
		d.conns = make(map[*h1Conn]struct{})
	}
	d.conns[c] = struct{}{}
}

func (d *Drainer) remove(c *h1Conn) {
	d.mu.Lock()
	delete(d.conns, c)
	d.mu.Unlock()
}

// draining: the response being written must close the connection.
func (c *h1Conn) draining() bool { return c.state.Load()&connDraining != 0 }

// serveOne reads and serves one request; false: the connection is done.
func (c *h1Conn) serveOne() bool {
	req, status, why := c.readRequest()
	if !c.timer.Stop() {
		return false // a timeout fired: the connection is closed
	}
	if req == nil {
		if status != 0 {
			c.refuse(status, why)
		}
		return false
	}
	ctx := c.scope.begin()
	gen := ctx.gen
	defer c.scope.end(gen)
	if req == &c.plain {
		req = c.plain.WithContext(ctx)
		c.plain = http.Request{}
	} else {
		// In place: the body fills in req.Trailer, on the request it was
		// read with.
		*req = *req.WithContext(ctx)
	}
	w := c.newResponse(req)
	expect := false
	if hasToken(req.Header.Get("Expect"), "100-continue") {
		expect = req.ProtoAtLeast(1, 1) && req.ContentLength != 0
	} else if req.Header.Get("Expect") != "" {
		c.bw.WriteString("HTTP/1.1 417 Expectation Failed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		_ = c.bw.Flush()
		return false
	}
	if req.Body == http.NoBody {
		c.bodyDone(gen)
	} else {
		// Kept apart from req.Body, which the handler may replace.
		w.body = &h1Body{src: req.Body, w: w, gen: gen, expect: expect}
		w.canContinue = expect
		req.Body = w.body
	}
	c.afterPost = req.Method == http.MethodPost

	if !c.serveRequest(w, req) {
		return false // hijacked, or the handler aborted the response
	}
	if !w.wroteHeader && ctx.Err() != nil {
		// Cancelled before any answer (the client went away, or the
		// connection is ending): no status is made up for it.
		return false
	}
	c.gone.disarm()
	c.scope.end(gen) // before the body is drained: nothing may still be sending it
	w.finish()
	return w.reusable()
}

// newResponse is the response writer for req.
func (c *h1Conn) newResponse(req *http.Request) *ResponseWriter {
	return &ResponseWriter{c: c, req: req, contentLength: -1,
		wants10KeepAlive: req.ProtoMajor == 1 && req.ProtoMinor == 0 && hasToken(req.Header.Get("Connection"), "keep-alive"),
		wantsClose:       req.Close || hasToken(req.Header.Get("Connection"), "close"),
	}
}

// serveRequest runs the handler; false when it hijacked the connection or
// aborted (panicked), which ends the connection.
func (c *h1Conn) serveRequest(w *ResponseWriter, req *http.Request) (ok bool) {
	defer func() {
		if err := recover(); err != nil {
			c.gone.disarm()
			if err != http.ErrAbortHandler {
				buf := make([]byte, 64<<10)
				buf = buf[:runtime.Stack(buf, false)]
				c.log.Error("panic serving a request", zap.Any("panic", err), zap.ByteString("stack", buf))
			}
			ok = false
		}
	}()
	if req.Method == http.MethodOptions && req.RequestURI == "*" {
		serverOptions(w, req)
	} else {
		c.handler.ServeHTTP(w, req)
	}
	return !w.hijacked
}

// serverOptions answers "OPTIONS *", a question to the server itself, as
// net/http's server does: 200, with up to 4 KiB of body read and dropped.
func serverOptions(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Length", "0")
	if r.ContentLength != 0 {
		_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, 4<<10))
	}
}

// readRequest reads the next request head. A nil request with status 0
// means the connection ended or timed out (nothing to answer).
func (c *h1Conn) readRequest() (*http.Request, int, string) {
	c.lr.N = int64(c.limits.MaxHeaderBytes) + 4096
	if c.afterPost {
		peek, _ := c.br.Peek(4)
		_, _ = c.br.Discard(leadingCRLF(peek))
	}
	req, plain, err := c.nextRequest()
	if err != nil {
		switch {
		case c.lr.N <= 0: // the head read all it was allowed
			return nil, http.StatusRequestHeaderFieldsTooLarge, ""
		case strings.HasPrefix(err.Error(), "unsupported transfer encoding"), strings.HasPrefix(err.Error(), "too many transfer encodings"):
			// (net/http's error type for them is not exported.)
			return nil, http.StatusNotImplemented, "Unsupported transfer encoding"
		case commonReadError(err):
			return nil, 0, ""
		}
		c.log.Debug("bad HTTP/1.1 request", zap.Error(err))
		return nil, http.StatusBadRequest, ""
	}
	c.lr.N = math.MaxInt64
	if req.ProtoMajor != 1 {
		return nil, http.StatusHTTPVersionNotSupported, "unsupported protocol version"
	}
	if !plain { // plainRequest took no framing fields
		if why := c.scan.faultyFraming(req.ProtoMinor); why != "" {
			return nil, http.StatusBadRequest, why
		}
	}
	// http.ReadRequest took the Host field out into req.Host, or the
	// target's authority in absolute form, which takes precedence (RFC 9112
	// §3.2.2). net/http's server also refuses an absolute-form request
	// without a Host field or with a malformed one; this one accepts what
	// the target names. It refuses an empty host, which net/http accepts.
	// The order of the checks is net/http's.
	if !httpguts.ValidHostHeader(req.Host) {
		return nil, http.StatusBadRequest, "malformed Host header"
	}
	if !plain { // plainRequest took only valid names and values
		switch _, name, bad := invalidField(FieldsOf(req.Header)); {
		case bad && name:
			return nil, http.StatusBadRequest, "invalid header name"
		case bad:
			return nil, http.StatusBadRequest, "invalid header value"
		}
	}
	if req.ProtoAtLeast(1, 1) && req.Host == "" && req.Method != http.MethodConnect {
		return nil, http.StatusBadRequest, "missing required Host header"
	}
	return req, 0, ""
}

// nextRequest reads the next request head: plainRequest's when it is
// plain and came whole, else net/http's.
func (c *h1Conn) nextRequest() (req *http.Request, plain bool, err error) {
	if _, err := c.br.Peek(1); err != nil {
		return nil, false, err // as http.ReadRequest returns it
	}
	if n := plainRequest(buffered(c.br), &c.plain); n > 0 {
		_, _ = c.br.Discard(n)
		return &c.plain, true, nil
	}
	c.scan.start(buffered(c.br))
	req, err = http.ReadRequest(c.br)
	c.scan.stop()
	return req, false, err
}

// refuse answers a request that is not served and ends the connection,
// worded as net/http's server words it.
func (c *h1Conn) refuse(status int, why string) {
	line := strconv.Itoa(status) + " " + http.StatusText(status)
	body := line
	switch {
	case status == http.StatusNotImplemented:
		body = why
	case why != "":
		line += ": " + why
		body = line
	}
	// An HBONE stream closed after this still delivers it: the reset that
	// may follow comes after END_STREAM, and the peer keeps what it got.
	c.bw.WriteString("HTTP/1.1 " + line + "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n" + body)
	_ = c.bw.Flush()
}

func leadingCRLF(b []byte) int {
	n := 0
	for _, c := range b {
		if c != '\r' && c != '\n' {
			break
		}
		n++
	}
	return n
}

// commonReadError: the client went away, closed its direction between
// requests, or timed out (as net/http's server sees it: a request cut
// short is answered 400); nothing to answer.
func commonReadError(err error) bool {
	var ne net.Error
	var oe *net.OpError
	return err == io.EOF || errors.Is(err, net.ErrClosed) || (errors.As(err, &ne) && ne.Timeout()) ||
		(errors.As(err, &oe) && oe.Op == "read")
}

// goneWatch cancels the request being served when its client goes away:
// the tunnel reports that a read would no longer block once the request's
// body was read and nothing more was sent, and it failed (a reset). A
// client that only ended its direction (a half-close, as `nc -N` or
// shutdown(SHUT_WR) after the request) still reads and gets its answers.
// (net/http's server keeps a read pending on the connection instead, and
// takes either for a client gone.)
type goneWatch struct {
	scope *requestScope
	peer  PeerDoner
	mu    sync.Mutex
	ended bool
	gen   uint64 // the current request's generation, once armed; 0: none
}

func (g *goneWatch) peerEnded() {
	if halfClosed(g.peer) {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.ended = true
	if g.gen != 0 {
		g.scope.end(g.gen)
	}
}

func (g *goneWatch) arm(gen uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ended {
		g.scope.end(gen)
		return
	}
	g.gen = gen
}

func (g *goneWatch) disarm() {
	g.mu.Lock()
	g.gen = 0
	g.mu.Unlock()
}

// h1Body is a request body: it sends 100 Continue on the first read when
// the client expects it, arms goneWatch at its end, and is closed without
// reading on (net/http's client-side body would read the rest of it on
// Close, unbounded): what is left is drained, within a limit, by the
// server before the next request, or the connection ends.
type h1Body struct {
	w      *ResponseWriter
	gen    uint64 // the request's (requestScope)
	expect bool   // 100-continue was asked for

	// mu keeps a Read (on whichever goroutine sends the body upstream) from
	// overlapping Close, the drain, or the next request's use of the
	// connection's reader.
	mu     sync.Mutex
	src    io.ReadCloser // http.ReadRequest's body
	sawEOF atomic.Bool
	closed bool
}

func (b *h1Body) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, http.ErrBodyReadAfterClose
	}
	if b.expect {
		b.w.writeContinue()
	}
	n, err := b.src.Read(p)
	if err == io.EOF && !b.sawEOF.Load() {
		b.sawEOF.Store(true)
		b.w.c.bodyDone(b.gen)
	}
	return n, err
}

func (b *h1Body) Close() error {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	return nil
}

// drain reads what is left of the body, up to 256 KiB as net/http's server
// does; false when more is left or it cannot be read: the next bytes on the
// connection would not be a request.
func (b *h1Body) drain() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	if b.sawEOF.Load() {
		return true
	}
	// io.EOF within the limit: drained; nil: more than the limit.
	_, err := io.CopyN(io.Discard, b.src, 256<<10+1)
	return err == io.EOF
}

// bodyDone arms goneWatch once a request's body was read, unless the
// client already sent more (pipelining): only then would a read not block
// because the client went away.
func (c *h1Conn) bodyDone(gen uint64) {
	if c.br.Buffered() == 0 {
		c.gone.arm(gen)
	}
}

// ResponseWriter is the http.ResponseWriter of one request.
type ResponseWriter struct {
	c                *h1Conn
	req              *http.Request
	body             *h1Body // nil: the request had none
	hdr              http.Header
	wants10KeepAlive bool
	wantsClose       bool

	// mu orders the interim responses (100 Continue from the body reader,
	// 1xx from the upstream) with the final header.
	mu          sync.Mutex
	canContinue bool
	wroteHeader bool

	status        int
	hijacked      bool
	chunked       bool
	bodyless      bool // HEAD: writes are eaten
	contentLength int64
	written       int64
	closeAfter    bool
	trailers      []string // declared in the Trailer header
	werr          error
}

var (
	_ http.ResponseWriter = (*ResponseWriter)(nil)
	_ http.Flusher        = (*ResponseWriter)(nil)
	_ http.Hijacker       = (*ResponseWriter)(nil)
)

func (w *ResponseWriter) Header() http.Header {
	if w.hdr == nil {
		w.hdr = make(http.Header)
	}
	return w.hdr
}

// TakeHeader uses h as the response's header, made by nobody else (see
// responseRecorder.TakeHeader), when none was set yet.
func (w *ResponseWriter) TakeHeader(h http.Header) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.hdr) > 0 || w.wroteHeader {
		return false
	}
	w.hdr = h
	return true
}

func (w *ResponseWriter) writeContinue() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.canContinue {
		w.canContinue = false
		// (A failure shows in the body's read.)
		w.c.bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
		_ = w.c.bw.Flush()
	}
}

// WriteHeader writes the status line and header now (nothing is buffered
// to guess a length: a response without Content-Length is chunked, or
// ends with the connection for HTTP/1.0).
func (w *ResponseWriter) WriteHeader(code int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.wroteHeader || w.hijacked {
		return
	}
	if code < 100 || code > 999 {
		w.c.log.Error("handler wrote an invalid status code", zap.Int("status", code))
		code = http.StatusInternalServerError
	}
	bw := w.c.bw
	if code < 200 && code != http.StatusSwitchingProtocols {
		if !w.req.ProtoAtLeast(1, 1) {
			return // HTTP/1.0 clients get no interim responses
		}
		if code == http.StatusContinue {
			w.canContinue = false
		}
		writeStatusLine(bw, true, code)
		writeFields(bw, w.hdr, func(k string) bool { return k == "Content-Length" || k == "Transfer-Encoding" })
		bw.WriteString("\r\n")
		w.note(bw.Flush())
		return
	}
	w.wroteHeader = true
	w.canContinue = false
	w.status = code
	if w.hdr == nil {
		w.hdr = make(http.Header)
	}
	h := w.hdr

	for _, v := range h["Trailer"] {
		for _, k := range strings.Split(v, ",") {
			k = http.CanonicalHeaderKey(textproto.TrimString(k))
			switch k {
			case "", "Transfer-Encoding", "Content-Length", "Trailer":
			default:
				w.trailers = append(w.trailers, k)
			}
		}
	}
	prefixed := false
	for k := range h {
		prefixed = prefixed || strings.HasPrefix(k, http.TrailerPrefix)
	}
	if cl := h.Get("Content-Length"); cl != "" {
		if v, err := strconv.ParseInt(cl, 10, 64); err == nil && v >= 0 {
			w.contentLength = v
		} else {
			w.c.log.Debug("response with an invalid Content-Length dropped it", zap.String("content-length", cl))
			delete(h, "Content-Length")
		}
	}
	te := h.Get("Transfer-Encoding")
	if w.contentLength >= 0 && te != "" && te != "identity" {
		delete(h, "Content-Length")
		w.contentLength = -1
	}

	switch {
	case w.wants10KeepAlive && (w.req.Method == http.MethodHead || w.contentLength >= 0 || !bodyAllowed(code)):
		if _, set := h["Connection"]; !set {
			h["Connection"] = keepAliveValue
		}
	case !w.req.ProtoAtLeast(1, 1) || w.wantsClose:
		w.closeAfter = true
	}
	if hasToken(h.Get("Connection"), "close") || w.c.draining() {
		w.closeAfter = true
	}
	if b := w.body; b != nil && b.expect && !b.sawEOF.Load() {
		// The client waited for 100 Continue, or is still sending a body
		// nobody read: the next bytes may not be a request.
		w.closeAfter = true
	}

	switch {
	case code == http.StatusNotModified:
		delete(h, "Content-Type")
		fallthrough
	case !bodyAllowed(code):
		delete(h, "Content-Length")
		delete(h, "Transfer-Encoding")
		w.contentLength = -1
	case w.req.Method == http.MethodHead:
		delete(h, "Transfer-Encoding")
		w.bodyless = true
	case w.contentLength >= 0:
		delete(h, "Transfer-Encoding")
	case w.req.ProtoAtLeast(1, 1) && te == "identity":
		delete(h, "Transfer-Encoding")
		w.closeAfter = true
	case w.req.ProtoAtLeast(1, 1):
		h["Transfer-Encoding"] = chunkedValue
		w.chunked = true
	default:
		delete(h, "Transfer-Encoding")
		w.closeAfter = true
	}
	if w.closeAfter && !hasToken(h.Get("Connection"), "close") {
		h["Connection"] = closeValue
	}
	if code == http.StatusSwitchingProtocols {
		w.closeAfter = true // what follows is not HTTP/1.1
	}

	writeStatusLine(bw, w.req.ProtoAtLeast(1, 1), code)
	if prefixed {
		writeFields(bw, h, func(k string) bool { return strings.HasPrefix(k, http.TrailerPrefix) })
	} else {
		writeFields(bw, h, nil)
	}
	if _, ok := h["Date"]; !ok {
		writeDate(bw)
	}
	_, err := bw.WriteString("\r\n")
	w.note(err)
}

func writeDate(bw *bufio.Writer) {
	var buf [64]byte
	bw.WriteString("Date: ")
	bw.Write(time.Now().UTC().AppendFormat(buf[:0], http.TimeFormat))
	bw.WriteString("\r\n")
}

// CanWriteRaw: WriteRaw would write (rawWritableLocked).
func (w *ResponseWriter) CanWriteRaw() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rawWritableLocked()
}

// rawWritableLocked: no header was written or set yet, and the request is
// not HEAD (whose response has no body to frame). w.mu held.
func (w *ResponseWriter) rawWritableLocked() bool {
	return !w.wroteHeader && !w.hijacked && len(w.hdr) == 0 && w.req.Method != http.MethodHead
}

// WriteRaw writes the head of a final response (2xx-5xx, not 204 or 304)
// with Content-Length cl whose fields are raw's lines, as WriteHeader would
// write that response with those fields in a header map (for such a
// response its cases come down to these: the length frames the body, and
// the connection is kept alive or closed as the request asks), in the
// upstream's field order rather than sorted. FuzzWriteRaw compares the two.
func (w *ResponseWriter) WriteRaw(code int, cl int64, raw *RawFields) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.rawWritableLocked() {
		return false
	}
	w.wroteHeader = true
	w.canContinue = false
	w.status = code
	w.contentLength = cl
	connection := ""
	switch {
	case w.wants10KeepAlive:
		connection = "keep-alive"
	case !w.req.ProtoAtLeast(1, 1) || w.wantsClose:
		w.closeAfter = true
	}
	if b := w.body; b != nil && b.expect && !b.sawEOF.Load() || w.c.draining() {
		w.closeAfter = true
	}
	if w.closeAfter {
		connection = "close"
	}
	bw := w.c.bw
	writeStatusLine(bw, w.req.ProtoAtLeast(1, 1), code)
	bw.WriteString(raw.lines)
	if connection != "" {
		bw.WriteString("Connection: ")
		bw.WriteString(connection)
		bw.WriteString("\r\n")
	}
	if !raw.date {
		writeDate(bw)
	}
	_, err := bw.WriteString("\r\n")
	w.note(err)
	return true
}

var (
	keepAliveValue = []string{"keep-alive"}
	closeValue     = []string{"close"}
	chunkedValue   = []string{"chunked"}
)

func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// note keeps the first write error: the connection is not reused after it.
func (w *ResponseWriter) note(err error) {
	if err != nil && w.werr == nil {
		w.werr = err
	}
}

func (w *ResponseWriter) Write(p []byte) (int, error) {
	if w.hijacked {
		return 0, http.ErrHijacked
	}
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	switch {
	case !bodyAllowed(w.status):
		return 0, http.ErrBodyNotAllowed
	case w.werr != nil:
		return 0, w.werr
	case w.contentLength >= 0 && w.written+int64(len(p)) > w.contentLength:
		return 0, http.ErrContentLength
	}
	w.written += int64(len(p))
	if w.bodyless || len(p) == 0 {
		return len(p), nil
	}
	bw := w.c.bw
	if w.chunked {
		var buf [18]byte
		bw.Write(strconv.AppendUint(buf[:0], uint64(len(p)), 16))
		bw.WriteString("\r\n")
	}
	n, err := bw.Write(p)
	if w.chunked && err == nil {
		_, err = bw.WriteString("\r\n")
	}
	w.note(err)
	return n, err
}

func (w *ResponseWriter) Flush() { _ = w.FlushError() }

func (w *ResponseWriter) FlushError() error {
	if w.hijacked {
		return http.ErrHijacked
	}
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	err := w.c.bw.Flush()
	w.note(err)
	return err
}

// SetReadDeadline bounds reading the request body (the engine's request
// timeout, through http.ResponseController).
func (w *ResponseWriter) SetReadDeadline(t time.Time) error { return w.c.conn.SetReadDeadline(t) }

// Hijack hands the connection to the handler (upgrades); bytes the client
// already sent are read from the returned connection first.
func (w *ResponseWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.hijacked {
		return nil, nil, http.ErrHijacked
	}
	w.mu.Lock()
	w.canContinue = false
	w.hijacked = true
	w.mu.Unlock()
	c := w.c
	c.gone.disarm()
	if err := c.bw.Flush(); err != nil {
		return nil, nil, err
	}
	var conn net.Conn = c.conn
	if n := c.br.Buffered(); n > 0 {
		buffered, _ := c.br.Peek(n)
		conn = &PrefixConn{Conn: c.conn, Prefix: slices.Clone(buffered)}
	}
	return conn, bufio.NewReadWriter(bufio.NewReader(conn), bufio.NewWriter(conn)), nil
}

// finish ends the response: the last chunk with the trailers, then flush.
func (w *ResponseWriter) finish() {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	bw := w.c.bw
	if w.chunked {
		bw.WriteString("0\r\n")
		writeTrailers(bw, w.hdr, w.trailers)
		bw.WriteString("\r\n")
	}
	w.note(bw.Flush())
}

// reusable reports whether the connection can carry another request: the
// response was framed and written whole and the request body was read to
// its end (or drained).
func (w *ResponseWriter) reusable() bool {
	if w.closeAfter || w.werr != nil {
		return false
	}
	if !w.bodyless && w.contentLength >= 0 && bodyAllowed(w.status) && w.written != w.contentLength {
		return false // short: the client cannot find the next response
	}
	return w.body == nil || w.body.drain()
}

func writeStatusLine(bw *bufio.Writer, http11 bool, code int) {
	if http11 {
		bw.WriteString("HTTP/1.1 ")
	} else {
		bw.WriteString("HTTP/1.0 ")
	}
	var buf [3]byte
	bw.Write(strconv.AppendInt(buf[:0], int64(code), 10))
	bw.WriteByte(' ')
	if text := http.StatusText(code); text != "" {
		bw.WriteString(text)
	} else {
		bw.WriteString("status code ")
		bw.Write(strconv.AppendInt(buf[:0], int64(code), 10))
	}
	bw.WriteString("\r\n")
}

// writeFields writes h's fields in key order as net/http's Header.Write
// does: invalid names dropped, CR and LF in values turned into spaces (a
// policy result or filter must not be able to split the response), values
// trimmed. skip, when set, leaves keys out.
func writeFields(bw *bufio.Writer, h http.Header, skip func(string) bool) {
	var buf [32]string
	keys := buf[:0]
	for k := range h {
		if skip == nil || !skip(k) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		writeField(bw, k, h[k])
	}
}

func writeField(bw *bufio.Writer, k string, vv []string) {
	if !httpguts.ValidHeaderFieldName(k) {
		return
	}
	for _, v := range vv {
		bw.WriteString(k)
		bw.WriteString(": ")
		if strings.ContainsAny(v, "\r\n") {
			v = strings.NewReplacer("\r", " ", "\n", " ").Replace(v)
		}
		bw.WriteString(textproto.TrimString(v))
		bw.WriteString("\r\n")
	}
}

// writeTrailers writes the declared trailers' values and the fields set
// under http.TrailerPrefix.
func writeTrailers(bw *bufio.Writer, h http.Header, declared []string) {
	for _, k := range declared {
		writeField(bw, k, h[k])
	}
	var prefixed []string
	for k := range h {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			prefixed = append(prefixed, k)
		}
	}
	slices.Sort(prefixed)
	for _, k := range prefixed {
		writeField(bw, http.CanonicalHeaderKey(k[len(http.TrailerPrefix):]), h[k])
	}
}
