package cniinstall

import (
	"context"
	"fmt"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.uber.org/zap"
)

// settle lets a burst of changes (an editor's save, a package upgrade)
// end before our configuration is rewritten once.
const settle = 200 * time.Millisecond

// Keep writes our configuration, then rewrites it whenever the directory
// changes (the primary edited, replaced or removed, ours deleted by hand),
// until ctx ends. A failed rewrite is logged and retried at the next
// change; only a directory that cannot be watched ends it.
func (in *Installer) Keep(ctx context.Context, log *zap.Logger) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("cniinstall: %w", err)
	}
	defer w.Close()
	if err := w.Add(in.ConfDir); err != nil {
		return fmt.Errorf("cniinstall: watch %s: %w", in.ConfDir, err)
	}
	write := func() {
		changed, err := in.Write()
		switch {
		case err != nil:
			log.Error("CNI configuration not written", zap.Error(err))
		case changed:
			log.Info("CNI configuration written", zap.String("dir", in.ConfDir), zap.String("name", in.confName()))
		}
	}
	write()
	timer := time.NewTimer(0)
	<-timer.C
	for {
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return fmt.Errorf("cniinstall: watch %s closed", in.ConfDir)
			}
			log.Debug("CNI configuration directory changed", zap.Stringer("event", ev))
			timer.Reset(settle)
		case err, ok := <-w.Errors:
			if !ok {
				return fmt.Errorf("cniinstall: watch %s closed", in.ConfDir)
			}
			// Events were lost (queue overflow): look again.
			log.Warn("CNI configuration watch", zap.Error(err))
			timer.Reset(settle)
		case <-timer.C:
			write()
		}
	}
}
