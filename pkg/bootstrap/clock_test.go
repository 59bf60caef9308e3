package bootstrap

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"
)

// TestOffsetClock: the clock follows the file (absent: no offset), keeps
// its offset while the file is malformed, and refuses to start on one.
func TestOffsetClock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "offset")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c, err := startOffsetClock(ctx, path, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	near := func(want time.Duration) bool {
		d := time.Until(c.Now()) - want
		return d > -time.Minute && d < time.Minute
	}
	follows := func(content string, want time.Duration) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); !near(want); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("after writing %q the clock is %v off, want %v", content, time.Until(c.Now()).Round(time.Second), want)
			}
		}
	}
	if !near(0) {
		t.Fatal("no file: the clock is offset")
	}
	follows("1h\n", time.Hour)
	follows("-90m", -90*time.Minute)
	if err := os.WriteFile(path, []byte("an hour"), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * clockPoll)
	if !near(-90 * time.Minute) {
		t.Fatal("a malformed file changed the offset")
	}
	if _, err := startOffsetClock(ctx, path, zap.NewNop()); err == nil {
		t.Fatal("started on a malformed file")
	}
	follows("", 0)
}
