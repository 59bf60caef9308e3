package hbone

import (
	"context"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
)

// stream is one tunnel: an HTTP/2 stream after a 200 answer to CONNECT,
// exposed as a net.Conn. CloseWrite ends our direction (END_STREAM) while
// the other keeps flowing; Read returns io.EOF when the peer ended its own.
// Close resets the stream unless both directions ended normally.
type stream struct {
	c  *h2conn
	id uint32

	// The fields are ordered so that the small ones share words: the
	// struct is allocated for every tunnel and stays for its life (issue
	// 36: memory per idle connection).

	// Guarded by c.mu.
	recvWindow  int32 // what the peer may still send
	recvUnacked int32 // read but not yet returned with WINDOW_UPDATE
	// Client role: the response's status (0 until the final one arrived).
	status      int32
	recvEOF     bool // the peer sent END_STREAM
	sentEOF     bool // we sent END_STREAM
	waitingConn bool // in c.sendWaiters
	rstSent     bool // we sent RST_STREAM (server: later frames are ignored)
	released    bool // Close was called
	pumping     bool
	respClosed  bool

	behindQueued atomic.Bool // bw is queued

	recv       recvQueue
	sendWindow int64
	err        error // reset, or the connection failed
	// expectBody is what the request's content-length still promises (-1:
	// none; server role, requests other than CONNECT).
	expectBody int64
	// pump, when set (Relay), writes received data out in place of a
	// blocked reader: wakeReaderLocked starts its drain on a goroutine of
	// its own (pumping until it finds nothing to do), unless its writeNow
	// wrote everything at once.
	pump *relay
	// rsig and wsig wake a blocked reader and writer; each is made by the
	// first one that waits (signalLocked), so that an idle relayed tunnel,
	// whose reader is the pump and whose writer rarely waits for window,
	// holds neither (issue 36: memory per idle connection).
	rsig chan struct{}
	wsig chan struct{}

	// Client role: the response. resp is closed when the final response
	// headers arrived (status != 0) or the stream failed first, and
	// dropped once openStream has read the answer.
	resp   chan struct{}
	reason string

	// Server role: the state of its context (streamContext), made when
	// first used.
	ctx *ctxState

	// peerDone (made on first use) ends once a Read would not block.
	peerDone *peerDoneCtx

	// dl holds the read and write deadlines, made by the first
	// SetDeadline (most tunnels never set one).
	dl  atomic.Pointer[deadlines]
	rmu sync.Mutex // one reader at a time
	wmu sync.Mutex // one writer at a time
	dw  dataWrite  // that writer's frame in the connection's queue
	// bw is the stream's one frame sent behind its writer's back, queued
	// while behindQueued (the flush clears it).
	bw dataWrite
}

var (
	_ net.Conn      = (*stream)(nil)
	_ io.WriterTo   = (*stream)(nil)
	_ io.ReaderFrom = (*stream)(nil)
)

// failLocked records why the stream cannot go on and wakes its waiters.
// Unread data is dropped unless the peer already ended its direction.
func (st *stream) failLocked(err error) {
	if st.err == nil {
		st.err = err
	}
	if !st.recvEOF {
		st.c.returnConnWindowLocked(st.recv.release())
	}
	st.endedLocked()
}

// endedLocked wakes whatever waits on a stream that cannot go on (failed
// or released): the response's waiter, the reader, the writer, the
// stream's context and PeerDone's watchers.
func (st *stream) endedLocked() {
	st.closeRespLocked()
	st.wakeReaderLocked()
	notify(st.wsig)
	st.endCtxLocked()
	st.checkPeerDoneLocked()
}

// wakeReaderLocked tells the reader that data, the end of the stream or a
// failure arrived: a blocked Read, or the pump.
func (st *stream) wakeReaderLocked() {
	notify(st.rsig)
	if r := st.pump; r != nil && !st.pumping {
		if r.writeNow() {
			return
		}
		st.pumping = true
		go r.drain()
	}
}

// stopPumpLocked is the pump's last act: nothing wakes it again.
func (st *stream) stopPumpLocked() {
	st.pump, st.pumping = nil, false
}

// signalLocked returns *sig, making it first: the channel a reader (rsig)
// or writer (wsig) about to wait receives its wake-up on.
func signalLocked(sig *chan struct{}) chan struct{} {
	if *sig == nil {
		*sig = make(chan struct{}, 1)
	}
	return *sig
}

// deadlines are a stream's read and write deadlines.
type deadlines struct{ r, w deadline }

