//go:build unix

package l7

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// socketReadable reports whether a read on the socket would not block:
// bytes or its end arrived, or it failed. It peeks, without waiting and
// without taking anything.
func socketReadable(sc syscall.Conn) bool {
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	p := peek{readable: true}
	if err := rc.Read(p.try); err != nil {
		return true // closed, or its deadline passed (an interrupted exchange)
	}
	return p.readable
}

type peek struct {
	buf      [1]byte
	readable bool
}

func (p *peek) try(fd uintptr) bool {
	_, _, err := unix.Recvfrom(int(fd), p.buf[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
	p.readable = err != unix.EAGAIN && err != unix.EWOULDBLOCK
	return true // done: never wait for readiness
}
