package hbone

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"testing"
	"time"
)

// halfCloser is what Dial returns.
type halfCloser interface {
	net.Conn
	CloseWrite() error
}

func dialTunnel(t *testing.T, p *Pool, tg Target) halfCloser {
	t.Helper()
	c, err := p.Dial(ctxTimeout(t, 30*time.Second), tg)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	hc, ok := c.(halfCloser)
	if !ok {
		t.Fatalf("tunnel %T has no CloseWrite", c)
	}
	return hc
}

// Client half-closes first: the upstream sees EOF, then answers, and the
// answer still reaches the client.
func TestHalfCloseClientFirst(t *testing.T) {
	m := newMesh(t)
	up := upstream(t, func(c *net.TCPConn) {
		got, err := io.ReadAll(c)
		if err != nil {
			t.Errorf("upstream read: %v", err)
			return
		}
		fmt.Fprintf(c, "got %d bytes: %s", len(got), got)
		c.CloseWrite()
	})
	_, addr := startServer(t, m, &dialHandler{}, nil)
	p := newPool(t, m, nil)
	c := dialTunnel(t, p, m.target(addr, up.String()))

	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("late")); err == nil {
		t.Fatal("Write after CloseWrite succeeded")
	}
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if want := "got 5 bytes: hello"; string(got) != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// The upstream half-closes first: the client reads EOF while its own
// direction is still open, then sends, and the upstream receives it all.
func TestHalfCloseServerFirst(t *testing.T) {
	m := newMesh(t)
	received := make(chan []byte, 1)
	up := upstream(t, func(c *net.TCPConn) {
		c.Write([]byte("banner"))
		c.CloseWrite()
		got, _ := io.ReadAll(c)
		received <- got
	})
	_, addr := startServer(t, m, &dialHandler{}, nil)
	p := newPool(t, m, nil)
	c := dialTunnel(t, p, m.target(addr, up.String()))

	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "banner" {
		t.Fatalf("read %q, %v; want banner and EOF", got, err)
	}
	payload := bytes.Repeat([]byte("after the server finished "), 1000)
	if _, err := c.Write(payload); err != nil {
		t.Fatalf("write after the server's EOF: %v", err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-received:
		if !bytes.Equal(got, payload) {
			t.Fatalf("upstream got %d bytes, want %d", len(got), len(payload))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("upstream never saw EOF")
	}
}

// A 256 MiB transfer each way arrives intact.
func TestLargeTransfer(t *testing.T) {
	size := int64(256 << 20)
	if testing.Short() {
		size = 16 << 20
	}
	m := newMesh(t)
	type result struct {
		n   int64
		sum [32]byte
	}
	upResult := make(chan result, 1)
	up := upstream(t, func(c *net.TCPConn) {
		done := make(chan struct{})
		go func() {
			defer close(done)
			io.Copy(c, io.LimitReader(rand.NewChaCha8([32]byte{2}), size))
			c.CloseWrite()
		}()
		h := sha256.New()
		n, _ := io.Copy(h, c)
		var r result
		r.n = n
		copy(r.sum[:], h.Sum(nil))
		upResult <- r
		<-done
	})
	_, addr := startServer(t, m, &dialHandler{}, nil)
	p := newPool(t, m, nil)
	c := dialTunnel(t, p, m.target(addr, up.String()))

	sendErr := make(chan error, 1)
	go func() {
		_, err := io.Copy(c, io.LimitReader(rand.NewChaCha8([32]byte{1}), size))
		if err == nil {
			err = c.CloseWrite()
		}
		sendErr <- err
	}()
	h := sha256.New()
	n, err := io.Copy(h, c)
	if err != nil {
		t.Fatalf("reading from tunnel: %v", err)
	}
	if err := <-sendErr; err != nil {
		t.Fatalf("writing to tunnel: %v", err)
	}
	want := sha256.New()
	io.Copy(want, io.LimitReader(rand.NewChaCha8([32]byte{2}), size))
	if n != size || !bytes.Equal(h.Sum(nil), want.Sum(nil)) {
		t.Fatalf("upstream to client: got %d bytes (hash mismatch: %v)", n, !bytes.Equal(h.Sum(nil), want.Sum(nil)))
	}
	r := <-upResult
	want.Reset()
	io.Copy(want, io.LimitReader(rand.NewChaCha8([32]byte{1}), size))
	if r.n != size || !bytes.Equal(r.sum[:], want.Sum(nil)) {
		t.Fatalf("client to upstream: got %d bytes (hash mismatch: %v)", r.n, !bytes.Equal(r.sum[:], want.Sum(nil)))
	}
}

// A read deadline interrupts a blocked Read without breaking the tunnel.
func TestReadDeadline(t *testing.T) {
	m := newMesh(t)
	up := upstream(t, echo)
	_, addr := startServer(t, m, &dialHandler{}, nil)
	p := newPool(t, m, nil)
	c := dialTunnel(t, p, m.target(addr, up.String()))

	errc := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 10))
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond) // let the Read block first
	c.SetReadDeadline(time.Now())
	select {
	case err := <-errc:
		var ne net.Error
		if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("Read returned %v, want a timeout", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("deadline did not interrupt Read")
	}
	c.SetReadDeadline(time.Time{})
	if _, err := c.Write([]byte("still works")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len("still works"))
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "still works" {
		t.Fatalf("after deadline: %q, %v", buf, err)
	}
}

