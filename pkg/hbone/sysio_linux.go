package hbone

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The socket reads and writes of a request's path are made without the
// runtime's system call bookkeeping (RawSyscall, not Syscall). On a
// non-blocking socket they never block, and that bookkeeping is what
// wakes the runtime's monitor thread (sysmon) from its sleep each time an
// idle process makes its first system call: with requests arriving one by
// one (a process idle between them), that was a futex wake and two
// context switches of the monitor per request in each proxy (issue 36).
// A blocking call must never come here: the scheduler cannot take its
// processor back while it runs.

// rawRead reads a non-blocking descriptor.
func rawRead(fd uintptr, p []byte) (int, error) { return rawRW(unix.SYS_READ, fd, p) }

// rawWrite writes to a non-blocking descriptor; n < len(p) when its send
// buffer had too little room.
func rawWrite(fd uintptr, p []byte) (int, error) { return rawRW(unix.SYS_WRITE, fd, p) }

// The pointers go to unix.RawSyscall in its call expression, as
// unsafe.Pointer's rules require (a Go function in between could grow
// the stack and move what they point at).

func rawRW(trap, fd uintptr, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		r, _, e := unix.RawSyscall(trap, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		if e != unix.EINTR {
			return result(r, e)
		}
	}
}

// maxIovecs bounds the buffers of one rawReadv or rawWritev (the kernel's
// UIO_MAXIOV is 1024).
const maxIovecs = 64

// iovecs points iov at bufs' non-empty buffers (at most maxIovecs of
// them) and returns how many it took.
func iovecs(iov *[maxIovecs]unix.Iovec, bufs [][]byte) int {
	n := 0
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		if n == len(iov) {
			break
		}
		iov[n].Base = &b[0]
		iov[n].SetLen(len(b))
		n++
	}
	return n
}

// rawReadv reads a non-blocking descriptor into bufs with one readv.
func rawReadv(fd uintptr, bufs [][]byte) (int, error) {
	return rawIO(unix.SYS_READV, fd, bufs)
}

// rawWritev writes bufs to a non-blocking descriptor with one writev.
func rawWritev(fd uintptr, bufs [][]byte) (int, error) {
	return rawIO(unix.SYS_WRITEV, fd, bufs)
}

func rawIO(trap, fd uintptr, bufs [][]byte) (int, error) {
	var iov [maxIovecs]unix.Iovec
	n := iovecs(&iov, bufs)
	if n == 0 {
		return 0, nil
	}
	for {
		r, _, e := unix.RawSyscall(trap, fd, uintptr(unsafe.Pointer(&iov[0])), uintptr(n))
		if e != unix.EINTR {
			return result(r, e)
		}
	}
}

func result(r uintptr, e unix.Errno) (int, error) {
	if e != 0 {
		return -1, e
	}
	return int(r), nil
}
