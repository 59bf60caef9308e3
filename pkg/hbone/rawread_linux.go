package hbone

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// errWouldBlock is readPooled's answer, without waiting, for a socket with
// nothing to read.
var errWouldBlock = errors.New("hbone: nothing to read yet")

// rawConnOf returns the RawConn of a TCP or Unix stream socket, nil for
// other connections.
func rawConnOf(c any) syscall.RawConn {
	var (
		rc  syscall.RawConn
		err error
	)
	switch c := c.(type) {
	case *net.TCPConn:
		rc, err = c.SyscallConn()
	case *net.UnixConn:
		rc, err = c.SyscallConn()
	default:
		return nil
	}
	if err != nil {
		return nil
	}
	return rc
}

// rawSocketReader reads a TCP or Unix stream socket through its RawConn:
// the copy buffer is taken from the pool only once the socket is readable,
// so a tunnel waiting on an idle upstream holds no buffer. It returns nil
// for other readers.
func rawSocketReader(r io.Reader) func() (*[]byte, int, error) {
	rc := rawConnOf(r)
	if rc == nil {
		return nil
	}
	return func() (*[]byte, int, error) { return readPooled(rc, true, true) }
}

// readPooled reads what the socket has into a pooled buffer, taken only
// once there is something to read: a copy buffer when big, else a small
// one (one TLS record), so that many connections waking at once for a few
// bytes each take little. The payload is laid out in frame slots (see
// frameSlots; a small buffer is one slot), so that it is sent as DATA
// frames in place (sendSlotted). With wait it waits for readability;
// without, it answers errWouldBlock. Return the buffer with putReadBuf.
func readPooled(rc syscall.RawConn, wait, big bool) (*[]byte, int, error) {
	op := readOpPool.Get().(*readOp)
	op.wait, op.big = wait, big
	err := rc.Read(op.fn)
	buf, n, rerr := op.buf, op.n, op.rerr
	*op = readOp{fn: op.fn}
	readOpPool.Put(op)
	if err != nil {
		// Deadline or closed socket, reported by the poller (buf is nil:
		// a read that took one ended the wait).
		return nil, 0, err
	}
	return buf, n, rerr
}

// readFD is one read of readPooled, inside the socket's RawConn.Read: the
// buffer (nil on failure) and what it holds, errWouldBlock when the
// socket has nothing, io.EOF at its end. A copy buffer is read into its
// frame slots (frameSlots), a small one into its one slot.
func readFD(fd uintptr, big bool) (*[]byte, int, error) {
	pool := &smallFramePool
	if big {
		pool = &copyBufPool
	}
	b := pool.Get().(*[]byte)
	var (
		n   int
		err error
	)
	if big {
		var slots [framesPerFlush][]byte // on the stack: readv keeps no reference
		n, err = rawReadv(fd, frameSlots(*b, &slots))
	} else {
		n, err = rawRead(fd, (*b)[frameHeaderLen:tlsRecordPayload])
	}
	switch {
	case err == unix.EAGAIN:
		err = errWouldBlock
	case err != nil:
		err = os.NewSyscallError("read", err)
	case n <= 0:
		err = io.EOF
	default:
		return b, n, nil
	}
	pool.Put(b)
	return nil, 0, err
}

// readOp is one readPooled call's state, pooled with the function its
// RawConn.Read calls, so that a read allocates nothing (a closure and its
// escaping variables were four objects per read, garbage between the
// objects of connections being opened: issue 36).
type readOp struct {
	fn        func(fd uintptr) bool // op.read, bound once
	wait, big bool
	buf       *[]byte
	n         int
	rerr      error
}

var readOpPool = sync.Pool{New: func() any {
	op := new(readOp)
	op.fn = op.read
	return op
}}

func (op *readOp) read(fd uintptr) bool {
	op.buf, op.n, op.rerr = readFD(fd, op.big)
	return op.rerr != errWouldBlock || !op.wait // false: wait until readable
}

// writeNoWait writes bufs to the socket with one writev, taking what its
// send buffer has room for without waiting: n < the total (or
// errWouldBlock) when it had too little. It keeps no reference to bufs,
// which may be on the caller's stack.
func writeNoWait(rc syscall.RawConn, bufs [][]byte) (int, error) {
	op := writeOpPool.Get().(*writeOp)
	op.bufs = append(op.bufs[:0], bufs...)
	err := rc.Write(op.fn)
	n, werr := op.n, op.err
	clear(op.bufs)
	op.bufs, op.n, op.err = op.bufs[:0], 0, nil
	writeOpPool.Put(op)
	if err != nil {
		return 0, err
	}
	if werr == unix.EAGAIN {
		return 0, errWouldBlock
	}
	if werr != nil {
		return 0, os.NewSyscallError("writev", werr)
	}
	return n, nil
}

// writeOp is one writeNoWait call's state, pooled with the function its
// RawConn.Write calls and a copy of the buffers, as readOp is: a closure
// and its escaping variables were three objects per write, and the
// caller's buffers could not stay on its stack (a relay kept a slice of
// its own for them; issue 36).
type writeOp struct {
	fn   func(fd uintptr) bool // op.write, bound once
	bufs [][]byte
	n    int
	err  error
}

var writeOpPool = sync.Pool{New: func() any {
	op := new(writeOp)
	op.fn = op.write
	return op
}}

func (op *writeOp) write(fd uintptr) bool {
	op.n, op.err = rawWritev(fd, op.bufs)
	return true // never wait
}
