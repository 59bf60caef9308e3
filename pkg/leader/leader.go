// Package leader runs work on one control plane replica at a time: the
// replicas campaign for a coordination.k8s.io Lease (client-go
// leaderelection) and the holder runs the work; every replica keeps serving
// xDS and the CA whatever the election says.
//
// What the election does not guarantee (client-go's own caveats): there is
// no fencing. A leader that stops renewing keeps running its work until it
// notices, up to RenewDeadline later, while another replica may take the
// Lease once LeaseDuration has passed since the last renewal; clocks are
// trusted to agree on the rate of time. The work must therefore be
// idempotent and tolerate a second writer for a moment (the deployer applies
// desired state; the status writer writes only what differs). A replica that
// cannot stop its work, or that holds the Lease without renewing it, fails
// Healthy, so its liveness probe restarts it.
package leader

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

// Defaults are client-go's (and kube-controller-manager's).
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
)

// Options configure an Elector.
type Options struct {
	Client kubernetes.Interface
	// Namespace and Name of the Lease (causeway-system).
	Namespace, Name string
	// Identity of this replica in the Lease; unique per process (the pod
	// name and a random suffix).
	Identity string
	// LeaseDuration is how long others wait after the last renewal before
	// taking over; RenewDeadline how long the leader keeps retrying a
	// renewal before it gives up; RetryPeriod the time between attempts.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	Logger                                    *zap.Logger
}

func (o *Options) validate() error {
	if o.Client == nil || o.Logger == nil {
		return errors.New("leader: Client and Logger are required")
	}
	if o.Namespace == "" || o.Name == "" || o.Identity == "" {
		return errors.New("leader: the Lease's namespace and name and this replica's identity are required")
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration = DefaultLeaseDuration
	}
	if o.RenewDeadline == 0 {
		o.RenewDeadline = DefaultRenewDeadline
	}
	if o.RetryPeriod == 0 {
		o.RetryPeriod = DefaultRetryPeriod
	}
	switch {
	case o.LeaseDuration < 0 || o.RenewDeadline < 0 || o.RetryPeriod < 0:
		return errors.New("leader: lease duration, renew deadline and retry period must be positive")
	case o.LeaseDuration <= o.RenewDeadline:
		return fmt.Errorf("leader: lease duration %v must be longer than the renew deadline %v (a leader must give up before others take over)", o.LeaseDuration, o.RenewDeadline)
	case o.RenewDeadline <= time.Duration(leaderelection.JitterFactor*float64(o.RetryPeriod)):
		return fmt.Errorf("leader: renew deadline %v must be longer than %v times the retry period %v (else one slow attempt loses the lease)", o.RenewDeadline, leaderelection.JitterFactor, o.RetryPeriod)
	}
	return nil
}

// Elector campaigns for the Lease and runs the leader's work while it holds
// it. Build it with New; Run owns the campaign and the work.
type Elector struct {
	opts    Options
	lock    *acquireLock
	watch   *leaderelection.HealthzAdaptor
	leading atomic.Bool

	mu            sync.Mutex
	stoppingSince time.Time // when the work was told to stop and has not yet

	abandon     chan struct{}
	abandonOnce sync.Once
	klog        logr.Logger // client-go's, for the election
}

// New validates the options (filling in defaults).
func New(o Options) (*Elector, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	return &Elector{
		opts: o,
		lock: &acquireLock{LeaseLock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: o.Namespace, Name: o.Name},
			Client:     o.Client.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: o.Identity},
		}},
		// A leader is unhealthy once its lease has been expired for a renew deadline.
		watch:   leaderelection.NewLeaderHealthzAdaptor(o.RenewDeadline),
		abandon: make(chan struct{}),
		klog:    newRaceLogger(),
	}, nil
}

// Abandon ends Run at once without another request to the API server:
// the leader's work stops and the Lease is left to expire. For a replica
// being uninstalled, whose permissions go next (helm uninstall deletes the
// RBAC right after the workloads, before their pods stop): a renewal or a
// release would be refused.
func (e *Elector) Abandon() { e.abandonOnce.Do(func() { close(e.abandon) }) }

