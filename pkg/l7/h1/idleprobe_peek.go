//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package h1

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// socketProbe returns a function that reports whether a read on the socket
// would not block: bytes or its end arrived, or it failed. It peeks,
// without waiting and without taking anything; what it needs is made once
// per socket.
func socketProbe(sc syscall.Conn) func() bool {
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	p := &peek{}
	try := p.try
	return func() bool {
		p.readable = true
		if err := rc.Read(try); err != nil {
			return true // closed, or its deadline passed (an interrupted exchange)
		}
		return p.readable
	}
}

type peek struct {
	buf      [1]byte
	readable bool
}

func (p *peek) try(fd uintptr) bool {
	// recv(2) without an address to fill in: unix.Recvfrom's would be
	// allocated on every call.
	_, _, errno := unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&p.buf[0])), 1,
		unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
	p.readable = errno != unix.EAGAIN && errno != unix.EWOULDBLOCK
	return true // done: never wait for readiness
}
