package hbone

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// The connection's writer. The read loop never writes: it queues control
// frames (queueLocked) for the writer goroutine (writeLoop). A stream's
// DATA frame is written by its sender (writeData), which group-commits the
// frames queued behind it, taking the lead for a few rounds before the
// writer goroutine takes over (flushQueue, writeBatchLocked).

type ctrlKind uint8

const (
	ctrlSettingsAck ctrlKind = iota
	ctrlPing
	ctrlPingAck
	ctrlWindowUpdate
	ctrlRST
	ctrlGoAway
)

// ctrlFrame is a queued control frame, written by the writer goroutine so
// that the read loop never blocks on a write (two peers blocked writing to
// each other while neither reads would deadlock).
type ctrlFrame struct {
	kind   ctrlKind
	stream uint32
	n      uint32 // window increment, or last stream ID for GOAWAY
	code   http2.ErrCode
	data   [8]byte
}

func (c *h2conn) queueLocked(f ctrlFrame) {
	if c.closed {
		return
	}
	if len(c.ctrl) >= maxQueuedCtrl {
		c.ctrlOverflow.Store(true) // the read loop ends the connection
		return
	}
	c.ctrl = append(c.ctrl, f)
	c.signalWriterLocked()
}

func (c *h2conn) signalWriterLocked() {
	select {
	case c.ctrlSig <- struct{}{}:
	default:
	}
}

func (c *h2conn) writeLoop() {
	defer close(c.writerDone)
	// However the loop ends, a lead handed to it is taken: the flush fails,
	// answering its waiting writers.
	defer c.takeLead(0, true)
	for {
		select {
		case <-c.ctrlSig:
		case <-c.done:
			return
		}
		c.takeLead(maxLeadRounds, false)
		c.wmu.Lock()
		err := c.appendCtrlLocked()
		if err == nil {
			err = c.flushWbufLocked()
		}
		c.mu.Lock()
		finish := c.finishing && !c.finishSent
		c.finishSent = c.finishSent || finish
		c.mu.Unlock()
		if finish && err == nil {
			// close_notify: the peer reads EOF and closes; if it does not,
			// close after the grace period.
			if tc, ok := c.nc.(*tls.Conn); ok {
				tc.CloseWrite()
			}
			time.AfterFunc(goAwayGrace, func() { c.close(nil) })
		}
		c.wmu.Unlock()
		if err != nil {
			return
		}
	}
}

// takeLead flushes the queue if a writer handed the lead to the writer
// goroutine; last: the goroutine is ending and takes no lead after this.
func (c *h2conn) takeLead(rounds int, last bool) {
	c.qmu.Lock()
	lead := c.writerLeads
	c.writerLeads = false
	c.writerGone = c.writerGone || last
	c.qmu.Unlock()
	if lead {
		c.flushQueue(nil, rounds)
	}
}

// appendCtrlLocked encodes the queued control frames into wbuf. wmu held.
func (c *h2conn) appendCtrlLocked() error {
	c.mu.Lock()
	q := c.ctrl
	c.ctrl = nil
	finished := c.finishSent
	c.mu.Unlock()
	if finished {
		return nil
	}
	for _, f := range q {
		var err error
		switch f.kind {
		case ctrlSettingsAck:
			err = c.fr.WriteSettingsAck()
		case ctrlPing:
			err = c.fr.WritePing(false, f.data)
		case ctrlPingAck:
			err = c.fr.WritePing(true, f.data)
		case ctrlWindowUpdate:
			err = c.fr.WriteWindowUpdate(f.stream, f.n)
		case ctrlRST:
			err = c.fr.WriteRSTStream(f.stream, f.code)
		case ctrlGoAway:
			err = c.fr.WriteGoAway(f.n, f.code, nil)
		}
		if err != nil {
			return fmt.Errorf("encoding control frame: %w", err)
		}
	}
	return nil
}

// flushWbufLocked writes wbuf to the socket. wmu held.
func (c *h2conn) flushWbufLocked() error {
	if c.wbuf.Len() == 0 {
		return nil
	}
	err := c.writeOut(c.wbuf.Bytes())
	c.wbuf.Reset()
	return err
}

