//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package h1

import "syscall"

// socketProbe cannot peek here: such sockets are not reused when idle.
func socketProbe(syscall.Conn) func() bool { return nil }
