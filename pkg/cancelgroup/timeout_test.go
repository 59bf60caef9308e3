package cancelgroup

import (
	"context"
	"errors"
	"testing"
	"time"
)

// noDone is a Context whose Done must not be asked for: WithTimeout
// registers through AfterFunc.
type noDone struct {
	*Context
	t *testing.T
}

func (n noDone) Done() <-chan struct{} {
	n.t.Error("WithTimeout asked its parent for Done")
	return n.Context.Done()
}

// waitDone fails t unless ctx ends within 5 s.
func waitDone(t *testing.T, ctx context.Context, what string) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal(what)
	}
}

func registrations(c *Context) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.funcs.Len()
}

func TestWithTimeout(t *testing.T) {
	t.Run("expires", func(t *testing.T) {
		parent, cancel := New()
		defer cancel()
		ctx, stop := WithTimeout(noDone{parent, t}, 20*time.Millisecond)
		defer stop()
		waitDone(t, ctx, "not done after its timeout")
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			t.Errorf("Err = %v, want DeadlineExceeded", ctx.Err())
		}
		if n := registrations(parent); n != 0 {
			t.Errorf("expired child left %d registrations in its parent", n)
		}
	})
	t.Run("parent ends", func(t *testing.T) {
		parent, cancel := New()
		ctx, stop := WithTimeout(noDone{parent, t}, time.Hour)
		defer stop()
		if d, ok := ctx.Deadline(); !ok || time.Until(d) < 59*time.Minute {
			t.Errorf("Deadline = %v, %v; want an hour from now", d, ok)
		}
		cancel()
		waitDone(t, ctx, "not done after its parent ended")
		if !errors.Is(ctx.Err(), context.Canceled) {
			t.Errorf("Err = %v, want Canceled", ctx.Err())
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		parent, cancel := New()
		defer cancel()
		ctx, stop := WithTimeout(noDone{parent, t}, time.Hour)
		if n := registrations(parent); n != 1 {
			t.Fatalf("%d registrations in the parent, want 1", n)
		}
		stop()
		stop() // twice is fine
		if !errors.Is(ctx.Err(), context.Canceled) {
			t.Errorf("Err = %v, want Canceled", ctx.Err())
		}
		if n := registrations(parent); n != 0 {
			t.Errorf("cancelled child left %d registrations in its parent", n)
		}
	})
	t.Run("parent already ended", func(t *testing.T) {
		parent, cancel := New()
		cancel()
		ctx, stop := WithTimeout(noDone{parent, t}, time.Hour)
		defer stop()
		waitDone(t, ctx, "not done under an ended parent")
	})
	t.Run("earlier parent deadline", func(t *testing.T) {
		parent, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		ctx, stop := WithTimeout(parent, time.Hour) // no AfterFunc: the standard one
		defer stop()
		<-ctx.Done()
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			t.Errorf("Err = %v, want DeadlineExceeded", ctx.Err())
		}
	})
}
