package hbone

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Splice returns a Stream that joins the tunnel with upstream (see Join).
func Splice(upstream net.Conn) Stream {
	return RelayTo(upstream, 0, func(int64, int64, error) {})
}

// RelayTo returns a Stream that relays the tunnel with upstream (see
// Relay), cutting the pair once idle for idle (0: never), and calls done
// with the bytes sent to upstream, received from it, and the first error.
// A Server carries it without a goroutine waiting for its end.
func RelayTo(upstream net.Conn, idle time.Duration, done func(sent, received int64, err error)) *RelayStream {
	return &RelayStream{upstream: upstream, idle: idle, done: done}
}

// RelayStream is the Stream RelayTo returns.
type RelayStream struct {
	upstream net.Conn
	idle     time.Duration
	done     func(sent, received int64, err error)

	mu      sync.Mutex
	relay   *relay // once started without goroutines per direction
	aborted error  // Abort's cause, when it came before the start
}

func (r *RelayStream) Serve(ctx context.Context, tunnel net.Conn) {
	finished := make(chan struct{})
	r.start(ctx, tunnel, func() { close(finished) })
	<-finished
}

// start relays and returns at once; finished runs after done.
func (r *RelayStream) start(ctx context.Context, tunnel net.Conn, finished func()) {
	// Held while the relay starts: an Abort meanwhile waits for it.
	r.mu.Lock()
	r.relay = relayPair(ctx, tunnel, r.upstream, r.idle, func(sent, received int64, err error) {
		r.done(sent, received, err)
		finished()
	})
	rl, cause := r.relay, r.aborted
	r.mu.Unlock()
	if rl != nil && cause != nil {
		rl.abort(cause)
	}
}

// Bytes are the bytes sent to upstream and received from it so far (see
// Progress); zero before the relay starts.
func (r *RelayStream) Bytes() (sent, received int64) {
	r.mu.Lock()
	rl := r.relay
	r.mu.Unlock()
	return Progress{rl}.Bytes()
}

// Abort ends the relay with cause, resetting the tunnel and the upstream
// connection; before the relay starts, it resets upstream at once and the
// tunnel when the relay starts. Closing upstream by hand is not enough
// once the relay runs: a direction waiting in the idle poller would not
// hear of it.
func (r *RelayStream) Abort(cause error) {
	r.mu.Lock()
	rl := r.relay
	if rl == nil && r.aborted == nil {
		r.aborted = cause
	}
	r.mu.Unlock()
	if rl != nil {
		rl.abort(cause)
		return
	}
	abortConn(r.upstream)
}

// Join copies between a and b in both directions until both are done, then
// closes both. When one side ends its direction (EOF) the other side's
// write direction is closed (CloseWrite) and the opposite direction keeps
// flowing. An error in either direction, or ctx ending, aborts both: a
// tunnel is reset, a TCP connection is closed with RST. It returns the
// bytes copied each way and the first error (nil when both ended cleanly).
// Tunnels are copied from their receive buffers and TCP sockets are read
// only when readable, so an idle pair holds no copy buffer.
func Join(ctx context.Context, a, b net.Conn) (aToB, bToA int64, err error) {
	return JoinIdle(ctx, a, b, 0)
}

// ErrIdle aborts a joined pair on which nothing moved for the idle timeout.
var ErrIdle = errors.New("idle timeout")

// idleError is why a pair idle for d was cut.
func idleError(d time.Duration) error {
	return fmt.Errorf("%w: nothing sent either way for %s", ErrIdle, d.Round(time.Millisecond))
}

// JoinIdle is Join that also aborts the pair (with an error wrapping
// ErrIdle) once no byte has moved in either direction for idle (0: never).
// A tunnel joined with a socket (see Relay) is cut when idle has passed
// since its last byte; other pairs between idle and 1.5 idle after it.
func JoinIdle(ctx context.Context, a, b net.Conn, idle time.Duration) (aToB, bToA int64, err error) {
	if !relayable(a, b) {
		return joinCopying(ctx, a, b, idle)
	}
	done := make(chan struct{})
	relayPair(ctx, a, b, idle, func(ab, ba int64, e error) {
		aToB, bToA, err = ab, ba, e
		close(done)
	})
	<-done
	return aToB, bToA, err
}

// joinCopying is JoinIdle with a goroutine per direction, for pairs Relay
// cannot carry without them. Each direction's reads carry a deadline of
// idle/2, so an active direction records its progress at least that
// often; a pair is cut between idle and 1.5 idle after its last byte.
func joinCopying(ctx context.Context, a, b net.Conn, idle time.Duration) (aToB, bToA int64, err error) {
	var (
		once     sync.Once
		firstErr error
	)
	abort := func(cause error) {
		once.Do(func() {
			firstErr = cause
			abortConn(a)
			abortConn(b)
		})
	}
	stop := context.AfterFunc(ctx, func() { abort(ctx.Err()) })
	defer stop()

	var act *activity
	if idle > 0 {
		act = &activity{idle: idle}
		act.touch()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		aToB = copyHalf(b, a, abort, act)
	}()
	bToA = copyHalf(a, b, abort, act)
	<-done
	once.Do(func() {
		// Both directions ended cleanly.
		a.Close()
		b.Close()
	})
	return aToB, bToA, firstErr
}

// activity is when a joined pair last moved a byte.
type activity struct {
	idle time.Duration
	last atomic.Int64 // unix nanoseconds
}

func (a *activity) touch() { a.last.Store(time.Now().UnixNano()) }

func (a *activity) idleFor() time.Duration {
	return time.Duration(time.Now().UnixNano() - a.last.Load())
}

// copyHalf copies src to dst; at EOF it closes dst's write direction. On
// error, or when the pair has been idle too long, it aborts both.
func copyHalf(dst, src net.Conn, abort func(error), act *activity) int64 {
	var total int64
	for {
		if act != nil {
			src.SetReadDeadline(time.Now().Add(act.idle / 2))
		}
		var (
			n   int64
			err error
		)
		switch {
		case isStream(src):
			n, err = src.(io.WriterTo).WriteTo(dst)
		case isStream(dst):
			n, err = dst.(io.ReaderFrom).ReadFrom(src)
		default:
			n, err = io.Copy(dst, src)
		}
		total += n
		if act != nil && n > 0 {
			act.touch()
		}
		if act != nil && errors.Is(err, os.ErrDeadlineExceeded) {
			if d := act.idleFor(); d >= act.idle {
				abort(idleError(d))
				return total
			}
			continue
		}
		if err == errStopSending {
			return total // the server answered in full and wants no more
		}
		if err != nil {
			abort(err)
			return total
		}
		break
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		if err := cw.CloseWrite(); err != nil && !errors.Is(err, net.ErrClosed) && err != errStopSending {
			abort(err)
		}
	}
	return total
}

func isStream(c net.Conn) bool {
	_, ok := c.(*stream)
	return ok
}

// abortConn closes c so that the peer sees a failure, not a clean end.
func abortConn(c net.Conn) {
	switch c := c.(type) {
	case *net.TCPConn:
		c.SetLinger(0)
	case *stream:
		c.abort()
		return
	}
	c.Close()
}
