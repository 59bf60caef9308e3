package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// The one request every client sends, keep-alive, on both transports.
const requestText = "GET /bench/item HTTP/1.1\r\nHost: backend.bench\r\nUser-Agent: causeway-bench/1\r\nAccept: */*\r\n\r\n"

// dialFunc opens one client connection: an HBONE tunnel to the waypoint,
// or a TLS connection to nginx.
type dialFunc func(ctx context.Context) (net.Conn, error)

// loadResult is one measured run.
type loadResult struct {
	requests  int
	errors    int
	firstErr  error
	window    time.Duration
	latencies []time.Duration // sorted
}

func (r loadResult) rps() float64 { return float64(r.requests) / r.window.Seconds() }

func (r loadResult) percentile(p float64) time.Duration {
	if len(r.latencies) == 0 {
		return 0
	}
	i := int(p * float64(len(r.latencies)-1))
	return r.latencies[i]
}

// runLoad keeps conns clients busy, each on its own keep-alive connection
// sending the next request when the answer arrives (closed loop), for
// warmup and then window; only requests that end inside the window count.
// onWindow, if set, runs at the window's start and end (CPU readings).
func runLoad(ctx context.Context, dial dialFunc, conns int, warmup, window time.Duration, onWindow func(start bool) error) (loadResult, error) {
	const (
		warming = iota
		measuring
		stopping
	)
	var phase atomic.Int32
	type worker struct {
		lat      []time.Duration
		errors   int
		firstErr error
	}
	workers := make([]*worker, conns)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for i := range workers {
		w := &worker{lat: make([]time.Duration, 0, 1<<16)}
		workers[i] = w
		wg.Go(func() {
			var c net.Conn
			var br *bufio.Reader
			defer func() {
				if c != nil {
					c.Close()
				}
			}()
			for phase.Load() != stopping && ctx.Err() == nil {
				if c == nil {
					var err error
					if c, err = dial(ctx); err != nil {
						if phase.Load() == measuring {
							w.errors++
						}
						if w.firstErr == nil {
							w.firstErr = err
						}
						c = nil
						time.Sleep(10 * time.Millisecond)
						continue
					}
					br = newReader(c)
				}
				start := time.Now()
				err := roundTrip(c, br)
				ph := phase.Load()
				if err != nil {
					// The peer may close a keep-alive connection; a new one
					// follows. Errors still count: none are expected.
					if ph == measuring && ctx.Err() == nil {
						w.errors++
					}
					if w.firstErr == nil && ctx.Err() == nil && ph != stopping {
						w.firstErr = err
					}
					c.Close()
					c = nil
					continue
				}
				if ph == measuring {
					w.lat = append(w.lat, time.Since(start))
				}
			}
		})
	}
	stop := func() {
		phase.Store(stopping)
		cancel()
		wg.Wait()
	}
	if err := sleepCtx(ctx, warmup); err != nil {
		stop()
		return loadResult{}, err
	}
	if onWindow != nil {
		if err := onWindow(true); err != nil {
			stop()
			return loadResult{}, err
		}
	}
	phase.Store(measuring)
	begin := time.Now()
	serr := sleepCtx(ctx, window)
	phase.Store(stopping)
	elapsed := time.Since(begin)
	var werr error
	if onWindow != nil && serr == nil {
		werr = onWindow(false)
	}
	// Requests in flight end with the connections.
	stop()
	if err := errors.Join(serr, werr); err != nil {
		return loadResult{}, err
	}
	r := loadResult{window: elapsed}
	for _, w := range workers {
		r.latencies = append(r.latencies, w.lat...)
		r.errors += w.errors
		if r.firstErr == nil {
			r.firstErr = w.firstErr
		}
	}
	r.requests = len(r.latencies)
	slices.Sort(r.latencies)
	return r, nil
}

// roundTrip sends the request and reads a 200 answer with its body.
func roundTrip(c net.Conn, br *bufio.Reader) error {
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return err
	}
	if _, err := io.WriteString(c, requestText); err != nil {
		return fmt.Errorf("write request: %w", err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return fmt.Errorf("read response: %w", err)
	}
	n, err := io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if err != nil {
		return fmt.Errorf("read body: %w", err)
	}
	if resp.StatusCode != http.StatusOK || n != int64(len(responseBody)) {
		return fmt.Errorf("answer %s with %d body bytes, want 200 with %d", resp.Status, n, len(responseBody))
	}
	if resp.Close {
		return errors.New("the proxy closed a keep-alive connection")
	}
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func newReader(c net.Conn) *bufio.Reader { return bufio.NewReaderSize(c, 16<<10) }

func runtimeCPUs() int { return runtime.NumCPU() }
