package main

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/bench/internal/peers"
)

// Each peer pair carries an exchange from pod A's address to pod B's app;
// the server side of a TLS pair refuses a client without a certificate,
// nginx_plain's takes plain TCP.
func TestPeersCarryTraffic(t *testing.T) {
	work := t.TempDir()
	pkiDir := filepath.Join(work, "pki")
	peerClient, err := peers.NewPKI(pkiDir)
	if err != nil {
		t.Fatal(err)
	}
	// Pod B's app, as the benchmark's child serves it.
	app := &servers{conns: map[net.Conn]struct{}{}}
	t.Cleanup(app.close)
	for _, port := range appPorts {
		ln, err := net.Listen("tcp", net.JoinHostPort(appIP, port))
		if err != nil {
			t.Skipf("pod B's app address: %v", err)
		}
		app.lns = append(app.lns, ln)
		app.wg.Go(func() { app.accept(ln, serveRR) })
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, name := range []string{"nginx_stream", "nginx_plain", "stunnel"} {
		t.Run(name, func(t *testing.T) {
			peer, err := startPeer(name, work, pkiDir, 1, 1024)
			var miss *peers.ErrMissing
			if errors.As(err, &miss) {
				t.Skip(err)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer peer.Stop()
			p := path{name: name, dial: directDialer(), target: peer.Listen}
			for range 3 {
				if err := exchange(ctx, p); err != nil {
					t.Fatalf("exchange through %s: %v", name, err)
				}
			}
			_, server := peerIPs(name)
			if name == "nginx_plain" {
				// Plain TCP between its sides: its server side carries a
				// plain exchange straight to the app.
				if err := exchange(ctx, path{name: name, dial: directDialer(), target: server}); err != nil {
					t.Fatalf("plain exchange with %s's server side: %v", name, err)
				}
				return
			}
			// Straight to the server side, with the CA but no certificate.
			conf := peerClient.Clone()
			conf.Certificates = nil
			c, err := tls.Dial("tcp", net.JoinHostPort(server, rrPort), conf)
			if err == nil {
				c.SetDeadline(time.Now().Add(5 * time.Second))
				_, err = c.Write(rrPayload)
				if err == nil {
					_, err = io.ReadFull(c, make([]byte, rrSize))
				}
				c.Close()
			}
			if err == nil {
				t.Fatalf("%s's server side served a client without a certificate", name)
			}
		})
	}
}
