package hbone

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The pool's connections end once their bytes stay unacknowledged for
// the keepalive's PING timeout (TCP_USER_TIMEOUT); without a keepalive
// the kernel's default (none) is left.
func TestUserTimeoutFollowsKeepalive(t *testing.T) {
	m := newMesh(t)
	up := upstream(t, echo)
	_, addr := startServer(t, m, &dialHandler{}, nil)
	for _, tc := range []struct {
		what            string
		readIdle, ping  time.Duration
		wantMillisecond int
	}{
		{"defaults", 0, 0, int(DefaultPingTimeout.Milliseconds())},
		{"a PING timeout of 2s", 0, 2 * time.Second, 2000},
		{"no keepalive", -1, 2 * time.Second, 0},
	} {
		var mu sync.Mutex
		var conns []net.Conn
		p := newPool(t, m, func(o *PoolOptions) {
			o.ReadIdleTimeout, o.PingTimeout = tc.readIdle, tc.ping
			o.Dial = func(ctx context.Context, local netip.Addr, remote netip.AddrPort) (net.Conn, error) {
				c, err := DialFrom(ctx, local, remote)
				if err == nil {
					mu.Lock()
					conns = append(conns, c)
					mu.Unlock()
				}
				return c, err
			}
		})
		c := dialTunnel(t, p, m.target(addr, up.String()))
		mu.Lock()
		if len(conns) != 1 {
			t.Fatalf("%s: %d connections dialled, want 1", tc.what, len(conns))
		}
		rc, err := conns[0].(syscall.Conn).SyscallConn()
		mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		var got int
		var gerr error
		if err := rc.Control(func(fd uintptr) {
			got, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
		}); err != nil || gerr != nil {
			t.Fatal(err, gerr)
		}
		if got != tc.wantMillisecond {
			t.Errorf("%s: TCP_USER_TIMEOUT %d ms, want %d", tc.what, got, tc.wantMillisecond)
		}
		c.Close()
		p.Close()
	}
}
