package hbone

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// This file is the HTTP/2 connection that carries HBONE tunnels, used by
// both the server and the client pool. It is built on x/net/http2's Framer
// and hpack rather than on http2.Server and http2.Transport because a tunnel
// must be able to end one direction (END_STREAM) while the other keeps
// flowing: http2.Server can only send END_STREAM by returning from the
// handler, and then resets the request side (see wroteFrame in x/net's
// server.go), and http2.Transport holds a frame-sized scratch buffer per
// open stream. Owning the stream layer also gives tunnels real deadlines,
// zero buffers while idle, and DATA frames written without extra copies.

const (
	initialWindowSize = 65535 // RFC 9113 §6.9.2
	maxWindowSize     = math.MaxInt32
	initialFrameSize  = 16384
	// goAwayGrace is how long a connection that said GOAWAY (and has no
	// streams left) waits for the peer to close before closing itself, so
	// that the GOAWAY is read rather than lost to a TCP reset.
	goAwayGrace = time.Second
	// errorWriteTimeout bounds the last write on a failing connection.
	errorWriteTimeout = time.Second
	// maxQueuedCtrl bounds control frames waiting to be written: a peer
	// that floods PING, SETTINGS or stream errors without reading our
	// answers is disconnected instead of growing the queue.
	maxQueuedCtrl = 10000
)

var (
	errConnClosed         = errors.New("hbone: connection closed")
	errConnUnusable       = errors.New("hbone: connection no longer takes new streams")
	errClosedWrite        = errors.New("hbone: write after CloseWrite")
	errHeaderTooLarge     = errors.New("hbone: headers exceed the peer's limit")
	errStreamIDsExhausted = errors.New("hbone: stream IDs exhausted")
	errSelfDependency     = errors.New("hbone: stream depends on itself")
)

// resetError is a stream that was reset, by the peer or locally.
type resetError struct {
	code   http2.ErrCode
	remote bool
}

func (e *resetError) Error() string {
	if e.remote {
		return "hbone: stream reset by peer: " + e.code.String()
	}
	return "hbone: stream reset: " + e.code.String()
}

// refusedError is a stream the peer did not process (REFUSED_STREAM, or
// above the last stream of a GOAWAY): the request can be retried elsewhere.
type refusedError struct{ reason string }

func (e *refusedError) Error() string { return "hbone: stream refused by peer: " + e.reason }

// connConfig holds a connection's limits and timers.
type connConfig struct {
	streamWindow    int32  // receive window per stream
	connWindow      int32  // receive window per connection
	maxFrameSize    uint32 // largest frame we accept
	maxHeaderBytes  uint32 // largest header list we accept
	maxStreams      uint32 // server: concurrent streams a client may open
	readIdleTimeout time.Duration
	pingTimeout     time.Duration
	writeTimeout    time.Duration
	idleTimeout     time.Duration
	headerTimeout   time.Duration // server: preface and first request, later multi-frame header blocks
}

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

