package hbone

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/net/http2/hpack"

	"github.com/causeway-mesh/causeway/pkg/trust"
)

// Defaults shared by the server and the pool (ztunnel's window sizes).
// Frames stay at the protocol's initial 16 KiB: a TLS record carries at
// most 16 KiB anyway, bulk transfers measured no slower than with 1 MiB
// frames (bench/hbone throughput, 3 interleaved pairs: 302/313/541 MB/s
// with 1 MiB, 441/397/732 with 16 KiB), and h2spec's frame-size cases
// assume the initial size.
const (
	DefaultStreamWindow    = 4 << 20
	DefaultConnWindow      = 16 << 20
	DefaultMaxFrameSize    = initialFrameSize
	DefaultMaxHeaderBytes  = 32 << 10
	DefaultReadIdleTimeout = 30 * time.Second
	DefaultPingTimeout     = 15 * time.Second
	DefaultWriteTimeout    = 30 * time.Second

	DefaultServerMaxStreams = 200
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultHeaderTimeout    = 10 * time.Second
	DefaultServerIdle       = 10 * time.Minute
)

// ErrServerClosed is returned by Serve after Shutdown or Close.
var ErrServerClosed = errors.New("hbone: server closed")

// Request is one CONNECT as a Handler sees it. Only Peer says who the caller
// is; everything from headers is untrusted metadata.
type Request struct {
	// Peer comes from the verified TLS handshake only: an identity when the
	// client presented a valid mesh certificate, unauthenticated otherwise.
	Peer trust.Peer
	// Local is where the tunnel connection was accepted (the pod or
	// waypoint IP the client dialed), Remote the TCP peer of that connection.
	Local, Remote netip.AddrPort
	// Authority is the :authority parsed strictly as ip:port. It is the zero
	// value only when Host is set.
	Authority netip.AddrPort
	// Host is the raw :authority when it is a host name; only on servers
	// with AllowHostnames.
	Host string
	// Forwarded is the for= address of the first Forwarded element; zero
	// when absent or unparseable. Untrusted: it is what the client claims.
	Forwarded netip.AddrPort
	// Baggage (all values joined with ",") and Traceparent, untrusted.
	Baggage, Traceparent string
}

// Handler decides about each CONNECT. Returning an error answers it with
// the error's status (Deny: 401, Unavailable: 503, BadRequest: 400; any
// other error: 503) and logs the error. Returning a Stream answers 200 and
// hands the tunnel to it; answer only once the upstream is connected.
type Handler interface {
	Open(ctx context.Context, r *Request) (Stream, error)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, r *Request) (Stream, error)

func (f HandlerFunc) Open(ctx context.Context, r *Request) (Stream, error) { return f(ctx, r) }

// Stream serves one accepted tunnel. It owns the tunnel and must close it
// (the server closes it too once Serve returns). The tunnel supports
// CloseWrite (END_STREAM) and deadlines. ctx is cancelled when the peer
// resets the stream or the connection ends.
type Stream interface {
	Serve(ctx context.Context, tunnel net.Conn)
}

// StreamFunc adapts a function to Stream.
type StreamFunc func(ctx context.Context, tunnel net.Conn)

func (f StreamFunc) Serve(ctx context.Context, tunnel net.Conn) { f(ctx, tunnel) }

