package h1

import (
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// FuzzFieldList runs the same operations on a Fields and an http.Header
// and holds the two to the same contents after each: the header rules run
// on lists where they used to run on maps.
func FuzzFieldList(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11})
	f.Add([]byte{0x10, 0x21, 0x12, 0x33, 0x04, 0x45, 0x16, 0x27})
	names := []string{"Accept", "Connection", "Te", "X-A", "X-B", "X-Causeway-Source-Principal"} // the last: the waypoint's identity header
	f.Fuzz(func(t *testing.T, ops []byte) {
		var l Fields
		h := http.Header{}
		for i, op := range ops {
			k := names[int(op>>4)%len(names)]
			vv := []string{strings.Repeat("v", i%3)}
			switch op % 4 {
			case 0, 1:
				l.Set(k, vv)
				h[k] = vv
			case 2:
				l.Del(k)
				delete(h, k)
			case 3:
				drop := func(name string) bool { return len(name)%2 == int(op>>4)%2 }
				l.DeleteFunc(drop)
				maps.DeleteFunc(h, func(name string, _ []string) bool { return drop(name) })
			}
			if got := l.Header(); !reflect.DeepEqual(got, h) {
				t.Fatalf("after %d operations: list %v, map %v", i+1, got, h)
			}
			for _, k := range names {
				if l.Has(k) != (h[k] != nil) || !slices.Equal(l.Get(k), h[k]) || l.First(k) != h.Get(k) {
					t.Fatalf("after %d operations, %s: list %v, map %v", i+1, k, l.Get(k), h[k])
				}
			}
		}
		sorted := FieldsOf(h)
		if !slices.IsSortedFunc(sorted, func(a, b Field) int { return strings.Compare(a.Name, b.Name) }) || !reflect.DeepEqual(sorted.Header(), h) {
			t.Fatalf("FieldsOf(%v) = %v", h, sorted)
		}
		l.Sort()
		if !slices.EqualFunc(l, sorted, func(a, b Field) bool { return a.Name == b.Name && slices.Equal(a.Values, b.Values) }) {
			t.Fatalf("sorted list %v, want %v", l, sorted)
		}
	})
}
