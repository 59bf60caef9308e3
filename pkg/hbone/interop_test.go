package hbone

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/causeway-mesh/causeway/pkg/trust"
)

// x/net's HTTP/2 client (the one Istio's Go tooling uses) opens tunnels on
// our server, half-closing its side while reading the answer.
func TestInteropXNetClient(t *testing.T) {
	m := newMesh(t)
	up := upstream(t, func(c *net.TCPConn) {
		got, _ := io.ReadAll(c)
		c.Write(bytes.ToUpper(got))
		c.CloseWrite()
	})
	h := &dialHandler{}
	_, addr := startServer(t, m, h, nil)
	tr := rawClient(t, m, addr, m.clientCert)

	pr, pw := io.Pipe()
	req := connectRequest(ctxTimeout(t, 30*time.Second), up.String(), http.Header{"Forwarded": {`for="10.0.0.9:999"`}})
	req.Body = pr
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	payload := strings.Repeat("interop ", 1<<20) // 8 MiB: several windows
	go func() {
		io.WriteString(pw, payload)
		pw.Close() // END_STREAM
	}()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != strings.ToUpper(payload) {
		t.Fatalf("got %d bytes back, want %d", len(got), len(payload))
	}
	if id, ok := h.lastRequest().Peer.Identity(); !ok || id != m.clientID {
		t.Fatalf("peer %v", h.lastRequest().Peer)
	}
}

// Our pool works against x/net's HTTP/2 server answering CONNECT.
func TestInteropXNetServer(t *testing.T) {
	m := newMesh(t)
	ln := listenLocal(t)
	srv := &http2.Server{}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodConnect {
			http.Error(w, "no", http.StatusMethodNotAllowed)
			return
		}
		if r.Host == "10.0.0.1:401" {
			w.Header().Set(ReasonHeader, "not you")
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Body.Read(buf)
			if n > 0 {
				w.Write(buf[:n])
				w.(http.Flusher).Flush()
			}
			if err != nil {
				return // ends the response: END_STREAM
			}
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				tc := tls.Server(c, m.serverTLS(trust.VerifyIfGiven))
				if tc.Handshake() != nil {
					c.Close()
					return
				}
				srv.ServeConn(tc, &http2.ServeConnOpts{Handler: handler})
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })

	p := newPool(t, m, nil)
	c := dialTunnel(t, p, m.target(addrOf(ln), "10.0.0.1:80"))
	payload := strings.Repeat("pool to x/net ", 600000) // 8.4 MiB: several windows
	go func() {
		io.WriteString(c, payload)
		c.CloseWrite()
	}()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || string(got) != payload {
		t.Fatalf("echo: %d bytes, %v", len(got), err)
	}

	_, err = p.Dial(ctxTimeout(t, 30*time.Second), m.target(addrOf(ln), "10.0.0.1:401"))
	var se *StatusError
	if !errors.As(err, &se) || se.Code != 401 || se.Reason != "not you" {
		t.Fatalf("401 from x/net server: %v", err)
	}
}
