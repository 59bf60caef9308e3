package reconnect

import (
	"testing"
	"time"
)

// Waits double from Initial to Max, each in [b/2, b]; Reset starts over.
func TestBackoff(t *testing.T) {
	b := Backoff{Initial: 100 * time.Millisecond, Max: 800 * time.Millisecond}
	for round := range 2 {
		for k, want := range []time.Duration{100, 200, 400, 800, 800, 800} {
			want *= time.Millisecond
			if got := b.Next(); got < want/2 || got > want {
				t.Fatalf("round %d, wait %d: %v, want in [%v, %v]", round, k+1, got, want/2, want)
			}
		}
		b.Reset()
	}
	// Jittered: not every client waits the same.
	seen := map[time.Duration]bool{}
	for range 20 {
		c := Backoff{Initial: time.Second, Max: time.Second}
		seen[c.Next()] = true
	}
	if len(seen) < 2 {
		t.Errorf("20 first waits, all %v", seen)
	}
}