// h2conn is one HTTP/2 connection carrying tunnels, in the client or the
// server role. Goroutines: the caller of serve runs the read loop, serve
// starts the writer goroutine and waits for it.
type h2conn struct {
	isClient bool
	cfg      *connConfig
	nc       net.Conn
	batch    *recordBatcher // under nc (TLS): gathers one write's records
	log      *zap.Logger
	fr       *http2.Framer

	ctx    context.Context // done when the connection closes
	cancel context.CancelFunc

	// newStream (server role) is called on the read loop for each accepted
	// request; it must copy what it needs from the frame and not block.
	newStream func(st *stream, b *headerBlock)
	// onUnusable is called once, without locks held, when the connection
	// stops taking new streams.
	onUnusable func()

	lastRead     atomic.Int64 // unix nanoseconds of the last frame read
	ctrlOverflow atomic.Bool  // maxQueuedCtrl was exceeded
	ctrlSig      chan struct{}
	done         chan struct{}
	writerDone   chan struct{}

	// Write side. wmu is taken before mu when both are held; qmu is a leaf.
	wmu  sync.Mutex
	qmu  sync.Mutex
	dq   []*dataWrite // DATA frames waiting for the flushing writer
	dqUp []*dataWrite // the flushing writer's spare queue
	// dqBehind counts the behind frames in dq; early is flushBehind's
	// scratch queue (wmu).
	dqBehind int
	early    []*dataWrite
	// flushing: a writer is sending the queue; others wait to be told.
	flushing bool
	// writerLeads: the writer goroutine is to flush the queue; writerGone:
	// it has ended, so the lead stays with whoever holds it.
	writerLeads, writerGone bool
	wbuf                    bytes.Buffer // framer output, sent with one Write
	wout                    [][]byte     // scratch: the pieces of one batched write
	wpieces                 []batchPiece // scratch: where they are
	henc                    *hpack.Encoder
	hbuf                    bytes.Buffer

	// Read loop only: the HPACK decoder, the header block being read, its
	// frames and bytes so far, and whether a read deadline bounds it.
	hdec                    *hpack.Decoder
	block                   headerBlock
	blockFrames, blockBytes int
	blockDeadline           bool

	mu       sync.Mutex
	closed   bool
	closeErr error
	streams  map[uint32]*stream
	ctrl     []ctrlFrame

	sendWindow        int64     // connection send window
	sendWaiters       []*stream // streams waiting for the connection window
	peerInitialWindow int32
	peerMaxFrame      uint32
	peerMaxStreams    uint32
	peerMaxHeaderList uint32
	sawSettings       bool

	recvWindow  int32 // connection receive window the peer may still use
	recvUnacked int32 // consumed bytes not yet returned with WINDOW_UPDATE

	maxPeerStream  uint32 // server: highest stream ID the client opened
	recent         recentClosed
	nextStream     uint32 // client: next stream ID
	reserved       int    // client: streams promised to Dial callers
	headersSeen    bool   // a header block was read (read loop only)
	draining       bool   // GOAWAY sent or received: no new streams
	finishing      bool   // draining and empty: closing
	finishSent     bool
	goAwaySent     bool
	unusableCalled bool

	pingOutstanding bool
	pingData        [8]byte
	keepalive       *time.Timer
	idleTimer       *time.Timer
	idleGen         uint64
}

func newH2Conn(parent context.Context, nc net.Conn, batch *recordBatcher, isClient bool, cfg *connConfig, log *zap.Logger) *h2conn {
	c := &h2conn{
		isClient:          isClient,
		cfg:               cfg,
		nc:                nc,
		batch:             batch,
		log:               log,
		ctrlSig:           make(chan struct{}, 1),
		done:              make(chan struct{}),
		writerDone:        make(chan struct{}),
		streams:           make(map[uint32]*stream),
		sendWindow:        initialWindowSize,
		peerInitialWindow: initialWindowSize,
		peerMaxFrame:      initialFrameSize,
		peerMaxStreams:    math.MaxUint32,
		recvWindow:        cfg.connWindow,
		nextStream:        1,
	}
	c.ctx, c.cancel = context.WithCancel(parent)
	c.fr = http2.NewFramer(&c.wbuf, nc)
	c.fr.SetMaxReadFrameSize(cfg.maxFrameSize)
	c.hdec = hpack.NewDecoder(4096, func(hf hpack.HeaderField) { c.block.addField(hf, cfg.maxHeaderBytes) })
	// A field longer than that cannot fit the block's byte bound anyway.
	c.hdec.SetMaxStringLength(cfg.maxBlockBytes())
	// No dynamic table for what we send: our header blocks are small, and
	// a table of size 0 never disagrees with the peer's setting.
	c.henc = hpack.NewEncoder(&c.hbuf)
	c.henc.SetMaxDynamicTableSizeLimit(0)
	c.lastRead.Store(time.Now().UnixNano())
	return c
}

// start sends the connection preface: the client magic (client role), our
// SETTINGS and the connection window.
func (c *h2conn) start() error {
	settings := []http2.Setting{
		{ID: http2.SettingInitialWindowSize, Val: uint32(c.cfg.streamWindow)},
		{ID: http2.SettingMaxFrameSize, Val: c.cfg.maxFrameSize},
		{ID: http2.SettingMaxHeaderListSize, Val: c.cfg.maxHeaderBytes},
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.isClient {
		c.wbuf.WriteString(http2.ClientPreface)
		settings = append(settings, http2.Setting{ID: http2.SettingEnablePush, Val: 0})
	} else {
		settings = append(settings, http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: c.cfg.maxStreams})
	}
	if err := c.fr.WriteSettings(settings...); err != nil {
		return err
	}
	if d := c.cfg.connWindow - initialWindowSize; d > 0 {
		if err := c.fr.WriteWindowUpdate(0, uint32(d)); err != nil {
			return err
		}
	}
	return c.flushWbufLocked()
}