// rdl and wdl are the stream's deadlines; nil (none) until one is set.
func (st *stream) rdl() *deadline {
	if d := st.dl.Load(); d != nil {
		return &d.r
	}
	return nil
}

func (st *stream) wdl() *deadline {
	if d := st.dl.Load(); d != nil {
		return &d.w
	}
	return nil
}

// deadlines returns the stream's deadlines, making them first.
func (st *stream) deadlines() *deadlines {
	if d := st.dl.Load(); d != nil {
		return d
	}
	st.dl.CompareAndSwap(nil, new(deadlines))
	return st.dl.Load()
}

// PeerDone returns a context that ends once reading the tunnel would no
// longer block: the peer ended its direction and everything it sent has
// been read, or the stream failed or was closed. A server learns from it
// that its client went away without keeping a read pending.
func (st *stream) PeerDone() context.Context {
	st.c.mu.Lock()
	defer st.c.mu.Unlock()
	if st.peerDone == nil {
		pd := new(peerDoneCtx)
		pd.ctx, pd.end = context.WithCancel(context.Background())
		st.peerDone = pd
		st.checkPeerDoneLocked()
	}
	return st.peerDone.ctx
}

// peerDoneCtx is PeerDone's context and what ends it.
type peerDoneCtx struct {
	ctx context.Context
	end context.CancelFunc
}

// checkPeerDoneLocked ends PeerDone's context when a Read would return at
// once with io.EOF or an error.
func (st *stream) checkPeerDoneLocked() {
	if st.peerDone != nil && (st.released || st.err != nil || (st.recvEOF && st.recv.size == 0)) {
		st.peerDone.end()
	}
}

// Readable reports, without blocking, whether a Read would return at once:
// the peer sent bytes not read yet or ended its direction, or the stream
// failed or was closed. A client keeping an idle tunnel for reuse learns
// from it that the peer sent something while nothing was asked (pkg/l7
// then discards the tunnel rather than read those bytes as an answer).
func (st *stream) Readable() bool {
	st.c.mu.Lock()
	defer st.c.mu.Unlock()
	return st.recv.size > 0 || st.recvEOF || st.err != nil || st.released
}

func (st *stream) closeRespLocked() {
	if st.resp != nil && !st.respClosed {
		st.respClosed = true
		close(st.resp)
	}
}

// returnWindowLocked credits n bytes to the stream's receive window,
// sending WINDOW_UPDATE once a quarter of the window is outstanding.
func (st *stream) returnWindowLocked(n int) {
	if st.recvEOF || st.err != nil {
		return
	}
	st.recvUnacked += int32(n)
	if st.recvUnacked >= st.c.cfg.streamWindow/4 {
		st.c.queueLocked(ctrlFrame{kind: ctrlWindowUpdate, stream: st.id, n: uint32(st.recvUnacked)})
		st.recvWindow += st.recvUnacked
		st.recvUnacked = 0
	}
}

func (st *stream) consumedLocked(n int) {
	st.c.returnConnWindowLocked(n)
	st.returnWindowLocked(n)
}

// readableLocked reports whether buffered data may be handed out: always,
// unless the stream failed before the peer finished sending.
func (st *stream) readableLocked() bool {
	return st.recv.size > 0 && (st.err == nil || st.recvEOF)
}

// lockReadable blocks until there is data to read and returns with c.mu
// held, or returns the error Read should report (deadline, closed, reset,
// io.EOF) without the lock.
func (st *stream) lockReadable() error {
	c := st.c
	for {
		if st.rdl().exceeded() {
			return os.ErrDeadlineExceeded
		}
		c.mu.Lock()
		switch {
		case st.released:
			c.mu.Unlock()
			return net.ErrClosed
		case st.readableLocked():
			return nil
		case st.recvEOF:
			// The peer finished its direction; a later failure does not
			// change that.
			c.mu.Unlock()
			return io.EOF
		case st.err != nil:
			err := st.err
			c.mu.Unlock()
			return err
		}
		sig := signalLocked(&st.rsig)
		c.mu.Unlock()
		awaitSignal(sig, st.rdl().wait())
	}
}

// awaitSignal waits for sig or for the deadline channel dl to close; a
// plain receive when there is no deadline (nil dl), which costs the
// scheduler less than a select.
func awaitSignal(sig <-chan struct{}, dl <-chan struct{}) {
	if dl == nil {
		<-sig
		return
	}
	select {
	case <-sig:
	case <-dl:
	}
}