// ServerOptions configures a Server. Zero values take the defaults.
type ServerOptions struct {
	// TLS is the server TLS configuration, normally trust.ServerConfig.
	// Connections that do not end up with TLS 1.3 and ALPN h2 are closed.
	TLS     *tls.Config
	Handler Handler
	Logger  *zap.Logger
	// AllowHostnames accepts name:port authorities (Request.Host) besides
	// ip:port; off by default.
	AllowHostnames bool

	MaxConcurrentStreams uint32 // per connection; default 200
	// MaxHeaderBytes bounds a request's header list (default 32 KiB): a
	// larger one is answered 431, a header block of more than twice that
	// ends the connection.
	MaxHeaderBytes int
	MaxFrameSize   uint32 // largest frame accepted; default 16 KiB
	StreamWindow   int32  // default 4 MiB
	ConnWindow     int32  // default 16 MiB

	// HandshakeTimeout bounds the TLS handshake (default 10s); HeaderTimeout
	// bounds the HTTP/2 preface and the first request after it (default
	// 10s), and each later header block that spans several frames.
	HandshakeTimeout time.Duration
	HeaderTimeout    time.Duration
	// IdleTimeout closes connections without tunnels (default 10m; < 0: never).
	IdleTimeout time.Duration
	// ReadIdleTimeout sends a PING after that long without a frame from the
	// client (default 30s; < 0: no keepalive); PingTimeout (default 15s)
	// closes the connection when the PING is not answered.
	ReadIdleTimeout time.Duration
	PingTimeout     time.Duration
	// WriteTimeout closes a connection whose socket accepts no data for
	// that long (default 30s).
	WriteTimeout time.Duration
	// Registerer, if set, registers hbone_handshake_failures_total.
	Registerer prometheus.Registerer
}

// Server accepts HBONE connections and serves CONNECT tunnels.
type Server struct {
	opts ServerOptions
	cfg  connConfig
	log  *zap.Logger

	ctx    context.Context // cancelled by Close or an expired Shutdown
	cancel context.CancelFunc

	tunnels atomic.Int64
	// handshakeFailures counts connections refused before their first
	// frame, by reason (handshake.go).
	handshakeFailures *prometheus.CounterVec

	mu        sync.Mutex
	closed    bool
	listeners map[net.Listener]struct{}
	conns     map[*h2conn]struct{}
	connWG    sync.WaitGroup
}

