package xds

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"testing"
)

// A versionSet reads as the plain map it stands for through a random run
// of updates and removals (empty versions included), across compactions,
// and an older set keeps reading as it did: States share them.
func TestVersionSetIsAnImmutableMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	type snapshot struct {
		set  versionSet
		want map[string]string
	}
	var history []snapshot
	var v versionSet
	want := map[string]string{}
	for step := range 1500 {
		updated := map[string]string{}
		var removed []string
		for range 1 + rng.IntN(8) {
			name := fmt.Sprintf("r%d", rng.IntN(400))
			if rng.IntN(3) == 0 {
				removed = append(removed, name)
				delete(updated, name)
			} else {
				updated[name] = []string{"", "a", "b", fmt.Sprint(step)}[rng.IntN(4)]
			}
		}
		v = v.with(updated, removed)
		for _, name := range removed {
			delete(want, name)
		}
		maps.Copy(want, updated)
		history = append(history, snapshot{v, maps.Clone(want)})
		if step%97 == 0 {
			for i, h := range history {
				if got := h.set.all(); !maps.Equal(got, h.want) || h.set.n != len(h.want) {
					t.Fatalf("step %d, set of step %d: all = %v (n %d), want %v", step, i, got, h.set.n, h.want)
				}
				for name, ver := range h.want {
					if got, ok := h.set.get(name); !ok || got != ver {
						t.Fatalf("step %d, set of step %d: get(%s) = %q %v, want %q", step, i, name, got, ok, ver)
					}
				}
				if _, ok := h.set.get("absent"); ok {
					t.Fatalf("step %d: holds a name never given", step)
				}
			}
			history = history[max(0, len(history)-10):]
		}
	}
	if len(v.base) == 0 {
		t.Fatal("never compacted")
	}
}
