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

// JoinIdle cuts a pair on which nothing moves, but not one on which only
// one direction is busy.
func TestJoinIdle(t *testing.T) {
	const idle = 300 * time.Millisecond
	m := newMesh(t)
	results := make(chan error, 2)
	h := HandlerFunc(func(ctx context.Context, r *Request) (Stream, error) {
		a, b := tcpPair(t)
		if r.Authority.Port() == 1 {
			// Busy: the upstream streams to the client for 4 idle periods.
			go ticks(b, 4*idle, idle/10)
		} else {
			go func() { io.Copy(io.Discard, b); b.Close() }()
		}
		return StreamFunc(func(ctx context.Context, tunnel net.Conn) {
			_, _, err := JoinIdle(ctx, tunnel, a, idle)
			results <- err
		}), nil
	})
	_, addr := startServer(t, m, h, nil)
	p := newPool(t, m, nil)

	busy := dialTunnel(t, p, m.target(addr, "127.0.0.1:1"))
	busy.SetReadDeadline(time.Now().Add(30 * time.Second))
	got, err := io.ReadAll(busy)
	if err != nil || len(got) == 0 {
		t.Fatalf("busy tunnel: %d bytes, %v", len(got), err)
	}
	busy.Close()
	if err := <-results; errors.Is(err, ErrIdle) {
		t.Fatalf("a pair busy in one direction was cut as idle: %v", err)
	}

	quiet := dialTunnel(t, p, m.target(addr, "127.0.0.1:2"))
	defer quiet.Close()
	start := time.Now()
	select {
	case err := <-results:
		if !errors.Is(err, ErrIdle) {
			t.Fatalf("quiet pair ended with %v, want ErrIdle", err)
		}
		if waited := time.Since(start); waited < idle {
			t.Fatalf("quiet pair cut after %s, before the idle timeout %s", waited, idle)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("quiet pair never cut")
	}
}

// ticks is an upstream busy in one direction: it writes to b every
// period for total, then ends its direction, reads b to its end and
// closes it.
func ticks(b net.Conn, total, every time.Duration) {
	for end := time.Now().Add(total); time.Now().Before(end); {
		if _, err := b.Write([]byte("tick")); err != nil {
			return
		}
		time.Sleep(every)
	}
	b.(*net.TCPConn).CloseWrite()
	io.Copy(io.Discard, b)
	b.Close()
}

// tcpPair returns two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	return a, b
}

// PeerDone ends only once a Read would not block: after the peer ended its
// direction and what it sent was read, or when the peer reset the stream;
// never while unread data is waiting or the peer is merely quiet.
func TestPeerDone(t *testing.T) {
	m := newMesh(t)
	type served struct {
		tunnel net.Conn
		done   context.Context
	}
	got := make(chan served, 1)
	release := make(chan struct{})
	h := HandlerFunc(func(ctx context.Context, r *Request) (Stream, error) {
		return StreamFunc(func(ctx context.Context, tunnel net.Conn) {
			got <- served{tunnel, tunnel.(interface{ PeerDone() context.Context }).PeerDone()}
			<-release
		}), nil
	})
	defer close(release)
	_, addr := startServer(t, m, h, nil)
	p := newPool(t, m, nil)
	ended := func(ctx context.Context) bool {
		select {
		case <-ctx.Done():
			return true
		case <-time.After(100 * time.Millisecond):
			return false
		}
	}

	t.Run("half-close after data", func(t *testing.T) {
		c := dialTunnel(t, p, m.target(addr, "127.0.0.1:80"))
		defer c.Close()
		if _, err := io.WriteString(c, "request"); err != nil {
			t.Fatal(err)
		}
		s := <-got
		if ended(s.done) {
			t.Fatal("done while the peer is still open")
		}
		if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		if ended(s.done) {
			t.Fatal("done while sent data is still unread")
		}
		buf := make([]byte, 3)
		if _, err := io.ReadFull(s.tunnel, buf); err != nil {
			t.Fatal(err)
		}
		if ended(s.done) {
			t.Fatal("done with 4 bytes still unread")
		}
		if _, err := io.ReadAll(s.tunnel); err != nil {
			t.Fatal(err)
		}
		if !ended(s.done) {
			t.Fatal("not done after everything was read and the peer ended its direction")
		}
	})
	t.Run("reset", func(t *testing.T) {
		c := dialTunnel(t, p, m.target(addr, "127.0.0.1:80"))
		if _, err := io.WriteString(c, "x"); err != nil {
			t.Fatal(err)
		}
		s := <-got
		if ended(s.done) {
			t.Fatal("done while the peer is still open")
		}
		c.Close() // the server has not ended its direction: a reset
		if !ended(s.done) {
			eventually(t, 5*time.Second, "PeerDone after a reset", func() bool { return s.done.Err() != nil })
		}
	})
}
