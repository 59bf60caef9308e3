package h1

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

type ctxKey struct{}

func newScope(parent context.Context) *requestScope { return &requestScope{parent: parent} }

// waitDone fails unless ch is closed within a while.
func waitDone(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not happen", what)
	}
}

func TestRequestScope(t *testing.T) {
	parent, cancelParent := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "conn"))
	defer cancelParent()
	s := newScope(parent)

	ctx1 := s.begin()
	if ctx1.Err() != nil {
		t.Fatalf("a new request's context is already done: %v", ctx1.Err())
	}
	if ctx1.Value(ctxKey{}) != "conn" {
		t.Fatal("the request's context does not carry the connection's values")
	}
	done1 := ctx1.Done()
	select {
	case <-done1:
		t.Fatal("Done of a running request is closed")
	default:
	}

	var ran, removed atomic.Int32
	id, ok := s.add(ctx1.gen, func() { removed.Add(1) }, false)
	if !ok || !s.remove(id) || s.remove(id) {
		t.Fatal("a pending hook could not be removed exactly once")
	}
	id, _ = s.add(ctx1.gen, func() { ran.Add(1) }, false)
	s.end(ctx1.gen)
	s.end(ctx1.gen)
	if ran.Load() != 1 || removed.Load() != 0 {
		t.Fatalf("ran %d times (want 1), removed hook ran %d times", ran.Load(), removed.Load())
	}
	if s.remove(id) {
		t.Fatal("remove of a hook that ran reported it had not")
	}
	waitDone(t, done1, "closing the Done channel taken before the end")
	waitDone(t, ctx1.Done(), "a closed Done after the end")
	if !errors.Is(ctx1.Err(), context.Canceled) || !errors.Is(context.Cause(ctx1), context.Canceled) {
		t.Fatalf("ended request: Err %v, Cause %v", ctx1.Err(), context.Cause(ctx1))
	}
	if _, ok := s.add(ctx1.gen, func() {}, false); ok {
		t.Fatal("a hook was taken after the request ended")
	}

	// The next request: an old generation's end, or a stale remove, does
	// not touch it, and the old context stays canceled.
	ctx2 := s.begin()
	var ran2 atomic.Int32
	id2, ok := s.add(ctx2.gen, func() { ran2.Add(1) }, false)
	if !ok {
		t.Fatal("refused for the next request")
	}
	s.end(ctx1.gen)
	if s.remove(id) || ran2.Load() != 0 || ctx2.Err() != nil {
		t.Fatal("the previous request reached the next one")
	}
	if ctx1.Err() == nil {
		t.Fatal("the previous request's context came back to life")
	}
	s.endCurrent()
	if ran2.Load() != 1 || s.remove(id2) || ctx2.Err() == nil {
		t.Fatalf("endCurrent: ran %d times, err %v", ran2.Load(), ctx2.Err())
	}

	// The connection's context ending ends the request being served, and
	// a request begun after that starts ended.
	ctx3 := s.begin()
	stop := context.AfterFunc(parent, s.endCurrent)
	defer stop()
	cancelParent()
	waitDone(t, ctx3.Done(), "ending the request with its connection")
	if ctx4 := s.begin(); ctx4.Err() == nil {
		t.Fatal("a request begun on an ended connection is not done")
	}
}

// TestReqContextAfterFunc: context.AfterFunc and derived contexts register
// with the scope (no goroutine waiting on Done) and are told of the end.
func TestReqContextAfterFunc(t *testing.T) {
	s := newScope(context.Background())
	ctx := s.begin()

	stopped := make(chan struct{})
	stop := context.AfterFunc(ctx, func() { close(stopped) })
	if !stop() {
		t.Fatal("stop of a pending AfterFunc reported it had run")
	}
	ran := make(chan struct{})
	context.AfterFunc(ctx, func() { close(ran) })
	derived, cancel := context.WithTimeout(ctx, time.Hour) // a route timeout on top
	defer cancel()
	if n := len(s.fns); n != 2 {
		t.Fatalf("%d functions registered with the scope, want 2 (AfterFunc and the derived context)", n)
	}
	s.end(ctx.gen)
	waitDone(t, ran, "AfterFunc at the end")
	waitDone(t, derived.Done(), "canceling the derived context")
	select {
	case <-stopped:
		t.Fatal("a stopped AfterFunc ran")
	default:
	}

	// On an ended request, AfterFunc runs at once.
	late := make(chan struct{})
	if context.AfterFunc(ctx, func() { close(late) })() {
		t.Fatal("stop of an AfterFunc on an ended request reported it had not run")
	}
	waitDone(t, late, "AfterFunc on an ended request")
}

// TestCtxWatch: through the scope for a request's context, through
// context.AfterFunc for any other, with the same answers from end.
func TestCtxWatch(t *testing.T) {
	s := newScope(context.Background())
	reqCtx := s.begin()
	other, cancelOther := context.WithTimeout(reqCtx, time.Hour)

	for _, tc := range []struct {
		name   string
		ctx    context.Context
		scoped bool
		cancel func()
	}{
		{"derived context", other, false, cancelOther},
		{"request's context", reqCtx, true, func() { s.end(reqCtx.gen) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w ctxWatch
			w.start(tc.ctx, func() {})
			if got := w.scope != nil; got != tc.scoped {
				t.Fatalf("through the scope: %v, want %v", got, tc.scoped)
			}
			if !w.end() {
				t.Fatal("end before the context ended reported the function ran")
			}
			ran := make(chan struct{})
			w.start(tc.ctx, func() { close(ran) })
			tc.cancel()
			waitDone(t, ran, "the function running when the context ended")
			if w.end() {
				t.Fatal("end after the function ran reported it had not")
			}
		})
	}
}
