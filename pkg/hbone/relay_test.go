package hbone

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/pkg/cancelgroup"
)

// Idle relays hold no goroutine: many tunnels joined with idle sockets add
// (almost) none to the process, and each still carries data afterwards.
func TestIdleRelaysHoldNoGoroutine(t *testing.T) {
	const pairs = 50
	m := newMesh(t)
	apps := make(chan net.Conn, pairs)
	h := HandlerFunc(func(ctx context.Context, r *Request) (Stream, error) {
		a, b := tcpPair(t)
		apps <- b
		return Splice(a), nil
	})
	_, addr := startServer(t, m, h, nil)
	p := newPool(t, m, nil)
	var tunnels []halfCloser
	var ups []net.Conn
	// The first tunnel brings the connection's own goroutines.
	first := dialTunnel(t, p, m.target(addr, "127.0.0.1:80"))
	defer first.Close()
	ups = append(ups, <-apps)
	time.Sleep(100 * time.Millisecond)
	before := runtime.NumGoroutine()
	for range pairs {
		tn := dialTunnel(t, p, m.target(addr, "127.0.0.1:80"))
		defer tn.Close()
		tunnels = append(tunnels, tn)
		ups = append(ups, <-apps)
	}
	for _, u := range ups {
		defer u.Close()
	}
	time.Sleep(200 * time.Millisecond) // every relay parks
	// The test's own ends add none: tunnels are streams, apps sockets.
	if grew := runtime.NumGoroutine() - before; grew > pairs/5 {
		t.Fatalf("%d idle relays added %d goroutines", pairs, grew)
	}
	pingPong := func(round int, pairs []int) {
		for _, i := range pairs {
			tn := tunnels[i]
			tn.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.WriteString(tn, "ping"); err != nil {
				t.Fatal(err)
			}
			var b [4]byte
			u := ups[i+1]
			u.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.ReadFull(u, b[:]); err != nil || string(b[:]) != "ping" {
				t.Fatalf("round %d, pair %d after idling: %q, %v", round, i, b, err)
			}
			if _, err := io.WriteString(u, "pong"); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(tn, b[:]); err != nil || string(b[:]) != "pong" {
				t.Fatalf("round %d, pair %d back: %q, %v", round, i, b, err)
			}
		}
	}
	// A relay that carried an answer for the first time parks once quiet
	// for firstHotWait. One that carried another within hotWait waits for
	// the next on its own goroutine (carry), then parks again once it has
	// been quiet hotWait. A few pairs first, so that all of them are still
	// within hotWait when counted, however slow the machine.
	const hot = 10
	all := make([]int, pairs)
	for i := range all {
		all[i] = i
	}
	pingPong(1, all[:hot])
	time.Sleep(firstHotWait + 300*time.Millisecond)
	if grew := runtime.NumGoroutine() - before; grew > hot/5 {
		t.Errorf("%d relays that carried one answer hold %d goroutines; want none", hot, grew)
	}
	pingPong(2, all[:hot])
	if grew := runtime.NumGoroutine() - before; grew < hot/2 {
		t.Errorf("%d relays that carried a second answer hold %d goroutines; want one each", hot, grew)
	}
	pingPong(1, all[hot:])
	time.Sleep(hotWait + 300*time.Millisecond)
	if grew := runtime.NumGoroutine() - before; grew > pairs/5 {
		t.Fatalf("%d relays quiet for %s added %d goroutines", pairs, hotWait, grew)
	}
	pingPong(3, all)
}

// A relay whose context ends while both sides idle ends at once: done
// reports the context's error, the socket is reset and the tunnel too;
// also under a context that takes the relay's registration itself
// (AfterFunc: pkg/cancelgroup, the node proxy's drain).
func TestRelayCancelledWhileIdle(t *testing.T) {
	t.Run("WithCancel", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		testRelayCancelledWhileIdle(t, ctx, cancel)
	})
	t.Run("cancelgroup", func(t *testing.T) {
		ctx, cancel := cancelgroup.New()
		testRelayCancelledWhileIdle(t, ctx, cancel)
	})
}

func testRelayCancelledWhileIdle(t *testing.T, ctx context.Context, cancel context.CancelFunc) {
	m := newMesh(t)
	defer cancel()
	result := make(chan error, 1)
	apps := make(chan net.Conn, 1)
	h := HandlerFunc(func(_ context.Context, r *Request) (Stream, error) {
		a, b := tcpPair(t)
		apps <- b
		return StreamFunc(func(_ context.Context, tunnel net.Conn) {
			done := make(chan struct{})
			Relay(ctx, tunnel, a, 0, func(_, _ int64, err error) {
				result <- err
				close(done)
			})
			<-done // the server closes the tunnel when Serve returns
		}), nil
	})
	_, addr := startServer(t, m, h, nil)
	p := newPool(t, m, nil)
	tn := dialTunnel(t, p, m.target(addr, "127.0.0.1:80"))
	defer tn.Close()
	up := <-apps
	defer up.Close()
	time.Sleep(100 * time.Millisecond) // parked
	cancel()
	wantAborted(t, result, context.Canceled, up, tn)
}

