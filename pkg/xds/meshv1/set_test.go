package meshv1

import (
	"testing"

	"google.golang.org/protobuf/proto"
)

// Every type URL has its map in a Set; Patch makes a new map and leaves
// the old one, which readers may share, as it was.
func TestSetPatch(t *testing.T) {
	old := NewSet()
	for _, typeURL := range TypeURLs {
		if m := old.Messages(typeURL); m == nil || len(m) != 0 {
			t.Fatalf("%s: NewSet holds %v, want an empty map", typeURL, m)
		}
		res, err := NewResource(typeURL)
		if err != nil {
			t.Fatal(err)
		}
		s := old
		s.Patch(typeURL, map[string]proto.Message{"a": res, "b": res}, nil)
		s.Patch(typeURL, nil, []string{"b"})
		if got, ok := s.Get(typeURL, "a"); !ok || got != res {
			t.Errorf("%s: Get(a) = %v, %v after Patch", typeURL, got, ok)
		}
		if _, ok := s.Get(typeURL, "b"); ok {
			t.Errorf("%s: b still there after its removal", typeURL)
		}
		if n := len(old.Messages(typeURL)); n != 0 {
			t.Errorf("%s: Patch changed the old map (%d resources)", typeURL, n)
		}
	}
	if _, ok := old.Get("type.googleapis.com/unknown", "a"); ok {
		t.Error("Get found a resource of an unknown type")
	}
}
