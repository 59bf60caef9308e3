package hbone

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Relay is JoinIdle without a caller waiting: it returns at once and calls
// done, on a goroutine of its own, once both directions are done, with
// what JoinIdle would have returned.
//
// A tunnel joined with a TCP (or Unix) socket is carried without a
// goroutine per direction, so that an idle pair costs little more than
// its two connections: the tunnel's data is written out by a goroutine
// started when it arrives, which ends when the receive buffer is empty;
// the socket is read only once it is readable, into a pooled buffer, by a
// goroutine started when it is, which goes on reading while data keeps
// coming (carry). On Linux one epoll goroutine shared by all relays
// (idlePoller) waits for the quiet sockets, so an idle pair holds no
// goroutine at all; elsewhere the socket's goroutine waits, going back to
// waiting on a fresh goroutine (a small stack) after it has sent data,
// whose TLS and framing grew its own. Other pairs get JoinIdle's goroutine
// per direction.
//
// The Progress it returns reads the bytes carried so far while the pair
// runs.
func Relay(ctx context.Context, a, b net.Conn, idle time.Duration, done func(aToB, bToA int64, err error)) Progress {
	return Progress{relayPair(ctx, a, b, idle, done)}
}

// Progress reads the bytes a running relay has carried so far (its done
// reports the totals): the counters the relay keeps anyway, read only
// when asked. A pair carried with a goroutine per direction (not a tunnel
// and a socket) reads zero: its done alone reports its bytes.
type Progress struct{ r *relay }

// Bytes are the bytes carried so far from a to b and from b to a.
func (p Progress) Bytes() (aToB, bToA int64) {
	if p.r == nil {
		return 0, 0
	}
	toPeer, toStream := p.r.toPeer.Load(), p.r.toStream.Load()
	if p.r.streamIsA {
		return toPeer, toStream
	}
	return toStream, toPeer
}

// relayPair is Relay; it returns the relay it started, nil for a pair
// carried by joinCopying.
func relayPair(ctx context.Context, a, b net.Conn, idle time.Duration, done func(aToB, bToA int64, err error)) *relay {
	if !relayable(a, b) {
		go func() { done(joinCopying(ctx, a, b, idle)) }()
		return nil
	}
	r := &relay{idle: idle, done: done}
	if st, ok := a.(*stream); ok {
		r.st, r.peer, r.streamIsA = st, b, true
	} else {
		r.st, r.peer = b.(*stream), a
	}
	r.rc = rawConnOf(r.peer)
	r.left.Store(2)
	r.last.Store(time.Now().UnixNano())
	if ctx == (streamContext{r.st}) {
		// A server's tunnel context ends only with the stream, whose end
		// the relay sees anyway.
		r.stopCtx = func() bool { return false }
	} else if a, ok := ctx.(interface{ AfterFunc(func()) func() bool }); ok {
		// Registered with ctx itself (pkg/cancelgroup), without the
		// context context.AfterFunc makes for each relay.
		r.stopCtx = a.AfterFunc(func() { r.abort(ctx.Err()) })
	} else {
		r.stopCtx = context.AfterFunc(ctx, func() { r.abort(ctx.Err()) })
	}
	if idle > 0 {
		relayIdleClock.add(r, r.last.Load())
	}
	r.st.c.mu.Lock()
	r.st.pump = r
	r.st.wakeReaderLocked() // data may be waiting already
	r.st.c.mu.Unlock()
	go r.fromPeer()
	return r
}

// relayable reports whether Relay carries a and b without a goroutine per
// direction: one is a tunnel, the other a socket it can wait on.
func relayable(a, b net.Conn) bool {
	_, sa := a.(*stream)
	_, sb := b.(*stream)
	switch {
	case sa && !sb:
		return rawConnOf(b) != nil
	case sb && !sa:
		return rawConnOf(a) != nil
	}
	return false
}

// relay is one tunnel joined with one socket (peer).
type relay struct {
	st        *stream
	peer      net.Conn
	rc        syscall.RawConn
	streamIsA bool
	idle      time.Duration
	stopCtx   func() bool
	done      func(aToB, bToA int64, err error)

	last     atomic.Int64 // unix nanoseconds of the last byte moved
	toPeer   atomic.Int64 // bytes from the tunnel to the socket
	toStream atomic.Int64 // bytes from the socket to the tunnel
	left     atomic.Int32 // directions not done

	once sync.Once
	err  error // the first failure; set in once

	// The socket direction's state (peerRunning, ...), and its poller
	// registration (touched only by fromPeer).
	state      atomic.Int32
	token      uint64
	registered bool
	hotUntil   int64 // carry's read deadline on the socket, unix nanoseconds

	// The relay's place in relayIdleClock (idleAt 0: none), under its mu.
	idleAt             int64
	idleNext, idlePrev *relay
	lastSend           int64 // when the socket's data was last sent, unix nanoseconds
}

