package l7

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"time"

	"golang.org/x/net/http2"

	"github.com/causeway-mesh/causeway/pkg/l7/h1"
)

// h2Preface is what an HTTP/2 client with prior knowledge sends first.
const h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// ServeConn serves HTTP on a tunnel until the client closes it, it idles
// out, or ctx ends; it closes conn. ProtocolHTTP serves HTTP/1.1 but
// switches to HTTP/2 when the client opens with the HTTP/2 preface;
// ProtocolHTTP2 and ProtocolGRPC serve HTTP/2 with prior knowledge.
// ProtocolTCP is not HTTP and is refused. HTTP/1.1 requests are cancelled
// when their client goes away (its tunnel fails or is reset; one that only
// ended its direction still gets its answers): an HBONE stream reports that
// itself (PeerDone); any other connection is read one buffer ahead to
// learn it.
func (e *Engine) ServeConn(ctx context.Context, conn net.Conn, info ConnInfo) error {
	defer conn.Close()
	if info.Protocol == ProtocolTCP {
		return errors.New("l7: ServeConn on a TCP port")
	}
	if info.Port == 0 {
		info.Port = uint32(info.Destination.Port())
	}
	if info.Service.IsZero() && !info.Destination.IsValid() {
		return errors.New("l7: ConnInfo has neither a service nor a destination")
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	t := newTunnel(info, e.log)
	t.identify(e.Config(), e.metrics)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { e.serveHTTP(w, r, t) })

	if info.Protocol != ProtocolHTTP {
		e.serveH2(ctx, conn, h)
		return nil
	}
	_ = conn.SetReadDeadline(time.Now().Add(e.opts.ReadHeaderTimeout))
	prefix, isH2, err := sniffPreface(conn)
	_ = conn.SetReadDeadline(time.Time{})
	if err != nil {
		if len(prefix) == 0 && errors.Is(err, io.EOF) {
			return nil // closed before sending anything
		}
		return fmt.Errorf("l7: reading the first request: %w", err)
	}
	pc := &h1.PrefixConn{Conn: conn, Prefix: prefix}
	if isH2 {
		e.serveH2(ctx, pc, h)
		return nil
	}
	var hc net.Conn = pc
	pd, ok := conn.(h1.PeerDoner)
	if !ok {
		ac := h1.NewAheadConn(pc)
		defer ac.Close()
		defer lingeringClose(conn, ac)
		hc, pd = ac, ac
	}
	h1.Serve(ctx, &e.drainer, hc, pd, h, h1.Limits{
		ReadHeaderTimeout: e.opts.ReadHeaderTimeout,
		IdleTimeout:       e.opts.IdleTimeout,
		MaxHeaderBytes:    e.opts.MaxHeaderBytes,
	}, e.log)
	return nil
}

// lingeringClose ends a TCP connection the server is done with as
// net/http's server does: our direction first, then what the client still
// sends is read for a moment (from r, which reads conn). Closed with
// unread bytes, the socket would be reset, and the client could lose the
// last answer (a refusal) with it. An HBONE stream needs none of this: its
// reset after END_STREAM leaves the client what it was sent.
func lingeringClose(conn net.Conn, r io.Reader) {
	cw, ok := conn.(interface{ CloseWrite() error })
	if !ok || cw.CloseWrite() != nil {
		return
	}
	_ = conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	_, _ = io.Copy(io.Discard, io.LimitReader(r, 256<<10))
}

func (e *Engine) serveH2(ctx context.Context, conn net.Conn, h http.Handler) {
	e.h2.ServeConn(conn, &http2.ServeConnOpts{Context: ctx, Handler: h, BaseConfig: e.h2base})
}

// sniffPreface reads until the bytes read stop being a prefix of the HTTP/2
// preface (an HTTP/1.1 request differs within three bytes) or the whole
// preface is read. The bytes read are returned for replay.
func sniffPreface(c net.Conn) ([]byte, bool, error) {
	buf := make([]byte, len(h2Preface))
	n := 0
	for n < len(buf) {
		m, err := c.Read(buf[n:])
		n += m
		if !bytes.HasPrefix([]byte(h2Preface), buf[:n]) {
			return buf[:n], false, nil
		}
		if err != nil {
			return buf[:n], false, err
		}
	}
	return buf, true, nil
}

// NewEngine creates an engine with no configuration: until the first Update
// every request gets 503.
func NewEngine(opts Options) (*Engine, error) {
	if opts.Dialer == nil {
		return nil, errors.New("l7: Options.Dialer is required")
	}
	if opts.Authorizer == nil {
		return nil, errors.New("l7: Options.Authorizer is required (AllowAll() to run without policy)")
	}
	opts.defaults()
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &Engine{
		opts:      opts,
		log:       opts.Logger.Named("l7"),
		metrics:   m,
		pools:     newPools(opts.Dialer, opts.UpstreamIdleTimeout, opts.EjectionTime, int64(opts.MaxHeaderBytes)),
		ctx:       ctx,
		cancel:    cancel,
		mirrorSem: make(chan struct{}, opts.MaxMirrorsInFlight),
	}
	e.h2 = &http2.Server{
		MaxConcurrentStreams:         opts.MaxConcurrentStreams,
		IdleTimeout:                  opts.IdleTimeout,
		ReadIdleTimeout:              30 * time.Second,
		PingTimeout:                  15 * time.Second,
		WriteByteTimeout:             30 * time.Second,
		MaxUploadBufferPerStream:     4 << 20,
		MaxUploadBufferPerConnection: 16 << 20,
	}
	e.h2base = &http.Server{MaxHeaderBytes: opts.MaxHeaderBytes, ErrorLog: log.New(zapWriter{e.log}, "", 0), ConnState: e.h2ConnState}
	if err := http2.ConfigureServer(e.h2base, e.h2); err != nil {
		return nil, err
	}
	e.proxy = &httputil.ReverseProxy{
		Rewrite:        e.rewrite,
		Transport:      upstreamTransport{e},
		ModifyResponse: e.modifyResponse,
		ErrorHandler:   e.proxyError,
		BufferPool:     bufferPool{},
		ErrorLog:       log.New(zapWriter{e.log}, "", 0),
	}
	return e, nil
}
