package testnet

import (
	"io"
	"net"
	"testing"
	"time"
)

// Handlers run per connection, and a handler still blocked on an open
// connection when the test ends is ended with it.
func TestServe(t *testing.T) {
	done := make(chan struct{}, 1)
	t.Run("serving", func(t *testing.T) {
		ln := Listen(t, "127.0.0.1:0")
		Serve(t, ln, func(c net.Conn) {
			defer func() { done <- struct{}{} }()
			io.WriteString(c, "hello")
			io.Copy(io.Discard, c) // until the connection is closed under it
		})
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		buf := make([]byte, 5)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "hello" {
			t.Fatalf("read %q, %v", buf, err)
		}
	}) // the client never closed: Cleanup must end the handler
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("handler outlived its test")
	}
}