// Read reads what the peer sent; io.EOF once it sent END_STREAM.
func (st *stream) Read(p []byte) (int, error) {
	st.rmu.Lock()
	defer st.rmu.Unlock()
	if err := st.lockReadable(); err != nil {
		return 0, err
	}
	defer st.c.mu.Unlock()
	n := st.recv.read(p)
	st.consumedLocked(n)
	st.checkPeerDoneLocked()
	return n, nil
}

// WriteTo writes everything the peer sends to w (writev on TCP, straight
// from the receive buffers) until the peer ends its direction.
func (st *stream) WriteTo(w io.Writer) (int64, error) {
	st.rmu.Lock()
	defer st.rmu.Unlock()
	var total int64
	for {
		if err := st.lockReadable(); err != nil {
			if err == io.EOF {
				return total, nil
			}
			return total, err
		}
		n, err := st.writeBufferedLocked(w)
		total += n
		if err != nil {
			return total, err
		}
	}
}

// writeBufferedLocked writes what the stream has buffered to w straight
// from the receive chunks (writev on TCP) and consumes what was written.
// It is called with c.mu held and returns with it released.
func (st *stream) writeBufferedLocked(w io.Writer) (int64, error) {
	c := st.c
	bufs := st.recv.peek(make(net.Buffers, 0, len(st.recv.chunks)))
	st.recv.reading = true
	c.mu.Unlock()
	n, err := bufs.WriteTo(w)
	c.mu.Lock()
	st.recv.reading = false
	if !st.recv.dead {
		// (A released queue already returned these bytes' window.)
		st.recv.consume(int(n))
		st.consumedLocked(int(n))
		st.checkPeerDoneLocked()
	}
	c.mu.Unlock()
	return n, err
}

// awaitSend reserves flow control for up to max bytes, waiting for window.
// Frames carry at most framePayload bytes, less than any peer's largest.
func (st *stream) awaitSend(max int) (int, error) {
	c := st.c
	for {
		if st.wdl().exceeded() {
			return 0, os.ErrDeadlineExceeded
		}
		c.mu.Lock()
		switch {
		case st.released:
			c.mu.Unlock()
			return 0, net.ErrClosed
		case st.err != nil:
			err := st.err
			c.mu.Unlock()
			return 0, err
		case st.sentEOF:
			c.mu.Unlock()
			return 0, errClosedWrite
		}
		if st.sendWindow > 0 && c.sendWindow > 0 {
			n := int64(max)
			n = min(n, st.sendWindow, c.sendWindow)
			st.sendWindow -= n
			c.sendWindow -= n
			c.mu.Unlock()
			return int(n), nil
		}
		if c.sendWindow <= 0 && !st.waitingConn {
			st.waitingConn = true
			c.sendWaiters = append(c.sendWaiters, st)
		}
		sig := signalLocked(&st.wsig)
		c.mu.Unlock()
		awaitSignal(sig, st.wdl().wait())
	}
}

// waiting returns the stream's frame for a writer that waits for its flush
// (st.wmu held).
func (st *stream) waiting(head []byte, end bool) *dataWrite {
	w := &st.dw
	w.st, w.head, w.end, w.err, w.frames = st, head, end, nil, 0
	return w
}

// Write sends p as DATA frames, waiting for flow control as needed. A
// write that fits one small frame returns once the frame is queued, as a
// socket's does once its data is in the send buffer (writeData); Close and
// CloseWrite still deliver it first.
func (st *stream) Write(p []byte) (int, error) {
	st.wmu.Lock()
	defer st.wmu.Unlock()
	written := 0
	for len(p) > 0 {
		if len(p) > framePayload {
			// Several frames: they share a flush.
			n, err := st.sendFrames(p)
			written += n
			if err != nil {
				return written, err
			}
			p = p[n:]
			continue
		}
		n, err := st.awaitSend(len(p))
		if err != nil {
			return written, err
		}
		// One frame, copied behind its header into a pooled buffer.
		buf := smallFramePool.Get().(*[]byte)
		copy((*buf)[frameHeaderLen:], p[:n])
		head := (*buf)[:frameHeaderLen+n]
		if !st.behindQueued.Load() {
			// The whole frame is in buf: it need not be waited for. One such
			// frame per stream at a time bounds what a fast writer queues.
			st.behindQueued.Store(true)
			w := &st.bw
			w.st, w.head, w.end, w.err, w.behind, w.buf = st, head, false, nil, true, buf
			err = st.c.writeData(w)
		} else {
			err = st.c.writeData(st.waiting(head, false))
			smallFramePool.Put(buf)
		}
		if err != nil {
			return written, err
		}
		written += n
		p = p[n:]
	}
	return written, nil
}

