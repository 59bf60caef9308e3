package hbone

import (
	"io"
	"net"
	"os"
	"sync"
	"syscall"
)

// maxKeptBatch bounds the batch buffer a connection keeps between writes.
const maxKeptBatch = 256 << 10

// recordBatcher sits between a TLS connection and its socket. crypto/tls
// sends every record (at most 16 KiB of payload) with its own write; while a
// batch is open the records are gathered and sent with one write when it
// closes, so a 128 KiB DATA frame costs one syscall instead of eight.
// Outside a batch (the handshake, alerts) writes go straight through.
//
// On a TCP socket it reads and writes through the socket's RawConn with
// rawRead and rawWrite (sysio_linux.go): without the runtime's system call
// bookkeeping, which wakes its monitor thread once per request when
// requests come one by one.
type recordBatcher struct {
	net.Conn
	rc       syscall.RawConn // nil: not a TCP socket
	mu       sync.Mutex
	batching bool
	buf      []byte

	// The state of a Read (one at a time: crypto/tls reads under its
	// input lock) and of a write (mu held) for the functions their
	// RawConn calls run, bound once: a closure per call was three objects
	// of garbage per record read or batch written (issue 36).
	readFD, writeFD func(fd uintptr) bool
	rp              []byte
	rn              int
	rerr            error
	wp              []byte
	wn              int
	werr            error
}

func newRecordBatcher(c net.Conn) *recordBatcher {
	b := &recordBatcher{Conn: c, rc: rawConnOf(c)}
	if b.rc != nil {
		b.readFD, b.writeFD = b.readRaw, b.writeRaw
	}
	return b
}

func (b *recordBatcher) Read(p []byte) (int, error) {
	if b.rc == nil {
		return b.Conn.Read(p)
	}
	b.rp = p
	rerr := b.rc.Read(b.readFD)
	n, err := b.rn, b.rerr
	b.rp, b.rn, b.rerr = nil, 0, nil
	if rerr != nil {
		return 0, rerr
	}
	switch {
	case err != nil:
		return 0, b.opError("read", err)
	case n == 0 && len(p) > 0:
		return 0, io.EOF
	}
	return n, nil
}

func (b *recordBatcher) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.batching {
		return b.write(p)
	}
	b.buf = append(b.buf, p...)
	return len(p), nil
}

// write writes all of p to the socket, waiting for room as needed.
func (b *recordBatcher) write(p []byte) (int, error) {
	if b.rc == nil {
		return b.Conn.Write(p)
	}
	b.wp = p
	werr := b.rc.Write(b.writeFD)
	done, err := b.wn, b.werr
	b.wp, b.wn, b.werr = nil, 0, nil
	if werr != nil {
		return done, werr
	}
	if err != nil {
		return done, b.opError("write", err)
	}
	return done, nil
}

// readRaw is Read's one read, inside RawConn.Read.
func (b *recordBatcher) readRaw(fd uintptr) bool {
	b.rn, b.rerr = rawRead(fd, b.rp)
	return b.rerr != syscall.EAGAIN
}

// writeRaw writes all of b.wp, inside RawConn.Write.
func (b *recordBatcher) writeRaw(fd uintptr) bool {
	for b.wn < len(b.wp) {
		n, e := rawWrite(fd, b.wp[b.wn:])
		if e == syscall.EAGAIN {
			return false // wait until writable
		}
		if e != nil {
			b.werr = e
			return true
		}
		b.wn += n
	}
	return true
}

// opError is what net.Conn's Read and Write say of a failed system call.
func (b *recordBatcher) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: "tcp", Source: b.LocalAddr(), Addr: b.RemoteAddr(), Err: os.NewSyscallError(op, err)}
}

// begin opens a batch.
func (b *recordBatcher) begin() {
	b.mu.Lock()
	b.batching = true
	b.mu.Unlock()
}

// end closes the batch and sends what it gathered.
func (b *recordBatcher) end() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.batching = false
	if len(b.buf) == 0 {
		return nil
	}
	_, err := b.write(b.buf)
	if cap(b.buf) > maxKeptBatch {
		b.buf = nil
	} else {
		b.buf = b.buf[:0]
	}
	return err
}
