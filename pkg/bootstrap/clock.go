package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/causeway-mesh/causeway/pkg/readlimit"
)

// clockPoll is how often a clock offset file is read again.
const clockPoll = 100 * time.Millisecond

// offsetClock is the system clock shifted by the duration written in a
// file (--clock-offset-file), for fault tests of clock skew: certificates
// are judged by it, so a test can skew one proxy's clock and set it right
// again without touching the host's. Nothing else reads it.
type offsetClock struct {
	path   string
	log    *zap.Logger
	offset atomic.Int64
}

// startOffsetClock reads path once (an unreadable or malformed file is an
// error; an absent one is no offset) and then every clockPoll until ctx
// ends.
func startOffsetClock(ctx context.Context, path string, log *zap.Logger) (*offsetClock, error) {
	c := &offsetClock{path: path, log: log}
	d, err := c.read()
	if err != nil {
		return nil, fmt.Errorf("--clock-offset-file: %w", err)
	}
	c.set(d)
	go func() {
		tick := time.NewTicker(clockPoll)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			d, err := c.read()
			if err != nil {
				log.Error("clock offset file unreadable; offset kept", zap.String("path", path), zap.Error(err))
				continue
			}
			c.set(d)
		}
	}()
	return c, nil
}

// read parses the file: a Go duration such as "-1h" or "90s"; absent or
// empty means 0.
func (c *offsetClock) read() (time.Duration, error) {
	data, err := readlimit.File(c.path, 64)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(data))
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", c.path, err)
	}
	return d, nil
}

func (c *offsetClock) set(d time.Duration) {
	if old := time.Duration(c.offset.Swap(int64(d))); old != d {
		c.log.Warn("clock offset for judging certificates changed (fault test)", zap.Duration("offset", d), zap.Duration("was", old))
	}
}

// Now is the system's time plus the offset.
func (c *offsetClock) Now() time.Time { return time.Now().Add(time.Duration(c.offset.Load())) }
