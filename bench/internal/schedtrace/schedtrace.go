// Package schedtrace reads a Go execution trace (a proxy's
// /debug/pprof/trace) for what delays a request inside a process other
// than its own work: how long goroutines that became runnable waited to
// run (the hand-offs of a request), and what the garbage collector took
// (stop-the-world pauses, assists charged to goroutines). The latency
// benchmarks print these beside the percentiles they explain.
package schedtrace

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/exp/trace"
)

// Stats is what one trace shows.
type Stats struct {
	// Waits: runnable -> running of every goroutine woken, sorted.
	Waits []time.Duration
	// GCs: garbage collection cycles begun in the trace.
	GCs int
	// Pauses: stop-the-world pauses, sorted (the trace's own not counted).
	Pauses []time.Duration
	// Assist: time goroutines spent assisting the collector's marking
	// (work a request's goroutine does before it may allocate).
	Assist time.Duration
	// Span is the trace's length.
	Span time.Duration
}

// rangeKey names an open range: one of a name per resource at a time.
type rangeKey struct {
	name  string
	scope trace.ResourceID
}

// Read parses the trace in file.
func Read(file string) (Stats, error) {
	f, err := os.Open(file)
	if err != nil {
		return Stats{}, err
	}
	defer f.Close()
	r, err := trace.NewReader(f)
	if err != nil {
		return Stats{}, fmt.Errorf("%s: %w", file, err)
	}
	var (
		s           Stats
		runnable    = map[trace.GoID]trace.Time{}
		open        = map[rangeKey]trace.Time{}
		first, last trace.Time
	)
	for {
		ev, err := r.ReadEvent()
		if err == io.EOF {
			break
		}
		if err != nil {
			return Stats{}, fmt.Errorf("%s: %w", file, err)
		}
		if first == 0 {
			first = ev.Time()
		}
		last = ev.Time()
		switch ev.Kind() {
		case trace.EventStateTransition:
			st := ev.StateTransition()
			if st.Resource.Kind != trace.ResourceGoroutine {
				continue
			}
			id := st.Resource.Goroutine()
			switch from, to := st.Goroutine(); {
			case to == trace.GoRunnable && from != trace.GoRunnable:
				runnable[id] = ev.Time()
			case from == trace.GoRunnable && to == trace.GoRunning:
				if t0, ok := runnable[id]; ok {
					s.Waits = append(s.Waits, ev.Time().Sub(t0))
					delete(runnable, id)
				}
			}
		case trace.EventRangeBegin:
			rg := ev.Range()
			open[rangeKey{rg.Name, rg.Scope}] = ev.Time()
			if rg.Name == "GC concurrent mark phase" {
				s.GCs++
			}
		case trace.EventRangeEnd:
			rg := ev.Range()
			k := rangeKey{rg.Name, rg.Scope}
			t0, ok := open[k]
			if !ok {
				continue // begun before the trace started
			}
			delete(open, k)
			d := ev.Time().Sub(t0)
			switch {
			case strings.HasPrefix(rg.Name, "stop-the-world") && !strings.Contains(rg.Name, "trace"):
				// (Not the pauses of starting and stopping the trace.)
				s.Pauses = append(s.Pauses, d)
			case rg.Name == "GC mark assist":
				s.Assist += d
			}
		}
	}
	slices.Sort(s.Waits)
	slices.Sort(s.Pauses)
	s.Span = last.Sub(first)
	return s, nil
}

// quantile of sorted durations, in microseconds.
func quantile(d []time.Duration, q float64) float64 {
	if len(d) == 0 {
		return 0
	}
	return float64(d[min(len(d)-1, int(q*float64(len(d))))]) / 1e3
}

func sum(d []time.Duration) time.Duration {
	var t time.Duration
	for _, v := range d {
		t += v
	}
	return t
}

// Report prints the trace's figures as "bench: <name>_<figure>" lines.
func Report(w io.Writer, name string, s Stats) {
	for _, c := range []struct {
		suffix string
		v      float64
	}{{"p50", 0.5}, {"p90", 0.9}, {"p99", 0.99}, {"p99_9", 0.999}} {
		fmt.Fprintf(w, "bench: %s_sched_wait_%s %.1f us\n", name, c.suffix, quantile(s.Waits, c.v))
	}
	fmt.Fprintf(w, "bench: %s_sched_wait_max %.1f us\n", name, quantile(s.Waits, 1))
	fmt.Fprintf(w, "bench: %s_sched_wait_total %.1f ms\n", name, float64(sum(s.Waits))/1e6)
	fmt.Fprintf(w, "bench: %s_gc_cycles_per_second %.1f\n", name, float64(s.GCs)/max(s.Span.Seconds(), 1e-9))
	fmt.Fprintf(w, "bench: %s_gc_pause_max %.1f us\n", name, quantile(s.Pauses, 1))
	fmt.Fprintf(w, "bench: %s_gc_pause_total %.1f ms\n", name, float64(sum(s.Pauses))/1e6)
	fmt.Fprintf(w, "bench: %s_gc_assist_total %.1f ms\n", name, float64(s.Assist)/1e6)
}

// maxTrace bounds a trace fetched: a few seconds of a busy proxy are tens
// of megabytes.
const maxTrace = 1 << 30

// Fetch writes the trace that url serves (a /debug/pprof/trace?seconds=N)
// to file, through client.
func Fetch(ctx context.Context, client *http.Client, url, file string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, io.LimitReader(resp.Body, maxTrace)); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
