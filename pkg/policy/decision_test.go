package policy

import (
	"regexp"
	"testing"
)

// Decision ids are version-4 UUIDs, and distinct.
func TestDecisionIDs(t *testing.T) {
	uuid4 := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for range 100000 {
		id := newDecisionID()
		if !uuid4.MatchString(id) {
			t.Fatalf("id %q is not a version-4 UUID", id)
		}
		if seen[id] {
			t.Fatalf("id %q twice", id)
		}
		seen[id] = true
	}
}
