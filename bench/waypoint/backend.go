package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/causeway-mesh/causeway/pkg/hbone"
	"github.com/causeway-mesh/causeway/pkg/trust"
)

// responseBody is what the backend answers every request with.
var responseBody = []byte("causeway waypoint benchmark: the backend's fixed answer of one hundred bytes, padding.............\n")

// backendHandler is the backend behind both proxies: one small fixed answer.
func backendHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			http.Error(w, "GET only", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		w.Write(responseBody)
	})
}

func newHTTPServer() *http.Server {
	return &http.Server{Handler: backendHandler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
}

// backend is the same HTTP server behind two fronts: the HBONE server the
// waypoint tunnels to (as a node proxy would answer, but delivering straight
// into this process), and the TLS server nginx proxies to.
type backend struct {
	hboneSrv *hbone.Server
	hboneLn  net.Listener
	tunnels  *tunnelListener
	tlsLn    net.Listener
	servers  []*http.Server
	wg       sync.WaitGroup
}

// startBackend listens for HBONE on hboneAddr, presenting cert (the
// backend workload's mesh identity, clients verified against bundle), and
// for TLS on tlsAddr with tlsConf.
func startBackend(hboneAddr, tlsAddr string, bundle *trust.Bundle, cert *tls.Certificate, tlsConf *tls.Config, log *zap.Logger) (*backend, error) {
	b := &backend{tunnels: newTunnelListener(hboneAddr)}
	srv, err := hbone.NewServer(hbone.ServerOptions{
		TLS:     trust.ServerConfig(bundle, func(net.Addr) (*tls.Certificate, error) { return cert, nil }, trust.RequireClientCert),
		Handler: hbone.HandlerFunc(b.open),
		Logger:  log,
	})
	if err != nil {
		return nil, err
	}
	b.hboneSrv = srv
	if b.hboneLn, err = net.Listen("tcp", hboneAddr); err != nil {
		return nil, fmt.Errorf("backend HBONE: %w", err)
	}
	ln, err := net.Listen("tcp", tlsAddr)
	if err != nil {
		b.hboneLn.Close()
		return nil, fmt.Errorf("backend TLS: %w", err)
	}
	b.tlsLn = tls.NewListener(ln, tlsConf)
	httpOverHBONE, httpOverTLS := newHTTPServer(), newHTTPServer()
	b.servers = []*http.Server{httpOverHBONE, httpOverTLS}
	b.wg.Go(func() { srv.Serve(b.hboneLn) })
	b.wg.Go(func() { httpOverHBONE.Serve(b.tunnels) })
	b.wg.Go(func() { httpOverTLS.Serve(b.tlsLn) })
	return b, nil
}

// open accepts every tunnel whose caller the handshake verified: the
// waypoint's identity is what this backend would admit.
func (b *backend) open(ctx context.Context, r *hbone.Request) (hbone.Stream, error) {
	if !r.Peer.Authenticated() {
		return nil, hbone.Deny("authenticated callers only")
	}
	return hbone.StreamFunc(func(ctx context.Context, tunnel net.Conn) {
		b.tunnels.serve(ctx, tunnel)
	}), nil
}

func (b *backend) close() {
	for _, s := range b.servers {
		s.Close()
	}
	b.tunnels.Close()
	b.tlsLn.Close()
	b.hboneSrv.Close()
	b.wg.Wait()
}

// tunnelListener hands accepted HBONE tunnels to an http.Server.
type tunnelListener struct {
	addr net.Addr
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func newTunnelListener(addr string) *tunnelListener {
	a, _ := net.ResolveTCPAddr("tcp", addr)
	return &tunnelListener{addr: a, ch: make(chan net.Conn), done: make(chan struct{})}
}

// serve gives the tunnel to the HTTP server and returns once the server
// has closed it, or the tunnel or the listener ended.
func (l *tunnelListener) serve(ctx context.Context, tunnel net.Conn) {
	c := &notifyConn{Conn: tunnel, closed: make(chan struct{})}
	select {
	case l.ch <- c:
	case <-l.done:
		return
	case <-ctx.Done():
		return
	}
	select {
	case <-c.closed:
	case <-ctx.Done():
		c.Close()
	case <-l.done:
		c.Close()
	}
}

func (l *tunnelListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *tunnelListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *tunnelListener) Addr() net.Addr { return l.addr }

// notifyConn reports its Close.
type notifyConn struct {
	net.Conn
	once   sync.Once
	closed chan struct{}
}

func (c *notifyConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { close(c.closed) })
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
