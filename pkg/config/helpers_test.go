package config

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// translateYAML decodes docs (one origin per element) and translates them.
// Objects the translation refuses are returned as an *InvalidError next to
// the snapshot, so a test of a check can ask for its problem (wantProblem)
// and mustTranslate fails on any refusal.
func translateYAML(t *testing.T, docs ...string) (*Snapshot, error) {
	t.Helper()
	var objs []Object
	var ps problems
	for i, d := range docs {
		o, err := Decode(originName(i), []byte(d))
		if err != nil {
			var inv *InvalidError
			if !errors.As(err, &inv) {
				t.Fatalf("decode: %v", err)
			}
			ps.addAll(inv.Problems)
			continue
		}
		objs = append(objs, o...)
	}
	if err := ps.err(); err != nil {
		return nil, err
	}
	s, err := Translate(objs, Options{})
	if err == nil && len(s.Rejected) > 0 {
		err = &InvalidError{Problems: s.Rejected}
	}
	return s, err
}

// decodeDocs decodes docs (one origin per element), failing on any error.
func decodeDocs(t *testing.T, docs ...string) []Object {
	t.Helper()
	var objs []Object
	for i, d := range docs {
		o, err := Decode(originName(i), []byte(d))
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, o...)
	}
	return objs
}

func originName(i int) string { return "file" + string(rune('0'+i)) + ".yaml" }

func mustTranslate(t *testing.T, docs ...string) *Snapshot {
	t.Helper()
	s, err := translateYAML(t, docs...)
	if err != nil {
		t.Fatalf("translate: %v", err)
	}
	return s
}

// wantProblem asserts that err is an *InvalidError with a problem from
// origin whose reason contains substr.
func wantProblem(t *testing.T, err error, origin, substr string) {
	t.Helper()
	var inv *InvalidError
	if !errors.As(err, &inv) {
		t.Fatalf("want *InvalidError mentioning %q, got %v", substr, err)
	}
	for _, p := range inv.Problems {
		if (origin == "" || p.Origin == origin) && strings.Contains(p.Reason, substr) {
			return
		}
	}
	t.Fatalf("no problem from %q mentioning %q in: %v", origin, substr, err)
}

func assertProto(t *testing.T, what string, want, got proto.Message) {
	t.Helper()
	if !proto.Equal(want, got) {
		t.Errorf("%s:\nwant %s\n got %s", what, protojson.Format(want), protojson.Format(got))
	}
}
