package policy

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func revisionPolicy(tag string) string {
	return `package envoy.authz

allow := {"allowed": true, "headers": {"x-rev": "` + tag + `"}}
`
}

// swapLink points link at target the way git-sync does: a new symlink
// renamed over the old one, so readers see either checkout, never neither.
func swapLink(t testing.TB, target, link string) {
	t.Helper()
	tmp := link + ".tmp"
	_ = os.Remove(tmp)
	if err := os.Symlink(target, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, link); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second) // generous: the machine is shared
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func startEngine(t testing.TB, e *Engine) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = e.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// TestHotReloadUnderLoad swaps git-sync style checkouts and edits files in
// place while requests are being decided: every decision must come from one
// of the valid revisions, and none may fail.
func TestHotReloadUnderLoad(t *testing.T) {
	root := t.TempDir()
	writeFiles(t, filepath.Join(root, "rev1"), map[string]string{"authz.rego": revisionPolicy("a")})
	writeFiles(t, filepath.Join(root, "rev2"), map[string]string{"authz.rego": revisionPolicy("b"), "sub/extra.rego": "package extra\n\nx := 1\n"})
	link := filepath.Join(root, "current")
	swapLink(t, filepath.Join(root, "rev1"), link)

	e, logs := newTestEngine(t, Options{Dir: link, Debounce: 20 * time.Millisecond, RescanInterval: -1})
	startEngine(t, e)
	waitFor(t, "first activation", func() bool { return e.Ready() == nil })
	revA := e.Revision()

	var (
		stop     atomic.Bool
		wg       sync.WaitGroup
		total    atomic.Int64
		failures atomic.Int64
		mu       sync.Mutex
		seen     = map[string]string{} // revision -> x-rev header
		firstBad atomic.Value
	)
	r := request(t, "GET /orders HTTP/1.1\nHost: checkout\n\n")
	for i := 0; i < 4; i++ {
		wg.Go(func() {
			for !stop.Load() {
				d := e.Decide(context.Background(), &Request{HTTP: r})
				total.Add(1)
				if !d.Allowed || d.Status != http.StatusOK {
					failures.Add(1)
					firstBad.CompareAndSwap(nil, d)
					continue
				}
				mu.Lock()
				if prev, ok := seen[d.Revision]; ok && prev != d.Headers.Get("X-Rev") {
					failures.Add(1)
				}
				seen[d.Revision] = d.Headers.Get("X-Rev")
				mu.Unlock()
			}
		})
	}

	swapLink(t, filepath.Join(root, "rev2"), link)
	waitFor(t, "rev2 after symlink swap", func() bool { return e.Revision() != revA })
	revB := e.Revision()

	// An edit inside the new checkout's subdirectory is seen too.
	writeFiles(t, filepath.Join(root, "rev2"), map[string]string{"sub/extra.rego": "package extra\n\nx := 2\n"})
	waitFor(t, "edit in a subdirectory", func() bool { return e.Revision() != revB })
	revC := e.Revision()

	// A broken edit is rejected while requests keep being served.
	writeFiles(t, filepath.Join(root, "rev2"), map[string]string{"sub/extra.rego": "package extra\n\nx := \n"})
	waitFor(t, "rejection of a broken edit", func() bool {
		return logs.FilterMessage("policy rejected, keeping the active policy").Len() > 0
	})

	swapLink(t, filepath.Join(root, "rev1"), link)
	waitFor(t, "back to rev1", func() bool { return e.Revision() == revA })

	stop.Store(true)
	wg.Wait()
	if failures.Load() != 0 {
		t.Fatalf("%d of %d decisions failed during reloads; first: %+v", failures.Load(), total.Load(), firstBad.Load())
	}
	if total.Load() == 0 {
		t.Fatal("no decisions were made")
	}
	for rev, tag := range seen {
		switch {
		case rev == revA && tag == "a", (rev == revB || rev == revC) && tag == "b":
		default:
			t.Errorf("revision %s answered x-rev %q", rev, tag)
		}
	}
	if n := logs.FilterMessage("policy rejected, keeping the active policy").Len(); n != 1 {
		t.Errorf("broken edit logged %d times, want once", n)
	}
	t.Logf("%d decisions across %d revisions", total.Load(), len(seen))
}

// TestRescanFallback covers missed notifications: events are never acted on
// (huge debounce), so only the periodic rescan can pick up the change.
func TestRescanFallback(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"authz.rego": revisionPolicy("a")})
	e, _ := newTestEngine(t, Options{Dir: dir, Debounce: time.Hour, RescanInterval: 50 * time.Millisecond})
	startEngine(t, e)
	waitFor(t, "first activation", func() bool { return e.Ready() == nil })
	rev := e.Revision()
	writeFiles(t, dir, map[string]string{"authz.rego": revisionPolicy("b")})
	waitFor(t, "rescan", func() bool { return e.Revision() != rev })
}

// TestDirectoryAppearsLater: git-sync may not have cloned yet when the
// waypoint starts; the engine activates once the checkout appears.
func TestDirectoryAppearsLater(t *testing.T) {
	root := t.TempDir()
	link := filepath.Join(root, "current")
	e, _ := newTestEngine(t, Options{Dir: link, Debounce: 20 * time.Millisecond, RescanInterval: time.Second})
	startEngine(t, e)
	time.Sleep(50 * time.Millisecond)
	if err := e.Ready(); err == nil || !strings.Contains(err.Error(), "no such file or directory") {
		t.Fatalf("without a directory: ready = %v, want the missing directory named", err)
	}
	writeFiles(t, filepath.Join(root, "rev1"), map[string]string{"authz.rego": revisionPolicy("a")})
	swapLink(t, filepath.Join(root, "rev1"), link)
	waitFor(t, "activation after the checkout appeared", func() bool { return e.Ready() == nil })
}

func TestWatchTargets(t *testing.T) {
	root := t.TempDir()
	writeFiles(t, filepath.Join(root, "rev1"), map[string]string{"a/b/x.rego": "", ".git/config": ""})
	link := filepath.Join(root, "current")
	swapLink(t, filepath.Join(root, "rev1"), link)
	got := watchTargets(link, 100)
	realRoot, _ := filepath.EvalSymlinks(root)
	for _, want := range []string{realRoot, filepath.Join(realRoot, "rev1"), filepath.Join(realRoot, "rev1", "a"), filepath.Join(realRoot, "rev1", "a", "b")} {
		if !got[want] {
			t.Errorf("not watched: %s (got %v)", want, got)
		}
	}
	if got[filepath.Join(realRoot, "rev1", ".git")] {
		t.Error("hidden directory watched")
	}
}
