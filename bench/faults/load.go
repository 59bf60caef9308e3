package main

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

// result is one request of the load.
type result struct {
	conn       string // "new" (a connection per request) or "existing" (keep-alive)
	start, end time.Time
	cause      string // "" when it succeeded
	revision   string // the policy revision that allowed it (from the echoed header)
}

// load sends GETs at a fixed rate on two kinds of connections, recording
// every request. check, if set, may turn a 200 into a failure.
type load struct {
	url      string
	rate     int // requests per second per connection kind
	fresh    *http.Client
	existing *http.Client

	mu      sync.Mutex
	results []result
	wg      sync.WaitGroup
}

// run sends until ctx ends, then waits for the requests in flight.
func (l *load) run(ctx context.Context) {
	tick := time.NewTicker(time.Second / time.Duration(l.rate))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			l.wg.Wait()
			return
		case <-tick.C:
		}
		for _, kind := range []string{"new", "existing"} {
			client := l.fresh
			if kind == "existing" {
				client = l.existing
			}
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				r := l.one(client)
				r.conn = kind
				l.mu.Lock()
				l.results = append(l.results, r)
				l.mu.Unlock()
			}()
		}
	}
}

func (l *load) one(client *http.Client) result {
	r := result{start: time.Now()}
	defer func() { r.end = time.Now() }()
	resp, err := client.Get(l.url)
	if err != nil {
		r.cause = classify(err)
		r.end = time.Now()
		return r
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	r.end = time.Now()
	switch {
	case err != nil:
		r.cause = "body: " + classify(err)
	case resp.StatusCode != http.StatusOK:
		r.cause = fmt.Sprintf("HTTP %d %s", resp.StatusCode, firstLine(string(body)))
	default:
		var echo struct{ Headers map[string][]string }
		if json.Unmarshal(body, &echo) != nil {
			r.cause = "not the echo's answer"
			break
		}
		revs := policyRevisions(echo.Headers["X-Policy-Revision"])
		if len(revs) != 1 {
			r.cause = fmt.Sprintf("decided by %d policy revisions %v", len(revs), revs)
			break
		}
		r.revision = revs[0]
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

// classify names an error's cause without its addresses, so that equal
// causes count together.
func classify(err error) string {
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

// take returns and clears the results so far.
func (l *load) take() []result {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.results
	l.results = nil
	return out
}

// summary is one row's figures for one connection kind.
type summary struct {
	sent, failed int
	causes       map[string]int
	longestGap   time.Duration // between successive successes, or the window's edges
	revisions    map[string]int
}

func summarize(rs []result, kind string, from, to time.Time) summary {
	s := summary{causes: map[string]int{}, revisions: map[string]int{}}
	var ok []time.Time
	for _, r := range rs {
		if r.conn != kind {
			continue
		}
		s.sent++
		if r.cause != "" {
			s.failed++
			s.causes[r.cause]++
			continue
		}
		ok = append(ok, r.end)
		s.revisions[r.revision]++
	}
	sort.Slice(ok, func(i, j int) bool { return ok[i].Before(ok[j]) })
	prev := from
	for _, t := range append(ok, to) {
		if g := t.Sub(prev); g > s.longestGap {
			s.longestGap = g
		}
		if t.After(prev) {
			prev = t
		}
	}
	return s
}

func (s summary) causesText() string {
	if len(s.causes) == 0 {
		return "-"
	}
	var parts []string
	for c, n := range s.causes {
		parts = append(parts, fmt.Sprintf("%d %s", n, c))
	}
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}
