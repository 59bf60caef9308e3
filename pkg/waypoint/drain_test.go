package waypoint

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/pkg/backendtls/backendtlstest"
	"github.com/causeway-mesh/causeway/pkg/internal/testnet"
	"github.com/causeway-mesh/causeway/pkg/xds"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestShutdownDrainsHTTPInTunnels: at Shutdown an idle keep-alive
// HTTP/1.1 tunnel is closed at once, a request in flight is answered whole
// with Connection: close, and Shutdown returns once they are gone, long
// before its deadline.
func TestShutdownDrainsHTTPInTunnels(t *testing.T) {
	f := start(t)
	f.expectDrain(t, "web.shop", func() net.Conn { return f.webTunnel(t) })
}

// expectDrain opens two connections with each dial: on the first a
// request was answered and it idles, on the second one is in flight
// (/held). Then
// Shutdown must close the idle ones at once, answer the others whole with
// Connection: close and close them, and return without its deadline's
// error once they are gone.
func (f *fixture) expectDrain(t *testing.T, host string, dial ...func() net.Conn) {
	t.Helper()
	type conn struct {
		c net.Conn
		r *bufio.Reader
	}
	var idle, busy []conn
	for _, d := range dial {
		c := d()
		r := bufio.NewReader(c)
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", host)
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusOK || resp.Close {
			t.Fatalf("before the shutdown: %s, close %v", resp.Status, resp.Close)
		}
		idle = append(idle, conn{c, r})
		c = d()
		fmt.Fprintf(c, "GET /held HTTP/1.1\r\nHost: %s\r\n\r\n", host)
		if got := <-f.stalls; got != "arrived /held" {
			t.Fatalf("backend: %s", got)
		}
		busy = append(busy, conn{c, bufio.NewReader(c)})
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- f.w.Shutdown(ctx) }()
	for _, c := range idle {
		testnet.ExpectClosed(t, c.c, c.r)
	}
	close(f.release)
	for _, c := range busy {
		resp, err := http.ReadResponse(c.r, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil || string(body) != heldBody || !resp.Close {
			t.Fatalf("in-flight answer: %d of %d bytes (%v), Connection: close %v", len(body), len(heldBody), err, resp.Close)
		}
		testnet.ExpectClosed(t, c.c, c.r)
	}
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown still draining 10 s after its connections closed")
	}
}

// TestShutdownDrainsIngressListeners: the ingress role's HTTP and HTTPS
// ports drain as tunnels do: idle keep-alive connections closed at once,
// a request in flight answered whole with Connection: close, and Shutdown
// returns once they are gone.
func TestShutdownDrainsIngressListeners(t *testing.T) {
	const httpPort, httpsPort = 25080, 25443
	f := start(t, func(o *Options) { o.Ingress, o.IngressAddress, o.Policy = true, netip.MustParseAddr("127.0.75.1"), nil })
	st := f.w.view.Load().state
	ca, secret := backendtlstest.TLSSecretData(t, "shop.example.com")
	route := &meshv1.HTTPRoute{Namespace: "shop", Name: "in", Rules: []*meshv1.HTTPRouteRule{{
		Backends: []*meshv1.HTTPBackendRef{{Backend: &meshv1.BackendRef{Namespace: "shop", Name: "plain", Port: 80}, Weight: 1}}}}}
	web := st.Services["shop/web"]
	plain := &meshv1.Service{Name: "plain", Namespace: "shop", Hostname: "plain.shop.svc.cluster.local", Vips: []string{"127.0.74.9"},
		Ports: web.GetPorts(), Endpoints: web.GetEndpoints()}
	f.w.Update(&xds.State{Set: meshv1.Set{
		Workloads: st.Workloads,
		Services:  map[string]*meshv1.Service{"shop/plain": plain},
		IngressGateways: map[string]*meshv1.IngressGateway{"shop/wp": {Namespace: "shop", Name: "wp", Listeners: []*meshv1.IngressListener{
			{Name: "http", Port: httpPort, HttpRoutes: []*meshv1.HTTPRoute{route}},
			{Name: "https", Port: httpsPort, Protocol: meshv1.IngressListener_HTTPS, HttpRoutes: []*meshv1.HTTPRoute{route},
				Certificates: []*meshv1.TLSKeyPair{{Secret: "shop/cert", CertificateChain: secret["tls.crt"], PrivateKey: secret["tls.key"]}}},
		}}},
	}})
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.PEM)
	f.expectDrain(t, "shop.example.com",
		func() net.Conn { return testnet.Dial(t, fmt.Sprintf("127.0.75.1:%d", httpPort)) },
		func() net.Conn {
			c := testnet.Dial(t, fmt.Sprintf("127.0.75.1:%d", httpsPort))
			tc := tls.Client(c, &tls.Config{ServerName: "shop.example.com", RootCAs: roots, NextProtos: []string{"http/1.1"}})
			if err := tc.Handshake(); err != nil {
				t.Fatal(err)
			}
			return tc
		})
}

// TestShutdownCutsAtItsDeadline: what has not closed when Shutdown's
// context ends is cut, and the log says how many.
func TestShutdownCutsAtItsDeadline(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	f := start(t, func(o *Options) { o.Logger = zap.New(core) })
	busy := f.webTunnel(t)
	fmt.Fprint(busy, "GET /held HTTP/1.1\r\nHost: web.shop\r\n\r\n")
	if got := <-f.stalls; got != "arrived /held" {
		t.Fatalf("backend: %s", got)
	}
	defer close(f.release)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := f.w.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown with an answer held: %v", err)
	}
	cut := logs.FilterMessage("drain deadline: cutting the tunnels left").All()
	if len(cut) != 1 || cut[0].ContextMap()["tunnels"] != int64(1) {
		t.Fatalf("deadline log: %+v", cut)
	}
	if n, err := busy.Read(make([]byte, 1)); err == nil {
		t.Fatalf("the held tunnel was not cut: read %d bytes", n)
	}
}