// framePayload is the most payload a DATA frame carries: 9 bytes less than
// the protocol's initial (and smallest allowed) 16 KiB frame, so that a
// full frame and its header fill one TLS record (16 KiB of plaintext)
// exactly. A 16 KiB payload went out as a full record and one of 9 bytes:
// twice the records to seal, read and open (issue 36).
const framePayload = tlsRecordPayload - frameHeaderLen

// framesPerFlush is how many frames of framePayload one copy buffer holds.
const framesPerFlush = (frameHeaderLen + copyBufSize) / tlsRecordPayload

// sendFrames sends up to framesPerFlush frames of p, as much as flow
// control allows, and returns how much it sent. The frames are copied,
// each behind its header, into one pooled buffer that one flush writes
// (one syscall, a TLS record per frame): sending them one by one, each
// waiting for its flush, cost a write syscall per 16 KiB (issue 36: bulk
// throughput). st.wmu held.
func (st *stream) sendFrames(p []byte) (int, error) {
	n, err := st.awaitSend(min(len(p), framesPerFlush*framePayload))
	if err != nil {
		return 0, err
	}
	buf := copyBufPool.Get().(*[]byte)
	b, frames := (*buf)[:0], 0
	for rest := p[:n]; len(rest) > 0; frames++ {
		m := min(len(rest), framePayload)
		b = b[:len(b)+frameHeaderLen]
		putFrameHeader(b[len(b)-frameHeaderLen:], m, http2.FrameData, 0, st.id)
		b = append(b, rest[:m]...)
		rest = rest[m:]
	}
	w := st.waiting(b, false)
	w.frames = int32(frames)
	err = st.c.writeData(w)
	copyBufPool.Put(buf)
	if err != nil {
		return 0, err
	}
	return n, nil
}

// frameSlots returns the payload slots of a copy buffer b: the payload of
// full frames, each behind room for its header, so that frames fill whole
// TLS records. A read into them (readv) leaves the payload where sending
// it as frames needs it: no copy into a second buffer (sendFrames's),
// which was 4 % of the CPU of a bulk tunnel (issue 36).
func frameSlots(b []byte, into *[framesPerFlush][]byte) [][]byte {
	for i := range into {
		into[i] = b[i*tlsRecordPayload+frameHeaderLen : (i+1)*tlsRecordPayload]
	}
	return into[:]
}

// sendSlotted sends the n payload bytes read into buf's frame slots
// (frameSlots; a payload of at most one slot is where sendFramed expects
// it too), as many frames per flush as flow control allows, each frame's
// header written into the room in front of its payload. When flow control
// cuts a frame short, the next one's header goes over the last 9 bytes
// already sent. st.wmu held.
func (st *stream) sendSlotted(buf []byte, n int) error {
	pos := frameHeaderLen // the first byte not sent
	for sent := 0; sent < n; {
		m, err := st.awaitSend(n - sent)
		if err != nil {
			return err
		}
		start, frames := -1, 0
		for left := m; left > 0; frames++ {
			if pos%tlsRecordPayload == 0 {
				pos += frameHeaderLen // at a slot's start: its payload follows the room
			}
			if start < 0 {
				start = pos - frameHeaderLen
			}
			slotEnd := (pos/tlsRecordPayload + 1) * tlsRecordPayload
			k := min(slotEnd-pos, left)
			putFrameHeader(buf[pos-frameHeaderLen:pos], k, http2.FrameData, 0, st.id)
			pos += k
			left -= k
		}
		w := st.waiting(buf[start:pos], false)
		w.frames = int32(frames)
		if err := st.c.writeData(w); err != nil {
			return err
		}
		sent += m
	}
	return nil
}

// sendFramed sends the n payload bytes at buf[frameHeaderLen:]: one frame
// with its header written in place in front of the payload, or several
// (sendFrames).
func (st *stream) sendFramed(buf []byte, n int) error {
	off, end := frameHeaderLen, frameHeaderLen+n
	for end-off > framePayload {
		m, err := st.sendFrames(buf[off:end])
		if err != nil {
			return err
		}
		off += m
	}
	for off < end {
		m, err := st.awaitSend(end - off)
		if err != nil {
			return err
		}
		if err := st.c.writeData(st.waiting(buf[off-frameHeaderLen:off+m], false)); err != nil {
			return err
		}
		off += m
	}
	return nil
}

