package hbone

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

// gatedConn blocks Writes while its gate is shut, standing in for a peer
// that stopped reading; pass lets single Writes through.
type gatedConn struct {
	net.Conn
	mu      sync.Mutex
	open    *sync.Cond
	shut    bool
	passes  int // Writes let through while shut
	blocked int // Writes waiting at the gate
	sent    []byte
}

func newGatedConn(c net.Conn) *gatedConn {
	g := &gatedConn{Conn: c}
	g.open = sync.NewCond(&g.mu)
	return g
}

func (g *gatedConn) Write(b []byte) (int, error) {
	g.mu.Lock()
	for g.shut && g.passes == 0 {
		g.blocked++
		g.open.Wait()
		g.blocked--
	}
	if g.shut {
		g.passes--
	}
	g.sent = append(g.sent, b...)
	g.mu.Unlock()
	return g.Conn.Write(b)
}

// appDataRecords counts the TLS application data records written so far.
func (g *gatedConn) appDataRecords() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for b := g.sent; len(b) >= 5; {
		size := 5 + (int(b[3])<<8 | int(b[4]))
		if b[0] == 23 {
			n++
		}
		b = b[min(size, len(b)):]
	}
	return n
}

func (g *gatedConn) setShut(shut bool) {
	g.mu.Lock()
	g.shut = shut
	g.mu.Unlock()
	g.open.Broadcast()
}

func (g *gatedConn) pass() {
	g.mu.Lock()
	g.passes++
	g.mu.Unlock()
	g.open.Broadcast()
}

// waiting reports whether a Write is blocked at the gate with no pass
// left for it.
func (g *gatedConn) waiting() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.blocked == 1 && g.passes == 0
}

// gatedTunnels opens n echo tunnels on one connection whose socket writes
// pass a gate, and shuts the gate.
func gatedTunnels(t *testing.T, n int) (*gatedConn, []halfCloser) {
	t.Helper()
	m := newMesh(t)
	up := upstream(t, echo)
	_, addr := startServer(t, m, &dialHandler{}, nil)
	var gate *gatedConn
	p := newPool(t, m, func(o *PoolOptions) {
		o.Dial = func(ctx context.Context, _ netip.Addr, remote netip.AddrPort) (net.Conn, error) {
			c, err := new(net.Dialer).DialContext(ctx, "tcp", remote.String())
			if err != nil {
				return nil, err
			}
			gate = newGatedConn(c)
			return gate, nil
		}
	})
	tg := m.target(addr, up.String())
	tunnels := make([]halfCloser, n)
	for i := range tunnels {
		tunnels[i] = dialTunnel(t, p, tg)
	}
	if s := p.Stats(); s.Connections != 1 {
		t.Fatalf("pool %+v: want the tunnels on one connection", s)
	}
	gate.setShut(true)
	t.Cleanup(func() { gate.setShut(false) }) // before the tunnels close
	return gate, tunnels
}

// writeAsync writes s on c in the background.
func writeAsync(c net.Conn, s string) chan error {
	done := make(chan error, 1)
	go func() { _, err := io.WriteString(c, s); done <- err }()
	return done
}

// expectEchoes reads want from each tunnel.
func expectEchoes(t *testing.T, want map[halfCloser]string) {
	t.Helper()
	for c, w := range want {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		got := make([]byte, len(w))
		if _, err := io.ReadFull(c, got); err != nil || string(got) != w {
			t.Fatalf("echo %q, %v; want %q", got, err, w)
		}
	}
}

// A small Write returns once its frame is queued, not flushed; a stream
// has at most one such frame queued, so a writer faster than the socket
// waits from its second frame on; and everything arrives, in order, once
// the socket drains.
func TestWriteBehindIsBounded(t *testing.T) {
	gate, tunnels := gatedTunnels(t, 2)
	a, b := tunnels[0], tunnels[1]
	aDone := writeAsync(a, "a1;")
	eventually(t, 10*time.Second, "a flush blocked on the socket", gate.waiting)

	select {
	case err := <-writeAsync(b, "b1;"):
		if err != nil {
			t.Fatalf("first small write: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a small write waited for the blocked flush")
	}
	bDone := writeAsync(b, "b2;")
	select {
	case err := <-bDone:
		t.Fatalf("a second small write returned (%v) while the first is still queued", err)
	case <-time.After(100 * time.Millisecond):
	}

	gate.setShut(false)
	for _, done := range []chan error{aDone, bDone} {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	expectEchoes(t, map[halfCloser]string{a: "a1;", b: "b1;b2;"})
}

// A writer flushes for others at most maxLeadRounds times; if frames are
// still queued then, the connection's writer goroutine sends them and the
// writer returns.
func TestFlushLeadPassesToWriter(t *testing.T) {
	gate, tunnels := gatedTunnels(t, maxLeadRounds+1)
	lead := writeAsync(tunnels[0], "t0;")
	for i := 1; i <= maxLeadRounds; i++ {
		eventually(t, 10*time.Second, "a flush blocked on the socket", gate.waiting)
		// Queued while the flush of round i is blocked: round i+1 sends it
		// (the last, past the limit, is left to the writer goroutine).
		if err := <-writeAsync(tunnels[i], fmt.Sprintf("t%d;", i)); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-lead:
			t.Fatalf("the leading writer returned (%v) before flushing round %d", err, i)
		default:
		}
		gate.pass()
	}
	select {
	case err := <-lead:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the leading writer is still flushing after %d rounds", maxLeadRounds)
	}
	gate.setShut(false)
	want := map[halfCloser]string{}
	for i, c := range tunnels {
		want[c] = fmt.Sprintf("t%d;", i)
	}
	expectEchoes(t, want)
}

// Small writes followed by Close are all delivered before the stream ends,
// as after a single large write (TestCloseDeliversWrittenData).
func TestCloseDeliversSmallWrites(t *testing.T) {
	m := newMesh(t)
	const pieces = 2000
	h := HandlerFunc(func(ctx context.Context, r *Request) (Stream, error) {
		return StreamFunc(func(ctx context.Context, tunnel net.Conn) {
			for i := range pieces {
				if _, err := io.WriteString(tunnel, strings.Repeat("x", i%64+1)+";"); err != nil {
					return
				}
			}
			tunnel.Close()
		}), nil
	})
	_, addr := startServer(t, m, h, nil)
	p := newPool(t, m, nil)
	var want strings.Builder
	for i := range pieces {
		want.WriteString(strings.Repeat("x", i%64+1) + ";")
	}
	c := dialTunnel(t, p, m.target(addr, "127.0.0.1:80"))
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read after the server closed: %v (%d bytes)", err, len(got))
	}
	if string(got) != want.String() {
		t.Fatalf("got %d bytes, want %d", len(got), want.Len())
	}
}

