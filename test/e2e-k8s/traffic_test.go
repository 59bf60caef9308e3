package e2ek8s

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Traffic while the node proxy rolls (helm upgrade, helm rollback): steady
// requests from a captured pod to a waypoint-bound Service, each on a new
// connection and counted, and connections held open through the node proxy
// the roll replaces, watched until that pod is gone (its drain over).
const (
	loadClients  = "4"     // echo load -c: requests in flight at once
	loadInterval = "100ms" // between one client's requests
	heldConns    = 4
	// How long past its SIGTERM the old node proxy carries a held
	// connection at least: its drain (--drain, 10s) with room for a
	// loaded machine. Less means it was cut at the stop, not drained.
	drainCarries = 3 * time.Second
)

// loadSummary is what `echo load` prints when it ends (cmd/echo).
type loadSummary struct {
	Sent, Failed int64
	First, Last  time.Time
	FirstAnswer  time.Time `json:"first_answer"`
	Errors       []string
}

// loadRun is an `echo load` running in a pod through kubectl exec -i,
// until stop closes its input.
type loadRun struct {
	url    string
	load   *exec.Cmd
	stdin  io.WriteCloser
	stdout bytes.Buffer
	stderr lockedBuffer  // read while the load runs
	done   chan struct{} // the load ended
}

// startLoad starts echo load (with flags) from the pod to url; it is
// ended when the test ends, if stop did not end it before.
func startLoad(t *testing.T, from corev1.Pod, url string, flags ...string) *loadRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l := &loadRun{url: url, done: make(chan struct{})}
	// -for 0: until its stdin ends (stop closes it).
	argv := append([]string{"--kubeconfig", kubeconfig, "-n", from.Namespace, "exec", "-i", from.Name, "-c", "echo", "--",
		"/usr/local/bin/echo", "load"}, flags...)
	l.load = exec.CommandContext(ctx, kubectl, append(argv, url)...)
	l.load.Stdout, l.load.Stderr = &l.stdout, &l.stderr
	stdin, err := l.load.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	l.stdin = stdin
	if err := l.load.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = l.load.Wait(); close(l.done) }()
	t.Cleanup(func() {
		l.stdin.Close()
		select {
		case <-l.done:
		case <-time.After(30 * time.Second):
		}
		cancel()
		<-l.done
	})
	return l
}

