package capture

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"go.uber.org/zap"
)

// SOCKS5 (RFC 1928) constants used here.
const (
	socksVersion       = 5
	methodNoAuth       = 0
	methodNoAcceptable = 0xff
	cmdConnect         = 1
	atypIPv4           = 1
	atypDomain         = 3
	atypIPv6           = 4

	repSucceeded          = 0
	repGeneralFailure     = 1
	repNotAllowed         = 2
	repHostUnreachable    = 4
	repCommandUnsupported = 7
	repAddrUnsupported    = 8
)

// SOCKS5 accepts workload connections on a listener and hands their CONNECT
// requests to a Handler. Only no-auth CONNECT is supported.
type SOCKS5 struct {
	Handler Handler
	Logger  *zap.Logger
	// HandshakeTimeout bounds the greeting and request (default 10 s).
	HandshakeTimeout time.Duration

	wg sync.WaitGroup
}

// Serve accepts until ln is closed or ctx ends, then waits for handlers.
func (s *SOCKS5) Serve(ctx context.Context, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	defer s.wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return fmt.Errorf("socks5 accept: %w", err)
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serveConn(ctx, c)
		}()
	}
}

func (s *SOCKS5) serveConn(ctx context.Context, c net.Conn) {
	timeout := s.HandshakeTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	_ = c.SetDeadline(time.Now().Add(timeout))
	dest, rep, err := handshake(c)
	if err != nil {
		if rep >= 0 {
			_ = writeReply(c, byte(rep))
		}
		s.Logger.Info("socks5 request refused", zap.Stringer("src", c.RemoteAddr()), zap.Error(err))
		c.Close()
		return
	}
	_ = c.SetDeadline(time.Time{})
	src, _ := netip.ParseAddrPort(c.RemoteAddr().String())
	s.Handler.HandleOutbound(ctx, &socksConn{Conn: c, src: unmap(src), dst: dest})
}

// handshake reads the greeting and the request. On error, rep is the reply
// code to send, or -1 when nothing should be sent.
func handshake(c net.Conn) (Destination, int, error) {
	var hdr [2]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return Destination{}, -1, fmt.Errorf("read greeting: %w", err)
	}
	if hdr[0] != socksVersion {
		return Destination{}, -1, fmt.Errorf("not SOCKS5 (version %d)", hdr[0])
	}
	methods := make([]byte, hdr[1])
	if _, err := io.ReadFull(c, methods); err != nil {
		return Destination{}, -1, fmt.Errorf("read methods: %w", err)
	}
	noAuth := false
	for _, m := range methods {
		noAuth = noAuth || m == methodNoAuth
	}
	if !noAuth {
		_, _ = c.Write([]byte{socksVersion, methodNoAcceptable})
		return Destination{}, -1, errors.New("client offers no acceptable auth method (only no-auth is supported)")
	}
	if _, err := c.Write([]byte{socksVersion, methodNoAuth}); err != nil {
		return Destination{}, -1, fmt.Errorf("write method: %w", err)
	}
	var req [4]byte
	if _, err := io.ReadFull(c, req[:]); err != nil {
		return Destination{}, -1, fmt.Errorf("read request: %w", err)
	}
	if req[0] != socksVersion {
		return Destination{}, repGeneralFailure, fmt.Errorf("request version %d", req[0])
	}
	if req[1] != cmdConnect {
		return Destination{}, repCommandUnsupported, fmt.Errorf("command %d not supported (only CONNECT)", req[1])
	}
	var d Destination
	switch req[3] {
	case atypIPv4, atypIPv6:
		n := 4
		if req[3] == atypIPv6 {
			n = 16
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(c, b); err != nil {
			return Destination{}, -1, fmt.Errorf("read address: %w", err)
		}
		ip, _ := netip.AddrFromSlice(b[:n])
		d.Addr = netip.AddrPortFrom(ip.Unmap(), binary.BigEndian.Uint16(b[n:]))
	case atypDomain:
		var l [1]byte
		if _, err := io.ReadFull(c, l[:]); err != nil {
			return Destination{}, -1, fmt.Errorf("read domain length: %w", err)
		}
		b := make([]byte, int(l[0])+2)
		if _, err := io.ReadFull(c, b); err != nil {
			return Destination{}, -1, fmt.Errorf("read domain: %w", err)
		}
		host := string(b[:l[0]])
		if ip, err := netip.ParseAddr(host); err == nil {
			d.Addr = netip.AddrPortFrom(ip.Unmap(), binary.BigEndian.Uint16(b[l[0]:]))
		} else {
			if host == "" {
				return Destination{}, repAddrUnsupported, errors.New("empty domain name")
			}
			d.Host, d.Port = host, binary.BigEndian.Uint16(b[l[0]:])
		}
	default:
		return Destination{}, repAddrUnsupported, fmt.Errorf("address type %d not supported", req[3])
	}
	if d.Host == "" && d.Addr.Port() == 0 || d.Host != "" && d.Port == 0 {
		return Destination{}, repAddrUnsupported, errors.New("destination port 0")
	}
	return d, 0, nil
}

func writeReply(c net.Conn, rep byte) error {
	// Bound address: 0.0.0.0:0; clients do not use it for CONNECT.
	_, err := c.Write([]byte{socksVersion, rep, 0, atypIPv4, 0, 0, 0, 0, 0, 0})
	return err
}

type socksConn struct {
	net.Conn
	src      netip.AddrPort
	dst      Destination
	answered bool
}

func (c *socksConn) Source() netip.AddrPort   { return c.src }
func (c *socksConn) Destination() Destination { return c.dst }

func (c *socksConn) Answer(o Outcome) error {
	if c.answered {
		return errors.New("socks5: connection already answered")
	}
	c.answered = true
	rep := byte(repGeneralFailure)
	switch o {
	case Connected:
		rep = repSucceeded
	case Refused:
		rep = repNotAllowed
	case Unreachable, HostUnknown:
		rep = repHostUnreachable
	}
	_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	defer c.SetWriteDeadline(time.Time{})
	return writeReply(c.Conn, rep)
}

// NetConn is the client's TCP connection.
func (c *socksConn) NetConn() net.Conn { return c.Conn }

// CloseWrite half-closes the client connection when the transport allows it.
func (c *socksConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

func unmap(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}
