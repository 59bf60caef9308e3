package hbone

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
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
//
// This file holds the connection, its start and its read side (the read
// loop, frame dispatch, DATA and header blocks); writer.go the writer,
// flow.go connection-level flow control, lifecycle.go keepalive, idling,
// GOAWAY, closing and the stream table.

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

// errStopSending: the server ended its side of the stream (END_STREAM) and
// then reset it with NO_ERROR, which asks the client to stop sending
// without an error (RFC 9113 §8.1): the exchange is complete; what the
// client still had to send is dropped. A relay ends cleanly on it.
var errStopSending = errors.New("hbone: peer ended the stream and asked to stop sending (NO_ERROR)")

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
	// batchAvg: frames per flush, a moving average in sixteenths
	// (writeData's yield).
	batchAvg int
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

// idleStreamLocked reports whether id names a stream that was never opened.
func (c *h2conn) idleStreamLocked(id uint32) bool {
	if c.isClient {
		return id%2 == 0 || id >= c.nextStream
	}
	return id%2 == 1 && id > c.maxPeerStream
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
	switch {
	case f.ErrCode == http2.ErrCodeRefusedStream:
		err = &refusedError{reason: "REFUSED_STREAM"}
	case f.ErrCode == http2.ErrCodeNo && c.isClient && st.recvEOF:
		err = errStopSending
	}
	st.failLocked(err)
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
	st.status = int32(status)
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

// validHeaderValue reports whether v may be sent as a header value.
func validHeaderValue(v string) bool { return httpguts.ValidHeaderFieldValue(v) }

func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
