// Package faultload is the load of the fault benchmarks (bench/faults on
// the local mesh, bench/faultsk8s on the test cluster): GETs at a fixed rate
// on new and on existing connections, every request recorded, and the
// per-row figures (sent, failed by cause, longest gap) the tables show.
package faultload

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Result is one request of the load. Its JSON form is what the in-pod load
// of bench/faultsk8s streams to the host.
type Result struct {
	Conn     string    `json:"conn"` // "new" (a connection per request) or "existing" (keep-alive)
	Start    time.Time `json:"start"`
	End      time.Time `json:"end"`
	Cause    string    `json:"cause,omitempty"`    // "" when it succeeded
	Revision string    `json:"revision,omitempty"` // the policy revision that allowed it (from the echoed header)
}

// Load sends GETs at a fixed rate on two kinds of connections, recording
// every request. A request fails when it errs, answers other than 200, or
// its answer (cmd/echo's) does not carry exactly one policy revision (see
// Policy).
type Load struct {
	URL      string
	Rate     int          // requests per second per connection kind
	Fresh    *http.Client // a connection per request
	Existing *http.Client // a keep-alive pool

	mu      sync.Mutex
	results []Result
	wg      sync.WaitGroup
}

// Run sends until ctx ends, then waits for the requests in flight.
func (l *Load) Run(ctx context.Context) {
	tick := time.NewTicker(time.Second / time.Duration(l.Rate))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			l.wg.Wait()
			return
		case <-tick.C:
		}
		for _, kind := range []string{"new", "existing"} {
			client := l.Fresh
			if kind == "existing" {
				client = l.Existing
			}
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				r := l.One(client)
				r.Conn = kind
				l.mu.Lock()
				l.results = append(l.results, r)
				l.mu.Unlock()
			}()
		}
	}
}

// One sends one GET with client and says how it went (Conn unset).
func (l *Load) One(client *http.Client) Result {
	r := Result{Start: time.Now()}
	resp, err := client.Get(l.URL)
	if err != nil {
		r.Cause = Classify(err)
		r.End = time.Now()
		return r
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	r.End = time.Now()
	switch {
	case err != nil:
		r.Cause = "body: " + Classify(err)
	case resp.StatusCode != http.StatusOK:
		r.Cause = fmt.Sprintf("HTTP %d %s", resp.StatusCode, firstLine(string(body)))
	default:
		var echo struct{ Headers map[string][]string }
		if json.Unmarshal(body, &echo) != nil {
			r.Cause = "not the echo's answer"
			break
		}
		revs := policyRevisions(echo.Headers["X-Policy-Revision"])
		if len(revs) != 1 {
			r.Cause = fmt.Sprintf("decided by %d policy revisions %v", len(revs), revs)
			break
		}
		r.Revision = revs[0]
	}
	return r
}

// policyRevisions picks the rev-N markers out of the x-policy-revision
// values the waypoint added (the harness's policy allows with one).
func policyRevisions(values []string) []string {
	var out []string
	for _, v := range values {
		for _, part := range strings.Split(v, ",") {
			if strings.HasPrefix(part, "rev-") {
				out = append(out, part)
			}
		}
	}
	return out
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	if len(s) > 80 {
		s = s[:80]
	}
	return s
}

// Classify names an error's cause without its addresses, so that equal
// causes count together.
func Classify(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "EOF"
	case errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 {
		s = s[i+2:]
	}
	return s
}

// Take returns and clears the results so far.
func (l *Load) Take() []Result {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.results
	l.results = nil
	return out
}

// Summary is one row's figures for one connection kind.
type Summary struct {
	Sent, Failed int
	Causes       map[string]int
	LongestGap   time.Duration // between successive successes, or the window's edges
	Revisions    map[string]int
}

// Summarize figures the results of one connection kind in the window
// [from, to].
func Summarize(rs []Result, kind string, from, to time.Time) Summary {
	s := Summary{Causes: map[string]int{}, Revisions: map[string]int{}}
	var ok []time.Time
	for _, r := range rs {
		if r.Conn != kind {
			continue
		}
		s.Sent++
		if r.Cause != "" {
			s.Failed++
			s.Causes[r.Cause]++
			continue
		}
		ok = append(ok, r.End)
		s.Revisions[r.Revision]++
	}
	sort.Slice(ok, func(i, j int) bool { return ok[i].Before(ok[j]) })
	prev := from
	for _, t := range append(ok, to) {
		if g := t.Sub(prev); g > s.LongestGap {
			s.LongestGap = g
		}
		if t.After(prev) {
			prev = t
		}
	}
	return s
}

// CausesText lists the causes of failure with their counts ("-" for none).
func (s Summary) CausesText() string {
	if len(s.Causes) == 0 {
		return "-"
	}
	var parts []string
	for c, n := range s.Causes {
		parts = append(parts, fmt.Sprintf("%d %s", n, c))
	}
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}

// Sleep waits for d or until ctx ends.
func Sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
