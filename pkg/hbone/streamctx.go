package hbone

import (
	"context"
	"slices"
	"time"
)

// streamContext is a server stream's context, the one its handler and
// Stream get: done once the stream ends (endedLocked: reset, failed with
// its connection, or released). It is the stream's own state, not a
// context.WithCancel of the connection's: that cost each stream a
// cancelCtx, an entry in the connection context's map of children, and,
// once the handler derived its connect timeout from it, a done channel
// and a map of children of its own that outlived the timeout, ~0.5 KiB
// per open tunnel (issue 36: memory per idle connection). The done channel
// is made when asked for; children derived from it register through
// AfterFunc, which the context package uses in place of its map.
type streamContext struct{ st *stream }

// ctxState is what a server stream's context holds once used.
type ctxState struct {
	done  chan struct{}
	after []*func() // AfterFunc's functions not yet run or stopped
}

var _ interface {
	context.Context
	AfterFunc(func()) func() bool
} = streamContext{}

func (x streamContext) Deadline() (time.Time, bool) { return x.st.c.ctx.Deadline() }
func (x streamContext) Value(key any) any           { return x.st.c.ctx.Value(key) }

func (x streamContext) Done() <-chan struct{} {
	st := x.st
	st.c.mu.Lock()
	defer st.c.mu.Unlock()
	s := st.ctxStateLocked()
	if s.done == nil {
		s.done = make(chan struct{})
		if st.ctxEndedLocked() {
			close(s.done)
		}
	}
	return s.done
}

func (x streamContext) Err() error {
	st := x.st
	st.c.mu.Lock()
	defer st.c.mu.Unlock()
	if st.ctxEndedLocked() {
		return context.Canceled
	}
	return nil
}

// AfterFunc runs f on a goroutine of its own once the stream ends (at once
// if it has); stop keeps it from running and reports whether it did.
func (x streamContext) AfterFunc(f func()) (stop func() bool) {
	st := x.st
	st.c.mu.Lock()
	defer st.c.mu.Unlock()
	if st.ctxEndedLocked() {
		go f()
		return func() bool { return false }
	}
	s := st.ctxStateLocked()
	fp := &f
	s.after = append(s.after, fp)
	return func() bool {
		st.c.mu.Lock()
		defer st.c.mu.Unlock()
		i := slices.Index(s.after, fp)
		if i < 0 {
			return false
		}
		s.after = slices.Delete(s.after, i, i+1)
		if len(s.after) == 0 && s.done == nil && st.ctx == s {
			st.ctx = nil // nothing left to hold for the stream's life
		}
		return true
	}
}

func (x streamContext) String() string { return "hbone stream context" }

func (st *stream) ctxStateLocked() *ctxState {
	if st.ctx == nil {
		st.ctx = new(ctxState)
	}
	return st.ctx
}

// ctxEndedLocked reports whether a server stream's context is done.
func (st *stream) ctxEndedLocked() bool { return st.err != nil || st.released }

// endCtxLocked ends a server stream's context (the stream just ended).
func (st *stream) endCtxLocked() {
	s := st.ctx
	if s == nil {
		return
	}
	if s.done != nil && !isClosed(s.done) {
		close(s.done)
	}
	for _, f := range s.after {
		go (*f)()
	}
	s.after = nil
}
