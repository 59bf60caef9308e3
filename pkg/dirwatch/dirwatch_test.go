package dirwatch

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// start runs Run on dirs and returns the channel of its reloads' times,
// after the initial reload.
func start(t *testing.T, dirs func() map[string]bool, debounce, rescan time.Duration) <-chan time.Time {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	reloads := make(chan time.Time, 100)
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(ctx, Options{Dirs: dirs, Debounce: debounce, Rescan: rescan,
			Reload: func(at time.Time) {
				select {
				case reloads <- at:
				case <-ctx.Done():
				}
			}})
	}()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-reloads:
	case <-time.After(5 * time.Second):
		t.Fatal("no initial reload")
	}
	return reloads
}

func only(dirs ...string) func() map[string]bool {
	return func() map[string]bool {
		set := map[string]bool{}
		for _, d := range dirs {
			set[d] = true
		}
		return set
	}
}

func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func next(t *testing.T, reloads <-chan time.Time, within time.Duration) time.Time {
	t.Helper()
	select {
	case at := <-reloads:
		return at
	case <-time.After(within):
		t.Fatalf("no reload within %v", within)
		return time.Time{}
	}
}

func none(t *testing.T, reloads <-chan time.Time, during time.Duration) {
	t.Helper()
	select {
	case at := <-reloads:
		t.Fatalf("unexpected reload (first event at %v)", at)
	case <-time.After(during):
	}
}

func TestEventReloadsOnceAfterDebounce(t *testing.T) {
	dir := t.TempDir()
	const debounce = 100 * time.Millisecond
	reloads := start(t, only(dir), debounce, 0)
	before := time.Now()
	write(t, filepath.Join(dir, "a.yaml"), "a") // create + write: two events
	next(t, reloads, 5*time.Second)
	if waited := time.Since(before); waited < debounce {
		t.Fatalf("reloaded %v after the change, before the %v debounce", waited, debounce)
	}
	none(t, reloads, 3*debounce)
}

func TestBurstIsOneReloadAtItsFirstEvent(t *testing.T) {
	dir := t.TempDir()
	reloads := start(t, only(dir), 200*time.Millisecond, 0)
	before := time.Now()
	write(t, filepath.Join(dir, "a.yaml"), "a")
	var lastWrite time.Time
	for i := range 5 {
		time.Sleep(30 * time.Millisecond)
		lastWrite = time.Now()
		write(t, filepath.Join(dir, "a.yaml"), string(rune('b'+i)))
	}
	// The watcher sees the first event a little after its write, but long
	// before the last write.
	at := next(t, reloads, 5*time.Second)
	if at.Before(before) || !at.Before(lastWrite) {
		t.Fatalf("reload's change time %v is not the first event's (after %v, before the last write at %v)", at, before, lastWrite)
	}
	none(t, reloads, 600*time.Millisecond)
}

func TestSteadyStreamIsCapped(t *testing.T) {
	dir := t.TempDir()
	const debounce = 50 * time.Millisecond // events every 10ms never leave it quiet
	reloads := start(t, only(dir), debounce, 0)
	stop := time.Now().Add(40 * maxWaitFactor * debounce)
	for i := 0; time.Now().Before(stop); i++ {
		write(t, filepath.Join(dir, "a.yaml"), string(rune('a'+i%26)))
		select {
		case <-reloads:
			return // reloaded while the stream still ran
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("a steady stream postponed the reload for %v", 40*maxWaitFactor*debounce)
}

func TestRecreatedDirectoryIsWatchedAgain(t *testing.T) {
	root := t.TempDir()
	sub := filepath.Join(root, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	reloads := start(t, only(root, sub), 100*time.Millisecond, 0)
	// Removed and back within one debounce: the wanted set never changes,
	// only the kernel's watch on the old directory is gone.
	if err := os.Remove(sub); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	next(t, reloads, 5*time.Second)
	none(t, reloads, 300*time.Millisecond)
	write(t, filepath.Join(sub, "a.yaml"), "a")
	next(t, reloads, 5*time.Second)
}

func TestChmodIsNoChange(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "a.yaml")
	write(t, p, "a")
	reloads := start(t, only(dir), 50*time.Millisecond, 0)
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	none(t, reloads, 500*time.Millisecond)
	write(t, p, "b") // the watch works
	next(t, reloads, 5*time.Second)
}

func TestRescanCatchesChangeWithoutEvents(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "a.yaml")
	write(t, p, "old")
	ctx, cancel := context.WithCancel(context.Background())
	seen := make(chan string, 100)
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Nothing watched: only the rescan can notice.
		Run(ctx, Options{Dirs: only(), Debounce: time.Hour, Rescan: 50 * time.Millisecond,
			Reload: func(time.Time) {
				b, _ := os.ReadFile(p)
				select {
				case seen <- string(b):
				case <-ctx.Done():
				}
			}})
	}()
	defer func() { cancel(); <-done }()
	if got := <-seen; got != "old" {
		t.Fatalf("initial reload read %q", got)
	}
	write(t, p, "new")
	deadline := time.After(5 * time.Second)
	for {
		select {
		case got := <-seen:
			if got == "new" {
				return
			}
		case <-deadline:
			t.Fatal("rescan did not read the change")
		}
	}
}
