package hbone

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/net/http2/hpack"

	"github.com/causeway-mesh/causeway/pkg/trust"
)

// Pool defaults.
const (
	DefaultPoolIdleTimeout   = 5 * time.Minute
	DefaultMaxStreamsPerConn = 100
	DefaultDialTimeout       = 10 * time.Second
	DefaultResponseTimeout   = 30 * time.Second
	// dialAttempts bounds how often Dial moves to another connection when
	// one refused the stream without processing it (GOAWAY, REFUSED_STREAM).
	dialAttempts = 3
)

var errPoolClosed = errors.New("hbone: pool closed")

// PoolOptions configures a Pool. Zero values take the defaults.
type PoolOptions struct {
	// Bundle verifies servers' certificates.
	Bundle *trust.Bundle
	// IdleTimeout closes connections without tunnels after this long
	// (default 5m; < 0: never). Short values avoid reusing a connection to
	// a pod IP that now belongs to someone else.
	IdleTimeout time.Duration
	// MaxStreamsPerConn caps tunnels per connection (default 100); the
	// server's SETTINGS_MAX_CONCURRENT_STREAMS caps it further.
	MaxStreamsPerConn int
	// DialTimeout bounds TCP connect plus TLS handshake (default 10s).
	DialTimeout time.Duration
	// ResponseTimeout bounds the wait for the answer to CONNECT (default 30s).
	ResponseTimeout time.Duration
	// Dial opens the TCP connection to remote, from local when it is valid
	// (default: net.Dialer); a node proxy may use it to mark its own
	// sockets so that capture skips them.
	Dial   func(ctx context.Context, local netip.Addr, remote netip.AddrPort) (net.Conn, error)
	Logger *zap.Logger

	MaxHeaderBytes  int    // response header list accepted; default 32 KiB
	MaxFrameSize    uint32 // largest frame accepted; default 16 KiB
	StreamWindow    int32  // default 4 MiB
	ConnWindow      int32  // default 16 MiB
	ReadIdleTimeout time.Duration
	PingTimeout     time.Duration
	WriteTimeout    time.Duration
}

// Target says where and as whom a tunnel goes.
type Target struct {
	// Address is the next hop: a pod IP:15008 or a waypoint IP:15008.
	Address netip.AddrPort
	// Authority is the :authority, the final destination ip:port.
	Authority string
	// Source is the identity presented; the zero value makes a TLS-only
	// client that presents no certificate (and Cert must be nil).
	Source trust.Identity
	// Cert returns Source's certificate; its URI SAN must be Source.
	Cert func() (*tls.Certificate, error)
	// Expected lists the server identities accepted (URI SAN).
	Expected []trust.Identity
	// Forwarded, when valid, is sent as Forwarded: for="ip:port".
	Forwarded netip.AddrPort
	// LocalAddr, when valid, is the source address of the connection: a
	// node proxy dials from the source pod's IP, as ztunnel does from the
	// pod's network namespace, so the next hop sees where traffic comes
	// from. Connections are pooled per local address.
	LocalAddr netip.Addr
	// Baggage and Traceparent are sent as headers when not empty.
	Baggage, Traceparent string
}

type poolKey struct {
	source   string
	expected string // sorted, space separated
	addr     netip.AddrPort
	local    netip.Addr
}

type keyState struct {
	conns []*h2conn
	dial  *dialCall // in flight, at most one per key
}

type dialCall struct {
	done chan struct{}
	err  error
}

// Pool opens tunnels over pooled HTTP/2 connections, one set per
// {source identity, expected identities, next hop}.
type Pool struct {
	opts   PoolOptions
	cfg    connConfig
	log    *zap.Logger
	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // dials and connection read loops

	mu     sync.Mutex
	closed bool
	keys   map[poolKey]*keyState
}

