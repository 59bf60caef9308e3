package fortioload

import (
	"testing"
	"time"
)

func TestQuantilesAreNearestRank(t *testing.T) {
	r := &recorder{}
	for i := 1000; i >= 1; i-- { // out of order: result sorts
		r.Report(t.Context(), 0, 0, time.Time{}, float64(i)/1e6, true, "")
	}
	p := r.result()
	for _, c := range []struct{ q, wantMS float64 }{{0.5, 0.5}, {0.9, 0.9}, {0.99, 0.99}, {0.999, 0.999}, {1, 1}} {
		if got := p.MS(c.q); got < c.wantMS-1e-9 || got > c.wantMS+1e-9 {
			t.Errorf("q%g = %g ms, want %g", c.q, got, c.wantMS)
		}
	}
	if got := (Result{}).MS(0.5); got != 0 {
		t.Errorf("no requests: %g ms, want 0", got)
	}
}

func TestMedian(t *testing.T) {
	if got := Median([]float64{3, 1, 2}); got != 2 {
		t.Errorf("median of 3 = %g, want 2", got)
	}
	if got := Median([]float64{4, 1, 2, 3}); got != 2.5 {
		t.Errorf("median of 4 = %g, want 2.5", got)
	}
}
