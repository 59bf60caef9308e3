// Package testnet serves TCP connections for tests on real loopback
// sockets.
package testnet

import (
	"net"
	"sync"
	"testing"
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
