package atomicfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"
)

func TestReplace(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "10-mesh.conflist")
	if err := os.WriteFile(p, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Replace(p, strings.NewReader("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	checkFile(t, p, "new", 0o644)
	checkOnly(t, dir, "10-mesh.conflist")
}

func TestCreate(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "ca-key.pem")
	if err := Create(p, []byte("first"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := Create(p, []byte("second"), 0o600)
	if !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second Create: %v, want fs.ErrExist", err)
	}
	checkFile(t, p, "first", 0o600)
	checkOnly(t, dir, "ca-key.pem")
}

// A write that fails leaves the target as it was and no temporary file.
func TestFailedWriteLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "plugin")
	if err := os.WriteFile(p, []byte("old"), 0o755); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if err := Replace(p, iotest.ErrReader(boom), 0o755); !errors.Is(err, boom) {
		t.Fatalf("Replace: %v, want %v", err, boom)
	}
	checkFile(t, p, "old", 0o755)
	checkOnly(t, dir, "plugin")
}

func checkFile(t *testing.T, p, content string, mode fs.FileMode) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != content {
		t.Errorf("%s holds %q, want %q", p, b, content)
	}
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != mode {
		t.Errorf("%s has mode %v, want %v", p, fi.Mode().Perm(), mode)
	}
}

func checkOnly(t *testing.T, dir, name string) {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 1 || es[0].Name() != name {
		var names []string
		for _, e := range es {
			names = append(names, e.Name())
		}
		t.Errorf("%s holds %v, want only %s", dir, names, name)
	}
}
