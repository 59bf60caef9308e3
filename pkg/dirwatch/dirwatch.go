// Package dirwatch keeps something read from directories current: it
// watches the directories with file notifications, waits for a burst of
// changes to settle, rescans periodically for what notifications miss,
// and calls back to reload.
package dirwatch

import (
	"context"
	"errors"
	"io/fs"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.uber.org/zap"
)

// Options configure Run.
type Options struct {
	// Dirs returns the directories to watch now (fsnotify is not
	// recursive). It is called before every reload, so watches follow
	// directories that appear, disappear or move (a git-sync symlink swap).
	Dirs func() map[string]bool
	// Debounce is how long the directories must be quiet after an event
	// before Reload runs; a steady stream of events cannot postpone it for
	// more than 10 × Debounce.
	Debounce time.Duration
	// Rescan is the period of a reload without events; 0 disables it.
	Rescan time.Duration
	Logger *zap.Logger
	// Reload reads the directories again; changedAt is when the first
	// event it may include was seen (the start of a rescan or of Run when
	// there was none).
	Reload func(changedAt time.Time)
}

// maxWaitFactor caps, in debounces, how long a steady stream of events
// may postpone a reload.
const maxWaitFactor = 10

// Run watches, reloads once, then reloads after every settled burst of
// events, watcher error or rescan tick until ctx ends. Without file
// notifications it relies on the rescans. Reload is called from Run's
// goroutine.
func Run(ctx context.Context, o Options) {
	log := o.Logger
	if log == nil {
		log = zap.NewNop()
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		log.Warn("file notifications unavailable; relying on periodic rescans", zap.Error(err))
		w = nil
	} else {
		defer w.Close()
	}
	watched := map[string]bool{}
	unwatchable := map[string]bool{} // warned about once, retried on every sync
	syncWatches := func() {
		if w == nil {
			return
		}
		want := o.Dirs()
		for p := range watched {
			if !want[p] {
				_ = w.Remove(p) // fails when the directory is already gone
				delete(watched, p)
			}
		}
		for p := range unwatchable {
			if !want[p] {
				delete(unwatchable, p)
			}
		}
		for p := range want {
			if watched[p] {
				continue
			}
			if err := w.Add(p); err != nil {
				// Gone since Dirs listed it, or out of inotify watches.
				if !unwatchable[p] && !errors.Is(err, fs.ErrNotExist) {
					log.Warn("cannot watch directory; relying on periodic rescans", zap.String("dir", p), zap.Error(err))
				}
				unwatchable[p] = true
				continue
			}
			watched[p] = true
			delete(unwatchable, p)
		}
	}
	// Watches are in place before every read, so a change made after a
	// read is never missed: it raises an event.
	syncWatches()
	o.Reload(time.Now())

	var events <-chan fsnotify.Event
	var errs <-chan error
	if w != nil {
		events, errs = w.Events, w.Errors
	}
	var rescan <-chan time.Time
	if o.Rescan > 0 {
		t := time.NewTicker(o.Rescan)
		defer t.Stop()
		rescan = t.C
	}
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	defer debounce.Stop()
	var firstEvent time.Time // of the burst the debounce timer waits out
	schedule := func() {
		// Trailing debounce, capped so a steady stream still reloads.
		if firstEvent.IsZero() {
			firstEvent = time.Now()
			debounce.Reset(o.Debounce)
		} else if time.Since(firstEvent) < maxWaitFactor*o.Debounce {
			debounce.Reset(o.Debounce)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			if ev.Op == fsnotify.Chmod {
				continue // no content changed
			}
			if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
				// The kernel dropped the watch; forget it so a directory
				// that comes back under the name is watched again.
				delete(watched, ev.Name)
			}
			schedule()
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			// Events may have been lost (queue overflow): read again.
			log.Warn("file watch error; rescanning", zap.Error(err))
			schedule()
		case <-debounce.C:
			syncWatches()
			o.Reload(firstEvent)
			firstEvent = time.Time{}
		case <-rescan:
			syncWatches()
			o.Reload(time.Now())
		}
	}
}