// serve runs the read loop until the connection ends and returns why.
func (c *h2conn) serve() error {
	go c.writeLoop()
	if c.cfg.readIdleTimeout > 0 {
		c.mu.Lock()
		c.keepalive = time.AfterFunc(c.cfg.readIdleTimeout, c.onKeepalive)
		c.mu.Unlock()
	}
	c.mu.Lock()
	c.armIdleLocked()
	c.mu.Unlock()
	err := c.readLoop()
	c.failRead(err)
	<-c.writerDone
	return err
}

func (c *h2conn) readLoop() error {
	if !c.isClient {
		if d := c.cfg.headerTimeout; d > 0 {
			c.nc.SetReadDeadline(time.Now().Add(d))
		}
		var preface [len(http2.ClientPreface)]byte
		if _, err := io.ReadFull(c.nc, preface[:]); err != nil {
			return fmt.Errorf("reading client preface: %w", err)
		}
		if string(preface[:]) != http2.ClientPreface {
			return errors.New("bad client preface")
		}
	}
	first := true
	for {
		fh, err := c.fr.ReadFrameHeader()
		if err != nil {
			return err
		}
		if first {
			if fh.Type != http2.FrameSettings || fh.Flags.Has(http2.FlagSettingsAck) {
				return connError(http2.ErrCodeProtocol, "first frame is not SETTINGS")
			}
			first = false
		}
		switch fh.Type {
		case http2.FrameData:
			err = c.readData(fh)
		case http2.FrameHeaders, http2.FrameContinuation:
			err = c.readHeaderFrame(fh)
		default:
			var f http2.Frame
			f, err = c.fr.ReadFrameForHeader(fh)
			if err == nil {
				err = c.processFrame(f)
			}
		}
		c.lastRead.Store(time.Now().UnixNano())
		if err == nil && c.ctrlOverflow.Load() {
			err = connError(http2.ErrCodeEnhanceYourCalm, "too many control frames queued; the peer is not reading")
		}
		if err != nil {
			var se http2.StreamError
			if errors.As(err, &se) {
				c.streamError(se, fh)
				continue
			}
			return err
		}
	}
}

// connectionError carries a code to send in GOAWAY before closing.
type connectionError struct {
	code   http2.ErrCode
	reason string
}

func (e *connectionError) Error() string {
	return "hbone: connection error " + e.code.String() + ": " + e.reason
}

func connError(code http2.ErrCode, reason string) error {
	return &connectionError{code: code, reason: reason}
}

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

// dataWrite is one DATA frame handed to writeData.
type dataWrite struct {
	st         *stream
	head, tail []byte
	end        bool
	err        error
	done       chan error // the flushing writer's answer, or errLead
	// behind: the writer did not wait; the frame owns buf (head's pooled
	// buffer), which the flush returns.
	behind bool
	buf    *[]byte
}

// errLead tells a waiting writer that it now flushes the queue.
var errLead = errors.New("hbone: flush the write queue")

// maxLeadRounds bounds the flushes one writer makes for others before the
// connection's writer goroutine takes over, so that its own stream is not
// held up behind a steady queue.
const maxLeadRounds = 4

