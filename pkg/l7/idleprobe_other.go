//go:build !unix

package l7

import "syscall"

// socketReadable cannot peek here: every socket counts as readable, so
// idle connections are not reused.
func socketReadable(syscall.Conn) bool { return true }