// writeOut writes b to the socket, bounded by the write timeout; a failed
// write ends the connection. wmu held.
func (c *h2conn) writeOut(bs ...[]byte) error {
	if c.cfg.writeTimeout > 0 {
		c.nc.SetWriteDeadline(time.Now().Add(c.cfg.writeTimeout))
	}
	if c.batch != nil {
		c.batch.begin()
	}
	var err error
	for _, b := range bs {
		if len(b) > 0 {
			if _, err = c.nc.Write(b); err != nil {
				break
			}
		}
	}
	if c.batch != nil {
		if berr := c.batch.end(); err == nil {
			err = berr
		}
	}
	if err != nil {
		err = fmt.Errorf("write: %w", err)
		c.close(err)
		return err
	}
	return nil
}

// dataWrite is one DATA frame (or several, frames) handed to writeData.
type dataWrite struct {
	st   *stream
	head []byte
	err  error
	// done carries the flushing writer's answer, or errLead, to a writer
	// that queued behind a flush in progress; it is taken from donePool
	// for that wait only, so that an idle stream holds none (issue 36:
	// memory per idle connection).
	done chan error
	// behind: the writer did not wait; the frame owns buf (head's pooled
	// buffer), which the flush returns.
	buf *[]byte
	// frames: head holds this many whole frames, headers written
	// (sendFrames); 0: one frame whose header the flush writes.
	frames int32
	end    bool
	behind bool
}

// donePool holds dataWrite.done channels, empty.
var donePool = sync.Pool{New: func() any { return make(chan error, 1) }}

// errLead tells a waiting writer that it now flushes the queue.
var errLead = errors.New("hbone: flush the write queue")

// maxLeadRounds bounds the flushes one writer makes for others before the
// connection's writer goroutine takes over, so that its own stream is not
// held up behind a steady queue.
const maxLeadRounds = 4

// writeData sends one DATA frame: head starts with frameHeaderLen bytes of
// room for the frame header, followed by the payload (or head holds whole
// frames, w.frames). The caller reserved flow control for the payload.
//
// Writers of many streams share one socket, and a small frame costs a
// write syscall of its own. So writes group-commit: the first writer
// flushes every frame queued meanwhile (one TLS batch, one syscall) and
// answers their writers; while it is busy, new frames queue for the next
// flush. A waiting writer is not held for more than the flush in progress
// and its own.
//
// A frame marked behind is not waited for: it was copied into a buffer the
// frame owns, and the writer goes on as with a socket's send buffer (a
// failed flush fails the connection, so the stream's next operation says
// so). That saves the writer a park and a wake-up per frame, which under
// the waypoint benchmark is most of its frames (a response, then a read of
// the next request).
//
// A writer that finds no flush in progress yields once before it flushes
// while flushes carry frames of several writers (more than 1.25 a flush,
// averaged over the last eight or so): the goroutines
// already runnable (other streams' handlers under load) get to queue their
// frames into the same write, where they would otherwise find the socket
// idle and each pay a syscall. Under the waypoint benchmark this cut write
// syscalls from 1.66 to 0.35 per proxied request (and its CPU per request
// by a sixth); bulk transfer is unchanged (see bench/README.md). When
// writers come one at a time it does not yield: a yield also wakes an idle
// thread to look for work (the runtime's wakep), a futex wake and a
// context switch per frame for nothing, a sixth of the node proxies' CPU
// at 1000 requests/s spread evenly (issue 36).
//
// The yield lasts until every runnable goroutine has run, so a burst of
// requests would leave as one write only once the last of them is handled,
// and the peer would idle until then. The writer of the earlyFlushFrames-th
// behind frame queued meanwhile sends the queued behind frames at once
// (flushBehind), so that a burst leaves in parts while the rest is handled.
func (c *h2conn) writeData(w *dataWrite) error {
	c.qmu.Lock()
	lead := !c.flushing
	if !lead && !w.behind {
		w.done = donePool.Get().(chan error)
	}
	c.dq = append(c.dq, w)
	c.flushing = true
	yield := lead && c.batchAvg > yieldBatchAvg
	early := false
	if w.behind {
		c.dqBehind++
		early = !lead && c.dqBehind >= earlyFlushFrames
	}
	c.qmu.Unlock()
	if !lead {
		if w.behind {
			if early {
				c.flushBehind()
			}
			return nil
		}
		err := <-w.done
		donePool.Put(w.done) // empty: one answer was sent, and taken
		w.done = nil
		if err != errLead {
			return err
		}
	} else if yield {
		runtime.Gosched() // let runnable writers join this flush
	}
	return c.flushQueue(w, maxLeadRounds)
}

