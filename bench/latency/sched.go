package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"golang.org/x/exp/trace"
)

// schedWaits reads an execution trace and returns, sorted, how long each
// goroutine that became runnable waited before it ran: the scheduling
// delay a request pays at each hand-off between goroutines (a socket
// becoming readable, a writer woken by a flush, a reader by arriving data).
func schedWaits(file string) ([]time.Duration, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r, err := trace.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	since := map[trace.GoID]trace.Time{}
	var waits []time.Duration
	for {
		ev, err := r.ReadEvent()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		if ev.Kind() != trace.EventStateTransition {
			continue
		}
		st := ev.StateTransition()
		if st.Resource.Kind != trace.ResourceGoroutine {
			continue
		}
		id := st.Resource.Goroutine()
		switch from, to := st.Goroutine(); {
		case to == trace.GoRunnable && from != trace.GoRunnable:
			since[id] = ev.Time()
		case from == trace.GoRunnable && to == trace.GoRunning:
			if t0, ok := since[id]; ok {
				waits = append(waits, ev.Time().Sub(t0))
				delete(since, id)
			}
		}
	}
	slices.Sort(waits)
	return waits, nil
}

// reportSchedWaits prints the scheduling delays of one traced process.
func reportSchedWaits(name, file string) {
	w, err := schedWaits(file)
	if err != nil || len(w) == 0 {
		fmt.Fprintf(os.Stderr, "latency bench: trace %s: %v (%d waits)\n", file, err, len(w))
		return
	}
	q := func(p float64) float64 { return float64(w[min(len(w)-1, int(p*float64(len(w))))]) / 1e3 }
	var total time.Duration
	for _, d := range w {
		total += d
	}
	for _, c := range []struct {
		suffix string
		v      float64
	}{{"p50", q(0.5)}, {"p90", q(0.9)}, {"p99", q(0.99)}, {"max", float64(w[len(w)-1]) / 1e3}} {
		fmt.Printf("bench: %s_sched_wait_%s %.1f us\n", name, c.suffix, c.v)
	}
	fmt.Printf("bench: %s_sched_wait_total %.1f ms\n", name, float64(total)/1e6)
}