// NewServer checks opts and returns a server.
func NewServer(opts ServerOptions) (*Server, error) {
	if opts.TLS == nil {
		return nil, errors.New("hbone: ServerOptions.TLS is required")
	}
	if opts.Handler == nil {
		return nil, errors.New("hbone: ServerOptions.Handler is required")
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	setDefault(&opts.MaxConcurrentStreams, DefaultServerMaxStreams)
	setDefault(&opts.MaxHeaderBytes, DefaultMaxHeaderBytes)
	setDefault(&opts.HandshakeTimeout, DefaultHandshakeTimeout)
	setDefault(&opts.HeaderTimeout, DefaultHeaderTimeout)
	setDefault(&opts.IdleTimeout, DefaultServerIdle)
	cfg, err := newConnConfig(opts.StreamWindow, opts.ConnWindow, opts.MaxFrameSize, opts.MaxHeaderBytes,
		opts.ReadIdleTimeout, opts.PingTimeout, opts.WriteTimeout)
	if err != nil {
		return nil, err
	}
	cfg.maxStreams = opts.MaxConcurrentStreams
	cfg.idleTimeout = max(opts.IdleTimeout, 0)
	cfg.headerTimeout = opts.HeaderTimeout
	failures, err := newHandshakeFailures(opts.Registerer)
	if err != nil {
		return nil, fmt.Errorf("hbone server metrics: %w", err)
	}
	s := &Server{
		handshakeFailures: failures,
		opts:              opts,
		cfg:               cfg,
		log:               opts.Logger,
		listeners:         make(map[net.Listener]struct{}),
		conns:             make(map[*h2conn]struct{}),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

func setDefault[T int | int32 | uint32 | time.Duration](v *T, def T) {
	if *v == 0 {
		*v = def
	}
}

// newConnConfig validates the limits common to both roles.
func newConnConfig(streamWin, connWin int32, maxFrame uint32, maxHeader int,
	readIdle, ping, write time.Duration) (connConfig, error) {
	setDefault(&streamWin, DefaultStreamWindow)
	setDefault(&connWin, DefaultConnWindow)
	setDefault(&maxFrame, DefaultMaxFrameSize)
	setDefault(&maxHeader, DefaultMaxHeaderBytes)
	setDefault(&readIdle, DefaultReadIdleTimeout)
	setDefault(&ping, DefaultPingTimeout)
	setDefault(&write, DefaultWriteTimeout)
	switch {
	case streamWin < initialWindowSize:
		return connConfig{}, fmt.Errorf("hbone: stream window %d below %d", streamWin, initialWindowSize)
	case connWin < initialWindowSize:
		return connConfig{}, fmt.Errorf("hbone: connection window %d below %d", connWin, initialWindowSize)
	case maxFrame < initialFrameSize || maxFrame > 1<<24-1:
		return connConfig{}, fmt.Errorf("hbone: max frame size %d outside [%d, %d]", maxFrame, initialFrameSize, 1<<24-1)
	case maxHeader < 1024:
		return connConfig{}, fmt.Errorf("hbone: max header bytes %d below 1024", maxHeader)
	}
	return connConfig{
		streamWindow:    streamWin,
		connWindow:      connWin,
		maxFrameSize:    maxFrame,
		maxHeaderBytes:  uint32(maxHeader),
		readIdleTimeout: max(readIdle, 0),
		pingTimeout:     ping,
		writeTimeout:    max(write, 0),
	}, nil
}

// Serve accepts connections on ln until Shutdown or Close, and returns
// ErrServerClosed then (or the listener's error).
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	s.listeners[ln] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
	}()
	var backoff time.Duration
	for {
		raw, err := ln.Accept()
		if err != nil {
			if s.isClosed() {
				return ErrServerClosed
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// Out of file descriptors and the like: wait and retry.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Warn("accept failed; retrying", zap.Error(err), zap.Duration("backoff", backoff))
			select {
			case <-time.After(backoff):
			case <-s.ctx.Done():
				return ErrServerClosed
			}
			continue
		}
		backoff = 0
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			raw.Close()
			return ErrServerClosed
		}
		s.connWG.Add(1)
		s.mu.Unlock()
		go s.serveConn(raw)
	}
}

// now is the time the TLS configuration judges certificates at.
func (s *Server) now() time.Time {
	if s.opts.TLS.Time != nil {
		return s.opts.TLS.Time()
	}
	return time.Now()
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

func (s *Server) serveConn(raw net.Conn) {
	defer s.connWG.Done()
	log := s.log.With(zap.Stringer("remote", raw.RemoteAddr()))
	batch := newRecordBatcher(raw)
	tc := tls.Server(batch, s.opts.TLS)
	raw.SetDeadline(time.Now().Add(s.opts.HandshakeTimeout))
	if err := tc.HandshakeContext(s.ctx); err != nil {
		// A client certificate outside its validity period is an expired
		// certificate or a skewed clock: worth a warning with the skew.
		var te *trust.CertificateTimeError
		err = trust.ExplainValidity(err, s.now())
		reason := handshakeFailure(err)
		s.handshakeFailures.WithLabelValues(reason).Inc()
		if errors.As(err, &te) {
			log.Warn("TLS handshake refused: client certificate outside its validity period", zap.String("reason", reason),
				zap.Duration("skew", te.Skew()), zap.Error(err))
		} else {
			log.Debug("TLS handshake failed", zap.String("reason", reason), zap.Error(err))
		}
		raw.Close()
		return
	}
	raw.SetDeadline(time.Time{})
	cs := tc.ConnectionState()
	if cs.Version != tls.VersionTLS13 || cs.NegotiatedProtocol != trust.ALPN {
		s.handshakeFailures.WithLabelValues(FailProtocol).Inc()
		log.Debug("closing connection: need TLS 1.3 with ALPN h2",
			zap.Uint16("tls_version", cs.Version), zap.String("alpn", cs.NegotiatedProtocol))
		tc.Close()
		return
	}
	peer, err := trust.PeerFromTLS(cs)
	if err != nil {
		s.handshakeFailures.WithLabelValues(FailBadCertificate).Inc()
		log.Info("closing connection: unusable client certificate", zap.Error(err))
		tc.Close()
		return
	}
	log = log.With(zap.Stringer("peer", peer))
	base := Request{Peer: peer, Local: addrPortOf(raw.LocalAddr()), Remote: addrPortOf(raw.RemoteAddr())}
	c := newH2Conn(s.ctx, tc, batch, false, &s.cfg, log)
	c.newStream = func(st *stream, b *headerBlock) { s.onStream(log, &base, st, b) }

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		tc.Close()
		return
	}
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
	}()
	if err := c.start(); err != nil {
		log.Debug("connection preface failed", zap.Error(err))
		c.close(err)
		return
	}
	if err := c.serve(); err != nil && !errors.Is(err, net.ErrClosed) {
		log.Debug("connection ended", zap.Error(err))
	}
}

