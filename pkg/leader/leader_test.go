package leader

import (
	"context"
	"errors"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"

	"github.com/causeway-mesh/causeway/pkg/internal/kubetest"
)

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }

func TestTimingsValidated(t *testing.T) {
	base := Options{Client: &kubernetes.Clientset{}, Namespace: "ns", Name: "l", Identity: "me", Logger: zaptest.NewLogger(t)}
	for _, c := range []struct {
		name     string
		l, r, rp time.Duration
		want     string
	}{
		{"defaults", 0, 0, 0, ""},
		{"lease not longer than renew", 10 * time.Second, 10 * time.Second, time.Second, "must be longer than the renew deadline"},
		{"renew too close to retry", 15 * time.Second, 2 * time.Second, 2 * time.Second, "times the retry period"},
		{"negative", -time.Second, 0, 0, "must be positive"},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := base
			o.LeaseDuration, o.RenewDeadline, o.RetryPeriod = c.l, c.r, c.rp
			_, err := New(o)
			if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
				t.Fatalf("got %v, want %q", err, c.want)
			}
		})
	}
	if _, err := New(Options{Client: &kubernetes.Clientset{}, Logger: zaptest.NewLogger(t)}); err == nil {
		t.Fatal("no lease name or identity accepted")
	}
}

// gate fails every request while closed: a replica cut off from the
// apiserver, or crashed.
type gate struct {
	rt     http.RoundTripper
	closed *atomic.Bool
}

func (g gate) RoundTrip(r *http.Request) (*http.Response, error) {
	if g.closed.Load() {
		return nil, errors.New("gate closed")
	}
	return g.rt.RoundTrip(r)
}

type candidate struct {
	e       *Elector
	cut     atomic.Bool
	cancel  context.CancelFunc
	done    chan struct{}
	leading atomic.Int32 // lead calls running
}

const (
	testLease = 3 * time.Second
	testRenew = 2 * time.Second
	testRetry = 500 * time.Millisecond
)

func newCandidate(t *testing.T, env *kubetest.Env, id string, lead func(ctx context.Context, c *candidate)) *candidate {
	c := &candidate{done: make(chan struct{})}
	cfg := env.ControlPlane(t) // the Role of the shipped manifest
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return gate{rt, &c.cut} })
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.e, err = New(Options{Client: cs, Namespace: "causeway-system", Name: strings.ToLower(t.Name()), Identity: id,
		LeaseDuration: testLease, RenewDeadline: testRenew, RetryPeriod: testRetry, Logger: zaptest.NewLogger(t).Named(id)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go func() {
		defer close(c.done)
		if err := c.e.Run(ctx, func(ctx context.Context) {
			if n := c.leading.Add(1); n != 1 {
				t.Errorf("%s runs the leader's work %d times at once", id, n)
			}
			defer c.leading.Add(-1)
			lead(ctx, c)
		}); err != nil {
			t.Errorf("%s: %v", id, err)
		}
	}()
	t.Cleanup(func() { cancel(); <-c.done })
	return c
}

func untilDone(ctx context.Context, _ *candidate) { <-ctx.Done() }

func ensureNamespace(t *testing.T, env *kubetest.Env) {
	_, err := env.Clientset(t).CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "causeway-system"}}, metav1.CreateOptions{})
	if err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
}

func waitLeading(t *testing.T, c *candidate, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	if err := kubetest.WaitFor(context.Background(), within, func() (bool, error) { return c.e.Leading(), nil }); err != nil {
		t.Fatalf("not leading within %v", within)
	}
	return time.Since(start)
}

