package hbone

import (
	"testing"
	"time"
)

func closedWithin(ch <-chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

// One deadline moved around as net/http moves a connection's: it passes
// when its time comes, not when an earlier setting's would have.
func TestDeadlineRearmed(t *testing.T) {
	var d deadline
	if d.wait() != nil || d.exceeded() {
		t.Fatal("a deadline never set must block forever")
	}
	d.set(time.Now().Add(20 * time.Millisecond))
	if !closedWithin(d.wait(), 10*time.Second) || !d.exceeded() {
		t.Fatal("deadline did not pass")
	}
	d.set(time.Time{})
	if d.wait() != nil || d.exceeded() {
		t.Fatal("cleared deadline still exceeded")
	}
	// Moved later before it fires: the earlier time does not count.
	d.set(time.Now().Add(10 * time.Millisecond))
	d.set(time.Now().Add(time.Hour))
	if closedWithin(d.wait(), 100*time.Millisecond) {
		t.Fatal("deadline passed at the time it was moved away from")
	}
	// Moved earlier: passes at the new time.
	d.set(time.Now().Add(20 * time.Millisecond))
	if !closedWithin(d.wait(), 10*time.Second) {
		t.Fatal("deadline moved earlier did not pass")
	}
	d.set(time.Now().Add(-time.Second))
	if !d.exceeded() {
		t.Fatal("a deadline in the past must have passed")
	}
	// A firing of an earlier setting that runs after the deadline moved
	// later (the timer could not be stopped in time) changes nothing.
	d.set(time.Now().Add(time.Hour))
	d.expire()
	if d.exceeded() {
		t.Fatal("a stale firing closed a deadline an hour away")
	}
	// Racing for real: a firing due now against a move to later.
	for range 200 {
		d.set(time.Now().Add(time.Millisecond))
		for start := time.Now(); time.Since(start) < time.Millisecond; {
		}
		d.set(time.Now().Add(time.Hour))
		if closedWithin(d.wait(), time.Millisecond) || d.exceeded() {
			t.Fatal("a deadline an hour away passed")
		}
	}
}
