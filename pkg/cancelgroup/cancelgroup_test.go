package cancelgroup

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/pkg/shrinkmap"
)

// Cancelling runs every registration not stopped, once, and ends contexts
// derived before and after; registrations after the end run at once.
func TestCancelRunsRegistrations(t *testing.T) {
	c, cancel := New()
	const n = 3000
	var ran atomic.Int64
	done := make(chan struct{}, n)
	stops := make([]func() bool, n)
	for i := range stops {
		stops[i] = context.AfterFunc(c, func() { ran.Add(1); done <- struct{}{} })
	}
	for _, stop := range stops[:n/2] {
		if !stop() {
			t.Fatal("stop before the end reported false")
		}
	}
	if stops[0]() {
		t.Fatal("a second stop reported true")
	}
	child, childCancel := context.WithTimeout(c, time.Hour)
	defer childCancel()
	if c.Err() != nil || child.Err() != nil {
		t.Fatal("done before cancel")
	}
	cancel()
	cancel() // a second cancel does nothing
	for range n - n/2 {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of %d registrations ran", ran.Load(), n-n/2)
		}
	}
	select {
	case <-child.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a derived context did not end")
	}
	if !errors.Is(c.Err(), context.Canceled) || !errors.Is(child.Err(), context.Canceled) {
		t.Fatalf("Err %v, child's %v", c.Err(), child.Err())
	}
	late := make(chan struct{})
	context.AfterFunc(c, func() { close(late) })
	select {
	case <-late:
	case <-time.After(10 * time.Second):
		t.Fatal("a registration after the end did not run")
	}
	time.Sleep(50 * time.Millisecond)
	if got := ran.Load(); got != n-n/2 {
		t.Fatalf("%d registrations ran, want %d", got, n-n/2)
	}
}

// After a burst of registrations that ended, the map is back at the size in use.
func TestRegistrationsGiveBackABurst(t *testing.T) {
	c, cancel := New()
	defer cancel()
	stops := make([]func() bool, 5000)
	for i := range stops {
		stops[i] = c.AfterFunc(func() {})
	}
	for _, stop := range stops[10:] {
		stop()
	}
	if p := c.funcs.Peak(); p >= len(stops)/shrinkmap.ShrinkBelow {
		t.Fatalf("peak %d with 10 registrations left", p)
	}
}