// writeData sends one DATA frame: head starts with frameHeaderLen bytes of
// room for the frame header, and its payload continues with tail (which may
// be empty). The caller reserved flow control for the whole payload.
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
// A writer that finds no flush in progress yields once before it flushes:
// the goroutines already runnable (other streams' handlers under load) get
// to queue their frames into the same write, where they would otherwise
// find the socket idle and each pay a syscall. With nothing runnable the
// yield returns at once. Under the waypoint benchmark this cut write
// syscalls from 1.66 to 0.35 per proxied request (and its CPU per request
// by a sixth); bulk transfer is unchanged (see bench/README.md).
//
// The yield lasts until every runnable goroutine has run, so a burst of
// requests would leave as one write only once the last of them is handled,
// and the peer would idle until then. The writer of the earlyFlushFrames-th
// behind frame queued meanwhile sends the queued behind frames at once
// (flushBehind), so that a burst leaves in parts while the rest is handled.
func (c *h2conn) writeData(w *dataWrite) error {
	c.qmu.Lock()
	c.dq = append(c.dq, w)
	lead := !c.flushing
	c.flushing = true
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
		if err := <-w.done; err != errLead {
			return err
		}
	} else {
		runtime.Gosched() // let runnable writers join this flush
	}
	return c.flushQueue(w, maxLeadRounds)
}

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
	w.st, w.head, w.tail, w.buf, w.err = nil, nil, nil, nil, nil
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
	// frame keeps its pieces: a head that fills a record, and a tail
	// written from the writer's own buffer.
	pieces := c.wpieces[:0]
	run := 0 // where the run of copied bytes not yet in pieces starts
	c.mu.Lock()
	for _, w := range batch {
		payload := len(w.head) - frameHeaderLen + len(w.tail)
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
		var flags http2.Flags
		if w.end {
			w.st.sentEOF = true
			flags = http2.FlagDataEndStream
		}
		putFrameHeader(w.head, payload, http2.FrameData, flags, w.st.id)
		if n := len(w.head) + len(w.tail); n <= coalesceMax && c.wbuf.Len()+n <= maxCoalesced {
			c.wbuf.Write(w.head)
			c.wbuf.Write(w.tail)
			continue
		}
		if c.wbuf.Len() > run {
			pieces = append(pieces, batchPiece{from: run, to: c.wbuf.Len()})
			run = c.wbuf.Len()
		}
		pieces = append(pieces, batchPiece{direct: w.head})
		if len(w.tail) > 0 {
			pieces = append(pieces, batchPiece{direct: w.tail})
		}
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

func (c *h2conn) processFrame(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.SettingsFrame:
		return c.processSettings(f)
	case *http2.WindowUpdateFrame:
		return c.processWindowUpdate(f)
	case *http2.PingFrame:
		return c.processPing(f)
	case *http2.RSTStreamFrame:
		return c.processRSTStream(f)
	case *http2.GoAwayFrame:
		return c.processGoAway(f)
	case *http2.PushPromiseFrame:
		return connError(http2.ErrCodeProtocol, "PUSH_PROMISE not allowed")
	case *http2.PriorityFrame:
		if f.StreamDep == f.StreamID {
			return http2.StreamError{StreamID: f.StreamID, Code: http2.ErrCodeProtocol, Cause: errSelfDependency}
		}
		return nil
	default:
		// PRIORITY_UPDATE and unknown extension frames: ignored.
		return nil
	}
}

