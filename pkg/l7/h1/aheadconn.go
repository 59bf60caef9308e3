package h1

import (
	"context"
	"io"
	"net"
	"sync"
)

// PeerDoner is a tunnel that reports, without being read, when reading it
// would no longer block: its peer ended its direction and everything it
// sent has been read, or it failed. hbone's streams are. A Read then tells
// which: io.EOF for an end (a half-close: the peer still reads what it is
// sent), another error for a failure (the peer is gone).
type PeerDoner interface {
	PeerDone() context.Context
	Read([]byte) (int, error)
}

// halfClosed reports whether a tunnel whose PeerDone ended was half-closed
// by its peer rather than failed. The read takes nothing: there is nothing
// left to read.
func halfClosed(pd PeerDoner) bool {
	_, err := pd.Read(nil)
	return err == io.EOF
}

// AheadConn gives a connection that cannot report its peer's end (any but
// an HBONE stream: a test's TCP connection) a PeerDone by reading it in the
// background, one buffer ahead of its reader.
type AheadConn struct {
	net.Conn
	done context.Context
	end  context.CancelFunc

	mu    sync.Mutex
	data  []byte // read ahead, not yet returned
	err   error  // the read error that ended the background reader
	ready chan struct{}
	room  chan struct{}
}

func NewAheadConn(c net.Conn) *AheadConn {
	a := &AheadConn{Conn: c, ready: make(chan struct{}, 1), room: make(chan struct{}, 1)}
	a.done, a.end = context.WithCancel(context.Background())
	go a.readAhead()
	return a
}

func (a *AheadConn) PeerDone() context.Context { return a.done }

// Close closes the connection and lets the background reader go, even
// with data nobody will read.
func (a *AheadConn) Close() error {
	err := a.Conn.Close()
	notify(a.room)
	return err
}

// readAhead reads a buffer at a time, waiting for the last to be taken (or
// Close).
func (a *AheadConn) readAhead() {
	buf := make([]byte, 4<<10)
	for {
		n, err := a.Conn.Read(buf)
		a.mu.Lock()
		a.data, a.err = buf[:n], err
		if n == 0 && err != nil {
			a.end()
		}
		a.mu.Unlock()
		notify(a.ready)
		if err != nil {
			return
		}
		<-a.room
	}
}

func (a *AheadConn) Read(p []byte) (int, error) {
	for {
		a.mu.Lock()
		if len(a.data) > 0 {
			n := copy(p, a.data)
			a.data = a.data[n:]
			if len(a.data) == 0 {
				if a.err != nil {
					a.end()
				} else {
					notify(a.room)
				}
			}
			a.mu.Unlock()
			return n, nil
		}
		if err := a.err; err != nil {
			a.mu.Unlock()
			return 0, err
		}
		a.mu.Unlock()
		<-a.ready
	}
}

// PrefixConn replays bytes already read (sniffed, or buffered by the
// server) before reading on.
type PrefixConn struct {
	net.Conn
	Prefix []byte
}

func (c *PrefixConn) Read(p []byte) (int, error) {
	if len(c.Prefix) > 0 {
		n := copy(p, c.Prefix)
		c.Prefix = c.Prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// notify wakes a waiter on a one-slot channel without blocking.
func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
