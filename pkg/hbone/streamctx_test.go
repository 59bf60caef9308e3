package hbone

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"
)

// A server stream's context ends when the client resets the tunnel: its
// Done closes, Err says Canceled, contexts derived from it (before and
// after) end too, and an AfterFunc runs unless stopped first.
func TestStreamContextEndsWithTheStream(t *testing.T) {
	m := newMesh(t)
	type seen struct {
		openErr, serveErr error
		child             context.Context
		cancelChild       context.CancelFunc
		stopped           bool
		ran, stoppedRan   chan struct{}
		serveCtx          context.Context
	}
	s := seen{ran: make(chan struct{}), stoppedRan: make(chan struct{})}
	serving := make(chan struct{})
	h := HandlerFunc(func(ctx context.Context, r *Request) (Stream, error) {
		s.openErr = ctx.Err()
		// As a handler bounds its connect: derived, then cancelled.
		dctx, cancel := context.WithTimeout(ctx, time.Hour)
		cancel()
		if dctx.Err() == nil {
			return nil, errors.New("derived context not cancelled")
		}
		return StreamFunc(func(ctx context.Context, tunnel net.Conn) {
			s.serveCtx = ctx
			s.serveErr = ctx.Err()
			s.child, s.cancelChild = context.WithTimeout(ctx, time.Hour)
			context.AfterFunc(ctx, func() { close(s.ran) })
			stop := context.AfterFunc(ctx, func() { close(s.stoppedRan) })
			s.stopped = stop()
			close(serving)
			<-ctx.Done()
		}), nil
	})
	_, addr := startServer(t, m, h, nil)
	p := newPool(t, m, nil)
	c := dialTunnel(t, p, m.target(addr, "127.0.0.1:9"))
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-serving:
	case <-time.After(10 * time.Second):
		t.Fatal("the tunnel was not served")
	}
	defer s.cancelChild()
	if s.openErr != nil || s.serveErr != nil || !s.stopped {
		t.Fatalf("before the end: Open's ctx.Err %v, Serve's %v, AfterFunc stopped %v", s.openErr, s.serveErr, s.stopped)
	}
	c.Close() // resets the stream (our direction still open)
	select {
	case <-s.child.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a context derived from the stream's did not end with it")
	}
	select {
	case <-s.ran:
	case <-time.After(10 * time.Second):
		t.Fatal("AfterFunc did not run when the stream ended")
	}
	select {
	case <-s.stoppedRan:
		t.Fatal("a stopped AfterFunc ran")
	case <-time.After(50 * time.Millisecond):
	}
	if err := s.serveCtx.Err(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Err after the end: %v", err)
	}
	late, cancel := context.WithCancel(s.serveCtx)
	defer cancel()
	if late.Err() == nil {
		t.Fatal("a context derived after the end is not done")
	}
}
