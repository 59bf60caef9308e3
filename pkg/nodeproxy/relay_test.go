package nodeproxy

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/pkg/internal/testnet"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// pattern is a reproducible byte stream (ChaCha8 from seed).
func pattern(seed uint64) io.Reader {
	var s [32]byte
	s[0] = byte(seed)
	return rand.NewChaCha8(s)
}

// sumOf reads r to its end and returns its length and CRC-32C.
func sumOf(r io.Reader) (int64, uint32, error) {
	h := crc32.New(castagnoli)
	n, err := io.Copy(h, r)
	return n, h.Sum32(), err
}

// A gibibyte each way at once through the pair arrives byte for byte:
// pod A uploads one stream while pod B's app sends another back, and each
// end checks the length and checksum of what it received. (About 6-10 s
// on 2 shared cores; -short moves 64 MiB each way.)
func TestLargeTransferIntact(t *testing.T) {
	size := int64(1 << 30)
	if testing.Short() {
		size = 64 << 20
	}
	_, wantSum, _ := sumOf(io.LimitReader(pattern(1), size))
	_, backSum, _ := sumOf(io.LimitReader(pattern(2), size))
	type result struct {
		n   int64
		sum uint32
		err error
	}
	got := make(chan result, 1)
	testnet.Serve(t, testnet.Listen(t, app(podB)+":8080"), func(c net.Conn) {
		sent := make(chan struct{})
		go func() {
			defer close(sent)
			io.Copy(c, io.LimitReader(pattern(2), size))
			c.(*net.TCPConn).CloseWrite()
		}()
		n, sum, err := sumOf(c)
		got <- result{n, sum, err}
		<-sent // the connection closes when this returns
	})
	m := startMesh(t, "node-a", "node-b")
	c, err := m.dial(t, "node-a", podA, podB+":8080")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Minute))
	upload := make(chan error, 1)
	go func() {
		_, err := io.Copy(c, io.LimitReader(pattern(1), size))
		if err == nil {
			err = c.(interface{ CloseWrite() error }).CloseWrite()
		}
		upload <- err
	}()
	n, sum, err := sumOf(c)
	if err != nil || n != size || sum != backSum {
		t.Fatalf("pod A received %d bytes (crc32c %08x, %v), want %d (%08x)", n, sum, err, size, backSum)
	}
	if err := <-upload; err != nil {
		t.Fatalf("upload: %v", err)
	}
	r := <-got
	if r.err != nil || r.n != size || r.sum != wantSum {
		t.Fatalf("pod B received %d bytes (crc32c %08x, %v), want %d (%08x)", r.n, r.sum, r.err, size, wantSum)
	}
}

// Either side may end its direction first; the other direction keeps
// flowing through the pair, and each end sees the other's EOF.
func TestHalfCloseBothWays(t *testing.T) {
	heard := make(chan string, 1)
	testnet.Serve(t, testnet.Listen(t, app(podB)+":8080"), func(c net.Conn) {
		// The app speaks first and ends its direction, then listens.
		io.WriteString(c, "greeting")
		c.(*net.TCPConn).CloseWrite()
		data, _ := io.ReadAll(c)
		heard <- string(data)
	})
	m := startMesh(t, "node-a", "node-b")

	// Server first.
	c, err := m.dial(t, "node-a", podA, podB+":8080")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "greeting" {
		t.Fatalf("read to the app's EOF: %q, %v", got, err)
	}
	time.Sleep(50 * time.Millisecond) // the pair idles with one direction ended
	if _, err := io.WriteString(c, "after your EOF"); err != nil {
		t.Fatalf("write after the app's EOF: %v", err)
	}
	c.(interface{ CloseWrite() error }).CloseWrite()
	if h := <-heard; h != "after your EOF" {
		t.Fatalf("app heard %q", h)
	}

	// Client first (the app of startApp answers once the client ended).
	startApp(t, app(podB)+":8081", "B")
	out, err := m.exchange(t, "node-a", podA, podB+":8081", "client ends first")
	if err != nil || out != "B:client ends first" {
		t.Fatalf("client-first exchange: %q, %v", out, err)
	}
}

// Many connections at once through the pair each get their own answer.
func TestManyConcurrentConnections(t *testing.T) {
	startApp(t, app(podB)+":8080", "B")
	// So many tunnels opening at once take a while on a busy machine (and
	// under -race); the test is about carrying them, not opening them fast.
	m := startMeshWith(t, func(o *Options) { o.ConnectTimeout = 30 * time.Second }, "node-a", "node-b")
	const conns = 300
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	held := make(chan net.Conn, conns)
	for i := range conns {
		wg.Go(func() {
			c, err := m.dial(t, "node-a", podA, podB+":8080")
			if err != nil {
				errs <- err
				return
			}
			held <- c
			c.SetDeadline(time.Now().Add(60 * time.Second))
			msg := bytes.Repeat([]byte(fmt.Sprintf("%d.", i)), 1000+i)
			if _, err := c.Write(msg); err != nil {
				errs <- fmt.Errorf("connection %d: write: %w", i, err)
				return
			}
			// All are open before any ends.
			time.Sleep(200 * time.Millisecond)
			c.(interface{ CloseWrite() error }).CloseWrite()
			out, err := io.ReadAll(c)
			if err != nil || !bytes.Equal(out, append([]byte("B:"), msg...)) {
				errs <- fmt.Errorf("connection %d: %d bytes back, %v", i, len(out), err)
			}
		})
	}
	wg.Wait()
	close(errs)
	close(held)
	for c := range held {
		c.Close()
	}
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	if len(all) > 0 {
		time.Sleep(time.Second) // the access line follows the answer
		for _, l := range accessLines(m.logs["node-a"], "outbound") {
			if l["result"] != "ok" {
				t.Logf("node proxy A: %v", l["result"])
				break
			}
		}
		t.Fatalf("%d of %d connections failed: %v", len(all), conns, all[0])
	}
}
