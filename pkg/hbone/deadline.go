package hbone

import (
	"sync"
	"sync/atomic"
	"time"
)

// deadline is a settable point in time whose wait channel is closed once it
// has passed. Waiters select on wait(); a nil channel (no deadline was ever
// set) blocks forever, so tunnels that never use deadlines pay nothing. A
// nil *deadline is one never set.
//
// armed is set with the first deadline and stays set: until then exceeded
// and wait answer without taking the lock. (Setting a deadline wakes the
// stream's waiters, which then look again.)
//
// net/http moves a connection's read deadline several times per request,
// so one timer is re-armed rather than a new one made each time; a firing
// left over from an earlier setting finds the deadline moved and does
// nothing.
type deadline struct {
	mu    sync.Mutex
	at    time.Time   // zero: none
	timer *time.Timer // calls expire; made on first use
	ch    chan struct{}
	armed atomic.Bool
}

func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.at = t
	if d.timer != nil {
		d.timer.Stop()
	}
	if d.ch != nil && isClosed(d.ch) {
		d.ch = nil
	}
	if t.IsZero() {
		return
	}
	if d.ch == nil {
		d.ch = make(chan struct{})
	}
	d.armed.Store(true)
	dur := time.Until(t)
	switch {
	case dur <= 0:
		close(d.ch)
	case d.timer == nil:
		d.timer = time.AfterFunc(dur, d.expire)
	default:
		d.timer.Reset(dur)
	}
}

// expire closes the channel if the deadline it was armed for still holds.
func (d *deadline) expire() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.at.IsZero() || time.Now().Before(d.at) || d.ch == nil || isClosed(d.ch) {
		return
	}
	close(d.ch)
}

func (d *deadline) wait() <-chan struct{} {
	if d == nil || !d.armed.Load() {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ch
}

// exceeded reports whether the deadline has passed.
func (d *deadline) exceeded() bool {
	if d == nil || !d.armed.Load() {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ch != nil && isClosed(d.ch)
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