// ReadFrom sends everything read from r until r returns io.EOF. A TCP
// source is read only once it is readable, so an idle tunnel holds no
// buffer.
func (st *stream) ReadFrom(r io.Reader) (int64, error) {
	st.wmu.Lock()
	defer st.wmu.Unlock()
	read, slotted := readerFor(r)
	send := st.sendFramed
	if slotted {
		send = st.sendSlotted
	}
	var total int64
	for {
		buf, n, err := read()
		if n > 0 {
			if werr := send(*buf, n); werr != nil {
				copyBufPool.Put(buf)
				return total, werr
			}
			total += int64(n)
		}
		if buf != nil {
			copyBufPool.Put(buf)
		}
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// readerFor returns a function that reads the next piece of r into a pooled
// copy buffer (payload after frameHeaderLen).
func readerFor(r io.Reader) (read func() (*[]byte, int, error), slotted bool) {
	if read := rawSocketReader(r); read != nil {
		return read, true
	}
	return func() (*[]byte, int, error) {
		buf := copyBufPool.Get().(*[]byte)
		n, err := r.Read((*buf)[frameHeaderLen:])
		return buf, n, err
	}, false
}

// CloseWrite ends our direction of the tunnel (END_STREAM); reading goes on.
func (st *stream) CloseWrite() error {
	st.wmu.Lock()
	defer st.wmu.Unlock()
	c := st.c
	c.mu.Lock()
	switch {
	case st.released:
		c.mu.Unlock()
		return net.ErrClosed
	case st.sentEOF:
		c.mu.Unlock()
		return nil
	case st.err != nil:
		err := st.err
		c.mu.Unlock()
		return err
	}
	c.mu.Unlock()
	var frame [frameHeaderLen]byte
	return c.writeData(st.waiting(frame[:], true))
}

// Close releases the tunnel like closing a TCP socket: what was written is
// still delivered, followed by END_STREAM; if the peer has not finished
// sending, the stream is then reset (CANCEL; NO_ERROR from a server). Use
// abort to reset without ending the stream cleanly.
func (st *stream) Close() error {
	c := st.c
	c.mu.Lock()
	open := !st.released && st.err == nil && !st.sentEOF
	c.mu.Unlock()
	if open {
		_ = st.CloseWrite() // on failure the stream is reset below
	}
	return st.release()
}

// abort resets the stream (CANCEL) without ending it cleanly, so the peer
// sees a failure rather than an end of data.
func (st *stream) abort() error {
	c := st.c
	c.mu.Lock()
	if !st.released && st.err == nil && !(st.sentEOF && st.recvEOF) {
		c.resetLocked(st, http2.ErrCodeCancel)
	}
	c.mu.Unlock()
	return st.release()
}

// release frees the stream, resetting it if either direction is still open.
func (st *stream) release() error {
	c := st.c
	c.mu.Lock()
	if st.released {
		c.mu.Unlock()
		return nil
	}
	if st.err == nil && !(st.sentEOF && st.recvEOF) {
		code := http2.ErrCodeCancel
		if !c.isClient && st.sentEOF {
			code = http2.ErrCodeNo
		}
		c.resetLocked(st, code)
	}
	st.released = true
	c.returnConnWindowLocked(st.recv.release())
	st.endedLocked()
	c.removeLocked(st)
	c.mu.Unlock()
	if d := st.dl.Load(); d != nil {
		d.r.set(time.Time{})
		d.w.set(time.Time{})
	}
	return nil
}

func (st *stream) LocalAddr() net.Addr  { return st.c.nc.LocalAddr() }
func (st *stream) RemoteAddr() net.Addr { return st.c.nc.RemoteAddr() }

func (st *stream) SetDeadline(t time.Time) error {
	st.SetReadDeadline(t)
	return st.SetWriteDeadline(t)
}

// SetReadDeadline interrupts a blocked Read when t passes; the tunnel stays
// usable with a later deadline.
func (st *stream) SetReadDeadline(t time.Time) error {
	if t.IsZero() && st.dl.Load() == nil {
		return nil // none set, none to clear (net/http clears often)
	}
	st.deadlines().r.set(t)
	st.c.mu.Lock()
	notify(st.rsig)
	st.c.mu.Unlock()
	return nil
}

// SetWriteDeadline interrupts a Write waiting for flow control when t
// passes; the tunnel stays usable with a later deadline.
func (st *stream) SetWriteDeadline(t time.Time) error {
	if t.IsZero() && st.dl.Load() == nil {
		return nil
	}
	st.deadlines().w.set(t)
	st.c.mu.Lock()
	notify(st.wsig)
	st.c.mu.Unlock()
	return nil
}
