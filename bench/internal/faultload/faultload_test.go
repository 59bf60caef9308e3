package faultload

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestSummarize(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	rs := []Result{
		{Conn: "new", Start: at(0), End: at(100), Revision: "rev-0"},
		{Conn: "new", Start: at(100), End: at(900), Cause: "connection refused"},
		{Conn: "new", Start: at(200), End: at(300), Cause: "connection refused"},
		{Conn: "existing", Start: at(200), End: at(250), Revision: "rev-0"},
		// Out of order: answered before the one above it.
		{Conn: "new", Start: at(1200), End: at(1400), Revision: "rev-1"},
		{Conn: "new", Start: at(1000), End: at(1100), Revision: "rev-1"},
	}
	s := Summarize(rs, "new", at(0), at(2000))
	if s.Sent != 5 || s.Failed != 2 || s.Causes["connection refused"] != 2 {
		t.Errorf("sent %d failed %d causes %v, want 5, 2, 2 refused", s.Sent, s.Failed, s.Causes)
	}
	// Successes end at 100, 1100, 1400; the window at 2000.
	if s.LongestGap != time.Second {
		t.Errorf("longest gap %v, want 1s (100 ms to 1.1 s)", s.LongestGap)
	}
	if s.Revisions["rev-0"] != 1 || s.Revisions["rev-1"] != 2 {
		t.Errorf("revisions %v", s.Revisions)
	}
	if got := s.CausesText(); got != "2 connection refused" {
		t.Errorf("causes %q", got)
	}
	e := Summarize(rs, "existing", at(0), at(2000))
	if e.Sent != 1 || e.LongestGap != 1750*time.Millisecond || e.CausesText() != "-" {
		t.Errorf("existing: %+v", e)
	}
	// No success at all: the whole window is the gap.
	if g := Summarize(nil, "new", at(0), at(2000)).LongestGap; g != 2*time.Second {
		t.Errorf("empty window's gap %v", g)
	}
}

// The load against an echo-like server on loopback: a request counts only
// with a 200 carrying exactly one revision marker.
func TestLoadJudgesAnswers(t *testing.T) {
	answer := make(chan func(http.ResponseWriter), 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (<-answer)(w) }))
	defer srv.Close()
	echo := func(revs ...string) func(http.ResponseWriter) {
		return func(w http.ResponseWriter) {
			json.NewEncoder(w).Encode(map[string]any{"headers": map[string][]string{"X-Policy-Revision": revs}})
		}
	}
	l := &Load{URL: srv.URL, Rate: 10, Fresh: srv.Client(), Existing: srv.Client()}
	for _, c := range []struct {
		answer     func(http.ResponseWriter)
		cause, rev string
	}{
		{echo("read,rev-3"), "", "rev-3"},
		{echo(), "decided by 0 policy revisions []", ""},
		{echo("read,rev-3", "read,rev-4"), "decided by 2 policy revisions [rev-3 rev-4]", ""},
		{func(w http.ResponseWriter) { http.Error(w, "upstream connect error\nmore", 503) }, "HTTP 503 upstream connect error", ""},
		{func(w http.ResponseWriter) { fmt.Fprint(w, "<html>") }, "not the echo's answer", ""},
	} {
		answer <- c.answer
		r := l.One(l.Fresh)
		if r.Cause != c.cause || r.Revision != c.rev || r.End.Before(r.Start) {
			t.Errorf("got %+v, want cause %q revision %q", r, c.cause, c.rev)
		}
	}
}

func TestLoadRunRecordsBothKinds(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"headers": {"X-Policy-Revision": ["read,rev-0"]}}`)
	}))
	defer srv.Close()
	l := &Load{URL: srv.URL, Rate: 50, Fresh: srv.Client(), Existing: srv.Client()}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	l.Run(ctx)
	rs := l.Take()
	kinds := map[string]int{}
	for _, r := range rs {
		if r.Cause != "" {
			t.Fatalf("%+v", r)
		}
		kinds[r.Conn]++
	}
	if kinds["new"] == 0 || kinds["new"] != kinds["existing"] {
		t.Errorf("results by kind %v, want as many of each", kinds)
	}
	if len(l.Take()) != 0 {
		t.Error("Take left results behind")
	}
}

func TestClassify(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, err = (&http.Client{}).Get("http://" + addr + "/")
	if got := Classify(err); got != "connection refused" {
		t.Errorf("refused dial: %q (%v)", got, err)
	}
	if got := Classify(fmt.Errorf("dial tcp 10.96.0.7:80: some: thing odd")); got != "thing odd" {
		t.Errorf("other error: %q", got)
	}
}

func TestVerdict(t *testing.T) {
	for _, c := range []struct {
		why, problem, note, want string
		met                      bool
	}{
		{"", "", "", "met", true},
		{"", "", "3 edits", "met (3 edits)", true},
		{"2 failed on new connections", "", "n", "NOT met: 2 failed on new connections (n)", false},
		{"", "not ejected", "", "NOT met: not ejected", false},
		{"a", "b", "", "NOT met: a, b", false},
	} {
		got, met := Verdict(c.why, c.problem, c.note)
		if got != c.want || met != c.met {
			t.Errorf("Verdict(%q, %q, %q) = %q, %v; want %q, %v", c.why, c.problem, c.note, got, met, c.want, c.met)
		}
	}
	if got := NoFailures(Summary{Failed: 1}, Summary{Failed: 2}); got != "1 failed on new connections, 2 failed on existing connections" {
		t.Errorf("NoFailures: %q", got)
	}
}

func TestRouteTexts(t *testing.T) {
	r := Route(100, 0, ExtraRule, "")
	if strings.Contains(r, "retry") || !strings.Contains(r, "weight: 100}, {name: reviews-v2, port: 80, weight: 0}") || !strings.Contains(r, "x-version") {
		t.Errorf("route without retry:\n%s", r)
	}
	if r := Route(50, 50, "", RetryOn5xx); !strings.HasSuffix(r, "weight: 50}]\n"+RetryOn5xx) {
		t.Errorf("route with retry:\n%s", r)
	}
	if !strings.Contains(Policy(7), `"read,rev-7"`) {
		t.Error("policy without its revision")
	}
}