// Many tunnels on shared connections carry random amounts both ways with
// half-closes in random order, while others are reset midway; every
// completed tunnel's bytes arrive intact and nothing is left open.
func TestConcurrentMixedTunnels(t *testing.T) {
	m := newMesh(t)
	// The upstream echoes with a hash: it sends back what it received, then
	// the SHA-256 of it, then half-closes.
	up := upstream(t, func(c *net.TCPConn) {
		h := sha256.New()
		buf := make([]byte, 32<<10)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				h.Write(buf[:n])
				if _, werr := c.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				if err == io.EOF {
					c.Write(h.Sum(nil))
					c.CloseWrite()
				}
				return
			}
		}
	})
	srv, addr := startServer(t, m, &dialHandler{}, nil)
	p := newPool(t, m, func(o *PoolOptions) { o.MaxStreamsPerConn = 20 })
	tg := m.target(addr, up.String())

	const tunnels = 120
	errs := make(chan error, tunnels)
	for i := 0; i < tunnels; i++ {
		go func() {
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			size := rng.IntN(1 << 20)
			reset := i%5 == 0
			errs <- func() error {
				c, err := p.Dial(ctxTimeout(t, 60*time.Second), tg)
				if err != nil {
					return err
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(60 * time.Second))
				payload := make([]byte, size)
				rand.NewChaCha8([32]byte{byte(i)}).Read(payload)
				readDone := make(chan []byte, 1)
				go func() {
					got, _ := io.ReadAll(c)
					readDone <- got
				}()
				if reset {
					c.Write(payload[:size/2])
					c.Close() // reset midway; the read side must end too
					<-readDone
					return nil
				}
				if _, err := c.Write(payload); err != nil {
					return fmt.Errorf("tunnel %d write: %w", i, err)
				}
				if err := c.(halfCloser).CloseWrite(); err != nil {
					return err
				}
				got := <-readDone
				sum := sha256.Sum256(payload)
				want := append(payload, sum[:]...)
				if !bytes.Equal(got, want) {
					return fmt.Errorf("tunnel %d: got %d bytes, want %d", i, len(got), len(want))
				}
				return nil
			}()
		}()
	}
	for i := 0; i < tunnels; i++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	eventually(t, 30*time.Second, "all tunnels to close", func() bool {
		return srv.Stats().Tunnels == 0 && p.Stats().Tunnels == 0
	})
}

// Many streams of one connection writing small pieces at once share write
// syscalls (writeData's group commit); every stream's bytes still arrive
// whole and in order, and half-closes queued among data frames apply after
// the data that was written before them.
func TestConcurrentSmallWritesOnOneConnection(t *testing.T) {
	const streams, pieces = 64, 300
	m := newMesh(t)
	up := upstream(t, echo)
	_, addr := startServer(t, m, &dialHandler{}, nil)
	p := newPool(t, m, nil)
	tg := m.target(addr, up.String())
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := p.Dial(ctxTimeout(t, 30*time.Second), tg)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(60 * time.Second))
			var want bytes.Buffer
			got := make(chan []byte, 1)
			go func() { b, _ := io.ReadAll(c); got <- b }()
			for j := range pieces {
				piece := fmt.Appendf(nil, "stream %d piece %d;", i, j)
				want.Write(piece)
				if _, err := c.Write(piece); err != nil {
					errs <- fmt.Errorf("stream %d write %d: %w", i, j, err)
					return
				}
			}
			c.(halfCloser).CloseWrite()
			if b := <-got; !bytes.Equal(b, want.Bytes()) {
				errs <- fmt.Errorf("stream %d: echoed %d bytes, want %d in order", i, len(b), want.Len())
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if s := p.Stats(); s.Connections != 1 {
		t.Fatalf("pool %+v: want the streams on one connection", s)
	}
}

// Readable tells, without reading, that bytes arrived, and that the peer
// ended its direction once they were read.
func TestReadableWithoutReading(t *testing.T) {
	m := newMesh(t)
	send := make(chan string)
	up := upstream(t, func(c *net.TCPConn) {
		for s := range send {
			c.Write([]byte(s))
		}
		c.CloseWrite()
		io.Copy(io.Discard, c)
	})
	_, addr := startServer(t, m, &dialHandler{}, nil)
	p := newPool(t, m, nil)
	c := dialTunnel(t, p, m.target(addr, up.String()))
	r := c.(interface{ Readable() bool })
	if r.Readable() {
		t.Fatal("Readable before anything was sent")
	}
	send <- "x"
	eventually(t, 10*time.Second, "bytes to be readable", r.Readable)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		t.Fatal(err)
	}
	if r.Readable() {
		t.Fatal("Readable after everything was read")
	}
	close(send)
	eventually(t, 10*time.Second, "the end to be readable", r.Readable)
	if n, err := c.Read(b[:]); n != 0 || err != io.EOF {
		t.Fatalf("read after Readable: %d, %v; want io.EOF", n, err)
	}
}

// A write larger than the peer's stream window leaves in window-sized
// parts of several frames each (the last frame of a part short), and
// arrives whole and in order.
func TestLargeWriteUnderSmallWindow(t *testing.T) {
	m := newMesh(t)
	up := upstream(t, echo)
	_, addr := startServer(t, m, &dialHandler{}, func(o *ServerOptions) { o.StreamWindow = initialWindowSize })
	c := dialTunnel(t, newPool(t, m, nil), m.target(addr, up.String()))
	msg := make([]byte, 1<<20+12345)
	for i := range msg {
		msg[i] = byte(i*7 + i>>9)
	}
	sent := make(chan error, 1)
	go func() {
		_, err := c.Write(msg)
		if err == nil {
			err = c.CloseWrite()
		}
		sent <- err
	}()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("echoed %d bytes, want the %d written, equal", len(got), len(msg))
	}
}
