// Package fortioload is the load of the benchmarks that measure requests
// as a client sees them (bench/latency, bench/ingress): fortio's load
// runner (fortio.org/fortio, its standard HTTP/1.1 client, one connection
// per thread) on a path the benchmark dials itself, each request's latency
// kept exactly (fortio's histogram buckets are ~20 % wide), and the CPU
// time and context switches of the path's proxies read from /proc; and the
// fortio server as the backend, a child process of the benchmark.
package fortioload

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"sort"
	"sync"
	"syscall"
	"time"

	"fortio.org/fortio/fhttp"
	"fortio.org/fortio/periodic"

	"github.com/causeway-mesh/causeway/bench/internal/benchmesh"
)

// Target is one path to the server.
type Target struct {
	URL string // the host an IP address, which fortio need not look up
	// Host, if set, is the requests' Host header.
	Host string
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// TLS is the client's configuration for an https URL.
	TLS *tls.Config
	// PIDs are the proxies on the path, whose CPU time and context
	// switches a Result counts.
	PIDs []int
}

// Load is how a measurement loads a Target.
type Load struct {
	Rate     float64 // requests per second; 0 or less: as fast as the path answers
	Conns    int
	Duration time.Duration
	// Uniform staggers the connections' requests evenly (fortio -uniform).
	Uniform bool
	// NewConns opens a connection for every request (no keep-alive).
	NewConns bool
}

// Check makes one request on t.
func (t Target) Check(ctx context.Context) error {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: t.Dial, TLSClientConfig: t.TLS}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.URL, nil)
	if err != nil {
		return err
	}
	req.Host = t.Host
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %s from %q: %.200q", resp.Status, resp.Header.Get("Server"), body)
	}
	return nil
}

// Run runs fortio's load runner on t as l says and returns each request's
// latency. Any failed request fails the measurement.
func (t Target) Run(l Load) (Result, error) {
	rec := &recorder{}
	rate := l.Rate
	if rate <= 0 {
		rate = -1 // fortio's "max"
	}
	ro := fhttp.HTTPRunnerOptions{
		RunnerOptions: periodic.RunnerOptions{QPS: rate, NumThreads: l.Conns, Duration: l.Duration, Out: io.Discard,
			Uniform: l.Uniform, AccessLogger: rec},
		HTTPOptions: fhttp.HTTPOptions{URL: t.URL, DisableFastClient: true, NumConnections: l.Conns,
			DisableKeepAlive: l.NewConns, HTTPReqTimeOut: 10 * time.Second,
			// fortio's standard client, dialing as the benchmark says (its
			// own dialer cannot bind a pod's address or use SOCKS5).
			Transport: func(base http.RoundTripper) http.RoundTripper {
				if tr, ok := base.(*http.Transport); ok {
					tr.Proxy, tr.DialContext = nil, t.Dial
					if t.TLS != nil {
						tr.TLSClientConfig = t.TLS.Clone()
					}
				}
				return base
			}},
	}
	if t.Host != "" {
		if err := ro.HTTPOptions.AddAndValidateExtraHeader("Host: " + t.Host); err != nil {
			return Result{}, err
		}
	}
	cpu0, sw0, err := Usage(t.PIDs)
	if err != nil {
		return Result{}, err
	}
	res, err := fhttp.RunHTTPTest(&ro)
	if err != nil {
		return Result{}, err
	}
	cpu1, sw1, err := Usage(t.PIDs)
	if err != nil {
		return Result{}, err
	}
	if ok := res.RetCodes[http.StatusOK]; ok != res.DurationHistogram.Count || ok == 0 {
		return Result{}, fmt.Errorf("%d of %d requests answered 200 (codes %v)", ok, res.DurationHistogram.Count, res.RetCodes)
	}
	if l.Rate > 0 && res.ActualQPS < 0.95*l.Rate {
		// fortio's threads fell behind their schedule (a busy machine):
		// the figures are kept, and say so.
		fmt.Fprintf(os.Stderr, "# %s: reached %.0f requests/s of %g\n", t.URL, res.ActualQPS, l.Rate)
	}
	p := rec.result()
	p.RPS = res.ActualQPS
	// Per request, counting fortio's warm-up request on each connection.
	reqs := float64(p.N + l.Conns)
	p.CPUUS = float64(cpu1-cpu0) / float64(time.Microsecond) / reqs
	p.Switches = float64(sw1-sw0) / reqs
	return p, nil
}

// Usage is the CPU time and context switches of the processes pids.
func Usage(pids []int) (time.Duration, int64, error) {
	var cpu time.Duration
	var sw int64
	for _, pid := range pids {
		c, err := benchmesh.CPUTime(pid)
		if err != nil {
			return 0, 0, err
		}
		n, err := benchmesh.ContextSwitches(pid)
		if err != nil {
			return 0, 0, err
		}
		cpu, sw = cpu+c, sw+n
	}
	return cpu, sw, nil
}

// recorder is fortio's access logger: it keeps every request's latency.
type recorder struct {
	mu   sync.Mutex
	secs []float64
}

func (r *recorder) Start(ctx context.Context, _ periodic.ThreadID, _ int64, _ time.Time) context.Context {
	return ctx
}

func (r *recorder) Report(_ context.Context, _ periodic.ThreadID, _ int64, _ time.Time, latency float64, _ bool, _ string) {
	r.mu.Lock()
	r.secs = append(r.secs, latency)
	r.mu.Unlock()
}

func (r *recorder) Info() string { return "latency recorder" }

func (r *recorder) result() Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := slices.Clone(r.secs)
	sort.Float64s(s)
	return Result{sorted: s, N: len(s)}
}

// Result is one measurement: its latencies, sorted, and what it cost.
type Result struct {
	sorted []float64
	N      int     // requests measured
	RPS    float64 // requests per second reached
	// The path's proxies' CPU time (microseconds) and context switches
	// per request.
	CPUUS, Switches float64
}

// MS is the q-quantile in milliseconds (nearest rank).
func (p Result) MS(q float64) float64 {
	if p.N == 0 {
		return 0
	}
	i := int(q*float64(p.N)+0.5) - 1
	return p.sorted[max(0, min(i, p.N-1))] * 1e3
}

// Median of v (the mean of the middle two for an even count).
func Median(v []float64) float64 {
	s := slices.Clone(v)
	sort.Float64s(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}

// Serve runs the fortio server on addr until the process ends; the
// benchmarks run it in a child process of their own (StartServer).
func Serve(addr string) error {
	if _, a := fhttp.ServeTCP(addr, ""); a == nil {
		return fmt.Errorf("fortio server could not listen on %s", addr)
	}
	select {}
}

// Server is the fortio server, a child process: the benchmark's own
// program started with args, which make it call Serve.
type Server struct {
	cmd *exec.Cmd
}

// StartServer starts the server and waits until addr accepts connections.
func StartServer(ctx context.Context, addr string, args ...string) (*Server, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // not left behind
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("fortio server: %w", err)
	}
	s := &Server{cmd: cmd}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return s, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			s.Stop()
			return nil, fmt.Errorf("fortio server on %s not up: %w", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// PID is the server's process id.
func (s *Server) PID() int { return s.cmd.Process.Pid }

// Stop kills the server.
func (s *Server) Stop() {
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
}
