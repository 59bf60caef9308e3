package policy

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/causeway-mesh/causeway/pkg/dirwatch"
	"github.com/open-policy-agent/opa/v1/bundle"
)

// Run keeps the policy current until ctx ends: it loads the directory and
// watches it (file notifications, plus a periodic rescan for missed ones),
// or polls the Git repository (and fetches at once on Refresh), and, when
// configured, polls the bundle service. It returns when ctx is
// done and every goroutine it started has exited.
func (e *Engine) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	if f := e.opts.Feed; f != nil {
		stop, err := f.Start(ctx, e.log.Named("bundle"), func(ctx context.Context, b *bundle.Bundle, err error) {
			e.bundleUpdate(ctx, f.Name(), b, err)
		})
		if err != nil {
			return err
		}
		wg.Go(func() {
			<-ctx.Done()
			stop()
		})
	}
	switch {
	case e.opts.Dir != "":
		e.watchDir(ctx)
	case e.opts.Remote != nil:
		e.pollRemote(ctx)
	default:
		<-ctx.Done()
	}
	wg.Wait()
	return nil
}

// watchDir reloads the directory after changes settle. git-sync replaces a
// symlink to publish a checkout, so besides the resolved tree the watcher
// covers the directory holding every symlink on the configured path.
func (e *Engine) watchDir(ctx context.Context) {
	first := true
	dirwatch.Run(ctx, dirwatch.Options{
		Dirs:     func() map[string]bool { return watchTargets(e.opts.Dir, e.opts.Limits.MaxFiles) },
		Debounce: e.opts.Debounce,
		Rescan:   e.opts.RescanInterval,
		Logger:   e.log,
		Reload: func(time.Time) {
			if first {
				first = false
				_ = e.Load(ctx) // a rejection is logged; the rescan and events retry
				return
			}
			e.reloadDir(ctx)
		},
	})
}

// reloadDir reads the directory and offers it; unchanged or already rejected
// content is a no-op, so a rescan costs one read.
func (e *Engine) reloadDir(ctx context.Context) {
	if err := e.reload(ctx, false); err != nil && !errors.Is(err, context.Canceled) {
		e.log.Debug("policy reload", zap.Error(err))
	}
}

// minRefreshGap spaces fetches that Refresh asks for, so a burst of
// webhook calls costs one fetch.
const minRefreshGap = 2 * time.Second

// pollRemote reads the remote at start, every poll interval and on
// Refresh (a Git fetch lists the remote's references first; an unchanged
// ref costs no more than that).
func (e *Engine) pollRemote(ctx context.Context) {
	e.reloadDir(ctx)
	last := time.Now()
	poll := time.NewTicker(e.primary.poll)
	defer poll.Stop()
	held := time.NewTimer(time.Hour)
	held.Stop()
	defer held.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.refresh:
			if wait := minRefreshGap - time.Since(last); wait > 0 {
				held.Reset(wait)
				continue
			}
		case <-held.C:
		case <-poll.C:
		}
		e.reloadDir(ctx)
		last = time.Now()
	}
}

// watchTargets lists the directories to watch for dir: the resolved tree
// (fsnotify is not recursive), dir's parent, and the directory holding each
// symlink along dir's path.
func watchTargets(dir string, maxDirs int) map[string]bool {
	set := map[string]bool{}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return set
	}
	addResolved := func(p string) {
		if rp, err := filepath.EvalSymlinks(p); err == nil {
			set[rp] = true
		}
	}
	addResolved(filepath.Dir(abs))
	for p := abs; ; p = filepath.Dir(p) {
		if fi, err := os.Lstat(p); err == nil && fi.Mode()&os.ModeSymlink != 0 {
			addResolved(filepath.Dir(p))
		}
		if filepath.Dir(p) == p {
			break
		}
	}
	root, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return set
	}
	n := 0
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if p != root && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		if n++; n > maxDirs {
			return filepath.SkipAll
		}
		set[p] = true
		return nil
	})
	return set
}
