//go:build !linux

package hbone

import (
	"net"
	"time"
)

// setUserTimeout is Linux's (TCP_USER_TIMEOUT); elsewhere a vanished peer
// is found by the keepalive alone.
func setUserTimeout(net.Conn, time.Duration) error { return nil }
