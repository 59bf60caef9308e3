package shrinkmap

import (
	"runtime"
	"testing"
)

// After a burst the map is rebuilt at the size in use, keeping every entry
// still in it; below ShrinkMin it is left alone.
func TestShrinksAfterABurst(t *testing.T) {
	var m Map[int, int]
	const burst, kept = 5000, 10
	for i := range burst {
		m.Set(i, i*2)
	}
	if m.Peak() != burst || m.Len() != burst {
		t.Fatalf("peak %d, len %d after %d entries", m.Peak(), m.Len(), burst)
	}
	for i := kept; i < burst; i++ {
		m.Delete(i)
	}
	if m.Peak() >= burst/ShrinkBelow || m.Peak() < kept {
		t.Fatalf("peak %d with %d entries left: the map was not rebuilt", m.Peak(), kept)
	}
	n := 0
	for k := range m.Keys() {
		if v, ok := m.Get(k); !ok || v != k*2 || k >= kept {
			t.Fatalf("entry %d = %d, %v after the rebuild", k, v, ok)
		}
		n++
	}
	if n != kept || m.Len() != kept {
		t.Fatalf("%d entries (Len %d) after the rebuild, want %d", n, m.Len(), kept)
	}

	var small Map[int, int]
	for i := range ShrinkMin - 1 {
		small.Set(i, i)
	}
	for i := 1; i < ShrinkMin-1; i++ {
		small.Delete(i)
	}
	if small.Peak() != ShrinkMin-1 {
		t.Fatalf("a map below ShrinkMin was rebuilt: peak %d", small.Peak())
	}
}

// The rebuild gives the memory back: a map that held 100,000 entries and
// now holds 10 costs what a map of 10 does, once collected.
func TestBurstMemoryReturns(t *testing.T) {
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	var m Map[uint64, *int]
	before := heap()
	const burst = 100_000
	for i := range uint64(burst) {
		m.Set(i, nil)
	}
	peak := heap()
	for i := uint64(10); i < burst; i++ {
		m.Delete(i)
	}
	after := heap()
	if grown := peak - before; grown < burst*16 {
		t.Fatalf("the burst took %d bytes of heap, less than its keys and values", grown)
	}
	if left := int64(after) - int64(before); left > burst*16/10 {
		t.Fatalf("%d bytes still held after the burst (%d at its peak)", left, peak-before)
	}
	runtime.KeepAlive(&m)
}
