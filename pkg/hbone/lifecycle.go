package hbone

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"time"

	"go.uber.org/zap"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// The connection's life after start: keepalive PINGs and their answers,
// idling out, GOAWAY both ways, failing and closing; and the streams it
// opens (reserving room under the peer's limit) and retires.

// failRead ends the connection after the read loop stopped with err,
// telling the peer why when it broke the protocol.
func (c *h2conn) failRead(err error) {
	var (
		ce    *connectionError
		xce   http2.ConnectionError
		code  http2.ErrCode
		send  bool
		debug string
	)
	switch {
	case errors.As(err, &ce):
		code, send, debug = ce.code, true, ce.reason
	case errors.As(err, &xce):
		code, send = http2.ErrCode(xce), true
		if d := c.fr.ErrorDetail(); d != nil {
			err = fmt.Errorf("%w: %v", err, d)
			debug = d.Error()
		}
	case errors.Is(err, http2.ErrFrameTooLarge):
		code, send, debug = http2.ErrCodeFrameSize, true, "frame too large"
	}
	if send && debug == "" {
		debug = err.Error()
	}
	if send {
		// Cut short any write in progress, then say GOAWAY.
		c.nc.SetWriteDeadline(time.Now().Add(errorWriteTimeout))
		c.wmu.Lock()
		c.mu.Lock()
		last := c.maxPeerStream
		c.mu.Unlock()
		c.wbuf.Reset()
		c.nc.SetWriteDeadline(time.Now().Add(errorWriteTimeout))
		// The reason goes along as debug data: it helps whoever debugs the peer.
		if c.fr.WriteGoAway(last, code, []byte(sanitizeReason(debug))) == nil {
			c.nc.Write(c.wbuf.Bytes())
		}
		c.wbuf.Reset()
		c.wmu.Unlock()
	}
	if err == nil || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
		c.close(nil)
		return
	}
	c.close(err)
}

// close ends the connection now: every stream fails, the socket closes.
func (c *h2conn) close(err error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	if err == nil {
		err = errConnClosed
	} else {
		err = fmt.Errorf("%w: %w", errConnClosed, err)
	}
	c.closeErr = err
	for _, st := range c.streams {
		st.failLocked(err)
	}
	if c.keepalive != nil {
		c.keepalive.Stop()
	}
	if c.idleTimer != nil {
		c.idleTimer.Stop()
	}
	c.mu.Unlock()
	c.nc.Close()
	close(c.done)
	c.cancel()
	c.markUnusable()
}

func (c *h2conn) markUnusable() {
	c.mu.Lock()
	if c.unusableCalled {
		c.mu.Unlock()
		return
	}
	c.unusableCalled = true
	f := c.onUnusable
	c.mu.Unlock()
	if f != nil {
		f()
	}
}

// shutdown starts a graceful close: GOAWAY, no new streams, close once the
// last stream ends.
func (c *h2conn) shutdown() {
	c.mu.Lock()
	if c.closed || c.draining {
		c.mu.Unlock()
		return
	}
	c.draining = true
	c.goAwaySent = true
	c.queueLocked(ctrlFrame{kind: ctrlGoAway, n: c.maxPeerStream, code: http2.ErrCodeNo})
	c.maybeFinishLocked()
	c.mu.Unlock()
	c.markUnusable()
}

// maybeFinishLocked closes a draining connection whose last stream ended.
func (c *h2conn) maybeFinishLocked() {
	if c.draining && !c.finishing && len(c.streams) == 0 && c.reserved == 0 {
		c.finishing = true
		c.signalWriterLocked()
	}
}

func (c *h2conn) processPing(f *http2.PingFrame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f.IsAck() {
		if c.pingOutstanding && f.Data == c.pingData {
			c.pingOutstanding = false
		}
		return nil
	}
	c.queueLocked(ctrlFrame{kind: ctrlPingAck, data: f.Data})
	return nil
}

func (c *h2conn) processGoAway(f *http2.GoAwayFrame) error {
	c.mu.Lock()
	if f.ErrCode != http2.ErrCodeNo {
		c.log.Debug("peer sent GOAWAY", zap.String("code", f.ErrCode.String()),
			zap.ByteString("debug", f.DebugData()))
	}
	c.draining = true
	if c.isClient {
		for id, st := range c.streams {
			if id > f.LastStreamID {
				st.failLocked(&refusedError{reason: "GOAWAY before the stream was processed"})
			}
		}
	}
	c.maybeFinishLocked()
	c.mu.Unlock()
	c.markUnusable()
	return nil
}

// onKeepalive runs when nothing was read for readIdleTimeout: it sends a
// PING, and closes the connection if the previous one went unanswered for
// pingTimeout. A dead peer (or one stuck mid header block) is found this way.
func (c *h2conn) onKeepalive() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	if c.pingOutstanding {
		c.mu.Unlock()
		c.log.Debug("closing connection: PING not answered", zap.Stringer("remote", c.nc.RemoteAddr()),
			zap.Duration("timeout", c.cfg.pingTimeout))
		c.close(errors.New("PING not answered"))
		return
	}
	defer c.mu.Unlock()
	idle := time.Since(time.Unix(0, c.lastRead.Load()))
	if idle < c.cfg.readIdleTimeout {
		c.keepalive.Reset(c.cfg.readIdleTimeout - idle)
		return
	}
	rand.Read(c.pingData[:])
	c.pingOutstanding = true
	c.queueLocked(ctrlFrame{kind: ctrlPing, data: c.pingData})
	c.keepalive.Reset(c.cfg.pingTimeout)
}

