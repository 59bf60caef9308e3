package hbone

import (
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// setUserTimeout makes the kernel end the connection once data it sent
// stays unacknowledged for d (TCP_USER_TIMEOUT), as gRPC does with its
// keepalive timeout. A peer that vanished (its node lost: no reset ever
// comes) is then found within d of the first bytes it did not take, where
// the keepalive alone would first wait out the read idle timeout; the
// tunnels on it fail, and the pool dials afresh. A connection that is not
// a socket (a test's pipe) is left as it is.
func setUserTimeout(c net.Conn, d time.Duration) error {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d.Milliseconds()))
	}); err != nil {
		return err
	}
	return serr
}
