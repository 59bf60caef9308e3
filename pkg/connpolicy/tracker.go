package connpolicy

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/causeway-mesh/causeway/pkg/shrinkmap"
)

// ErrRevoked marks a connection a re-check closed.
var ErrRevoked = errors.New("closed by connection policy re-check")

// Tracker follows open connections and, on request, decides again about
// each under the state then in force, closing those now denied.
type Tracker struct {
	log     *zap.Logger
	mu      sync.Mutex
	conns   shrinkmap.Map[*Open, struct{}] // a burst's room goes with it
	pending chan struct{}
}

// Open is one tracked connection.
type Open struct {
	check    func(context.Context) (Verdict, error)
	describe func() []zap.Field
	revoke   func()                 // ends its relay, resetting both sides
	revoked  atomic.Pointer[string] // why a re-check closed it
}

// NewTracker builds a tracker logging to log.
func NewTracker(log *zap.Logger) *Tracker {
	if log == nil {
		log = zap.NewNop()
	}
	return &Tracker{log: log, pending: make(chan struct{}, 1)}
}

// Track follows a connection until the returned function is called.
// revoke ends its relay (resetting its upstream connection, aborting its
// tunnel); a re-check that denies it calls revoke once. check decides
// about it under the state in force (an error denies); describe returns
// the fields that name it in the log (asked only when a re-check closes
// it, so an open connection holds no copy of them). stale, asked once it is tracked, reports whether the state
// changed since it was admitted: then it is re-checked at once (with
// ctx), so no change is missed. Tracking before the relay starts is safe:
// a relay whose upstream is already reset ends at once.
func (t *Tracker) Track(ctx context.Context, check func(context.Context) (Verdict, error), stale func() bool, revoke func(), describe func() []zap.Field) (*Open, func()) {
	o := &Open{check: check, describe: describe, revoke: revoke}
	t.mu.Lock()
	t.conns.Set(o, struct{}{})
	t.mu.Unlock()
	if stale() {
		t.recheck(ctx, o)
	}
	return o, func() {
		t.mu.Lock()
		t.conns.Delete(o)
		t.mu.Unlock()
	}
}

// Describe lists the open connections, each as the fields that name it
// in the log (the node proxy's /config_dump "connections"), at most max
// of them.
func (t *Tracker) Describe(max int) []map[string]any {
	t.mu.Lock()
	list := slices.AppendSeq(make([]*Open, 0, min(t.conns.Len(), max)), t.conns.Keys())
	t.mu.Unlock()
	out := make([]map[string]any, 0, min(len(list), max))
	for _, o := range list[:min(len(list), max)] {
		enc := zapcore.NewMapObjectEncoder()
		for _, f := range o.describe() {
			f.AddTo(enc)
		}
		out = append(out, enc.Fields)
	}
	return out
}

// Result is err, or why a re-check closed the connection.
func (o *Open) Result(err error) error {
	if why := o.revoked.Load(); why != nil {
		return fmt.Errorf("%w: %s", ErrRevoked, *why)
	}
	return err
}

// recheck decides about o again and closes it when the answer is no
// longer yes; it reports whether it closed it.
func (t *Tracker) recheck(ctx context.Context, o *Open) bool {
	v, err := o.check(ctx)
	if err == nil && v.Allowed {
		return false
	}
	reason := v.Reason
	if err != nil {
		reason = err.Error()
	}
	if !o.revoked.CompareAndSwap(nil, &reason) {
		return false // already closed
	}
	// Logged first: whoever sees the connection end finds the reason.
	t.log.Info("open connection no longer authorized; closed", append(o.describe(),
		zap.String("policy", v.Policy), zap.String("policy_revision", v.Revision), zap.String("decision_id", v.DecisionID), zap.String("reason", reason))...)
	o.revoke()
	return true
}

// RecheckAll decides again about every tracked connection, on all CPUs,
// and closes those now denied; it returns how many it checked and closed.
func (t *Tracker) RecheckAll(ctx context.Context) (checked, closed int) {
	t.mu.Lock()
	list := slices.AppendSeq(make([]*Open, 0, t.conns.Len()), t.conns.Keys())
	t.mu.Unlock()
	var next, n atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), max(len(list), 1)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(list) {
					return
				}
				if t.recheck(ctx, list[i]) {
					n.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return len(list), int(n.Load())
}

// Request asks Run for a re-check; requests made while one is pending
// are merged (the pending one sees every change before it starts).
func (t *Tracker) Request() {
	select {
	case t.pending <- struct{}{}:
	default:
	}
}

// Run re-checks after every Request until ctx ends.
func (t *Tracker) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.pending:
			if checked, closed := t.RecheckAll(ctx); closed > 0 {
				t.log.Info("connections re-checked after a change", zap.Int("checked", checked), zap.Int("closed", closed))
			}
		}
	}
}