// wantAborted waits for a relay to end with want (on result), then checks
// that its socket (up's peer) and its tunnel (tn's server end) were reset.
func wantAborted(t *testing.T, result <-chan error, want error, up, tn net.Conn) {
	t.Helper()
	select {
	case err := <-result:
		if !errors.Is(err, want) {
			t.Fatalf("relay ended with %v, want %v", err, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("aborted idle relay never ended")
	}
	up.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := up.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("socket after the abort: %v, want a reset", err)
	}
	tn.SetReadDeadline(time.Now().Add(10 * time.Second))
	var re *resetError
	if _, err := io.ReadAll(tn); !errors.As(err, &re) {
		t.Fatalf("tunnel after the abort: %v, want a reset", err)
	}
}

// A RelayStream aborted while both sides idle (its socket direction parked
// in the poller, where closing the socket goes unheard) ends at once with
// the cause, resetting the socket and the tunnel; one aborted before the
// server starts it ends as it starts.
func TestRelayStreamAbort(t *testing.T) {
	cause := errors.New("revoked")
	for _, early := range []bool{false, true} {
		m := newMesh(t)
		result := make(chan error, 1)
		streams := make(chan *RelayStream, 1)
		apps := make(chan net.Conn, 1)
		h := HandlerFunc(func(_ context.Context, r *Request) (Stream, error) {
			a, b := tcpPair(t)
			apps <- b
			rs := RelayTo(a, 0, func(_, _ int64, err error) { result <- err })
			if early {
				rs.Abort(cause)
			}
			streams <- rs
			return rs, nil
		})
		_, addr := startServer(t, m, h, nil)
		p := newPool(t, m, nil)
		tn := dialTunnel(t, p, m.target(addr, "127.0.0.1:80"))
		defer tn.Close()
		up := <-apps
		defer up.Close()
		if rs := <-streams; !early {
			time.Sleep(100 * time.Millisecond) // parked
			rs.Abort(cause)
		}
		t.Logf("aborted before the start: %v", early)
		wantAborted(t, result, cause, up, tn)
	}
}

// A relay sends what it reads from its socket as frames in place, in the
// read buffer's frame slots; flow control cuts frames anywhere in a slot
// (a 65,535-byte window is 4 frames and 35 bytes), and the frame after a
// cut one carries on from there. Both directions move 3 MiB intact.
func TestRelayFramesInPlaceUnderSmallWindow(t *testing.T) {
	m := newMesh(t)
	apps := make(chan net.Conn, 1)
	h := HandlerFunc(func(ctx context.Context, r *Request) (Stream, error) {
		a, b := tcpPair(t)
		apps <- b
		return Splice(a), nil
	})
	_, addr := startServer(t, m, h, func(o *ServerOptions) { o.StreamWindow = initialWindowSize })
	p := newPool(t, m, func(o *PoolOptions) { o.StreamWindow = initialWindowSize })
	tn := dialTunnel(t, p, m.target(addr, "127.0.0.1:80"))
	app := <-apps
	defer app.Close()
	msg := make([]byte, 3<<20+777)
	for i := range msg {
		msg[i] = byte(i*13 + i>>11)
	}
	tn.SetDeadline(time.Now().Add(60 * time.Second))
	app.SetDeadline(time.Now().Add(60 * time.Second))

	// app -> relay (socket read into slots) -> tunnel
	go func() {
		app.Write(msg)
		app.(*net.TCPConn).CloseWrite()
	}()
	got, err := io.ReadAll(tn)
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("tunnel read %d bytes (%v), want the %d the app wrote, equal", len(got), err, len(msg))
	}
	// tunnel -> relay -> app, and a client relaying its own socket into
	// the tunnel (ReadFrom) the same way.
	a, b := tcpPair(t)
	defer a.Close()
	defer b.Close()
	go func() {
		b.Write(msg)
		b.(*net.TCPConn).CloseWrite()
	}()
	copied := make(chan error, 1)
	go func() {
		_, err := tn.(io.ReaderFrom).ReadFrom(a)
		if err == nil {
			err = tn.CloseWrite()
		}
		copied <- err
	}()
	got, err = io.ReadAll(app)
	if cerr := <-copied; cerr != nil {
		t.Fatalf("ReadFrom: %v", cerr)
	}
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("app read %d bytes (%v), want the %d sent through the tunnel, equal", len(got), err, len(msg))
	}
}

// A server that sends its whole answer and ends the stream, then resets it
// with NO_ERROR because the client is still sending (RFC 9113 §8.1: stop
// sending, no error), ends the client's relay cleanly once the app is
// done: no error reported, the app's socket gets the answer and a FIN,
// then a close without a reset.
func TestRelayEndsCleanlyOnServersNoErrorReset(t *testing.T) {
	m := newMesh(t)
	h := HandlerFunc(func(_ context.Context, r *Request) (Stream, error) {
		return StreamFunc(func(_ context.Context, tunnel net.Conn) {
			tunnel.Write([]byte("answer"))
			// Serve returns: the server ends the stream (END_STREAM) and,
			// the client not having ended its side, resets it (NO_ERROR).
		}), nil
	})
	_, addr := startServer(t, m, h, nil)
	p := newPool(t, m, nil)
	tn := dialTunnel(t, p, m.target(addr, "127.0.0.1:80"))
	a, app := tcpPair(t)
	defer app.Close()
	result := make(chan error, 1)
	Relay(context.Background(), tn, a, 0, func(_, _ int64, err error) { result <- err })
	app.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(app)
	if err != nil || string(got) != "answer" {
		t.Fatalf("app read %q, %v; want the answer and EOF", got, err)
	}
	// The app, answered, still sends (the server asked for no more of it),
	// then closes its side.
	if _, err := app.Write([]byte("more")); err != nil {
		t.Fatal(err)
	}
	app.(*net.TCPConn).CloseWrite()
	select {
	case err := <-result:
		if err != nil {
			t.Fatalf("relay ended with %v, want a clean end", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("relay never ended")
	}
	if _, err := app.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("app socket after the relay: %v, want EOF (closed, not reset)", err)
	}
}