func (r *relay) touch() { r.last.Store(time.Now().UnixNano()) }

// abort ends both directions with cause: the tunnel is reset, the socket
// closed with RST.
func (r *relay) abort(cause error) {
	r.once.Do(func() {
		r.err = cause
		abortConn(r.st)
		abortConn(r.peer)
	})
	// A direction parked in the poller never hears of the closed socket
	// (closing it dropped the registration): end it here.
	if r.state.CompareAndSwap(peerParked, peerDone) {
		r.directionDone()
	}
}

// directionDone is called once by each direction; the last one closes both
// connections (if nothing failed) and reports.
func (r *relay) directionDone() {
	if r.left.Add(-1) != 0 {
		return
	}
	r.stopCtx()
	if r.idle > 0 {
		relayIdleClock.remove(r)
	}
	idlePollerFor().forget(r)
	r.once.Do(func() {
		// Both directions ended cleanly.
		r.st.Close()
		r.peer.Close()
	})
	aToB, bToA := Progress{r}.Bytes()
	r.done(aToB, bToA, r.err)
}

// fromPeer carries the socket into the tunnel; at EOF it ends the
// tunnel's direction (END_STREAM). It runs when the socket is readable (or
// at the relay's start): it reads what is there, sends it, then carries
// on this goroutine while more comes (carry), and parks in the idle
// poller once the socket went quiet: hotWait if the socket had sent
// within hotWait before (requests on a kept connection) or filled the
// buffer (bulk), else firstHotWait.
func (r *relay) fromPeer() {
	buf, n, err := readPooled(r.rc, false, false)
	if err == errWouldBlock {
		if p := idlePollerFor(); p != nil && p.park(r) {
			return
		}
		buf, n, err = readPooled(r.rc, true, false)
	}
	if err == nil {
		// A read that filled the small buffer brings a copy buffer next.
		big := readFilled(buf, n)
		again := r.lastSend != 0 && time.Duration(time.Now().UnixNano()-r.lastSend) < hotWait
		if err = r.send(buf, n); err == nil {
			wait := firstHotWait
			if big || again {
				wait = hotWait
			}
			err = r.carry(big, wait)
		}
	}
	switch {
	case err == errWouldBlock:
		if p := idlePollerFor(); p != nil && p.park(r) {
			return
		}
		go r.fromPeer() // wait on a small stack
	case err == io.EOF:
		if err := r.st.CloseWrite(); err != nil && !errors.Is(err, net.ErrClosed) && err != errStopSending {
			r.abort(err)
		}
		r.directionDone()
	case err == errStopSending:
		// The server has answered in full and wants no more: the
		// direction is done; what the socket still sends is dropped.
		r.directionDone()
	default:
		r.abort(err)
		r.directionDone()
	}
}

// send sends the n bytes read into buf's frame slots into the tunnel, and
// gives buf back.
func (r *relay) send(buf *[]byte, n int) error {
	r.lastSend = time.Now().UnixNano()
	r.last.Store(r.lastSend)
	r.st.wmu.Lock()
	err := r.st.sendSlotted(*buf, n)
	r.st.wmu.Unlock()
	putReadBuf(buf)
	if err != nil {
		return err
	}
	r.toStream.Add(int64(n))
	r.touch()
	return nil
}

// hotWait is how long the socket direction of a relay that has sent waits
// for more on its own goroutine, in the runtime's poller, before it parks
// in the idle poller: a connection carrying requests keeps its goroutine,
// and each arrival wakes it directly, where a park costs two system calls
// and its wake-up a hand-off from the poller's goroutine to a new one
// (issue 36); one that went quiet gives its goroutine back.
const hotWait = time.Second

// firstHotWait is hotWait for a socket that had not sent within hotWait
// before. Most such wait for an answer (a connection opened for one
// exchange ends about a round trip later, and a park then costs its
// close a hand-off), but a connection opened, used once and kept idle
// sends nothing more: a full hotWait for each held a goroutine and its
// stack a second for every connection opened, which a burst of
// connections paid in memory (issue 36: 0.6 KiB per idle connection).
const firstHotWait = hotWait / 10

