package hbone

import (
	"net"
	"sync"
)

const (
	// frameHeaderLen is the size of an HTTP/2 frame header. Copy buffers keep
	// this much room in front of the payload so that a DATA frame header can
	// be written in place and the frame sent with one Write.
	frameHeaderLen = 9

	// recvChunkSize is the unit in which received DATA is buffered per
	// stream. Chunks come from a pool and go back as soon as they are read,
	// so an idle tunnel holds none.
	recvChunkSize = 32 << 10

	// copyBufSize is the payload size of the buffers that carry bytes from a
	// plain connection into a tunnel (one read, then DATA frames in place).
	copyBufSize = 128 << 10
)

var (
	recvChunkPool = sync.Pool{New: func() any { b := make([]byte, recvChunkSize); return &b }}
	copyBufPool   = sync.Pool{New: func() any { b := make([]byte, frameHeaderLen+copyBufSize); return &b }}
	// smallFramePool holds the head of each frame a Write sends: the frame
	// header and the first TLS record's worth of payload.
	smallFramePool = sync.Pool{New: func() any { b := make([]byte, frameHeaderLen+smallFrameSize); return &b }}
)

// readFilled reports whether a read of n bytes into readPooled's buffer b
// filled all its frame slots: the socket may have more.
func readFilled(b *[]byte, n int) bool {
	if len(*b) == frameHeaderLen+copyBufSize {
		return n == framesPerFlush*framePayload
	}
	return n == framePayload
}

// putReadBuf returns a buffer of readPooled to its pool.
func putReadBuf(b *[]byte) {
	if len(*b) == frameHeaderLen+copyBufSize {
		copyBufPool.Put(b)
	} else {
		smallFramePool.Put(b)
	}
}

const (
	smallFrameSize = 16 << 10
	// tlsRecordPayload is the most plaintext one TLS record carries.
	tlsRecordPayload = 16 << 10
)

// chunk is a pooled buffer holding n bytes of received DATA.
type chunk struct {
	buf *[]byte
	n   int
}

// recvQueue is the data a stream received and its reader has not consumed.
// All fields are guarded by the connection mutex. The connection's read loop
// fills the tail chunk's free space without holding the mutex (filling), and
// a reader may write chunks out without holding it (reading); chunks are
// recycled only when neither is in progress, otherwise they are dropped to
// the garbage collector, so a buffer is never reused while still referenced.
type recvQueue struct {
	chunks  []chunk
	inline  [2]chunk // chunks' backing array while it holds no more
	off     int      // read offset into chunks[0]
	size    int      // bytes buffered
	filling bool
	reading bool
	dead    bool // released: nothing more is accepted
}

// fillRegion returns free space for at most max more bytes at the tail,
// taking a new chunk when the tail is full, and marks the queue as filling.
func (q *recvQueue) fillRegion(max int) []byte {
	if len(q.chunks) == 0 || q.chunks[len(q.chunks)-1].n == len(*q.chunks[len(q.chunks)-1].buf) {
		if cap(q.chunks) == 0 {
			q.chunks = q.inline[:0]
		}
		q.chunks = append(q.chunks, chunk{buf: recvChunkPool.Get().(*[]byte)})
	}
	t := &q.chunks[len(q.chunks)-1]
	free := (*t.buf)[t.n:]
	if len(free) > max {
		free = free[:max]
	}
	q.filling = true
	return free
}

// commit records that n bytes were written into the last fillRegion. It
// reports false when the queue was released meanwhile (the bytes are lost).
func (q *recvQueue) commit(n int) bool {
	q.filling = false
	if q.dead {
		q.chunks = nil
		return false
	}
	q.chunks[len(q.chunks)-1].n += n
	q.size += n
	q.dropEmptyTail()
	return true
}

// dropEmptyTail recycles a tail chunk that holds no unread data, so that an
// idle stream keeps no buffer.
func (q *recvQueue) dropEmptyTail() {
	if q.filling || q.reading || len(q.chunks) != 1 || q.off < q.chunks[0].n {
		return
	}
	recvChunkPool.Put(q.chunks[0].buf)
	q.chunks[0] = chunk{}
	q.chunks = q.chunks[:0]
	q.off = 0
}

// read copies buffered data into p.
func (q *recvQueue) read(p []byte) int {
	n := 0
	for n < len(p) && q.size > 0 {
		c := q.chunks[0]
		m := copy(p[n:], (*c.buf)[q.off:c.n])
		n += m
		q.consume(m)
	}
	return n
}

// peek appends the buffered data to bufs without consuming it.
func (q *recvQueue) peek(bufs net.Buffers) net.Buffers {
	for i, c := range q.chunks {
		start := 0
		if i == 0 {
			start = q.off
		}
		if c.n > start {
			bufs = append(bufs, (*c.buf)[start:c.n])
		}
	}
	return bufs
}

// consume discards n buffered bytes from the front and recycles chunks
// that are fully read; the tail stays while the read loop is filling it.
func (q *recvQueue) consume(n int) {
	if q.dead {
		return
	}
	q.size -= n
	for len(q.chunks) > 0 {
		c := &q.chunks[0]
		m := min(n, c.n-q.off)
		q.off += m
		n -= m
		if q.off < c.n || (len(q.chunks) == 1 && q.filling) {
			break
		}
		recvChunkPool.Put(c.buf)
		q.chunks[0] = chunk{}
		q.chunks = q.chunks[1:]
		q.off = 0
	}
	if len(q.chunks) == 0 {
		q.chunks = q.inline[:0] // no allocation for the next chunk
	}
}

// release discards everything and refuses further data. It returns the
// number of unread bytes dropped.
func (q *recvQueue) release() int {
	n := q.size
	if !q.filling && !q.reading {
		for _, c := range q.chunks {
			recvChunkPool.Put(c.buf)
		}
	}
	q.chunks, q.off, q.size, q.dead = nil, 0, 0, true
	return n
}
