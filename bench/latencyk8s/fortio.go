package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// percentiles are the latency percentiles reported, as fortio's -p takes them.
var percentiles = []float64{50, 90, 99, 99.9}

// load is one fortio run: a fixed rate over a number of connections
// (fortio's -qps and -c; each connection sends qps/c requests a second).
type load struct {
	qps, conns int
	duration   time.Duration
	// uniform spreads the connections' requests over each interval
	// (fortio -uniform) instead of sending them together.
	uniform bool
}

// args is the command that runs the load in the client pod against url.
func (l load) args(url string) []string {
	ps := make([]string, len(percentiles))
	for i, p := range percentiles {
		ps[i] = strconv.FormatFloat(p, 'f', -1, 64)
	}
	a := []string{"/usr/local/bin/fortio", "load", "-quiet", "-json", "-",
		"-qps", fmt.Sprint(l.qps), "-c", fmt.Sprint(l.conns), "-t", l.duration.String(),
		// Histogram buckets of 10 µs at the low end (the default is 1 ms).
		"-r", "0.00001", "-p", strings.Join(ps, ",")}
	if l.uniform {
		a = append(a, "-uniform")
	}
	return append(a, url)
}

// result is what one fortio run measured.
type result struct {
	qps      float64 // achieved
	requests int64
	failed   int64 // answered with anything but 2xx, or not at all
	// latency holds the percentiles' values (as percentiles lists them).
	latency []time.Duration
}

// fortioOutput is the part of fortio's JSON output (fhttp.HTTPRunnerResults)
// that is read.
type fortioOutput struct {
	ActualQPS         float64
	RetCodes          map[string]int64
	DurationHistogram struct {
		Count       int64
		Percentiles []struct {
			Percentile float64
			Value      float64 // seconds
		}
	}
}

func parseFortio(b []byte) (result, error) {
	var o fortioOutput
	if err := json.Unmarshal(b, &o); err != nil {
		return result{}, fmt.Errorf("fortio's output: %w", err)
	}
	r := result{qps: o.ActualQPS, requests: o.DurationHistogram.Count, failed: o.DurationHistogram.Count}
	if r.requests <= 0 {
		return r, fmt.Errorf("fortio's output: no requests")
	}
	for code, n := range o.RetCodes {
		c, err := strconv.Atoi(code)
		if err != nil {
			return r, fmt.Errorf("fortio's output: return code %q", code)
		}
		if c >= 200 && c < 300 {
			r.failed -= n
		}
	}
	for _, want := range percentiles {
		found := false
		for _, p := range o.DurationHistogram.Percentiles {
			if p.Percentile == want {
				r.latency = append(r.latency, time.Duration(p.Value*float64(time.Second)))
				found = true
				break
			}
		}
		if !found {
			return r, fmt.Errorf("fortio's output: no p%v", want)
		}
	}
	return r, nil
}