// NewPool returns a pool. opts.Bundle is required.
func NewPool(opts PoolOptions) (*Pool, error) {
	if opts.Bundle == nil {
		return nil, errors.New("hbone: PoolOptions.Bundle is required")
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	setDefault(&opts.IdleTimeout, DefaultPoolIdleTimeout)
	setDefault(&opts.MaxStreamsPerConn, DefaultMaxStreamsPerConn)
	setDefault(&opts.DialTimeout, DefaultDialTimeout)
	setDefault(&opts.ResponseTimeout, DefaultResponseTimeout)
	if opts.MaxStreamsPerConn < 0 {
		return nil, fmt.Errorf("hbone: MaxStreamsPerConn %d is negative", opts.MaxStreamsPerConn)
	}
	if opts.Dial == nil {
		opts.Dial = DialFrom
	}
	cfg, err := newConnConfig(opts.StreamWindow, opts.ConnWindow, opts.MaxFrameSize, opts.MaxHeaderBytes,
		opts.ReadIdleTimeout, opts.PingTimeout, opts.WriteTimeout)
	if err != nil {
		return nil, err
	}
	cfg.idleTimeout = max(opts.IdleTimeout, 0)
	p := &Pool{opts: opts, cfg: cfg, log: opts.Logger, keys: make(map[poolKey]*keyState)}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	return p, nil
}

// Dial opens a tunnel to t.Authority through t.Address. The returned
// net.Conn supports CloseWrite (END_STREAM) and deadlines; Close it when
// done. Errors say what failed: the dial, the TLS handshake (with the
// identities expected and presented), or the server's answer (a wrapped
// *StatusError with its reason).
func (p *Pool) Dial(ctx context.Context, t Target) (net.Conn, error) {
	if err := t.validate(); err != nil {
		return nil, fmt.Errorf("hbone: tunnel to %s via %s: %w", t.Authority, t.Address, err)
	}
	key := t.key()
	fields := t.headers()
	var err error
	for attempt := 0; attempt < dialAttempts; attempt++ {
		var c *h2conn
		if c, err = p.acquire(ctx, key, &t); err != nil {
			return nil, err
		}
		rctx, cancel := context.WithTimeout(ctx, p.opts.ResponseTimeout)
		st, status, reason, oerr := c.openStream(rctx, fields)
		cancel()
		switch {
		case oerr == nil && st != nil:
			return st, nil
		case oerr == nil:
			return nil, fmt.Errorf("hbone: CONNECT %s via %s: %w", t.Authority, t.Address,
				&StatusError{Code: status, Reason: reason})
		case ctx.Err() != nil:
			return nil, fmt.Errorf("hbone: CONNECT %s via %s: %w", t.Authority, t.Address, ctx.Err())
		case errors.Is(oerr, context.DeadlineExceeded):
			return nil, fmt.Errorf("hbone: CONNECT %s via %s: no answer within %s", t.Authority, t.Address,
				p.opts.ResponseTimeout)
		}
		err = oerr
		var refused *refusedError
		if !errors.As(oerr, &refused) && !errors.Is(oerr, errConnClosed) {
			break
		}
		p.log.Debug("tunnel not processed; retrying on another connection",
			zap.Stringer("address", t.Address), zap.Error(oerr))
	}
	return nil, fmt.Errorf("hbone: CONNECT %s via %s: %w", t.Authority, t.Address, err)
}

// acquire returns a connection for key with one stream reserved, dialing
// (once per key at a time; other callers wait for that dial) when none has
// room.
func (p *Pool) acquire(ctx context.Context, key poolKey, t *Target) (*h2conn, error) {
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, errPoolClosed
		}
		ks := p.keys[key]
		if ks == nil {
			ks = &keyState{}
			p.keys[key] = ks
		}
		for _, c := range ks.conns {
			if c.tryReserve(p.opts.MaxStreamsPerConn) {
				p.mu.Unlock()
				return c, nil
			}
		}
		d := ks.dial
		if d == nil {
			d = &dialCall{done: make(chan struct{})}
			ks.dial = d
			p.wg.Add(1)
			go p.dial(key, ks, d, *t)
		}
		p.mu.Unlock()
		select {
		case <-d.done:
			if d.err != nil {
				return nil, d.err
			}
		case <-ctx.Done():
			return nil, fmt.Errorf("hbone: dial %s: %w", t.Address, ctx.Err())
		}
	}
}

