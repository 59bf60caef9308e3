package h1

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// requestScope gives the requests an HTTP/1.1 connection serves, one after
// another, their contexts (reqContext), and runs functions when a request
// ends: the server ends it (handler done, client gone) or the connection's
// context ends. net/http's server makes each request's context with
// context.WithCancel on the connection's, which allocates the context and
// its cancel function and adds it to the parent's children map and takes
// it out again; an exchange watching it (context.AfterFunc) added a done
// channel, another children map and an afterFunc context. That was ~5 %
// of the waypoint's CPU under the benchmark load. One scope per connection,
// reused request after request; a request's context stays canceled, and its
// functions never run for a later request (generations).
type requestScope struct {
	parent context.Context // the connection's
	// ended is the last generation that ended. Generations end in order:
	// a request ends before the next one begins.
	ended atomic.Uint64

	mu   sync.Mutex
	gen  uint64        // the current request's generation
	done chan struct{} // the current request's Done, once asked for
	next uint64        // hook ids, unique over the connection's life
	fns  []requestHook
}

type requestHook struct {
	id    uint64
	f     func()
	async bool // run in a goroutine of its own (context.AfterFunc's promise)
}

// closedDone is the Done channel of an ended request.
var closedDone = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// begin starts the next request and returns its context, already ended if
// the connection's is.
func (s *requestScope) begin() *reqContext {
	s.mu.Lock()
	s.gen++
	gen := s.gen
	s.done = nil
	clear(s.fns)
	s.fns = s.fns[:0]
	s.mu.Unlock()
	if s.parent.Err() != nil {
		s.end(gen)
	}
	return &reqContext{scope: s, gen: gen}
}

// end ends request gen, once: its context is canceled and its functions
// run; a later call, or one for an earlier request, does nothing.
func (s *requestScope) end(gen uint64) {
	s.mu.Lock()
	if gen != s.gen || s.ended.Load() == gen {
		s.mu.Unlock()
		return
	}
	s.ended.Store(gen)
	if s.done != nil {
		close(s.done)
		s.done = nil
	}
	fns := s.fns
	s.fns = nil
	s.mu.Unlock()
	for _, h := range fns {
		if h.async {
			go h.f()
		} else {
			h.f()
		}
	}
	clear(fns)
	s.mu.Lock()
	if s.fns == nil {
		s.fns = fns[:0] // reused for the next request
	}
	s.mu.Unlock()
}

// endCurrent ends the current request (the connection's context ended).
func (s *requestScope) endCurrent() {
	s.mu.Lock()
	gen := s.gen
	s.mu.Unlock()
	s.end(gen)
}

// add registers f to run when request gen ends; false if it has ended.
func (s *requestScope) add(gen uint64, f func(), async bool) (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if gen != s.gen || s.ended.Load() == gen {
		return 0, false
	}
	s.next++
	s.fns = append(s.fns, requestHook{id: s.next, f: f, async: async})
	return s.next, true
}

// remove unregisters hook id, reporting whether it had not run (as the
// stop function of context.AfterFunc does).
func (s *requestScope) remove(id uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, h := range s.fns {
		if h.id == id {
			s.fns = slices.Delete(s.fns, i, i+1)
			return true
		}
	}
	return false
}

// reqContext is the context of one request of a requestScope: canceled
// (context.Canceled) when the request ends; values and deadline are the
// connection's context's.
type reqContext struct {
	scope *requestScope
	gen   uint64
}

func (c *reqContext) Deadline() (time.Time, bool) { return c.scope.parent.Deadline() }
func (c *reqContext) Value(key any) any           { return c.scope.parent.Value(key) }

func (c *reqContext) Err() error {
	if c.scope.ended.Load() >= c.gen {
		return context.Canceled
	}
	return nil
}

func (c *reqContext) Done() <-chan struct{} {
	s := c.scope
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended.Load() >= c.gen {
		return closedDone
	}
	if s.done == nil {
		s.done = make(chan struct{})
	}
	return s.done
}

// AfterFunc is what context.AfterFunc and contexts derived from this one
// (a route's timeout) register through: f runs in its own goroutine when
// the request ends, at once if it has.
func (c *reqContext) AfterFunc(f func()) (stop func() bool) {
	id, ok := c.scope.add(c.gen, f, true)
	if !ok {
		go f()
		return func() bool { return false }
	}
	return func() bool { return c.scope.remove(id) }
}

// ctxWatch runs a function when a context ends: synchronously in whatever
// ends the request when the context is a request's own (so the function
// must not block), else through context.AfterFunc.
type ctxWatch struct {
	scope *requestScope
	id    uint64
	stop  func() bool
}

func (w *ctxWatch) start(ctx context.Context, f func()) {
	if rc, ok := ctx.(*reqContext); ok {
		if id, ok := rc.scope.add(rc.gen, f, false); ok {
			w.scope, w.id, w.stop = rc.scope, id, nil
			return
		}
	}
	w.scope, w.stop = nil, context.AfterFunc(ctx, f)
}

// end stops the watch, reporting whether the function had not run (or
// been started).
func (w *ctxWatch) end() bool {
	if s := w.scope; s != nil {
		w.scope = nil
		return s.remove(w.id)
	}
	stop := w.stop
	w.stop = nil
	return stop()
}