// onStream runs on the connection's read loop: it reads the request out of
// the header block (valid only until the next one) and starts the handler.
func (s *Server) onStream(log *zap.Logger, base *Request, st *stream, b *headerBlock) {
	req, code, reason := s.parseRequest(base, b)
	s.tunnels.Add(1)
	go s.serveStream(log, st, req, code, reason)
}

// parseRequest reads a request whose header block is well-formed (the
// connection reset the stream otherwise) or truncated.
func (s *Server) parseRequest(base *Request, b *headerBlock) (*Request, int, string) {
	if b.truncated {
		return nil, http.StatusRequestHeaderFieldsTooLarge, "request headers too large"
	}
	if method, _ := b.pseudo(":method"); method != http.MethodConnect {
		return nil, http.StatusMethodNotAllowed, "only CONNECT is served"
	}
	authority, _ := b.pseudo(":authority")
	req := *base
	var forwarded, baggage []string
	for _, hf := range b.regular() {
		switch hf.Name {
		case "host":
			if hf.Value != authority {
				return nil, http.StatusBadRequest, "host header differs from :authority"
			}
		case "forwarded":
			forwarded = append(forwarded, hf.Value)
		case "baggage":
			baggage = append(baggage, hf.Value)
		case "traceparent":
			if req.Traceparent == "" {
				req.Traceparent = hf.Value
			}
		}
	}
	ap, err := ParseAuthority(authority)
	switch {
	case err == nil:
		req.Authority = ap
	case s.opts.AllowHostnames:
		host, herr := parseHostAuthority(authority)
		if herr != nil {
			return nil, http.StatusBadRequest, "authority must be ip:port or name:port: " + herr.Error()
		}
		req.Host = host
	default:
		return nil, http.StatusBadRequest, "authority must be ip:port: " + err.Error()
	}
	if len(forwarded) > 0 {
		// Only the first element matters: the original client.
		if fwd, err := ParseForwardedFor(forwarded[0]); err == nil {
			req.Forwarded = fwd
		}
	}
	req.Baggage = strings.Join(baggage, ",")
	return &req, 0, ""
}

func (s *Server) serveStream(log *zap.Logger, st *stream, req *Request, code int, reason string) {
	handedOff := false
	defer func() {
		if v := recover(); v != nil {
			log.Error("tunnel handler panicked", zap.Any("panic", v), zap.Stack("stack"))
		}
		if !handedOff {
			st.Close()
			s.tunnels.Add(-1)
		}
	}()
	if code != 0 {
		log.Debug("bad CONNECT", zap.Int("status", code), zap.String("reason", reason))
		st.refuse(code, reason)
		return
	}
	target := zap.Stringer("authority", req.Authority)
	if req.Host != "" {
		target = zap.String("authority", req.Host)
	}
	strm, err := s.opts.Handler.Open(streamContext{st}, req)
	if err == nil && strm == nil {
		err = errors.New("handler returned neither a stream nor an error")
	}
	if err != nil {
		code, reason := statusOf(err)
		log.Info("tunnel refused", target, zap.Int("status", code), zap.String("reason", reason), zap.Error(err))
		st.refuse(code, reason)
		return
	}
	if err := st.respond(http.StatusOK, "", nil); err != nil {
		log.Debug("answering CONNECT failed", target, zap.Error(err))
	}
	handedOff = true
	if rs, ok := strm.(*RelayStream); ok {
		rs.start(streamContext{st}, st, func() {
			st.Close()
			s.tunnels.Add(-1)
		})
		return
	}
	// Serve on a fresh goroutine: this one's stack grew while the handler
	// connected upstream, and a tunnel may stay open (and idle) for hours.
	go s.serveTunnel(log, st, strm)
}