func (c *h2conn) processSettings(f *http2.SettingsFrame) error {
	if f.IsAck() {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	err := f.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			return err
		}
		switch s.ID {
		case http2.SettingInitialWindowSize:
			delta := int64(s.Val) - int64(c.peerInitialWindow)
			for _, st := range c.streams {
				st.sendWindow += delta
				if st.sendWindow > maxWindowSize {
					return connError(http2.ErrCodeFlowControl, "SETTINGS_INITIAL_WINDOW_SIZE overflows a stream window")
				}
				notify(st.wsig)
			}
			c.peerInitialWindow = int32(s.Val)
		case http2.SettingMaxFrameSize:
			c.peerMaxFrame = s.Val
		case http2.SettingMaxConcurrentStreams:
			c.peerMaxStreams = s.Val
		case http2.SettingMaxHeaderListSize:
			c.peerMaxHeaderList = s.Val
		case http2.SettingEnablePush:
			if c.isClient && s.Val != 0 {
				return connError(http2.ErrCodeProtocol, "server sent SETTINGS_ENABLE_PUSH=1")
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	c.sawSettings = true
	c.queueLocked(ctrlFrame{kind: ctrlSettingsAck})
	return nil
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

// idleStreamLocked reports whether id names a stream that was never opened.
func (c *h2conn) idleStreamLocked(id uint32) bool {
	if c.isClient {
		return id%2 == 0 || id >= c.nextStream
	}
	return id%2 == 1 && id > c.maxPeerStream
}

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

func (c *h2conn) processRSTStream(f *http2.RSTStreamFrame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.streams[f.StreamID]
	if st == nil {
		if c.idleStreamLocked(f.StreamID) {
			return connError(http2.ErrCodeProtocol, "RST_STREAM on idle stream")
		}
		return nil
	}
	var err error = &resetError{code: f.ErrCode, remote: true}
	if f.ErrCode == http2.ErrCodeRefusedStream {
		err = &refusedError{reason: "REFUSED_STREAM"}
	}
	st.failLocked(err)
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

// resetLocked resets a stream locally with code.
func (c *h2conn) resetLocked(st *stream, code http2.ErrCode) {
	if st.err == nil {
		st.failLocked(&resetError{code: code})
		st.rstSent = true
		c.queueLocked(ctrlFrame{kind: ctrlRST, stream: st.id, code: code})
	}
}

// sendResetLocked resets a stream that is not (or no longer) in c.streams.
func (c *h2conn) sendResetLocked(id uint32, code http2.ErrCode) {
	c.queueLocked(ctrlFrame{kind: ctrlRST, stream: id, code: code})
	if !c.isClient {
		c.recent.add(id, true)
	}
}

// lateFrameLocked handles DATA or HEADERS for a stream that failed (st) or
// is gone (st nil) as RFC 9113 §5.1 asks of a server: ignored once we reset
// the stream, as the peer may have sent it before it saw our RST_STREAM;
// otherwise (the peer ended or reset the stream) answered with RST_STREAM
// STREAM_CLOSED, once. The client role ignores such frames.
func (c *h2conn) lateFrameLocked(id uint32, st *stream) {
	switch {
	case c.isClient:
	case st != nil:
		if !st.rstSent {
			st.rstSent = true
			c.queueLocked(ctrlFrame{kind: ctrlRST, stream: id, code: http2.ErrCodeStreamClosed})
		}
	default:
		if _, reset := c.recent.lookup(id); !reset {
			c.sendResetLocked(id, http2.ErrCodeStreamClosed)
		}
	}
}

// streamError handles a stream-level protocol error reported by the framer.
func (c *h2conn) streamError(se http2.StreamError, fh http2.FrameHeader) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st := c.streams[se.StreamID]; st != nil {
		c.resetLocked(st, se.Code)
		return
	}
	c.sendResetLocked(se.StreamID, se.Code)
}

// readData reads a DATA frame's payload straight into the stream's buffer.
func (c *h2conn) readData(fh http2.FrameHeader) error {
	id := fh.StreamID
	if id == 0 {
		return connError(http2.ErrCodeProtocol, "DATA on stream 0")
	}
	length := int(fh.Length)
	remain := length
	padLen := 0
	if fh.Flags.Has(http2.FlagDataPadded) {
		if length < 1 {
			return connError(http2.ErrCodeProtocol, "padded DATA without pad length")
		}
		var b [1]byte
		if _, err := io.ReadFull(c.nc, b[:]); err != nil {
			return err
		}
		padLen = int(b[0])
		remain--
		if padLen > remain {
			return connError(http2.ErrCodeProtocol, "DATA padding exceeds payload")
		}
	}
	dataLen := remain - padLen
	overhead := length - dataLen // pad length byte and padding
	end := fh.Flags.Has(http2.FlagDataEndStream)

	c.mu.Lock()
	if int64(length) > int64(c.recvWindow) {
		c.mu.Unlock()
		return connError(http2.ErrCodeFlowControl, "DATA exceeds the connection window")
	}
	c.recvWindow -= int32(length)
	st := c.streams[id]
	switch {
	case st == nil:
		if c.idleStreamLocked(id) {
			c.mu.Unlock()
			return connError(http2.ErrCodeProtocol, "DATA on idle stream")
		}
		c.lateFrameLocked(id, nil)
	case st.err != nil:
		c.lateFrameLocked(id, st)
		st = nil
	case st.recvEOF:
		c.resetLocked(st, http2.ErrCodeStreamClosed)
		st = nil
	case st.expectBody >= 0 && (int64(dataLen) > st.expectBody || (end && int64(dataLen) != st.expectBody)):
		c.resetLocked(st, http2.ErrCodeProtocol) // content-length disagrees (RFC 9113 §8.1.1)
		st = nil
	case c.isClient && st.status == 0:
		c.resetLocked(st, http2.ErrCodeProtocol) // DATA before the response
		st = nil
	case int64(length) > int64(st.recvWindow):
		c.resetLocked(st, http2.ErrCodeFlowControl)
		st = nil
	default:
		st.recvWindow -= int32(length)
		if st.expectBody >= 0 {
			st.expectBody -= int64(dataLen)
		}
	}
	if st == nil {
		c.returnConnWindowLocked(length)
		c.mu.Unlock()
		_, err := io.CopyN(io.Discard, c.nc, int64(remain))
		return err
	}
	c.mu.Unlock()

	for dataLen > 0 {
		c.mu.Lock()
		if st.recv.dead || st.err != nil {
			c.returnConnWindowLocked(dataLen + overhead)
			c.mu.Unlock()
			_, err := io.CopyN(io.Discard, c.nc, int64(dataLen+padLen))
			return err
		}
		region := st.recv.fillRegion(dataLen)
		c.mu.Unlock()
		n, err := io.ReadFull(c.nc, region)
		c.mu.Lock()
		if !st.recv.commit(n) {
			c.returnConnWindowLocked(n)
		} else if n > 0 {
			st.wakeReaderLocked()
		}
		c.mu.Unlock()
		if err != nil {
			return err
		}
		dataLen -= n
	}
	if padLen > 0 {
		if _, err := io.CopyN(io.Discard, c.nc, int64(padLen)); err != nil {
			return err
		}
	}
	c.mu.Lock()
	if overhead > 0 {
		// Padding (and its length byte) is flow controlled but never read:
		// give it back at once.
		c.returnConnWindowLocked(overhead)
		if st.err == nil && !st.recv.dead {
			st.returnWindowLocked(overhead)
		}
	}
	if end && st.err == nil {
		st.recvEOF = true
		st.wakeReaderLocked()
		st.checkPeerDoneLocked()
	}
	c.mu.Unlock()
	return nil
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
	status, reason, err := st.status, st.reason, st.err
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
		rsig:       make(chan struct{}, 1),
		wsig:       make(chan struct{}, 1),
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

// readHeaderFrame reads a HEADERS or CONTINUATION frame (the Framer keeps
// them in order) into c.block, and processes the block once it ends. The
// bounds of a block are checked before each frame's payload is read.
func (c *h2conn) readHeaderFrame(fh http2.FrameHeader) error {
	if fh.Type == http2.FrameHeaders {
		c.blockFrames, c.blockBytes = 0, 0
	}
	c.blockFrames++
	c.blockBytes += int(fh.Length)
	if c.blockFrames > c.cfg.maxBlockFrames() || c.blockBytes > c.cfg.maxBlockBytes() {
		return connError(http2.ErrCodeEnhanceYourCalm, fmt.Sprintf("header block over %d frames or %d bytes",
			c.cfg.maxBlockFrames(), c.cfg.maxBlockBytes()))
	}
	f, err := c.fr.ReadFrameForHeader(fh)
	if err != nil {
		var se http2.StreamError
		if errors.As(err, &se) {
			// An undecoded block leaves the HPACK context out of step.
			return connError(http2.ErrCodeProtocol, "unreadable HEADERS frame: "+se.Error())
		}
		return err
	}
	b := &c.block
	var frag []byte
	switch f := f.(type) {
	case *http2.HeadersFrame:
		b.reset(f)
		frag = f.HeaderBlockFragment()
		if d := c.cfg.headerTimeout; d > 0 && c.headersSeen && !f.HeadersEnded() {
			// (Before the first request, the header timeout is running.)
			c.nc.SetReadDeadline(time.Now().Add(d))
			c.blockDeadline = true
		}
	case *http2.ContinuationFrame:
		frag = f.HeaderBlockFragment()
	}
	if _, err := c.hdec.Write(frag); err != nil {
		return connError(http2.ErrCodeCompression, "decoding header block: "+err.Error())
	}
	if !fh.Flags.Has(http2.FlagHeadersEndHeaders) {
		return nil
	}
	if err := c.hdec.Close(); err != nil {
		return connError(http2.ErrCodeCompression, "decoding header block: "+err.Error())
	}
	c.endHeaderBlock()
	if c.isClient {
		return c.processResponseHeaders(b)
	}
	return c.processRequestHeaders(b)
}

// endHeaderBlock lifts the read deadline of a header block, and the
// server's header timeout once the first block has been read, valid or not.
func (c *h2conn) endHeaderBlock() {
	if c.blockDeadline || (!c.isClient && !c.headersSeen && c.cfg.headerTimeout > 0) {
		c.nc.SetReadDeadline(time.Time{})
	}
	c.blockDeadline = false
	c.headersSeen = true
}

func (c *h2conn) processRequestHeaders(b *headerBlock) error {
	id := b.streamID
	if id%2 == 0 {
		return connError(http2.ErrCodeProtocol, "client opened an even stream")
	}
	selfDep := b.hasPriority && b.priority.StreamDep == id
	c.mu.Lock()
	if st := c.streams[id]; st != nil {
		defer c.mu.Unlock()
		if selfDep {
			c.resetLocked(st, http2.ErrCodeProtocol)
			return nil
		}
		return c.trailersLocked(st, b)
	}
	if last := c.maxPeerStream; id <= last {
		known, reset := c.recent.lookup(id)
		c.mu.Unlock()
		switch {
		case reset:
			return nil // we reset the stream; the peer had not seen it yet
		case known:
			return connError(http2.ErrCodeStreamClosed, fmt.Sprintf("HEADERS on closed stream %d", id))
		}
		// RFC 9113 §5.1.1: new streams take increasing IDs.
		return connError(http2.ErrCodeProtocol, fmt.Sprintf("HEADERS on stream %d after stream %d", id, last))
	}
	c.maxPeerStream = id
	contentLength, problem := b.checkRequest()
	switch {
	case b.truncated:
		// Answered with 431 unless malformed in what was read.
		contentLength, problem = -1, b.malformed
	case selfDep:
		problem = errSelfDependency.Error()
	case b.endStream && contentLength > 0:
		problem = "content-length without DATA"
	}
	if problem != "" {
		c.sendResetLocked(id, http2.ErrCodeProtocol)
		c.mu.Unlock()
		c.log.Debug("malformed request: stream reset", zap.Uint32("stream", id), zap.String("reason", problem))
		return nil
	}
	if c.draining || c.closed || uint32(len(c.streams)) >= c.cfg.maxStreams {
		c.sendResetLocked(id, http2.ErrCodeRefusedStream)
		c.mu.Unlock()
		return nil
	}
	st := c.newStreamLocked(id)
	st.ctx, st.cancel = context.WithCancel(c.ctx)
	st.expectBody = contentLength
	if b.endStream {
		st.recvEOF = true
	}
	c.mu.Unlock()
	c.newStream(st, b)
	return nil
}

// trailersLocked handles a second HEADERS on a stream: trailers, which must
// end the stream; their content means nothing to a tunnel.
func (c *h2conn) trailersLocked(st *stream, b *headerBlock) error {
	switch {
	case st.err != nil:
		c.lateFrameLocked(st.id, st)
	case st.recvEOF && st.sentEOF:
		// RFC 9113 §5.1: both sides ended, so the stream is closed even while
		// its handler still holds it (sentEOF is set before the frame leaves).
		return connError(http2.ErrCodeStreamClosed, fmt.Sprintf("HEADERS on closed stream %d", st.id))
	case st.recvEOF:
		c.resetLocked(st, http2.ErrCodeStreamClosed) // half-closed (remote)
	case b.checkTrailers() != "" || st.expectBody > 0:
		c.resetLocked(st, http2.ErrCodeProtocol)
	default:
		st.recvEOF = true
		st.wakeReaderLocked()
		st.checkPeerDoneLocked()
	}
	return nil
}

func (c *h2conn) processResponseHeaders(b *headerBlock) error {
	id := b.streamID
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.streams[id]
	if st == nil {
		if c.idleStreamLocked(id) {
			return connError(http2.ErrCodeProtocol, "HEADERS on idle stream")
		}
		return nil
	}
	if st.status != 0 {
		return c.trailersLocked(st, b)
	}
	statusText, _ := b.pseudo(":status")
	status, err := strconv.Atoi(statusText)
	if err != nil || status < 100 || status > 999 || b.malformed != "" || b.checkPseudo(":status") != "" {
		c.resetLocked(st, http2.ErrCodeProtocol)
		return nil
	}
	if status < 200 {
		// Informational; the final response follows.
		if b.endStream {
			c.resetLocked(st, http2.ErrCodeProtocol)
		}
		return nil
	}
	st.status = status
	if r, ok := b.value(ReasonHeader); ok {
		st.reason = sanitizeReason(r)
	}
	if b.endStream {
		st.recvEOF = true
		st.checkPeerDoneLocked()
	}
	st.closeRespLocked()
	st.wakeReaderLocked()
	return nil
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

// validHeaderValue reports whether v may be sent as a header value.
func validHeaderValue(v string) bool { return httpguts.ValidHeaderFieldValue(v) }

func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