// yieldBatchAvg is the average batch (frames per flush, in sixteenths)
// above which a leading writer yields before it flushes (writeData).
const yieldBatchAvg = 20

// earlyFlushFrames is how many behind frames queued behind a yielding
// leader are sent without waiting for it (writeData).
const earlyFlushFrames = 8

// flushBehind sends the behind frames queued so far, unless a flush is
// writing: the leader's flush takes the rest. Frames of one stream keep
// their order, because a stream's frame queued after its behind frame is
// the stream's last (its writer waits for it).
func (c *h2conn) flushBehind() {
	if !c.wmu.TryLock() {
		return
	}
	defer c.wmu.Unlock()
	c.qmu.Lock()
	batch, keep := c.early[:0], c.dq[:0]
	for _, x := range c.dq {
		if x.behind {
			batch = append(batch, x)
		} else {
			keep = append(keep, x)
		}
	}
	clear(c.dq[len(keep):])
	c.dq, c.dqBehind = keep, 0
	c.qmu.Unlock()
	c.writeBatchLocked(batch)
	for i, x := range batch {
		x.recycle()
		batch[i] = nil
	}
	c.early = batch[:0]
}

// flushQueue sends the queue as the flushing writer until it is empty, and
// returns the error of mine's frame (mine may be nil). After rounds
// flushes (0: no limit) the lead passes to a waiting writer, or else to the
// writer goroutine while it runs.
func (c *h2conn) flushQueue(mine *dataWrite, rounds int) error {
	var err error
	for round := 1; ; round++ {
		c.wmu.Lock()
		c.qmu.Lock()
		batch := c.dq
		c.dq, c.dqBehind = c.dqUp[:0], 0
		c.batchAvg += (len(batch)<<4 - c.batchAvg) >> 3
		c.qmu.Unlock()
		c.writeBatchLocked(batch)
		c.wmu.Unlock()
		for i, x := range batch {
			if x == mine {
				err = x.err
			}
			switch {
			case x.behind:
				x.recycle()
			case x != mine:
				x.done <- x.err
			}
			batch[i] = nil
		}
		c.qmu.Lock()
		c.dqUp = batch[:0]
		if len(c.dq) == 0 {
			c.flushing = false
			c.qmu.Unlock()
			return err
		}
		if rounds == 0 || round < rounds || c.writerGone {
			c.qmu.Unlock()
			continue
		}
		var next *dataWrite
		for _, x := range c.dq {
			if !x.behind {
				next = x
				break
			}
		}
		if next == nil {
			c.writerLeads = true
		}
		c.qmu.Unlock()
		if next != nil {
			next.done <- errLead
		} else {
			c.mu.Lock()
			c.signalWriterLocked()
			c.mu.Unlock()
		}
		return err
	}
}

// recycle returns a flushed behind frame's buffer and frees the stream's
// behind slot (after which the stream may reuse w).
func (w *dataWrite) recycle() {
	smallFramePool.Put(w.buf)
	st := w.st
	w.st, w.head, w.buf, w.err = nil, nil, nil, nil
	st.behindQueued.Store(false)
}