// armIdleLocked starts the idle timer when no stream is open or promised.
func (c *h2conn) armIdleLocked() {
	if c.cfg.idleTimeout <= 0 || c.closed || len(c.streams) > 0 || c.reserved > 0 {
		return
	}
	c.idleGen++
	gen := c.idleGen
	if c.idleTimer != nil {
		c.idleTimer.Stop()
	}
	c.idleTimer = time.AfterFunc(c.cfg.idleTimeout, func() { c.onIdle(gen) })
}

// busyLocked stops the idle timer: a stream is open or promised.
func (c *h2conn) busyLocked() {
	c.idleGen++
	if c.idleTimer != nil {
		c.idleTimer.Stop()
	}
}

func (c *h2conn) onIdle(gen uint64) {
	c.mu.Lock()
	idle := gen == c.idleGen && !c.closed && len(c.streams) == 0 && c.reserved == 0
	c.mu.Unlock()
	if idle {
		c.log.Debug("closing idle connection", zap.Stringer("remote", c.nc.RemoteAddr()))
		c.shutdown()
	}
}

// usableLocked reports whether a client connection may open streams.
func (c *h2conn) usableLocked() bool {
	return !c.closed && !c.draining && c.nextStream < math.MaxInt32
}

// tryReserve promises one stream to a caller if the connection is usable and
// below both limit and the server's SETTINGS_MAX_CONCURRENT_STREAMS.
func (c *h2conn) tryReserve(limit int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.usableLocked() {
		return false
	}
	if uint64(limit) > uint64(c.peerMaxStreams) {
		limit = int(c.peerMaxStreams)
	}
	if len(c.streams)+c.reserved >= limit {
		return false
	}
	c.reserved++
	c.busyLocked()
	return true
}

func (c *h2conn) unreserve() {
	c.mu.Lock()
	c.reserved--
	c.armIdleLocked()
	c.maybeFinishLocked()
	c.mu.Unlock()
}

// openStream sends a request on a reserved slot and waits for the response
// headers. It returns the stream, or the response status when it is not 200.
func (c *h2conn) openStream(ctx context.Context, fields []hpack.HeaderField) (*stream, int, string, error) {
	c.wmu.Lock()
	c.mu.Lock()
	c.reserved--
	if !c.usableLocked() {
		err := c.closeErr
		if err == nil {
			err = errConnUnusable
		}
		if c.nextStream >= math.MaxInt32 {
			err = errStreamIDsExhausted
		}
		c.armIdleLocked()
		c.maybeFinishLocked()
		c.mu.Unlock()
		c.wmu.Unlock()
		return nil, 0, "", &refusedError{reason: err.Error()}
	}
	id := c.nextStream
	c.nextStream += 2
	st := c.newStreamLocked(id)
	st.resp = make(chan struct{})
	c.mu.Unlock()
	err := c.writeHeadersLocked(id, fields, false)
	c.wmu.Unlock()
	if err != nil {
		st.Close()
		return nil, 0, "", err
	}
	select {
	case <-st.resp:
	case <-ctx.Done():
		st.Close()
		return nil, 0, "", ctx.Err()
	}
	c.mu.Lock()
	status, reason, err := int(st.status), st.reason, st.err
	st.resp = nil // closed and read: a tunnel open for hours need not keep it
	c.mu.Unlock()
	if status == 0 {
		st.Close()
		if err == nil {
			err = errConnClosed
		}
		return nil, 0, "", err
	}
	if status != 200 {
		st.Close()
		return nil, status, reason, nil
	}
	return st, 200, "", nil
}

// newStreamLocked registers a stream in the open state.
func (c *h2conn) newStreamLocked(id uint32) *stream {
	st := &stream{
		c:          c,
		id:         id,
		expectBody: -1,
		sendWindow: int64(c.peerInitialWindow),
		recvWindow: c.cfg.streamWindow,
	}
	c.streams[id] = st
	c.busyLocked()
	return st
}

// removeLocked forgets a released stream.
func (c *h2conn) removeLocked(st *stream) {
	if c.streams[st.id] == st {
		delete(c.streams, st.id)
		if !c.isClient {
			c.recent.add(st.id, st.rstSent)
		}
	}
	c.armIdleLocked()
	c.maybeFinishLocked()
}

// recentClosed remembers the last streams that closed on a server
// connection, for lateFrameLocked: which of them we reset, and which the
// peer ended or reset. Older streams count as closed by the peer, which
// RFC 9113 §5.1 allows once a while has passed.
type recentClosed struct {
	ids  [closedMemory]uint32 // id<<1, | 1 when we reset the stream
	next int
}

// closedMemory covers the streams closing during a round trip at a few
// thousand closes a second.
const closedMemory = 128

func (r *recentClosed) add(id uint32, resetByUs bool) {
	v := id << 1
	if resetByUs {
		v |= 1
	}
	r.ids[r.next] = v
	r.next = (r.next + 1) % closedMemory
}

// lookup reports whether id is remembered, and then whether we reset it.
func (r *recentClosed) lookup(id uint32) (known, resetByUs bool) {
	for i := 1; i <= closedMemory; i++ {
		if v := r.ids[(r.next-i+closedMemory)%closedMemory]; v>>1 == id {
			return true, v&1 == 1
		}
	}
	return false, false
}
