package inpod

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"unsafe"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/causeway-mesh/causeway/pkg/capture/cni"
)

// sockets makes the node proxy's sockets inside pod namespaces: marked, so
// the pod's rules let them through, and listeners with SO_REUSEPORT, so a
// restarting node proxy can listen beside the old one.
type sockets struct{ mark uint32 }

func (s sockets) control(reuse bool) func(network, address string, c syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(s.mark))
			if serr == nil && reuse {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
			}
		})
		if err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("socket option: %w", serr)
		}
		return nil
	}
}

// listen opens a TCP listener on every address of the namespace (IPv4
// and, when the namespace has it, IPv6 on one dual-stack socket).
func (s sockets) listen(netns ns.NetNS, port uint16) (net.Listener, error) {
	var ln net.Listener
	err := netns.Do(func(ns.NetNS) error {
		lc := net.ListenConfig{Control: s.control(true)}
		var err error
		ln, err = lc.Listen(context.Background(), "tcp", fmt.Sprintf(":%d", port))
		return err
	})
	return ln, err
}

// dial connects from inside the namespace; local, when valid, is the
// source address.
func (s sockets) dial(ctx context.Context, netns ns.NetNS, local netip.Addr, remote netip.AddrPort) (net.Conn, error) {
	var c net.Conn
	err := netns.Do(func(ns.NetNS) error {
		d := net.Dialer{Control: s.control(false)}
		if local.IsValid() {
			d.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(local, 0))
		}
		var err error
		c, err = d.DialContext(ctx, "tcp", remote.String())
		return err
	})
	return c, err
}

// migrateRequests makes sure the kernel moves connections still queued at
// a closing listener to another of its SO_REUSEPORT group
// (cni.MigrateReqSysctl): the CNI plugin sets it when the pod starts; a
// node proxy that may write /proc/sys (not the shipped, unprivileged one)
// sets it for pods captured otherwise.
func migrateRequests(netns ns.NetNS) error {
	return netns.Do(func(ns.NetNS) error {
		// /proc/sys/net shows the namespace of the thread that opens it.
		if v, err := os.ReadFile(cni.MigrateReqSysctl); err == nil && strings.TrimSpace(string(v)) == "1" {
			return nil
		}
		return os.WriteFile(cni.MigrateReqSysctl, []byte("1"), 0)
	})
}

// originalDestination reads where a redirected connection was going
// (SO_ORIGINAL_DST for IPv4, IP6T_SO_ORIGINAL_DST for IPv6).
func originalDestination(c *net.TCPConn) (netip.AddrPort, error) {
	local, err := netip.ParseAddrPort(c.LocalAddr().String())
	if err != nil {
		return netip.AddrPort{}, err
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var (
		out  netip.AddrPort
		serr error
	)
	err = rc.Control(func(fd uintptr) {
		if local.Addr().Unmap().Is4() {
			var sa unix.RawSockaddrInet4
			if serr = getsockopt(fd, unix.SOL_IP, unix.SO_ORIGINAL_DST, unsafe.Pointer(&sa), unix.SizeofSockaddrInet4); serr == nil {
				out = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), port(sa.Port))
			}
			return
		}
		var sa unix.RawSockaddrInet6
		if serr = getsockopt(fd, unix.SOL_IPV6, ip6tSOOriginalDst, unsafe.Pointer(&sa), unix.SizeofSockaddrInet6); serr == nil {
			out = netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), port(sa.Port))
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", err)
	}
	if !out.IsValid() || out.Port() == 0 {
		return netip.AddrPort{}, errors.New("original destination: none recorded")
	}
	return out, nil
}

// port converts a sockaddr port (network byte order in memory).
func port(p uint16) uint16 {
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], p)
	return binary.BigEndian.Uint16(b[:])
}

func getsockopt(fd uintptr, level, name int, p unsafe.Pointer, size uintptr) error {
	l := uint32(size)
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, uintptr(level), uintptr(name), uintptr(p), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 {
		return e
	}
	return nil
}

// ip6tSOOriginalDst is IP6T_SO_ORIGINAL_DST (linux/netfilter_ipv6/ip6_tables.h),
// which x/sys does not name.
const ip6tSOOriginalDst = 80

// Verify fails when the process may not do what in-pod mode needs:
// enter network namespaces (CAP_SYS_ADMIN) and mark sockets
// (CAP_NET_ADMIN). Better to fail at start than on the first pod.
func Verify() error {
	self, err := ns.GetCurrentNS()
	if err != nil {
		return fmt.Errorf("in-pod mode: own network namespace: %w", err)
	}
	defer self.Close()
	// Entering the namespace one is in still needs the privilege.
	if err := self.Do(func(ns.NetNS) error { return nil }); err != nil {
		return fmt.Errorf("in-pod mode needs to enter network namespaces (CAP_SYS_ADMIN): %w", err)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("in-pod mode: socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_MARK, 0x539); err != nil {
		return fmt.Errorf("in-pod mode needs to mark sockets (CAP_NET_ADMIN): %w", err)
	}
	return nil
}
