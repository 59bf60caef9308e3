package h1

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/causeway-mesh/causeway/pkg/internal/testnet"
)

// drainFront serves h as h1Front does, with timeouts far beyond the test
// (only the drain can end a connection) and a drain the test starts;
// accepted receives each connection as its serving begins.
func drainFront(t *testing.T, h http.Handler) (addr string, drain func(), accepted <-chan struct{}) {
	t.Helper()
	ln := testnet.Listen(t, "127.0.0.1:0")
	d := &Drainer{}
	t.Cleanup(d.Drain)
	acc := make(chan struct{}, 4)
	limits := Limits{ReadHeaderTimeout: time.Minute, IdleTimeout: time.Minute, MaxHeaderBytes: 1 << 10}
	testnet.Serve(t, ln, func(c net.Conn) {
		ac := NewAheadConn(c)
		defer ac.Close()
		acc <- struct{}{}
		Serve(context.Background(), d, ac, ac, h, limits, zap.NewNop())
	})
	return ln.Addr().String(), d.Drain, acc
}

func TestH1DrainClosesIdleConnection(t *testing.T) {
	addr, drain, _ := drainFront(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello")
	}))
	c := testnet.Dial(t, addr)
	br := bufio.NewReader(c)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(resp.Body); string(b) != "hello" || resp.Close {
		t.Fatalf("before the drain: body %q, close %v", b, resp.Close)
	}
	drain()
	testnet.ExpectClosed(t, c, br)
}

func TestH1DrainInFlightResponseSaysClose(t *testing.T) {
	body := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB: written after the drain began
	for _, early := range []bool{false, true} {
		t.Run("header before drain "+strconv.FormatBool(early), func(t *testing.T) {
			arrived, release := make(chan string, 1), make(chan struct{})
			addr, drain, _ := drainFront(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				got, _ := io.ReadAll(r.Body)
				if early {
					w.WriteHeader(http.StatusOK)
					w.(http.Flusher).Flush()
				} else {
					w.Header().Set("Content-Length", strconv.Itoa(len(body)))
				}
				arrived <- string(got)
				<-release
				w.Write(body)
			}))
			c := testnet.Dial(t, addr)
			br := bufio.NewReader(c)
			io.WriteString(c, "POST /order HTTP/1.1\r\nHost: a\r\nContent-Length: 7\r\n\r\npayload")
			if got := <-arrived; got != "payload" {
				t.Fatalf("handler got %q", got)
			}
			drain()
			close(release)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			if err != nil || !bytes.Equal(got, body) {
				t.Fatalf("body: %d of %d bytes, %v", len(got), len(body), err)
			}
			// A header written before the drain kept the connection alive;
			// one written after says close.
			if resp.Close == early {
				t.Errorf("Connection: close %v, want %v", resp.Close, !early)
			}
			testnet.ExpectClosed(t, c, br)
		})
	}
}

func TestH1DrainServesARequestThatArrivesAfter(t *testing.T) {
	addr, drain, accepted := drainFront(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "served "+r.URL.Path)
	}))
	c := testnet.Dial(t, addr)
	<-accepted
	drain()
	br := bufio.NewReader(c)
	io.WriteString(c, "GET /late HTTP/1.1\r\nHost: a\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if string(b) != "served /late" || !resp.Close { // (ReadResponse takes "Connection: close" into Close)
		t.Fatalf("body %q, Connection: close %v", b, resp.Close)
	}
	testnet.ExpectClosed(t, c, br)
}
