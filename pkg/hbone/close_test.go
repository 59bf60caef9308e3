package hbone

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// Close after Write behaves like closing a TCP socket: the peer reads all
// that was written, then EOF, even though its own direction is still open
// (an HTTP/1.1 server answering "Connection: close" does exactly this).
func TestCloseDeliversWrittenData(t *testing.T) {
	m := newMesh(t)
	want := strings.Repeat("answer ", 50000)
	h := HandlerFunc(func(ctx context.Context, r *Request) (Stream, error) {
		return StreamFunc(func(ctx context.Context, tunnel net.Conn) {
			io.WriteString(tunnel, want)
			tunnel.Close()
		}), nil
	})
	_, addr := startServer(t, m, h, nil)
	p := newPool(t, m, nil)
	c := dialTunnel(t, p, m.target(addr, "127.0.0.1:80"))
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read after the server closed: %v (%d bytes)", err, len(got))
	}
	if string(got) != want {
		t.Fatalf("got %d bytes, want %d", len(got), len(want))
	}
}

// A failed Join resets the tunnel: the peer sees an error, not a clean EOF.
func TestJoinAbortResets(t *testing.T) {
	m := newMesh(t)
	h := HandlerFunc(func(ctx context.Context, r *Request) (Stream, error) {
		return StreamFunc(func(ctx context.Context, tunnel net.Conn) {
			ctx, cancel := context.WithCancel(ctx)
			cancel() // the upstream side fails at once
			a, b := net.Pipe()
			defer b.Close()
			Join(ctx, tunnel, a)
		}), nil
	})
	_, addr := startServer(t, m, h, nil)
	p := newPool(t, m, nil)
	c := dialTunnel(t, p, m.target(addr, "127.0.0.1:80"))
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	_, err := io.ReadAll(c)
	var re *resetError
	if !errors.As(err, &re) {
		t.Fatalf("read after an aborted join: %v, want a stream reset", err)
	}
}
