package hbone

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"
)

// Quiet relays share one idle clock: each is cut once nothing moved for
// its idle time, never before, one that keeps sending is not cut, and the
// clock holds none of them once they ended.
func TestIdleClockCutsQuietRelays(t *testing.T) {
	const (
		quiet = 20
		idle  = 200 * time.Millisecond
	)
	m := newMesh(t)
	type result struct {
		err     error
		elapsed time.Duration
	}
	results := make(chan result, quiet+1)
	h := HandlerFunc(func(ctx context.Context, r *Request) (Stream, error) {
		a, b := tcpPair(t)
		if r.Authority.Port() == 1 {
			go ticks(b, 4*idle, idle/5) // busy for 4 idle periods, then ends
		} else {
			go func() { io.Copy(io.Discard, b); b.Close() }()
		}
		start := time.Now()
		return RelayTo(a, idle, func(_, _ int64, err error) {
			results <- result{err, time.Since(start)}
		}), nil
	})
	_, addr := startServer(t, m, h, nil)
	p := newPool(t, m, nil)

	busy := dialTunnel(t, p, m.target(addr, "127.0.0.1:1"))
	defer busy.Close()
	for range quiet {
		tn := dialTunnel(t, p, m.target(addr, "127.0.0.1:2"))
		defer tn.Close()
	}
	busy.SetReadDeadline(time.Now().Add(30 * time.Second))
	if got, err := io.ReadAll(busy); err != nil || len(got) == 0 {
		t.Fatalf("busy tunnel: %d bytes, %v", len(got), err)
	}
	busy.Close()
	for range quiet + 1 {
		select {
		case r := <-results:
			switch {
			case r.err == nil:
				// The busy pair, ended by both sides after 4 idle periods.
				if r.elapsed < 3*idle {
					t.Errorf("busy pair ended after %s", r.elapsed)
				}
			case !errors.Is(r.err, ErrIdle):
				t.Errorf("quiet pair ended with %v, want ErrIdle", r.err)
			case r.elapsed < idle:
				t.Errorf("quiet pair cut after %s, before its idle time %s", r.elapsed, idle)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a pair never ended")
		}
	}
	k := relayIdleClock
	k.mu.Lock()
	defer k.mu.Unlock()
	if n := len(k.slots); n != 0 {
		t.Errorf("the idle clock holds %d slots of ended relays", n)
	}
}