// Run campaigns until ctx ends or Abandon is called. Each time it wins, it
// runs lead with a context that ends when the Lease is lost (or Run ends),
// and campaigns again only after lead has returned, so this process never
// runs two leaders' work at once. When ctx ends the Lease is released once
// lead has returned, so another replica takes over without waiting for it
// to expire.
func (e *Elector) Run(ctx context.Context, lead func(context.Context)) error {
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-e.abandon:
			cancel()
		case <-ctx.Done():
		}
	}()
	for ctx.Err() == nil {
		done := make(chan struct{})
		e.lock.acquired.Store(false)
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:          e.lock,
			Name:          e.opts.Name,
			LeaseDuration: e.opts.LeaseDuration,
			RenewDeadline: e.opts.RenewDeadline,
			RetryPeriod:   e.opts.RetryPeriod,
			// Released below, unless abandoned (client-go's release
			// would ask the API server either way).
			ReleaseOnCancel: false,
			WatchDog:        e.watch,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(lctx context.Context) {
					defer close(done)
					e.leading.Store(true)
					e.opts.Logger.Info("leading", zap.String("lease", e.opts.Namespace+"/"+e.opts.Name), zap.String("identity", e.opts.Identity))
					lead(lctx)
				},
				OnStoppedLeading: func() {},
				OnNewLeader: func(id string) {
					if id != e.opts.Identity {
						e.opts.Logger.Info("another replica leads", zap.String("leader", id))
					}
				},
			},
		})
		if err != nil {
			return fmt.Errorf("leader: %w", err)
		}
		e.watch.SetLeaderElection(le)
		le.Run(klog.NewContext(ctx, e.klog))
		// Run returns when the Lease is lost or ctx ends; lead's context has
		// ended, and it may still be winding down (or, started late by
		// client-go's goroutine, not even have begun).
		if e.lock.acquired.Load() {
			e.mu.Lock()
			e.stoppingSince = time.Now()
			e.mu.Unlock()
			<-done
			e.mu.Lock()
			e.stoppingSince = time.Time{}
			e.mu.Unlock()
			e.leading.Store(false)
			e.opts.Logger.Info("stopped leading", zap.String("lease", e.opts.Namespace+"/"+e.opts.Name))
			if parent.Err() != nil {
				e.release()
			}
		}
	}
	return nil
}

// release gives up the Lease if this replica still holds it: a record
// with no holder that expires in a second (as client-go's ReleaseOnCancel).
func (e *Elector) release() {
	ctx, cancel := context.WithTimeout(context.Background(), e.opts.RenewDeadline)
	defer cancel()
	r, _, err := e.lock.Get(ctx)
	if err == nil && r.HolderIdentity == e.opts.Identity {
		now := metav1.Now()
		err = e.lock.Update(ctx, resourcelock.LeaderElectionRecord{LeaderTransitions: r.LeaderTransitions, LeaseDurationSeconds: 1, RenewTime: now, AcquireTime: now})
	}
	if err != nil {
		e.opts.Logger.Warn("the Lease was not released: another replica takes over when it expires",
			zap.String("lease", e.opts.Namespace+"/"+e.opts.Name), zap.Error(err))
	}
}

// Leading reports whether this replica runs the leader's work.
func (e *Elector) Leading() bool { return e.leading.Load() }

// Healthy fails when this replica holds the Lease but has not renewed it
// for LeaseDuration plus RenewDeadline, or when its work was told to stop
// (the Lease was lost) more than RenewDeadline ago and is still running:
// either way another replica may be leading too.
func (e *Elector) Healthy() error {
	e.mu.Lock()
	since := e.stoppingSince
	e.mu.Unlock()
	if !since.IsZero() && time.Since(since) > e.opts.RenewDeadline {
		return fmt.Errorf("leader: lost the lease %v ago and the leader's work has not stopped", time.Since(since).Round(time.Millisecond))
	}
	return e.watch.Check((*http.Request)(nil))
}

// acquireLock notes whether this replica wrote the Lease as its holder:
// exactly when client-go's elector acquired it and so runs (or is about to
// run) the leader's work.
type acquireLock struct {
	*resourcelock.LeaseLock
	acquired atomic.Bool
}

func (l *acquireLock) Create(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	err := l.LeaseLock.Create(ctx, r)
	l.note(err, r)
	return err
}

func (l *acquireLock) Update(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	err := l.LeaseLock.Update(ctx, r)
	l.note(err, r)
	return err
}

func (l *acquireLock) note(err error, r resourcelock.LeaderElectionRecord) {
	if err == nil && r.HolderIdentity == l.Identity() {
		l.acquired.Store(true)
	}
}

// raceSink is client-go's leader election logger (klog's) with the errors
// of a lost race for a free Lease said at info: another replica created or
// updated it first (the replicas of an install start at once), which is the
// election working, not an error. Any other error stays one. deeper is the
// same sink a frame deeper, for what Error logs (Error is a frame of its
// own; the other methods are promoted).
type raceSink struct {
	logr.LogSink
	deeper logr.LogSink
}

// newRaceLogger wraps copies of klog's sink.
func newRaceLogger() logr.Logger {
	return logr.New(newRaceSink(klog.Background().GetSink()))
}

func newRaceSink(s logr.LogSink) raceSink {
	if cd, ok := s.(logr.CallDepthLogSink); ok {
		return raceSink{cd.WithCallDepth(0), cd.WithCallDepth(1)}
	}
	return raceSink{s, s}
}

// Init does nothing: the sinks wrapped are initialized already (klog's
// for its own logr.Logger), and Init adds to their call depth.
func (raceSink) Init(logr.RuntimeInfo) {}

func (s raceSink) Error(err error, msg string, kv ...any) {
	if apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err) {
		s.deeper.Info(0, msg+": another replica wrote the Lease first", append(kv, "err", err)...)
		return
	}
	s.deeper.Error(err, msg, kv...)
}

func (s raceSink) WithValues(kv ...any) logr.LogSink { return newRaceSink(s.LogSink.WithValues(kv...)) }
func (s raceSink) WithName(name string) logr.LogSink { return newRaceSink(s.LogSink.WithName(name)) }