// dial connects for key and adds the connection to the pool. It runs on its
// own goroutine so that a caller giving up does not fail the others waiting.
func (p *Pool) dial(key poolKey, ks *keyState, d *dialCall, t Target) {
	defer p.wg.Done()
	ctx, cancel := context.WithTimeout(p.ctx, p.opts.DialTimeout)
	c, err := p.connect(ctx, key, t)
	cancel()
	p.mu.Lock()
	ks.dial = nil
	if err == nil && p.closed {
		err = errPoolClosed
		defer c.close(errPoolClosed)
	}
	if err == nil {
		ks.conns = append(ks.conns, c)
	} else if len(ks.conns) == 0 && p.keys[key] == ks {
		delete(p.keys, key)
	}
	d.err = err
	close(d.done)
	p.mu.Unlock()
	if err != nil {
		p.log.Debug("HBONE dial failed", zap.Error(err))
	}
}

func (p *Pool) connect(ctx context.Context, key poolKey, t Target) (*h2conn, error) {
	raw, err := p.opts.Dial(ctx, t.LocalAddr, t.Address)
	if err != nil {
		return nil, fmt.Errorf("hbone: dial %s: %w", t.Address, err)
	}
	// With the keepalive on, bytes unacknowledged for as long as a PING
	// may go unanswered end the connection too.
	if p.cfg.readIdleTimeout > 0 {
		if err := setUserTimeout(raw, p.cfg.pingTimeout); err != nil {
			raw.Close()
			return nil, fmt.Errorf("hbone: connection to %s: TCP_USER_TIMEOUT: %w", t.Address, err)
		}
	}
	var cert func() (*tls.Certificate, error)
	if !t.Source.IsZero() {
		cert = sourceCert(t.Source, t.Cert)
	}
	batch := newRecordBatcher(raw)
	tc := tls.Client(batch, trust.ClientConfig(p.opts.Bundle, cert, t.Expected))
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, fmt.Errorf("hbone: TLS handshake with %s as %s: %w", t.Address, sourceName(t.Source), err)
	}
	cs := tc.ConnectionState()
	if cs.Version != tls.VersionTLS13 || cs.NegotiatedProtocol != trust.ALPN {
		tc.Close()
		return nil, fmt.Errorf("hbone: %s did not negotiate TLS 1.3 with ALPN h2 (ALPN %q)", t.Address, cs.NegotiatedProtocol)
	}
	log := p.log.With(zap.Stringer("address", t.Address), zap.String("source", sourceName(t.Source)))
	c := newH2Conn(p.ctx, tc, batch, true, &p.cfg, log)
	c.onUnusable = func() { p.removeConn(key, c) }
	if err := c.start(); err != nil {
		c.close(err)
		return nil, fmt.Errorf("hbone: HTTP/2 preface to %s: %w", t.Address, err)
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		if err := c.serve(); err != nil && !errors.Is(err, net.ErrClosed) {
			log.Debug("HBONE connection ended", zap.Error(err))
		}
	}()
	return c, nil
}

// sourceCert wraps the certificate callback so that a connection keyed by
// source identity can only ever present that identity.
func sourceCert(id trust.Identity, get func() (*tls.Certificate, error)) func() (*tls.Certificate, error) {
	return func() (*tls.Certificate, error) {
		cert, err := get()
		if err != nil {
			return nil, fmt.Errorf("certificate for %s: %w", id, err)
		}
		if cert == nil || len(cert.Certificate) == 0 {
			return nil, fmt.Errorf("certificate for %s: empty", id)
		}
		leaf := cert.Leaf
		if leaf == nil {
			if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
				return nil, fmt.Errorf("certificate for %s: %w", id, err)
			}
		}
		if len(leaf.URIs) != 1 {
			return nil, fmt.Errorf("certificate for %s has %d URI SANs, want 1", id, len(leaf.URIs))
		}
		if got, err := trust.IdentityFromURL(leaf.URIs[0]); err != nil || got != id {
			return nil, fmt.Errorf("certificate for %s names %s", id, leaf.URIs[0])
		}
		return cert, nil
	}
}

func sourceName(id trust.Identity) string {
	if id.IsZero() {
		return "TLS-only client"
	}
	return id.String()
}