// A crashed leader (cut off, releasing nothing) is replaced once its lease
// has run out; a leader that shuts down releases the Lease at once.
func TestFailover(t *testing.T) {
	env := kubetest.Shared(t)
	ensureNamespace(t, env)
	a := newCandidate(t, env, "a", untilDone)
	waitLeading(t, a, 10*time.Second)
	b := newCandidate(t, env, "b", untilDone)
	time.Sleep(2 * testLease)
	if b.e.Leading() {
		t.Fatal("b leads while a holds the lease")
	}

	a.cut.Store(true) // crash: a can no longer renew or release
	a.cancel()
	<-a.done
	took := waitLeading(t, b, 10*time.Second)
	t.Logf("takeover after a crash: %v (lease %v)", took.Round(time.Millisecond), testLease)
	// b takes the lease once it has seen no renewal for the lease duration,
	// noticing within a retry period (with client-go's jitter).
	if limit := testLease + 2*time.Duration(1.2*float64(testRetry)) + time.Second; took > limit {
		t.Errorf("takeover took %v, longer than the lease duration allows (%v)", took, limit)
	}

	c := newCandidate(t, env, "c", untilDone)
	time.Sleep(2 * testRetry)
	b.cancel() // graceful: releases
	<-b.done
	took = waitLeading(t, c, 10*time.Second)
	t.Logf("takeover after a release: %v", took.Round(time.Millisecond))
	if took >= testLease {
		t.Errorf("takeover after a release took %v: the lease was not released", took)
	}
}

// A leader whose work does not stop after the Lease is lost, or that holds
// the Lease without renewing it, is unhealthy.
func TestHealthyFailsWhenRenewalStalls(t *testing.T) {
	env := kubetest.Shared(t)
	ensureNamespace(t, env)
	release := make(chan struct{})
	a := newCandidate(t, env, "a", func(ctx context.Context, _ *candidate) { <-release }) // ignores ctx
	defer close(release)
	waitLeading(t, a, 10*time.Second)
	time.Sleep(testLease)
	if err := a.e.Healthy(); err != nil {
		t.Fatalf("a renewing leader is unhealthy: %v", err)
	}
	a.cut.Store(true)
	start := time.Now()
	if err := kubetest.WaitFor(context.Background(), testLease+3*testRenew, func() (bool, error) { return a.e.Healthy() != nil, nil }); err != nil {
		t.Fatal("a leader that cannot renew stays healthy")
	}
	t.Logf("unhealthy %v after renewals began to fail: %v", time.Since(start).Round(time.Millisecond), a.e.Healthy())
}

// An abandoned replica (being uninstalled: its permissions go next) stops
// campaigning and leading at once and does not release the Lease, which
// would take a request its permissions may no longer allow.
func TestAbandonStopsWithoutARequest(t *testing.T) {
	env := kubetest.Shared(t)
	ensureNamespace(t, env)
	a := newCandidate(t, env, "a", untilDone)
	waitLeading(t, a, 10*time.Second)
	b := newCandidate(t, env, "b", untilDone)
	time.Sleep(2 * testRetry)
	for _, c := range []*candidate{a, b} {
		c.e.Abandon()
		select {
		case <-c.done:
		case <-time.After(testRenew):
			t.Fatal("Run did not end at Abandon")
		}
	}
	if a.e.Leading() || a.leading.Load() != 0 {
		t.Error("a still leads after Abandon")
	}
	lease, err := env.Clientset(t).CoordinationV1().Leases("causeway-system").Get(context.Background(), strings.ToLower(t.Name()), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := lease.Spec.HolderIdentity; h == nil || *h != "a" {
		t.Errorf("the Lease's holder after a's Abandon is %v, want a (not released)", h)
	}
}

// A lost race for a free Lease (another replica created or updated it
// first) is said at info; any other failure stays an error.
func TestRaceSink(t *testing.T) {
	var lines []string
	log := logr.New(newRaceSink(funcr.New(func(prefix, args string) { lines = append(lines, args) }, funcr.Options{}).GetSink()))
	lease := schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}
	log.Error(apierrors.NewAlreadyExists(lease, "l"), "Error initially creating lease lock")
	log.WithValues("lock", "ns/l").Error(apierrors.NewConflict(lease, "l", errors.New("modified")), "Failed to update lease")
	log.Error(apierrors.NewForbidden(lease, "l", errors.New("no")), "Error retrieving lease lock")
	want := []string{`"level"=0 "msg"="Error initially creating lease lock: another replica wrote the Lease first"`,
		`"level"=0 "msg"="Failed to update lease: another replica wrote the Lease first" "lock"="ns/l"`,
		`"msg"="Error retrieving lease lock" "error"=`}
	if len(lines) != len(want) {
		t.Fatalf("logged %q", lines)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d: %s, want it to begin %s", i, lines[i], w)
		}
	}
}