// answered waits, at most 30s, until the load has had an answer.
func (l *loadRun) answered(t *testing.T) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for !strings.Contains(l.stderr.String(), loadAnswered) {
		select {
		case <-l.done:
			t.Fatalf("echo load ended before its first answer: %s", l.stderr.String())
		case <-deadline:
			t.Fatalf("echo load had no answer within 30s: %s", l.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stop ends the load and returns its summary and what it printed before
// (with -each, a line per request).
func (l *loadRun) stop(t *testing.T, what string) (loadSummary, []string) {
	t.Helper()
	l.stdin.Close()
	select {
	case <-l.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: echo load did not end within 30s of its input's end", what)
	}
	var sum loadSummary
	out := strings.TrimSpace(l.stdout.String())
	lines := strings.Split(out, "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &sum); err != nil {
		t.Fatalf("%s: echo load's summary %q: %v; stderr %s", what, lastLine(out), err, l.stderr.String())
	}
	return sum, lines[:len(lines)-1]
}

// rollTraffic is the traffic running across one roll of the node proxy.
type rollTraffic struct {
	*loadRun
	holds []*hold
	began time.Time // every part of the traffic running

	// The node proxy pod serving the traffic at its start, watched until
	// it is gone.
	proxy    corev1.Pod
	mu       sync.Mutex
	stopAt   time.Time // when it was deleted (its SIGTERM), from its deletion timestamp
	seenAt   time.Time // when the test saw it deleted
	goneAt   time.Time
	watchErr error
	gone     chan struct{}
	// What the old pod's containers logged from the traffic's start on,
	// shown when a held connection ends early.
	proxyLogs func() string
}

// startRollTraffic starts the load and the held connections from the pod
// to url, and returns once each held connection has an answer (so it is
// the running node proxy's, proxy).
func startRollTraffic(t *testing.T, from, proxy corev1.Pod, url string) *rollTraffic {
	t.Helper()
	r := &rollTraffic{proxy: proxy, gone: make(chan struct{}),
		loadRun: startLoad(t, from, url+"/load", "-c", loadClients, "-interval", loadInterval, "-timeout", "5s")}
	wctx, stopWatch := context.WithCancel(context.Background())
	t.Cleanup(stopWatch)
	go r.watchProxy(wctx)
	r.proxyLogs = followPodLogs(wctx, proxy, "nodeproxy", "agent")
	for i := range heldConns {
		r.holds = append(r.holds, startHold(t, from.Namespace, from.Name, fmt.Sprintf("%s/held-%d", url, i)))
	}
	for _, h := range r.holds {
		h.answered(t, 1)
	}
	// The roll starts only once the load has been answered: its requests
	// then began before the roll did.
	r.answered(t)
	r.began = time.Now()
	return r
}

// loadAnswered is in echo load's line at its first answer (cmd/echo).
const loadAnswered = "echo load: the first answer from "

// lockedBuffer is a bytes.Buffer written by a command and read meanwhile.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// watchProxy notes when the proxy pod was deleted and when it is gone.
func (r *rollTraffic) watchProxy(ctx context.Context) {
	defer close(r.gone)
	for ctx.Err() == nil {
		p, err := client.CoreV1().Pods(r.proxy.Namespace).Get(ctx, r.proxy.Name, metav1.GetOptions{})
		r.mu.Lock()
		switch {
		case apierrors.IsNotFound(err) || (err == nil && p.UID != r.proxy.UID):
			r.goneAt = time.Now()
			r.mu.Unlock()
			return
		case err != nil:
			r.watchErr = err
		case p.DeletionTimestamp != nil && r.stopAt.IsZero():
			grace := int64(0)
			if p.DeletionGracePeriodSeconds != nil {
				grace = *p.DeletionGracePeriodSeconds
			}
			// The timestamp is the deletion plus the grace period, in
			// whole seconds (truncated): the deletion was at most 1s later.
			r.stopAt = p.DeletionTimestamp.Add(-time.Duration(grace) * time.Second)
			r.seenAt = time.Now()
		}
		r.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// stop waits until the node proxy pod the traffic began with is gone,
// ends the load and checks: no request failed, and every held connection
// either outlived that pod or was carried past its stop into its drain.
// It logs the counts.
func (r *rollTraffic) stop(t *testing.T, what string) {
	t.Helper()
	select {
	case <-r.gone:
	case <-time.After(2 * time.Minute):
		r.mu.Lock()
		defer r.mu.Unlock()
		t.Fatalf("%s: the old node proxy pod %s not gone within 2m (last error %v)", what, r.proxy.Name, r.watchErr)
	}
	r.mu.Lock()
	stopAt, goneAt := r.stopAt, r.goneAt
	r.mu.Unlock()
	if stopAt.IsZero() {
		t.Fatalf("%s: the old node proxy pod %s went without being seen terminating", what, r.proxy.Name)
	}
	// Still answering now: carried to the end by the new node proxy.
	survived, early := 0, false
	var ends []string
	for _, h := range r.holds {
		select {
		case <-h.done:
			last := time.Unix(0, h.last.Load())
			ends = append(ends, fmt.Sprintf("%s after %d answers, the last %.1fs after the old node proxy's stop (%s)",
				h.what, h.count.Load(), last.Sub(stopAt).Seconds(), holdEnd(h.stderr.String())))
			if last.Before(stopAt.Add(drainCarries)) {
				early = true
				t.Errorf("%s: %s ended %.1fs after the old node proxy's stop, want it carried into the drain (at least %s): %s",
					what, h.what, last.Sub(stopAt).Seconds(), drainCarries, h.stderr.String())
			}
		default:
			survived++
		}
	}

	if early {
		t.Logf("%s: the old node proxy pod %s deleted between %s and %s, gone at %s; its logs:\n%s", what, r.proxy.Name,
			stopAt.Format(time.RFC3339Nano), r.seenAt.Format(time.RFC3339Nano), goneAt.Format(time.RFC3339Nano), r.proxyLogs())
	}
	// The requests go on a little past the old pod's end, so that they
	// cover it.
	time.Sleep(time.Second)
	sum, _ := r.loadRun.stop(t, what)
	if sum.Sent == 0 || sum.Failed != 0 {
		t.Errorf("%s: %d of %d requests to %s failed during the roll: %v", what, sum.Failed, sum.Sent, r.url, sum.Errors)
		r.explainFailures(t, what, sum.Errors)
	}
	// The requests must cover the roll, so that none failing means the
	// handover dropped none: they began before it (startRollTraffic
	// returns after the first answer, and the roll starts after that) and
	// must have gone on until the old node proxy was gone (a load that
	// died or stalled midway would not have seen its drain).
	if sum.Last.Before(goneAt) {
		t.Errorf("%s: requests from %s to %s do not cover the roll (the old node proxy gone %s)",
			what, sum.First.Format(time.RFC3339Nano), sum.Last.Format(time.RFC3339Nano), goneAt.Format(time.RFC3339Nano))
	}
	t.Logf("%s: %d requests over %.1fs, %d failed; held connections: %d of %d survived the old node proxy (stopped %.1fs, gone %.1fs after the traffic began)",
		what, sum.Sent, sum.Last.Sub(sum.First).Seconds(), sum.Failed, survived, len(r.holds), stopAt.Sub(r.began).Seconds(), goneAt.Sub(r.began).Seconds())
	for _, e := range ends {
		t.Logf("%s: ended: %s", what, e)
	}
}

// followPodLogs follows the containers' logs of the pod from now until ctx
// ends or the pod is gone; the returned function gives what was read (at
// most maxLogBytes a container).
func followPodLogs(ctx context.Context, p corev1.Pod, containers ...string) func() string {
	var mu sync.Mutex
	var logs []string
	now := metav1.Now()
	for _, c := range containers {
		rc, err := client.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{
			Container: c, Follow: true, SinceTime: &now, LimitBytes: new(int64(maxLogBytes)),
		}).Stream(ctx)
		if err != nil {
			logs = append(logs, fmt.Sprintf("%s: %v", c, err))
			continue
		}
		go func() {
			defer rc.Close()
			sc := bufio.NewScanner(rc)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			for sc.Scan() {
				mu.Lock()
				logs = append(logs, c+": "+sc.Text())
				mu.Unlock()
			}
		}()
	}
	return func() string {
		mu.Lock()
		defer mu.Unlock()
		return strings.Join(logs, "\n")
	}
}

// holdEnd is what echo hold said about its end (kubectl adds its own
// line about the exit code).
func holdEnd(stderr string) string {
	for line := range strings.Lines(stderr) {
		if strings.HasPrefix(line, "echo hold") {
			return strings.TrimSpace(line)
		}
	}
	return lastLine(stderr)
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	return s[strings.LastIndex(s, "\n")+1:]
}

// clientAddr is the client's end of a failed request's connection, in
// Go's error text ("read tcp 10.244.0.10:36692->10.96.0.247:80: ...").
var clientAddr = regexp.MustCompile(`tcp ([0-9.]+:[0-9]+)->`)

// explainFailures logs what the node proxies (the old one and those
// running now) and the waypoints logged about the failed requests'
// connections, and the node proxies' lines that are not access logs
// (their handover of the pods).
func (r *rollTraffic) explainFailures(t *testing.T, what string, errs []string) {
	t.Helper()
	var addrs []string
	for _, e := range errs {
		if m := clientAddr.FindStringSubmatch(e); m != nil {
			addrs = append(addrs, m[1])
		}
	}
	relevant := func(line string) bool {
		for _, a := range addrs {
			if strings.Contains(line, a) {
				return true
			}
		}
		return !strings.Contains(line, `"connection"`)
	}
	show := func(who, logs string) {
		var keep []string
		for line := range strings.Lines(logs) {
			if relevant(line) {
				keep = append(keep, strings.TrimSpace(line))
			}
		}
		t.Logf("%s: %s logged:\n%s", what, who, strings.Join(keep, "\n"))
	}
	show("the old node proxy "+r.proxy.Name, r.proxyLogs())
	since := metav1.NewTime(r.began.Add(-5 * time.Second))
	ctx := context.Background()
	for _, sel := range []struct{ ns, label string }{{r.proxy.Namespace, "app.kubernetes.io/name=" + nodeProxy}, {"shop", "gateway.networking.k8s.io/gateway-name=waypoint"}} {
		ps, err := client.CoreV1().Pods(sel.ns).List(ctx, metav1.ListOptions{LabelSelector: sel.label})
		if err != nil {
			t.Logf("%s: list %s: %v", what, sel.label, err)
			continue
		}
		for _, p := range ps.Items {
			for _, c := range p.Spec.Containers {
				b, err := client.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{
					Container: c.Name, SinceTime: &since, Timestamps: true, LimitBytes: new(int64(maxLogBytes)),
				}).DoRaw(ctx)
				if err != nil {
					t.Logf("%s: logs of %s/%s: %v", what, p.Name, c.Name, err)
					continue
				}
				show(p.Name+"/"+c.Name, string(b))
			}
		}
	}
}
