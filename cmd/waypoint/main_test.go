package main

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/causeway-mesh/causeway/pkg/hbone"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
)

// On SIGTERM the waypoint goes on accepting tunnels for the shutdown
// delay (a node proxy that has not yet heard of the pod's removal still
// dials it, and must not find the port closed or, once the pod is gone,
// an address that leads nowhere), then says GOAWAY, refuses new
// connections and lets the tunnels in flight finish.
func TestServeUntilAcceptsThroughTheShutdownDelay(t *testing.T) {
	ca := trusttest.NewCA(t, "cluster.local")
	wpID := trusttest.Identity(t, "spiffe://cluster.local/ns/shop/sa/waypoint")
	clientID := trusttest.Identity(t, "spiffe://cluster.local/ns/web/sa/frontend")
	wpCert, clientCert := ca.Certificate(t, wpID, 0), ca.Certificate(t, clientID, 0)
	srv, err := hbone.NewServer(hbone.ServerOptions{
		TLS: trust.ServerConfig(ca.Bundle, func(net.Addr) (*tls.Certificate, error) { return wpCert, nil }, trust.RequireClientCert),
		Handler: hbone.HandlerFunc(func(context.Context, *hbone.Request) (hbone.Stream, error) {
			return hbone.StreamFunc(func(_ context.Context, tunnel net.Conn) { _, _ = io.Copy(tunnel, tunnel) }), nil
		}),
		Logger: zaptest.NewLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().(*net.TCPAddr).AddrPort()
	// Each dial on a pool of its own: a new connection, as a node proxy
	// without one to this pod opens.
	dial := func() (net.Conn, error) {
		p, err := hbone.NewPool(hbone.PoolOptions{Bundle: ca.Bundle, Logger: zaptest.NewLogger(t), DialTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return p.Dial(ctx, hbone.Target{Address: addr, Authority: "10.96.0.7:80", Source: clientID,
			Cert: func() (*tls.Certificate, error) { return clientCert, nil }, Expected: []trust.Identity{wpID}})
	}
	echo := func(c net.Conn, msg string) error {
		if _, err := c.Write([]byte(msg)); err != nil {
			return err
		}
		buf := make([]byte, len(msg))
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(c, buf); err != nil {
			return err
		}
		if string(buf) != msg {
			return errors.New("echoed " + string(buf))
		}
		return nil
	}

	const delay = 3 * time.Second
	sig, signal := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveUntil(sig, srv, ln, delay, time.Minute, zaptest.NewLogger(t)) }()
	inFlight, err := dial()
	if err != nil {
		t.Fatal(err)
	}
	defer inFlight.Close()

	signal()
	signalled := time.Now()
	late, err := dial()
	if err != nil {
		t.Fatalf("a tunnel on a new connection right after the signal: %v (want accepted for the %v delay)", err, delay)
	}
	if err := echo(late, "late"); err != nil {
		t.Fatalf("tunnel opened during the delay: %v", err)
	}
	late.Close()

	// After the delay: new connections are refused at once, the tunnel
	// in flight still works, and serving ends when it closes.
	var refused error
	for refused == nil {
		var c net.Conn
		if c, refused = dial(); refused == nil {
			c.Close()
			time.Sleep(100 * time.Millisecond)
		}
	}
	if since := time.Since(signalled); since < delay {
		t.Fatalf("new tunnels refused %v after the signal, before the %v delay: %v", since, delay, refused)
	}
	if !errors.Is(refused, syscall.ECONNREFUSED) {
		t.Errorf("a dial after the delay failed with %v, want the connection refused", refused)
	}
	if err := echo(inFlight, "in flight"); err != nil {
		t.Fatalf("the tunnel in flight during the drain: %v", err)
	}
	select {
	case err := <-done:
		t.Fatalf("serveUntil returned %v with a tunnel in flight", err)
	default:
	}
	inFlight.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serveUntil: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serveUntil did not return once the last tunnel closed")
	}
}