// removeConn forgets a connection that no longer takes new streams.
func (p *Pool) removeConn(key poolKey, c *h2conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ks := p.keys[key]
	if ks == nil {
		return
	}
	if i := slices.Index(ks.conns, c); i >= 0 {
		ks.conns = slices.Delete(ks.conns, i, i+1)
	}
	if len(ks.conns) == 0 && ks.dial == nil {
		delete(p.keys, key)
	}
}

// Close closes every connection (resetting their tunnels) and makes further
// Dial calls fail.
func (p *Pool) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	var conns []*h2conn
	for _, ks := range p.keys {
		conns = append(conns, ks.conns...)
	}
	p.mu.Unlock()
	p.cancel()
	for _, c := range conns {
		c.close(errPoolClosed)
	}
	p.wg.Wait()
	return nil
}

// CloseFrom closes the connections dialled from local, resetting their
// tunnels: the address's pod is gone, and a pod that takes its address
// next must not inherit connections made from the old pod's namespace.
func (p *Pool) CloseFrom(local netip.Addr) {
	p.mu.Lock()
	var conns []*h2conn
	for key, ks := range p.keys {
		if key.local == local {
			conns = append(conns, ks.conns...)
		}
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.close(errLocalGone)
	}
}

var errLocalGone = errors.New("hbone: the source address left")

// PoolStats is a snapshot of a pool.
type PoolStats struct {
	Connections int // connections taking new tunnels
	Tunnels     int // open tunnels on them
}

func (p *Pool) Stats() PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	var s PoolStats
	for _, ks := range p.keys {
		s.Connections += len(ks.conns)
		for _, c := range ks.conns {
			c.mu.Lock()
			s.Tunnels += len(c.streams)
			c.mu.Unlock()
		}
	}
	return s
}

func (t *Target) validate() error {
	if !t.Address.IsValid() || t.Address.Port() == 0 {
		return fmt.Errorf("invalid next hop address %q", t.Address)
	}
	if _, err := ParseAuthority(t.Authority); err != nil {
		if _, herr := parseHostAuthority(t.Authority); herr != nil {
			return err
		}
	}
	if len(t.Expected) == 0 {
		return errors.New("no expected server identity")
	}
	for _, id := range t.Expected {
		if id.IsZero() {
			return errors.New("zero expected server identity")
		}
	}
	if t.Source.IsZero() != (t.Cert == nil) {
		return errors.New("Source and Cert must both be set (mTLS) or both be empty (TLS-only)")
	}
	for name, v := range map[string]string{"baggage": t.Baggage, "traceparent": t.Traceparent} {
		if !validHeaderValue(v) {
			return fmt.Errorf("invalid %s header value", name)
		}
	}
	return nil
}

func (t *Target) key() poolKey {
	exp := make([]string, len(t.Expected))
	for i, id := range t.Expected {
		exp[i] = id.String()
	}
	slices.Sort(exp)
	exp = slices.Compact(exp)
	return poolKey{source: t.Source.String(), expected: strings.Join(exp, " "), addr: t.Address, local: t.LocalAddr}
}

// DialFrom dials remote over TCP, from local when it is valid: the
// default Dial.
func DialFrom(ctx context.Context, local netip.Addr, remote netip.AddrPort) (net.Conn, error) {
	var d net.Dialer
	if local.IsValid() {
		d.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(local, 0))
	}
	return d.DialContext(ctx, "tcp", remote.String())
}

func (t *Target) headers() []hpack.HeaderField {
	fields := []hpack.HeaderField{
		{Name: ":method", Value: http.MethodConnect},
		{Name: ":authority", Value: t.Authority},
	}
	if t.Forwarded.IsValid() {
		fields = append(fields, hpack.HeaderField{Name: "forwarded", Value: FormatForwardedFor(t.Forwarded)})
	}
	if t.Baggage != "" {
		fields = append(fields, hpack.HeaderField{Name: "baggage", Value: t.Baggage})
	}
	if t.Traceparent != "" {
		fields = append(fields, hpack.HeaderField{Name: "traceparent", Value: t.Traceparent})
	}
	return fields
}
