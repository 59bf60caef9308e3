// Package shrinkmap holds a map that gives back the room of its peak.
//
// A Go map keeps the room of its largest size after its entries are
// deleted. A process that holds a map entry per open connection (tracked
// connections, relays parked in a poller) would so keep a burst's memory
// for good; Map copies itself into one of the size in use once it holds a
// ShrinkBelow-th of its peak (of at least ShrinkMin entries). Each copy
// follows at least peak*3/4 deletions, so its cost is amortized.
package shrinkmap

import "iter"

const (
	// ShrinkBelow: the map is rebuilt once it holds less than its peak
	// divided by ShrinkBelow...
	ShrinkBelow = 4
	// ... of a peak of at least ShrinkMin entries (smaller maps keep
	// their room).
	ShrinkMin = 1024
)

// Map is a map from K to V; the zero Map is empty and ready to use. It is
// not safe for concurrent use.
type Map[K comparable, V any] struct {
	m    map[K]V
	peak int // most entries m held since it was built
}

// Set maps k to v.
func (m *Map[K, V]) Set(k K, v V) {
	if m.m == nil {
		m.m = map[K]V{}
	}
	m.m[k] = v
	m.peak = max(m.peak, len(m.m))
}

// Get returns k's value and whether k is in the map.
func (m *Map[K, V]) Get(k K) (V, bool) {
	v, ok := m.m[k]
	return v, ok
}

// Delete removes k, rebuilding the map at the size in use after a burst.
func (m *Map[K, V]) Delete(k K) {
	delete(m.m, k)
	if m.peak >= ShrinkMin && len(m.m) < m.peak/ShrinkBelow {
		fresh := make(map[K]V, len(m.m))
		for k, v := range m.m {
			fresh[k] = v
		}
		m.m, m.peak = fresh, len(fresh)
	}
}

// Len is the number of entries.
func (m *Map[K, V]) Len() int { return len(m.m) }

// Peak is the most entries the map held since it was last rebuilt: the
// room it keeps.
func (m *Map[K, V]) Peak() int { return m.peak }

// Keys iterates over the keys, in no particular order.
func (m *Map[K, V]) Keys() iter.Seq[K] {
	return func(yield func(K) bool) {
		for k := range m.m {
			if !yield(k) {
				return
			}
		}
	}
}
