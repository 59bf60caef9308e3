package hbone

import (
	"golang.org/x/net/http2"
)

// Connection-level flow control (RFC 9113 section 5.2): the peer's
// WINDOW_UPDATEs open the send windows and wake the senders waiting on
// them; what the streams read is returned to the peer in batches. Each
// stream's own windows are in stream.go.

func (c *h2conn) processWindowUpdate(f *http2.WindowUpdateFrame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f.StreamID == 0 {
		c.sendWindow += int64(f.Increment)
		if c.sendWindow > maxWindowSize {
			return connError(http2.ErrCodeFlowControl, "connection window overflow")
		}
		c.wakeSendersLocked()
		return nil
	}
	st := c.streams[f.StreamID]
	if st == nil {
		if c.idleStreamLocked(f.StreamID) {
			return connError(http2.ErrCodeProtocol, "WINDOW_UPDATE on idle stream")
		}
		return nil
	}
	st.sendWindow += int64(f.Increment)
	if st.sendWindow > maxWindowSize {
		c.resetLocked(st, http2.ErrCodeFlowControl)
		return nil
	}
	notify(st.wsig)
	return nil
}

func (c *h2conn) wakeSendersLocked() {
	for i, st := range c.sendWaiters {
		st.waitingConn = false
		notify(st.wsig)
		c.sendWaiters[i] = nil
	}
	c.sendWaiters = c.sendWaiters[:0]
}

// returnConnWindowLocked credits n consumed (or discarded) bytes to the
// connection window, sending WINDOW_UPDATE once a quarter is outstanding.
func (c *h2conn) returnConnWindowLocked(n int) {
	c.recvUnacked += int32(n)
	if c.recvUnacked >= c.cfg.connWindow/4 {
		c.queueLocked(ctrlFrame{kind: ctrlWindowUpdate, n: uint32(c.recvUnacked)})
		c.recvWindow += c.recvUnacked
		c.recvUnacked = 0
	}
}
