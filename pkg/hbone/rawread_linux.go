package hbone

import (
	"errors"
	"io"
	"net"
	"os"
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

// readPooled reads what the socket has into a pooled buffer (payload
// after frameHeaderLen), taken only once there is something to read: a
// copy buffer when big, else a small one (one TLS record), so that many
// connections waking at once for a few bytes each take little. With wait
// it waits for readability; without, it answers errWouldBlock. Return the
// buffer with putReadBuf.
func readPooled(rc syscall.RawConn, wait, big bool) (*[]byte, int, error) {
	var (
		buf  *[]byte
		n    int
		rerr error
	)
	err := rc.Read(func(fd uintptr) bool {
		buf, n, rerr = readFD(fd, big)
		return rerr != errWouldBlock || !wait // false: wait until readable
	})
	if err != nil {
		// Deadline or closed socket, reported by the poller (buf is nil:
		// a read that took one ended the wait).
		return nil, 0, err
	}
	return buf, n, rerr
}

// readFD is one read of readPooled, inside the socket's RawConn.Read: the
// buffer (nil on failure) and what it holds, errWouldBlock when the
// socket has nothing, io.EOF at its end.
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
	n, err = rawRead(fd, (*b)[frameHeaderLen:])
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

// writeNoWait writes bufs to the socket with one writev, taking what its
// send buffer has room for without waiting: n < the total (or
// errWouldBlock) when it had too little.
func writeNoWait(rc syscall.RawConn, bufs [][]byte) (int, error) {
	var (
		n    int
		werr error
	)
	if err := rc.Write(func(fd uintptr) bool {
		n, werr = rawWritev(fd, bufs)
		return true // never wait
	}); err != nil {
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
