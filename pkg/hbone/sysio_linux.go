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
func rawRead(fd uintptr, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		n, _, e := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		switch e {
		case 0:
			return int(n), nil
		case unix.EINTR:
			continue
		}
		return -1, e
	}
}

// rawWrite writes to a non-blocking descriptor; n < len(p) when its send
// buffer had too little room.
func rawWrite(fd uintptr, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		n, _, e := unix.RawSyscall(unix.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		switch e {
		case 0:
			return int(n), nil
		case unix.EINTR:
			continue
		}
		return -1, e
	}
}

// maxIovecs bounds one rawWritev (the kernel's UIO_MAXIOV is 1024).
const maxIovecs = 64

// rawWritev writes bufs (at most maxIovecs of them are taken) to a
// non-blocking descriptor with one writev.
func rawWritev(fd uintptr, bufs [][]byte) (int, error) {
	var iov [maxIovecs]unix.Iovec
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
	if n == 0 {
		return 0, nil
	}
	for {
		w, _, e := unix.RawSyscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&iov[0])), uintptr(n))
		switch e {
		case 0:
			return int(w), nil
		case unix.EINTR:
			continue
		}
		return -1, e
	}
}