// Small frames flushed together go out in one TLS record, not one each.
func TestBatchedSmallFramesShareARecord(t *testing.T) {
	gate, tunnels := gatedTunnels(t, 8)
	before := gate.appDataRecords()
	first := writeAsync(tunnels[0], "first")
	eventually(t, 10*time.Second, "the first flush blocked on the socket", gate.waiting)
	want := map[halfCloser]string{tunnels[0]: "first"}
	for i, c := range tunnels[1:] {
		msg := fmt.Sprintf("queued %d", i)
		if err := <-writeAsync(c, msg); err != nil {
			t.Fatal(err)
		}
		want[c] = msg
	}
	gate.setShut(false)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	expectEchoes(t, want)
	// The first frame's own record, then the seven queued frames in one.
	if n := gate.appDataRecords() - before; n != 2 {
		t.Fatalf("%d records for 8 small frames in two flushes, want 2", n)
	}
}

// While the flushing writer yields, the writer of the earlyFlushFrames-th
// behind frame sends the queued behind frames itself, so a burst leaves in
// parts; fewer stay queued for the leader.
func TestBurstLeavesBeforeTheLeaderFlushes(t *testing.T) {
	gate, tunnels := gatedTunnels(t, earlyFlushFrames+1)
	gate.setShut(false)
	c := tunnels[0].(*stream).c
	// A leader that has not flushed yet, as one yielding in writeData.
	c.qmu.Lock()
	c.flushing = true
	c.qmu.Unlock()
	released := false
	release := func() {
		if released {
			return
		}
		released = true
		c.flushQueue(nil, 0) // as the leader would; it clears flushing
	}
	t.Cleanup(release)

	want := map[halfCloser]string{}
	for i, tc := range tunnels[:earlyFlushFrames] {
		msg := fmt.Sprintf("burst %d", i)
		if err := <-writeAsync(tc, msg); err != nil {
			t.Fatal(err)
		}
		want[tc] = msg
	}
	expectEchoes(t, want) // sent without the leader

	last := tunnels[earlyFlushFrames]
	if err := <-writeAsync(last, "after"); err != nil {
		t.Fatal(err)
	}
	c.qmu.Lock()
	queued := len(c.dq)
	c.qmu.Unlock()
	if queued != 1 {
		t.Fatalf("%d frames queued after the early flush, want the one written since", queued)
	}
	release()
	expectEchoes(t, map[halfCloser]string{last: "after"})
}

// Under the protocol's initial 16 KiB frame size a bulk write's frames
// carry 9 bytes less than 16 KiB, so that each frame with its header is
// one full TLS record: a 16 KiB payload would need a second record of 9
// bytes per frame.
func TestBulkFramesFillWholeRecords(t *testing.T) {
	gate, tunnels := gatedTunnels(t, 2)
	gate.setShut(false)
	// crypto/tls starts a connection with small records, growing them to
	// 16 KiB over its first 128 KB: send those first, on another tunnel.
	warm := strings.Repeat("w", 160<<10)
	go io.WriteString(tunnels[1], warm)
	tunnels[1].SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(tunnels[1], make([]byte, len(warm))); err != nil {
		t.Fatal(err)
	}
	before := gate.appDataRecords()
	const frames = 8
	msg := strings.Repeat("x", frames*(tlsRecordPayload-frameHeaderLen))
	if _, err := io.WriteString(tunnels[0], msg); err != nil {
		t.Fatal(err)
	}
	// CloseWrite returns once everything written is sent (and adds one
	// record: END_STREAM); nothing was read, so no window update was sent.
	if err := tunnels[0].CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if n := gate.appDataRecords() - before; n != frames+1 {
		t.Fatalf("%d records for %d full frames and END_STREAM, want %d", n, frames, frames+1)
	}
	got, err := io.ReadAll(tunnels[0])
	if err != nil || string(got) != msg {
		t.Fatalf("echo of %d bytes (%v), want the %d written", len(got), err, len(msg))
	}
}
