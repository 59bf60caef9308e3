package hbone

import (
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/causeway-mesh/causeway/pkg/shrinkmap"
)

// idlePoller waits, on one goroutine for the whole process, for the
// sockets of relays that have nothing to read: a parked direction costs an
// epoll registration instead of a goroutine and its stack. When a socket
// becomes readable (or closed, or failed) its relay's fromPeer runs again
// on a new goroutine. The poller and its goroutine are the package's, for
// the life of the process (as the runtime's own network poller is): they
// hold one descriptor and, with no relay parked, wait without waking.
//
// The goroutine waits in the runtime's network poller, on the epoll
// descriptor itself (readable when one of its sockets is ready), never in
// a blocking epoll_wait: a goroutine blocked in a system call keeps its
// scheduler slot (P) until the runtime's monitor takes it back, up to 10
// ms later when the process looks idle, so with GOMAXPROCS 2 every relay
// woke behind one slot's worth of other work (issue 36: the added latency
// at 1000 requests/s).
type idlePoller struct {
	epfd   int
	ep     syscall.RawConn // epfd in the runtime's poller
	mu     sync.Mutex
	relays shrinkmap.Map[uint64, *relay] // by token, the epoll event's data; a burst's room goes with it
	next   uint64
}

var (
	pollerOnce   sync.Once
	sharedPoller *idlePoller // nil: unavailable, relays wait on goroutines
)

func idlePollerFor() *idlePoller {
	pollerOnce.Do(func() {
		fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
		if err != nil {
			return
		}
		if err := unix.SetNonblock(fd, true); err != nil {
			unix.Close(fd)
			return
		}
		// A non-blocking descriptor that supports poll joins the runtime's
		// poller; the file lives as long as the process.
		rc, err := os.NewFile(uintptr(fd), "hbone-idle-poller").SyscallConn()
		if err != nil {
			return
		}
		sharedPoller = &idlePoller{epfd: fd, ep: rc}
		go sharedPoller.run()
	})
	return sharedPoller
}

// Relay states for the socket direction.
const (
	peerRunning int32 = iota // fromPeer is running (or waiting on its goroutine)
	peerParked               // waiting in the poller
	peerDone                 // abort ended the direction while parked
)

// park registers r's socket for one readiness event (level-triggered, so
// data that arrived since the last read is seen at once). It reports false
// when the socket cannot be registered: the caller waits on its own.
func (p *idlePoller) park(r *relay) bool {
	if r.token == 0 {
		p.mu.Lock()
		p.next++
		r.token = p.next
		p.relays.Set(r.token, r)
		p.mu.Unlock()
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT,
		Fd: int32(uint32(r.token)), Pad: int32(uint32(r.token >> 32))}
	r.state.Store(peerParked) // the event may come before EpollCtl returns
	var err error
	cerr := r.rc.Control(func(fd uintptr) {
		op := unix.EPOLL_CTL_MOD
		if !r.registered {
			op = unix.EPOLL_CTL_ADD
		}
		if err = unix.EpollCtl(p.epfd, op, int(fd), &ev); err == nil {
			r.registered = true
		}
	})
	if cerr == nil && err == nil {
		return true
	}
	// Not registered: go on waiting here, unless abort took the direction.
	return !r.state.CompareAndSwap(peerParked, peerRunning)
}

// forget drops a finished relay. (Its registration went with the socket.)
func (p *idlePoller) forget(r *relay) {
	if p == nil || r.token == 0 {
		return
	}
	p.mu.Lock()
	p.relays.Delete(r.token)
	p.mu.Unlock()
}

func (p *idlePoller) run() {
	events := make([]unix.EpollEvent, 256)
	var ready []*relay
	for {
		var (
			n    int
			werr error
		)
		err := p.ep.Read(func(uintptr) bool {
			for {
				n, werr = unix.EpollWait(p.epfd, events, 0)
				if werr != unix.EINTR {
					break
				}
			}
			// Nothing ready: wait in the runtime's poller for the next event.
			return n > 0 || werr != nil
		})
		if err == nil {
			err = werr
		}
		if err != nil {
			// Only a broken epoll descriptor fails so; do not spin.
			time.Sleep(time.Second)
			continue
		}
		p.mu.Lock()
		for _, ev := range events[:n] {
			if r, _ := p.relays.Get(uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32); r != nil {
				ready = append(ready, r)
			}
		}
		p.mu.Unlock()
		for i, r := range ready {
			if r.state.CompareAndSwap(peerParked, peerRunning) {
				go r.fromPeer()
			}
			ready[i] = nil
		}
		ready = ready[:0]
	}
}