func (s *Server) serveTunnel(log *zap.Logger, st *stream, strm Stream) {
	defer s.tunnels.Add(-1)
	defer st.Close()
	defer func() {
		if v := recover(); v != nil {
			log.Error("tunnel stream panicked", zap.Any("panic", v), zap.Stack("stack"))
		}
	}()
	strm.Serve(streamContext{st}, st)
}

const (
	// refuseBodyTimeout bounds how long a refusal's body waits for the
	// client's flow control window.
	refuseBodyTimeout = 5 * time.Second
	// A refused client still sending is read (and its data dropped) for up
	// to refuseDrain bytes and refuseLinger, so that it can finish its
	// request instead of being reset in the middle.
	refuseDrain  = 64 << 10
	refuseLinger = time.Second
)

// refuse answers a request that gets no tunnel: status, with the reason in
// ReasonHeader and as a plain-text body (what curl and browsers show).
func (st *stream) refuse(status int, reason string) error {
	reason = sanitizeReason(reason)
	text := reason
	if text == "" {
		text = http.StatusText(status)
	}
	body := []byte(text + "\n")
	if err := st.respond(status, reason, body); err != nil {
		return err
	}
	st.SetWriteDeadline(time.Now().Add(refuseBodyTimeout))
	if _, err := st.Write(body); err != nil {
		return err
	}
	if err := st.CloseWrite(); err != nil {
		return err
	}
	st.SetReadDeadline(time.Now().Add(refuseLinger))
	_, err := io.CopyN(io.Discard, st, refuseDrain)
	if err == io.EOF {
		err = nil
	}
	return err
}

// respond sends the response headers; with a body they describe it, and
// without one (a tunnel) the stream stays open.
func (st *stream) respond(status int, reason string, body []byte) error {
	fields := []hpack.HeaderField{{Name: ":status", Value: strconv.Itoa(status)}}
	if reason = sanitizeReason(reason); reason != "" {
		fields = append(fields, hpack.HeaderField{Name: ReasonHeader, Value: reason})
	}
	if body != nil {
		fields = append(fields,
			hpack.HeaderField{Name: "content-type", Value: "text/plain; charset=utf-8"},
			hpack.HeaderField{Name: "content-length", Value: strconv.Itoa(len(body))})
	}
	c := st.c
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.mu.Lock()
	if st.err != nil {
		err := st.err
		c.mu.Unlock()
		return err
	}
	c.mu.Unlock()
	return c.writeHeadersLocked(st.id, fields, false)
}

// Shutdown stops accepting, sends GOAWAY on every connection and waits for
// their tunnels to finish. When ctx ends first, it closes what is left and
// returns ctx's error.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	for ln := range s.listeners {
		ln.Close()
	}
	conns := make([]*h2conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.shutdown()
	}
	done := make(chan struct{})
	go func() {
		s.connWG.Wait()
		close(done)
	}()
	select {
	case <-done:
		s.cancel()
		return nil
	case <-ctx.Done():
		st := s.Stats()
		s.log.Warn("drain deadline: cutting the tunnels left", zap.Int("tunnels", st.Tunnels), zap.Int("connections", st.Connections))
		s.closeConns()
		<-done
		return ctx.Err()
	}
}

// Close closes listeners and connections at once; tunnels are reset.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for ln := range s.listeners {
		ln.Close()
	}
	s.mu.Unlock()
	s.closeConns()
	s.connWG.Wait()
	return nil
}

func (s *Server) closeConns() {
	s.cancel()
	s.mu.Lock()
	conns := make([]*h2conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.close(ErrServerClosed)
	}
}

// ServerStats is a snapshot of a server's load.
type ServerStats struct {
	Connections int // HTTP/2 connections
	Tunnels     int // streams being handled
}

func (s *Server) Stats() ServerStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return ServerStats{Connections: len(s.conns), Tunnels: int(s.tunnels.Load())}
}

// addrPortOf returns a socket address as an AddrPort with IPv4 unmapped.
func addrPortOf(a net.Addr) netip.AddrPort {
	var ap netip.AddrPort
	if ta, ok := a.(*net.TCPAddr); ok {
		ap = ta.AddrPort()
	} else if a != nil {
		ap, _ = netip.ParseAddrPort(a.String())
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}
