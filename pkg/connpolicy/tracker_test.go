package connpolicy

import (
	"context"
	"testing"

	"go.uber.org/zap"

	"github.com/causeway-mesh/causeway/pkg/shrinkmap"
)

// After a burst the tracker's map is rebuilt at the size in use, and the
// connections still open stay tracked: a re-check still sees each of them.
func TestTrackerShrinksAfterABurst(t *testing.T) {
	tr := NewTracker(nil)
	ctx := context.Background()
	allow := func(context.Context) (Verdict, error) { return Verdict{Allowed: true}, nil }
	fresh := func() bool { return false }
	const burst, kept = 5000, 10
	untrack := make([]func(), burst)
	for i := range untrack {
		_, untrack[i] = tr.Track(ctx, allow, fresh, func() {}, func() []zap.Field { return nil })
	}
	if tr.conns.Peak() != burst {
		t.Fatalf("peak %d after %d connections", tr.conns.Peak(), burst)
	}
	for _, u := range untrack[kept:] {
		u()
	}
	if tr.conns.Peak() >= burst/shrinkmap.ShrinkBelow || tr.conns.Peak() < kept {
		t.Fatalf("peak %d with %d connections left: the map was not rebuilt", tr.conns.Peak(), kept)
	}
	if checked, closed := tr.RecheckAll(ctx); checked != kept || closed != 0 {
		t.Fatalf("re-check saw %d connections and closed %d, want %d and 0", checked, closed, kept)
	}
	for _, u := range untrack[:kept] {
		u()
	}
	if checked, _ := tr.RecheckAll(ctx); checked != 0 {
		t.Fatalf("re-check saw %d connections after all ended", checked)
	}
}
