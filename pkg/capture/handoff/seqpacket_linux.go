package handoff

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// maxFDs is how many descriptors one read can take in: more than any
// message may carry, so that extras arrive and are closed rather than
// silently truncated.
const maxFDs = 8

// Conn is one end of a handoff socket. It is not safe for concurrent
// sends or concurrent receives; a send and a receive may overlap.
type Conn struct {
	uc  *net.UnixConn
	buf []byte
	oob []byte
}

func newConn(uc *net.UnixConn) *Conn {
	return &Conn{uc: uc, buf: make([]byte, MaxMessage+1), oob: make([]byte, unix.CmsgSpace(4*maxFDs))}
}

// Dial connects to the agent's socket.
func Dial(path string) (*Conn, error) {
	uc, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	return newConn(uc), nil
}

// Listen serves the socket at path, replacing a stale one.
func Listen(path string) (*net.UnixListener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// Send writes one message with netns as its descriptor (nil for none).
func (c *Conn) Send(m Message, netns *os.File) error {
	if carriesFD(m.Type) != (netns != nil) {
		return fmt.Errorf("handoff: %s message with%s a descriptor", m.Type, map[bool]string{true: "", false: "out"}[netns != nil])
	}
	b, err := Encode(m)
	if err != nil {
		return err
	}
	var n, oobn int
	if netns == nil {
		n, oobn, err = c.uc.WriteMsgUnix(b, nil, nil)
	} else {
		// Inside Control the descriptor cannot be closed (and its number
		// reused) by a concurrent Close of netns.
		rc, rerr := netns.SyscallConn()
		if rerr != nil {
			return fmt.Errorf("handoff: send %s: %w", m.Type, rerr)
		}
		cerr := rc.Control(func(fd uintptr) {
			n, oobn, err = c.uc.WriteMsgUnix(b, unix.UnixRights(int(fd)), nil)
		})
		if err == nil {
			err = cerr
		}
	}
	if err != nil {
		return fmt.Errorf("handoff: send %s: %w", m.Type, err)
	}
	if n != len(b) || (netns != nil) != (oobn > 0) {
		return fmt.Errorf("handoff: send %s: short write", m.Type)
	}
	return nil
}

// Recv reads one message and, for an add, its descriptor (the caller owns
// it). Descriptors a message may not carry are closed before it is read.
func (c *Conn) Recv() (Message, *os.File, error) {
	n, oobn, flags, _, err := c.uc.ReadMsgUnix(c.buf, c.oob)
	if err != nil {
		return Message{}, nil, err
	}
	fds, ferr := parseRights(c.oob[:oobn])
	var keep *os.File
	for i, fd := range fds {
		if i == 0 && ferr == nil && flags&unix.MSG_CTRUNC == 0 {
			keep = os.NewFile(uintptr(fd), "netns")
			continue
		}
		unix.Close(fd)
	}
	fail := func(err error) (Message, *os.File, error) {
		if keep != nil {
			keep.Close()
		}
		return Message{}, nil, err
	}
	switch {
	case ferr != nil:
		return fail(ferr)
	case flags&unix.MSG_CTRUNC != 0:
		return fail(errors.New("handoff: control data truncated (too many descriptors)"))
	case n == 0:
		return fail(errors.New("handoff: peer closed the connection"))
	case n > MaxMessage || flags&unix.MSG_TRUNC != 0:
		return fail(fmt.Errorf("handoff: message exceeds %d bytes", MaxMessage))
	case len(fds) > 1:
		return fail(fmt.Errorf("handoff: message with %d descriptors", len(fds)))
	}
	m, err := Decode(c.buf[:n])
	if err != nil {
		return fail(err)
	}
	if carriesFD(m.Type) != (keep != nil) {
		return fail(fmt.Errorf("handoff: %s message with %d descriptors", m.Type, len(fds)))
	}
	return m, keep, nil
}

func parseRights(oob []byte) ([]int, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("handoff: control data: %w", err)
	}
	var fds []int
	var bad error
	for _, m := range msgs {
		if m.Header.Level != unix.SOL_SOCKET || m.Header.Type != unix.SCM_RIGHTS {
			bad = fmt.Errorf("handoff: unexpected control message %d/%d", m.Header.Level, m.Header.Type)
			continue
		}
		got, err := unix.ParseUnixRights(&m)
		if err != nil {
			bad = fmt.Errorf("handoff: control data: %w", err)
			continue
		}
		fds = append(fds, got...)
	}
	return fds, bad
}

// SetDeadline bounds the next reads and writes.
func (c *Conn) SetDeadline(t time.Time) error { return c.uc.SetDeadline(t) }

// Close closes the socket.
func (c *Conn) Close() error { return c.uc.Close() }
