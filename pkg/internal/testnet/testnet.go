// Package testnet serves TCP connections for tests on real loopback
// sockets.
package testnet

import (
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// Serve accepts connections on ln until the test ends and runs handle on
// each in its own goroutine, closing the connection when handle returns.
// When the test ends it closes ln and every connection still open, then
// waits for the handlers, so no handler outlives its test.
func Serve(t testing.TB, ln net.Listener, handle func(net.Conn)) {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		open  = map[net.Conn]bool{}
		ended bool
	)
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		ended = true
		for c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1) // the accept loop's count keeps Add legal while Cleanup waits
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			if ended {
				mu.Unlock()
				c.Close()
				return
			}
			open[c] = true
			wg.Add(1)
			mu.Unlock()
			go func() {
				defer wg.Done()
				defer func() {
					mu.Lock()
					delete(open, c)
					mu.Unlock()
					c.Close()
				}()
				handle(c)
			}()
		}
	}()
}

// Listen listens on addr ("127.0.0.1:0": any free port), failing the test
// when it cannot.
func Listen(t testing.TB, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// Dial opens a raw connection to addr for hand-written requests; it is
// closed when the test ends, and nothing on it waits past 20 s.
func Dial(t testing.TB, addr string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	return conn
}

// Exchange sends raw to addr, ends its direction and returns all the server
// wrote until it closed the connection.
func Exchange(t testing.TB, addr, raw string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	_ = c.(*net.TCPConn).CloseWrite()
	out, err := io.ReadAll(c)
	if err != nil && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "connection reset") {
		t.Fatalf("reading the answer to %q: %v", raw, err)
	}
	return string(out)
}

// ExpectClosed fails the test unless the peer closes c gently (EOF, no
// reset) within a few seconds, with nothing more sent; r reads c (a
// bufio.Reader may hold what c delivered).
func ExpectClosed(t testing.TB, c net.Conn, r io.Reader) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := r.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("want the connection closed (EOF), got %d bytes, %v", n, err)
	}
}
