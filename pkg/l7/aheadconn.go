package l7

import (
	"context"
	"io"
	"net"
	"sync"
)

// peerDoner is a tunnel that reports, without being read, when reading it
// would no longer block: its peer ended its direction and everything it
// sent has been read, or it failed. hbone's streams are. A Read then tells
// which: io.EOF for an end (a half-close: the peer still reads what it is
// sent), another error for a failure (the peer is gone).
type peerDoner interface {
	PeerDone() context.Context
	Read([]byte) (int, error)
}

// halfClosed reports whether a tunnel whose PeerDone ended was half-closed
// by its peer rather than failed. The read takes nothing: there is nothing
// left to read.
func halfClosed(pd peerDoner) bool {
	_, err := pd.Read(nil)
	return err == io.EOF
}

// aheadConn gives a connection that cannot report its peer's end (any but
// an HBONE stream: a test's TCP connection) a PeerDone by reading it in the
// background, one buffer ahead of its reader.
type aheadConn struct {
	net.Conn
	done context.Context
	end  context.CancelFunc

	mu    sync.Mutex
	data  []byte // read ahead, not yet returned
	err   error  // the read error that ended the background reader
	ready chan struct{}
	room  chan struct{}
}

func newAheadConn(c net.Conn) *aheadConn {
	a := &aheadConn{Conn: c, ready: make(chan struct{}, 1), room: make(chan struct{}, 1)}
	a.done, a.end = context.WithCancel(context.Background())
	go a.readAhead()
	return a
}

func (a *aheadConn) PeerDone() context.Context { return a.done }

// Close closes the connection and lets the background reader go, even
// with data nobody will read.
func (a *aheadConn) Close() error {
	err := a.Conn.Close()
	notify(a.room)
	return err
}

// readAhead reads a buffer at a time, waiting for the last to be taken (or
// Close).
func (a *aheadConn) readAhead() {
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

func (a *aheadConn) Read(p []byte) (int, error) {
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

// notify wakes a waiter on a one-slot channel without blocking.
func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
