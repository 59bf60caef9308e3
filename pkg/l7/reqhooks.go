package l7

import (
	"context"
	"slices"
	"sync"
)

// requestHooks runs functions when the request an HTTP/1.1 connection is
// serving ends: its context is canceled by the server (handler done,
// client gone) or by the connection's context. It stands in for
// context.AfterFunc on that context for the one registration every proxied
// request makes, the upstream exchange's interrupt: on a fresh per-request
// context, AfterFunc allocates the context's done channel, a children map
// and an afterFunc context, and locks both contexts twice, which was ~5 % of
// the waypoint's CPU under the benchmark load. One per connection, reused
// request after request; a request's hooks never outlive it (generations).
//
// The functions run synchronously in whatever cancels the request, so they
// must not block (an interrupt sets a deadline).
type requestHooks struct {
	mu   sync.Mutex
	ctx  context.Context // the current request's; hooks are for it alone
	gen  uint64          // the current request's generation
	done bool            // the current request ended: no more hooks
	next uint64          // hook ids, unique over the connection's life
	fns  []requestHook
}

type requestHook struct {
	id uint64
	f  func()
}

// begin makes ctx the current request's context and returns its generation.
func (r *requestHooks) begin(ctx context.Context) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gen++
	r.ctx, r.done = ctx, false
	clear(r.fns)
	r.fns = r.fns[:0]
	return r.gen
}

// end runs the hooks of generation gen, once; a later call, or one for an
// earlier request, does nothing.
func (r *requestHooks) end(gen uint64) {
	r.mu.Lock()
	if gen != r.gen || r.done {
		r.mu.Unlock()
		return
	}
	r.done = true
	fns := r.fns
	r.fns = nil
	r.mu.Unlock()
	for _, h := range fns {
		h.f()
	}
	clear(fns)
	r.mu.Lock()
	if r.fns == nil {
		r.fns = fns[:0] // reuse the slice for the next request
	}
	r.mu.Unlock()
}

// endCurrent ends the current request (the connection's context ended).
func (r *requestHooks) endCurrent() {
	r.mu.Lock()
	gen := r.gen
	r.mu.Unlock()
	r.end(gen)
}

// add registers f to run when ctx ends, if ctx is the current request's
// context and it has not ended; false otherwise (nil r included), and the
// caller uses context.AfterFunc.
func (r *requestHooks) add(ctx context.Context, f func()) (uint64, bool) {
	if r == nil {
		return 0, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if ctx != r.ctx || r.done || ctx.Err() != nil {
		return 0, false
	}
	r.next++
	r.fns = append(r.fns, requestHook{id: r.next, f: f})
	return r.next, true
}

// remove unregisters hook id, reporting whether it had not run (as the
// stop function of context.AfterFunc does).
func (r *requestHooks) remove(id uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, h := range r.fns {
		if h.id == id {
			r.fns = slices.Delete(r.fns, i, i+1)
			return true
		}
	}
	return false
}

// ctxWatch runs a function when a context ends, through requestHooks when
// the context is the request's own, else through context.AfterFunc.
type ctxWatch struct {
	hooks *requestHooks
	id    uint64
	stop  func() bool
}

func (w *ctxWatch) start(ctx context.Context, hooks *requestHooks, f func()) {
	if id, ok := hooks.add(ctx, f); ok {
		w.hooks, w.id, w.stop = hooks, id, nil
		return
	}
	w.hooks, w.stop = nil, context.AfterFunc(ctx, f)
}

// end stops the watch, reporting whether the function had not run (or
// been started).
func (w *ctxWatch) end() bool {
	if h := w.hooks; h != nil {
		w.hooks = nil
		return h.remove(w.id)
	}
	stop := w.stop
	w.stop = nil
	return stop()
}
