package hbone

import (
	"io"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// rawSocketReader reads a TCP or Unix stream socket through its RawConn:
// the copy buffer is taken from the pool only once the socket is readable,
// so a tunnel waiting on an idle upstream holds no buffer. It returns nil
// for other readers.
func rawSocketReader(r io.Reader) func() (*[]byte, int, error) {
	var (
		rc  syscall.RawConn
		err error
	)
	switch c := r.(type) {
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
	return func() (*[]byte, int, error) {
		var (
			buf  *[]byte
			n    int
			rerr error
		)
		err := rc.Read(func(fd uintptr) bool {
			b := copyBufPool.Get().(*[]byte)
			for {
				n, rerr = unix.Read(int(fd), (*b)[frameHeaderLen:])
				if rerr != unix.EINTR {
					break
				}
			}
			if rerr == unix.EAGAIN {
				copyBufPool.Put(b)
				return false // wait until readable
			}
			buf = b
			return true
		})
		switch {
		case err != nil:
			// Deadline or closed socket, reported by the poller.
			if buf != nil {
				copyBufPool.Put(buf)
			}
			return nil, 0, err
		case rerr != nil:
			copyBufPool.Put(buf)
			return nil, 0, os.NewSyscallError("read", rerr)
		case n <= 0:
			copyBufPool.Put(buf)
			return nil, 0, io.EOF
		}
		return buf, n, nil
	}
}
