package cancelgroup

import (
	"context"
	"sync"
	"time"
)

// afterFuncer is a context that runs functions at its end itself: a
// Context, an HBONE stream's context.
type afterFuncer interface {
	AfterFunc(func()) (stop func() bool)
}

// WithTimeout is context.WithTimeout, except that when parent runs
// functions at its end itself (AfterFunc), the child registers there
// instead of asking for parent.Done(). context.WithTimeout asks for the
// parent's done channel first: a context that makes it on demand, such
// as an HBONE stream's, then keeps one for the stream's whole life
// because a short connect timeout was derived from it (issue 36: memory
// per idle connection). Here the registration goes when the child ends.
//
// Values are the parent's; so context.Cause of the child is the parent's
// cause, not the child's own end (its Err says that).
func WithTimeout(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	a, ok := parent.(afterFuncer)
	if !ok {
		return context.WithTimeout(parent, d)
	}
	deadline := time.Now().Add(d)
	if pd, ok := parent.Deadline(); ok && pd.Before(deadline) {
		deadline = pd
	}
	t := &timeout{parent: parent, deadline: deadline, done: make(chan struct{})}
	// Held while both registrations are made: either may fire at once.
	t.mu.Lock()
	t.stopParent = a.AfterFunc(func() { t.end(parent.Err()) })
	t.timer = time.AfterFunc(time.Until(deadline), func() { t.end(context.DeadlineExceeded) })
	t.mu.Unlock()
	return t, func() { t.end(context.Canceled) }
}

// timeout is WithTimeout's context.
type timeout struct {
	parent   context.Context
	deadline time.Time
	done     chan struct{}

	mu         sync.Mutex
	err        error
	timer      *time.Timer
	stopParent func() bool
}

func (t *timeout) Deadline() (time.Time, bool) { return t.deadline, true }
func (t *timeout) Done() <-chan struct{}       { return t.done }
func (t *timeout) Value(key any) any           { return t.parent.Value(key) }

func (t *timeout) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// end ends t with err (once) and drops both registrations.
func (t *timeout) end(err error) {
	t.mu.Lock()
	if t.err != nil {
		t.mu.Unlock()
		return
	}
	if err == nil {
		err = context.Canceled
	}
	t.err = err
	close(t.done)
	timer, stop := t.timer, t.stopParent
	t.timer, t.stopParent = nil, nil
	t.mu.Unlock()
	timer.Stop()
	stop()
}
