package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/causeway-mesh/causeway/bench/internal/faultload"
)

// event is one line of the in-pod load's output: when the load started,
// a request's result, or when it ended (the last line).
type event struct {
	Started *time.Time        `json:"started,omitempty"`
	Result  *faultload.Result `json:"result,omitempty"`
	Ended   *time.Time        `json:"ended,omitempty"`
}

// loadMain is `faultsk8s load`, run in the client pod through kubectl exec:
// it waits until a GET succeeds, then sends the load until its stdin ends
// (the host closes it when the row is over) or -max passes, writing every
// result to stdout as it comes.
func loadMain(args []string) error {
	fs := flagSet("load")
	target := fs.String("url", "http://reviews.shop/", "what to GET")
	rate := fs.Int("rate", 25, "requests per second on each kind of connection (new, existing)")
	settle := fs.Duration("settle", time.Minute, "how long to wait for a first successful GET before the load starts")
	maxTime := fs.Duration("max", 10*time.Minute, "end the load after this long even if stdin stays open")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *rate <= 0 {
		return fmt.Errorf("-rate %d: want at least 1", *rate)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *maxTime)
	defer cancel()
	dial, err := pinnedDial(ctx, *target)
	if err != nil {
		return err
	}
	l := &faultload.Load{URL: *target, Rate: *rate,
		Fresh: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true}},
		Existing: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: dial,
			MaxIdleConnsPerHost: 4, MaxConnsPerHost: 4, IdleConnTimeout: time.Minute}}}
	go func() {
		// The host closes stdin to end the row.
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	if err := settleLoad(ctx, l, *settle); err != nil {
		return err
	}
	return stream(ctx, l, os.Stdout)
}

// pinnedDial resolves the URL's host once and dials that address for
// every connection: the cluster's DNS is not the mesh's, and a lost query
// would cost the resolver's 5 s timeout on a new connection.
func pinnedDial(ctx context.Context, rawURL string) (func(context.Context, string, string) (net.Conn, error), error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "http" || u.Hostname() == "" {
		return nil, fmt.Errorf("-url %q: want http://host[:port]/...", rawURL)
	}
	port := u.Port()
	if port == "" {
		port = "80"
	}
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var addrs []string
	for {
		addrs, err = net.DefaultResolver.LookupHost(rctx, u.Hostname())
		if err == nil && len(addrs) > 0 {
			break
		}
		if rctx.Err() != nil {
			return nil, fmt.Errorf("resolve %s: %v", u.Hostname(), err)
		}
		faultload.Sleep(rctx, 200*time.Millisecond)
	}
	target := net.JoinHostPort(addrs[0], port)
	var d net.Dialer
	return func(ctx context.Context, network, _ string) (net.Conn, error) {
		return d.DialContext(ctx, network, target)
	}, nil
}

// settleLoad waits until a GET succeeds, so that a row starts on a mesh
// that serves whatever the row before it did.
func settleLoad(ctx context.Context, l *faultload.Load, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		r := l.One(l.Fresh)
		if r.Cause == "" {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("no GET of %s succeeded within %v; last: %s", l.URL, limit, r.Cause)
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// stream runs the load until ctx ends and writes its events to w: started,
// the results (every 100 ms those answered since), ended.
func stream(ctx context.Context, l *faultload.Load, w io.Writer) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	write := func(e event) error {
		if err := enc.Encode(e); err != nil {
			return err
		}
		return bw.Flush()
	}
	started := time.Now()
	if err := write(event{Started: &started}); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		l.Run(ctx)
		close(done)
	}()
	flush := func() error {
		for _, r := range l.Take() {
			if err := write(event{Result: &r}); err != nil {
				return err
			}
		}
		return nil
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for running := true; running; {
		select {
		case <-tick.C:
		case <-done:
			running = false
		}
		if err := flush(); err != nil {
			return err
		}
	}
	ended := time.Now()
	return write(event{Ended: &ended})
}

// idleMain is the client pod's own process: it waits to be stopped.
func idleMain() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	<-sig
}

// remoteLoad is the host's view of one run of the in-pod load: the events
// read from its output so far.
type remoteLoad struct {
	mu      sync.Mutex
	started time.Time
	ended   time.Time
	results []faultload.Result
	// startedc is closed at the started event.
	startedc chan struct{}
}

func newRemoteLoad() *remoteLoad { return &remoteLoad{startedc: make(chan struct{})} }

// read consumes the load's output until it ends, which must be with the
// ended event.
func (l *remoteLoad) read(r io.Reader) error {
	dec := json.NewDecoder(io.LimitReader(r, 256<<20))
	for {
		var e event
		if err := dec.Decode(&e); err != nil {
			if err == io.EOF {
				return fmt.Errorf("the load's output ended before its end")
			}
			return fmt.Errorf("the load's output: %w", err)
		}
		l.mu.Lock()
		switch {
		case e.Started != nil:
			if !l.started.IsZero() {
				l.mu.Unlock()
				return fmt.Errorf("the load's output: started twice")
			}
			l.started = *e.Started
			close(l.startedc)
		case e.Result != nil:
			l.results = append(l.results, *e.Result)
		case e.Ended != nil:
			l.ended = *e.Ended
		default:
			l.mu.Unlock()
			return fmt.Errorf("the load's output: an empty event")
		}
		done := !l.ended.IsZero()
		l.mu.Unlock()
		if done {
			return nil
		}
	}
}

// first is the earliest answered of the results so far that satisfy f.
func (l *remoteLoad) first(f func(faultload.Result) bool) (faultload.Result, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out faultload.Result
	found := false
	for _, r := range l.results {
		if f(r) && (!found || r.End.Before(out.End)) {
			out, found = r, true
		}
	}
	return out, found
}

// revisions counts the policy revisions the answers so far show.
func (l *remoteLoad) revisions() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	seen := map[string]bool{}
	for _, r := range l.results {
		if r.Revision != "" {
			seen[r.Revision] = true
		}
	}
	return len(seen)
}

// window is the load's results and its span (once it has ended).
func (l *remoteLoad) window() (rs []faultload.Result, from, to time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]faultload.Result(nil), l.results...), l.started, l.ended
}
