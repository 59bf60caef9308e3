package readlimit

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLimits(t *testing.T) {
	for _, tc := range []struct {
		in    string
		limit int64
		ok    bool
	}{
		{"", 0, true},
		{"abc", 3, true},
		{"abcd", 3, false},
		{"a", 0, false},
	} {
		data, err := All(strings.NewReader(tc.in), tc.limit)
		switch {
		case tc.ok && (err != nil || string(data) != tc.in):
			t.Errorf("%q limit %d: %q, %v", tc.in, tc.limit, data, err)
		case !tc.ok && (!errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "larger than")):
			t.Errorf("%q limit %d: %v, want too large", tc.in, tc.limit, err)
		}
	}
}

// An endless input is cut after limit+1 bytes.
func TestEndlessInput(t *testing.T) {
	if _, err := File("/dev/zero", 1<<10); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("/dev/zero: %v", err)
	}
}

func TestFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte("0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	if data, err := File(p, 10); err != nil || string(data) != "0123456789" {
		t.Fatalf("File: %q, %v", data, err)
	}
	if _, err := File(p, 9); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("File over the limit: %v", err)
	}
	if _, err := File(filepath.Join(t.TempDir(), "missing"), 9); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}
