package l7

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

func TestRequestHooks(t *testing.T) {
	var r requestHooks
	ctx1, cancel1 := context.WithCancel(context.Background())
	defer cancel1()
	gen1 := r.begin(ctx1)

	var ran, removed atomic.Int32
	if _, ok := r.add(context.Background(), func() {}); ok {
		t.Fatal("a hook was taken for a context that is not the request's")
	}
	id, ok := r.add(ctx1, func() { removed.Add(1) })
	if !ok {
		t.Fatal("a hook for the request's context was refused")
	}
	if !r.remove(id) {
		t.Fatal("remove of a pending hook reported it had run")
	}
	if r.remove(id) {
		t.Fatal("a hook was removed twice")
	}
	id, _ = r.add(ctx1, func() { ran.Add(1) })
	r.end(gen1)
	r.end(gen1)
	if ran.Load() != 1 || removed.Load() != 0 {
		t.Fatalf("ran %d times (want 1), removed hook ran %d times", ran.Load(), removed.Load())
	}
	if r.remove(id) {
		t.Fatal("remove of a hook that ran reported it had not")
	}
	if _, ok := r.add(ctx1, func() {}); ok {
		t.Fatal("a hook was taken after the request ended")
	}

	// The next request: an old generation's end, or a stale remove, does
	// not touch its hooks.
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	gen2 := r.begin(ctx2)
	var ran2 atomic.Int32
	id2, ok := r.add(ctx2, func() { ran2.Add(1) })
	if !ok {
		t.Fatal("refused for the next request")
	}
	r.end(gen1)
	if r.remove(id) || ran2.Load() != 0 {
		t.Fatal("the previous request reached the next one's hooks")
	}
	r.endCurrent()
	if ran2.Load() != 1 || r.remove(id2) {
		t.Fatalf("endCurrent: ran %d times", ran2.Load())
	}
	r.end(gen2) // already ended: nothing more
	if ran2.Load() != 1 {
		t.Fatal("a hook ran twice")
	}

	// An ended context is refused even before end runs (its canceler
	// cancels first).
	ctx3, cancel3 := context.WithCancel(context.Background())
	r.begin(ctx3)
	cancel3()
	if _, ok := r.add(ctx3, func() {}); ok {
		t.Fatal("a hook was taken for a canceled context")
	}

	var none *requestHooks
	if _, ok := none.add(ctx3, func() {}); ok {
		t.Fatal("a nil requestHooks took a hook")
	}
}

// TestCtxWatch: through the hooks for the request's context, through
// context.AfterFunc for any other, with the same answers from end.
func TestCtxWatch(t *testing.T) {
	var r requestHooks
	reqCtx, cancelReq := context.WithCancel(context.Background())
	defer cancelReq()
	gen := r.begin(reqCtx)
	other, cancelOther := context.WithTimeout(reqCtx, time.Hour) // a route timeout on top

	for _, tc := range []struct {
		name   string
		ctx    context.Context
		hooked bool
		cancel func()
	}{
		{"derived context", other, false, cancelOther},
		{"request's context", reqCtx, true, func() { cancelReq(); r.end(gen) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w ctxWatch
			w.start(tc.ctx, &r, func() {})
			if got := w.hooks != nil; got != tc.hooked {
				t.Fatalf("through hooks: %v, want %v", got, tc.hooked)
			}
			if !w.end() {
				t.Fatal("end before the context ended reported the function ran")
			}
			ran := make(chan struct{})
			w.start(tc.ctx, &r, func() { close(ran) })
			tc.cancel()
			select {
			case <-ran:
			case <-time.After(10 * time.Second):
				t.Fatal("the function did not run when the context ended")
			}
			if w.end() {
				t.Fatal("end after the function ran reported it had not")
			}
		})
	}
}
