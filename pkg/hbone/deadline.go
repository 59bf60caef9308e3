package hbone

import (
	"sync"
	"time"
)

// deadline is a settable point in time whose wait channel is closed once it
// has passed. Waiters select on wait(); a nil channel (no deadline was ever
// set) blocks forever, so tunnels that never use deadlines pay nothing.
type deadline struct {
	mu    sync.Mutex
	timer *time.Timer
	ch    chan struct{} // closed when the deadline has passed
}

func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil {
		if !d.timer.Stop() {
			// The timer fired or is firing: wait for it to close the channel.
			<-d.ch
		}
		d.timer = nil
	}
	if t.IsZero() {
		if d.ch != nil && isClosed(d.ch) {
			d.ch = make(chan struct{})
		}
		return
	}
	if d.ch == nil || isClosed(d.ch) {
		d.ch = make(chan struct{})
	}
	if dur := time.Until(t); dur > 0 {
		ch := d.ch
		d.timer = time.AfterFunc(dur, func() { close(ch) })
		return
	}
	close(d.ch)
}

func (d *deadline) wait() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ch
}

// exceeded reports whether the deadline has passed.
func (d *deadline) exceeded() bool {
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