// carry reads the socket and sends what it reads while it keeps arriving
// within wait (hotWait once it sent); it returns errWouldBlock once the
// socket stayed quiet that long, io.EOF at its end, else the failure. All its reads happen in
// one RawConn.Read: the runtime's poller remembers an arrival from the
// start of that call on, so a short read (the socket emptied) is followed
// by waiting, not by a read that would find nothing. The read deadline
// that bounds the wait moves once half of it has passed, so a busy socket
// seldom touches its timer.
func (r *relay) carry(big bool, wait time.Duration) error {
	var (
		err     error
		drained bool
	)
	rerr := r.rc.Read(func(fd uintptr) bool {
		for {
			if last := r.last.Load(); time.Duration(r.hotUntil-last) < wait/2 {
				r.hotUntil = last + int64(wait)
				if err = r.peer.SetReadDeadline(time.Unix(0, r.hotUntil)); err != nil {
					return true
				}
			}
			if drained {
				drained = false
				return false
			}
			var (
				buf *[]byte
				n   int
			)
			if buf, n, err = readFD(fd, big); err != nil {
				return err != errWouldBlock
			}
			big = readFilled(buf, n)
			if err = r.send(buf, n); err != nil {
				return true
			}
			drained, wait = !big, hotWait // it sent again
		}
	})
	if errors.Is(rerr, os.ErrDeadlineExceeded) {
		r.hotUntil = 0
		if rerr = r.peer.SetReadDeadline(time.Time{}); rerr == nil {
			return errWouldBlock
		}
	}
	if rerr != nil {
		return rerr
	}
	return err
}

// writeNowMax is the most a read loop writes to a relay's socket itself
// (writeNow): a request or an answer; bulk data is the pump's, so that
// reading the connection and writing the sockets go on in parallel.
const writeNowMax = 4 << 10

// writeNow writes what the tunnel received to the socket if there is at
// most writeNowMax of it and the socket takes all of it at once, without
// waiting (c.mu held: the read loop that received it calls it). It reports
// whether it did; otherwise the pump writes the rest, and the end of the
// stream, a failure or a closed socket are the pump's too. A request or an
// answer so leaves without a hand-off to a goroutine, whose wake-up it
// would wait for (issue 36).
func (r *relay) writeNow() bool {
	st := r.st
	if st.recvEOF || st.err != nil || st.released || st.recv.dead || st.recv.size <= 0 || st.recv.size > writeNowMax {
		return false
	}
	var iov [4][]byte // on the stack: writeNoWait keeps no reference
	n, err := writeNoWait(r.rc, st.recv.peek(iov[:0]))
	if n <= 0 {
		return false
	}
	st.recv.consume(n)
	st.consumedLocked(n)
	st.checkPeerDoneLocked()
	r.toPeer.Add(int64(n))
	r.touch()
	return err == nil && st.recv.size == 0
}

// drain is the tunnel's pump (stream.pump): it writes what the tunnel
// received to the socket until the receive buffer is empty, and at the
// tunnel's end (END_STREAM) ends the socket's write direction.
func (r *relay) drain() {
	st, c := r.st, r.st.c
	for {
		c.mu.Lock()
		switch {
		case st.released:
			st.stopPumpLocked()
			c.mu.Unlock()
			r.directionDone()
			return
		case st.readableLocked():
			n, err := st.writeBufferedLocked(r.peer)
			if n > 0 {
				r.toPeer.Add(n)
				r.touch()
			}
			if err != nil {
				c.mu.Lock()
				st.stopPumpLocked()
				c.mu.Unlock()
				r.abort(err)
				r.directionDone()
				return
			}
		case st.recvEOF:
			st.stopPumpLocked()
			c.mu.Unlock()
			if cw, ok := r.peer.(interface{ CloseWrite() error }); ok {
				if err := cw.CloseWrite(); err != nil && !errors.Is(err, net.ErrClosed) {
					r.abort(err)
				}
			}
			r.directionDone()
			return
		case st.err != nil:
			err := st.err
			st.stopPumpLocked()
			c.mu.Unlock()
			r.abort(err)
			r.directionDone()
			return
		default:
			// Nothing to write: the next arrival starts the pump again.
			st.pumping = false
			c.mu.Unlock()
			return
		}
	}
}