// writeBatchLocked sends the queued control frames and batch in one write,
// setting each entry's err. wmu held.
func (c *h2conn) writeBatchLocked(batch []*dataWrite) {
	if err := c.appendCtrlLocked(); err != nil {
		for _, w := range batch {
			w.err = err
		}
		return
	}
	// Small frames are copied behind the control frames in wbuf, so that a
	// batch of them goes out as one TLS record instead of one record each
	// (a seal here, an open and a read at the peer, per record). A larger
	// one is written from the writer's buffer: a frame fills a record.
	pieces := c.wpieces[:0]
	run := 0 // where the run of copied bytes not yet in pieces starts
	c.mu.Lock()
	for _, w := range batch {
		payload := len(w.head) - frameHeaderLen*int(max(w.frames, 1))
		if w.st.err != nil || c.finishSent {
			w.err = w.st.err
			if w.err == nil {
				w.err = errConnClosed
			}
			// The stream died while we waited: give the flow control back.
			c.sendWindow += int64(payload)
			c.wakeSendersLocked()
			continue
		}
		if w.frames == 0 {
			var flags http2.Flags
			if w.end {
				w.st.sentEOF = true
				flags = http2.FlagDataEndStream
			}
			putFrameHeader(w.head, payload, http2.FrameData, flags, w.st.id)
		}
		if n := len(w.head); n <= coalesceMax && c.wbuf.Len()+n <= maxCoalesced {
			c.wbuf.Write(w.head)
			continue
		}
		if c.wbuf.Len() > run {
			pieces = append(pieces, batchPiece{from: run, to: c.wbuf.Len()})
			run = c.wbuf.Len()
		}
		pieces = append(pieces, batchPiece{direct: w.head})
	}
	c.mu.Unlock()
	if c.wbuf.Len() > run {
		pieces = append(pieces, batchPiece{from: run, to: c.wbuf.Len()})
	}
	out := c.wout[:0]
	copied := c.wbuf.Bytes()
	for _, p := range pieces {
		if p.direct != nil {
			out = append(out, p.direct)
		} else {
			out = append(out, copied[p.from:p.to])
		}
	}
	err := c.writeOut(out...)
	if c.wbuf.Cap() > maxKeptWbuf {
		c.wbuf = bytes.Buffer{} // a burst's copies are not kept for the connection's life
	} else {
		c.wbuf.Reset()
	}
	clear(out)
	clear(pieces)
	c.wout, c.wpieces = out[:0], pieces[:0]
	for _, w := range batch {
		if w.err == nil {
			w.err = err
		}
	}
}

// batchPiece is one write of a batch: bytes from..to of wbuf, or direct.
type batchPiece struct {
	from, to int
	direct   []byte
}

const (
	// coalesceMax is the largest frame a batch copies into wbuf.
	coalesceMax = 2 << 10
	// maxCoalesced bounds what a batch copies into wbuf; later small frames
	// go out as they are.
	maxCoalesced = 64 << 10
	// maxKeptWbuf bounds the wbuf a connection keeps between batches.
	maxKeptWbuf = 16 << 10
)

func putFrameHeader(b []byte, length int, t http2.FrameType, flags http2.Flags, id uint32) {
	b[0], b[1], b[2] = byte(length>>16), byte(length>>8), byte(length)
	b[3] = byte(t)
	b[4] = byte(flags)
	b[5], b[6], b[7], b[8] = byte(id>>24)&0x7f, byte(id>>16), byte(id>>8), byte(id)
}

// writeHeadersLocked encodes fields and sends them as HEADERS (plus
// CONTINUATION when the block exceeds the peer's frame size). wmu held.
func (c *h2conn) writeHeadersLocked(id uint32, fields []hpack.HeaderField, end bool) error {
	if err := c.appendCtrlLocked(); err != nil {
		return err
	}
	c.mu.Lock()
	maxFrame, maxList, closed := int(c.peerMaxFrame), c.peerMaxHeaderList, c.closed || c.finishSent
	c.mu.Unlock()
	if closed {
		return errConnClosed
	}
	var listSize uint32
	for _, f := range fields {
		listSize += f.Size()
	}
	if maxList != 0 && listSize > maxList {
		return fmt.Errorf("%w (%d > %d bytes)", errHeaderTooLarge, listSize, maxList)
	}
	c.hbuf.Reset()
	for _, f := range fields {
		if err := c.henc.WriteField(f); err != nil {
			return fmt.Errorf("encoding headers: %w", err)
		}
	}
	block := c.hbuf.Bytes()
	first := block
	if len(first) > maxFrame {
		first = first[:maxFrame]
	}
	rest := block[len(first):]
	err := c.fr.WriteHeaders(http2.HeadersFrameParam{
		StreamID:      id,
		BlockFragment: first,
		EndStream:     end,
		EndHeaders:    len(rest) == 0,
	})
	for err == nil && len(rest) > 0 {
		part := rest
		if len(part) > maxFrame {
			part = part[:maxFrame]
		}
		rest = rest[len(part):]
		err = c.fr.WriteContinuation(id, len(rest) == 0, part)
	}
	if err != nil {
		c.wbuf.Reset()
		return fmt.Errorf("encoding headers: %w", err)
	}
	return c.flushWbufLocked()
}
