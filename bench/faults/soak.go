package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/causeway-mesh/causeway/bench/internal/benchmesh"
	"github.com/causeway-mesh/causeway/bench/internal/faultload"
)

// The soak row: many idle connections (to the sink, a pod without a
// waypoint on node-b, through both node proxies) and many active ones
// (keep-alive GETs through the waypoints) held while the mesh's processes
// are sampled; a count that grows while the connections stay the same is
// a leak, and so is one that does not come back down once they close.
type soakOptions struct {
	duration time.Duration // how long the connections are held once open
	idle     int
	active   int
	interval time.Duration // between two requests of one active connection
	sample   time.Duration
	// openRate paces the opening (connections per second): the kernel
	// fires the keepalive timers of sockets opened close together in one
	// batch, and over loopback a batch larger than the input backlog
	// loses the same sockets' probes every round until it aborts them
	// (hostnet.go). Connections build up over time in real use; opened
	// all at once (7 s for 11,000) the soak measured this host instead of
	// the mesh.
	openRate int
}

// sinkAddr is the sink pod's address (mesh.go).
const sinkAddr = "127.0.83.13:8080"

// soakProcesses are the processes sampled: every proxy the connections
// cross.
var soakProcesses = []string{nodeProxyA, "nodeproxy-node-b", waypoint0, waypoint1}

// raiseFileLimit lets this process and the mesh's (which inherit it) hold
// the soak's connections: each process holds up to one descriptor per
// connection, the harness one per connection and the sink one.
func raiseFileLimit(need uint64) error {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return err
	}
	if l.Cur >= need {
		return nil
	}
	want := syscall.Rlimit{Cur: need, Max: max(l.Max, need)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
		return fmt.Errorf("the soak needs %d file descriptors per process, the limit is %d (hard %d): %w", need, l.Cur, l.Max, err)
	}
	return nil
}

// sample is one reading of one process. live is the heap a garbage
// collection forced for the sample kept (the collection's next goal over
// 1+GOGC/100): RSS moves with the collector's pace (the proxies run
// GOGC=400, so collections are rare) and the Go runtime's returning of
// memory, live only with what the process holds.
type sample struct {
	goroutines, fds int
	rss, live       int64
}

func (h *harness) sampleAll() (map[string]sample, error) {
	pids := h.mesh.PIDs()
	out := map[string]sample{}
	for _, name := range soakProcesses {
		pid, ok := pids[name]
		if !ok {
			return nil, fmt.Errorf("%s is not running", name)
		}
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil {
			return nil, err
		}
		rss, err := benchmesh.RSS(pid)
		if err != nil {
			return nil, err
		}
		if err := h.forceGC(name); err != nil {
			return nil, err
		}
		var g [3]float64
		for i, m := range []string{"go_goroutines", "go_memstats_next_gc_bytes", "go_gc_gogc_percent"} {
			if g[i], err = h.gauge(name, m); err != nil {
				return nil, err
			}
		}
		out[name] = sample{goroutines: int(g[0]), fds: len(fds), rss: rss, live: int64(g[1] / (1 + g[2]/100))}
	}
	return out, nil
}

// ports are the admin and status addresses of a node proxy or waypoint
// (by process name).
func (h *harness) ports(name string) (admin, status string) {
	for _, n := range h.mesh.Plan.Nodes {
		if "nodeproxy-"+n.Node == name {
			return n.Admin, n.Status
		}
	}
	for _, w := range h.mesh.Plan.Waypoints {
		if "waypoint-"+w.Namespace+"-"+w.Pod == name {
			return w.Admin, w.Status
		}
	}
	return "", ""
}

// forceGC makes a node proxy or waypoint collect its garbage: its admin
// port's heap profile with gc=1 does (the profile itself is discarded).
func (h *harness) forceGC(name string) error {
	addr, _ := h.ports(name)
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Get("http://" + addr + "/debug/pprof/heap?gc=1")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<20))
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s heap profile: HTTP %d", name, resp.StatusCode)
	}
	return err
}

// gauge reads one unlabelled metric of a mesh process.
func (h *harness) gauge(name, metric string) (float64, error) {
	found, v := false, 0.0
	err := h.scrape(name, func(line string) error {
		s, ok := strings.CutPrefix(line, metric+" ")
		if !ok || found {
			return nil
		}
		found = true
		_, err := fmt.Sscan(s, &v)
		return err
	})
	if err == nil && !found {
		err = fmt.Errorf("%s: no %s in /metrics", name, metric)
	}
	return v, err
}

// scrape calls each for every line of a node proxy's or waypoint's
// /metrics (on its status port).
func (h *harness) scrape(name string, each func(line string) error) error {
	_, addr := h.ports(name)
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + addr + "/metrics")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 16<<20))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if err := each(sc.Text()); err != nil {
			return fmt.Errorf("%s /metrics: %w", name, err)
		}
	}
	return sc.Err()
}

// soakConns are the connections the soak holds.
type soakConns struct {
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
	// closedIdle counts idle connections the mesh (or the sink) closed;
	// activeOK, activeFailed the active connections' requests, redialed
	// the active connections made again after a failure.
	closedIdle, activeOK, activeFailed, redialed atomic.Int64
	stopping                                     atomic.Bool
	// held is when the hold began (Unix nanoseconds; before, when the
	// opening did).
	held atomic.Int64
	// idleEnds are the idle connections' ends, by the harness's error
	// (under mu).
	idleEnds map[string]*idleEnd
}

// idleEnd counts the idle connections that ended with one error, and
// when the first and the last did (after the hold began).
type idleEnd struct {
	n           int
	first, last time.Duration
}

// idleEnded records an idle connection's end (not one the harness closed).
func (s *soakConns) idleEnded(err error) {
	at := time.Since(time.Unix(0, s.held.Load()))
	s.closedIdle.Add(1)
	text := "EOF"
	if err != nil {
		text = err.Error()
		// "read tcp 127.0.1.1:40000->127.0.0.1:21100: read: connection
		// reset by peer": the addresses differ per connection.
		if i := strings.LastIndex(text, ": "); i >= 0 {
			text = text[i+2:]
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.idleEnds == nil {
		s.idleEnds = map[string]*idleEnd{}
	}
	e := s.idleEnds[text]
	if e == nil {
		e = &idleEnd{first: at}
		s.idleEnds[text] = e
	}
	e.n++
	e.last = at
}

// idleEndsMatching counts the idle connections that ended with one of
// the errors.
func (s *soakConns) idleEndsMatching(texts ...string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, t := range texts {
		if e := s.idleEnds[t]; e != nil {
			n += e.n
		}
	}
	return int64(n)
}

// idleEndsText is the idle connections' ends, most frequent first.
func (s *soakConns) idleEndsText() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]string, 0, len(s.idleEnds))
	for k := range s.idleEnds {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return s.idleEnds[keys[i]].n > s.idleEnds[keys[j]].n })
	var parts []string
	for _, k := range keys {
		e := s.idleEnds[k]
		parts = append(parts, fmt.Sprintf("%d %q (from %v to %v into the hold)", e.n, k, e.first.Round(time.Second), e.last.Round(time.Second)))
	}
	return strings.Join(parts, ", ")
}

func (s *soakConns) add(c net.Conn) {
	s.mu.Lock()
	s.conns = append(s.conns, c)
	s.mu.Unlock()
}

func (s *soakConns) closeAll() {
	s.stopping.Store(true)
	s.mu.Lock()
	for _, c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// get sends one GET on c and reads the answer.
func get(c net.Conn, br *bufio.Reader, host string) error {
	c.SetDeadline(time.Now().Add(30 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", host); err != nil {
		return err
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return err
}

func soakRow(o soakOptions) func(ctx context.Context, h *harness) (outcome, error) {
	return func(ctx context.Context, h *harness) (outcome, error) {
		client, err := h.mesh.Plan.Client("web/frontend")
		if err != nil {
			return outcome{}, err
		}
		base, err := h.sampleAll()
		if err != nil {
			return outcome{}, err
		}
		s := &soakConns{}
		defer s.closeAll()
		dial := func(addr, host string) (net.Conn, *bufio.Reader, error) {
			c, err := client.DialContext(ctx, "tcp", addr)
			if err != nil {
				return nil, nil, err
			}
			br := bufio.NewReaderSize(c, 1024)
			if err := get(c, br, host); err != nil {
				c.Close()
				return nil, nil, err
			}
			return c, br, nil
		}
		net0, err := readHostNet()
		if err != nil {
			return outcome{}, err
		}
		// Open them 64 at a time; each answers one GET first, so that it
		// is known to cross the mesh.
		opened := time.Now()
		s.held.Store(opened.UnixNano())
		sem := make(chan struct{}, 64)
		var openErr atomic.Value
		var opening sync.WaitGroup
		for i := 0; i < o.idle+o.active && ctx.Err() == nil && openErr.Load() == nil; i++ {
			faultload.Sleep(ctx, time.Until(opened.Add(time.Duration(i)*time.Second/time.Duration(max(o.openRate, 1)))))
			sem <- struct{}{}
			opening.Go(func() {
				defer func() { <-sem }()
				active := i >= o.idle
				addr, host := sinkAddr, "sink.soak"
				if active {
					addr, host = "reviews.shop:80", "reviews.shop"
				}
				c, br, err := dial(addr, host)
				if err != nil {
					openErr.CompareAndSwap(nil, fmt.Errorf("connection %d of %d: %w", i+1, o.idle+o.active, err))
					return
				}
				s.add(c)
				s.wg.Go(func() {
					if !active {
						// Idle: the read returns only when the connection ends.
						_, err := c.Read(make([]byte, 1))
						if !s.stopping.Load() {
							s.idleEnded(err)
						}
						return
					}
					faultload.Sleep(ctx, time.Duration(rand.Int64N(int64(o.interval))))
					for !s.stopping.Load() && ctx.Err() == nil {
						if err := get(c, br, host); err != nil {
							if s.stopping.Load() {
								return
							}
							s.activeFailed.Add(1)
							c.Close()
							if c, br, err = dial(addr, host); err != nil {
								return
							}
							s.add(c)
							s.redialed.Add(1)
						} else {
							s.activeOK.Add(1)
						}
						faultload.Sleep(ctx, o.interval)
					}
				})
			})
		}
		opening.Wait()
		if err, _ := openErr.Load().(error); err != nil {
			return outcome{}, err
		}
		openTook := time.Since(opened)

		// Hold them, sampling; the first quarter (at most 2 minutes) warms
		// up (buffers, the garbage collector's pace) and is only shown.
		held := time.Now()
		s.held.Store(held.UnixNano())
		warm := min(o.duration/4, 2*time.Minute)
		var samples []map[string]sample
		for end := held.Add(o.duration); ctx.Err() == nil; {
			faultload.Sleep(ctx, min(o.sample, time.Until(end)))
			sm, err := h.sampleAll()
			if err != nil {
				return outcome{}, err
			}
			at := time.Since(held)
			var line []string
			for _, name := range soakProcesses {
				line = append(line, fmt.Sprintf("%s %d/%d/%d/%dMiB", name, sm[name].goroutines, sm[name].fds, sm[name].rss>>20, sm[name].live>>20))
			}
			hn, err := readHostNet()
			if err != nil {
				return outcome{}, err
			}
			fmt.Fprintf(os.Stderr, "soak: %v goroutines/fds/RSS/live heap: %s; idle closed %d; host since opening: %s\n",
				at.Round(time.Second), strings.Join(line, ", "), s.closedIdle.Load(), hn.since(net0))
			if at < warm {
				continue
			}
			samples = append(samples, sm)
			if !time.Now().Before(end) {
				break
			}
		}
		closedIdle, ok, failed, redialed := s.closedIdle.Load(), s.activeOK.Load(), s.activeFailed.Load(), s.redialed.Load()
		ends := s.idleEndsText()
		net1, err := readHostNet()
		if err != nil {
			return outcome{}, err
		}
		s.closeAll()

		var problems []string
		if closedIdle > 0 {
			// An idle connection the kernel aborted (its keepalive probes
			// unanswered) ends with ETIMEDOUT on the aborting side, and
			// the RST it sends ends the other side with ECONNRESET. Such
			// ends are the host's as long as it aborted at least as many
			// connections; any other end (EOF: the mesh closed it) fails.
			aborted := s.idleEndsMatching("connection timed out", "connection reset by peer")
			if hostAborts := int64(net1["TCPAbortOnTimeout"] - net0["TCPAbortOnTimeout"]); aborted < closedIdle || aborted > hostAborts {
				problems = append(problems, fmt.Sprintf("%d idle connections closed: %s", closedIdle, ends))
			}
		}
		if failed > 0 {
			problems = append(problems, fmt.Sprintf("%d requests on active connections failed (%d redialed)", failed, redialed))
		}
		problems = append(problems, flat(samples)...)
		// Closed, every count comes back down to near where it started.
		last := samples[len(samples)-1]
		var down map[string]sample
		released := func() bool {
			if down, err = h.sampleAll(); err != nil {
				return true
			}
			return len(notReleased(base, down, o.idle+o.active)) == 0
		}
		took, _ := h.until(ctx, 30*time.Second, released)
		if err != nil {
			return outcome{}, err
		}
		problems = append(problems, notReleased(base, down, o.idle+o.active)...)

		var figures []string
		for _, name := range soakProcesses {
			b, m, d := base[name], last[name], down[name]
			figures = append(figures, fmt.Sprintf("%s goroutines %d→%d→%d, fds %d→%d→%d, RSS %d→%d→%d MiB, live heap %d→%d→%d MiB", name,
				b.goroutines, m.goroutines, d.goroutines, b.fds, m.fds, d.fds, b.rss>>20, m.rss>>20, d.rss>>20, b.live>>20, m.live>>20, d.live>>20))
		}
		note := fmt.Sprintf("%d idle + %d active connections opened in %v, held %v (%d samples every %v after %v; %d GETs on the active ones, %d failed; %d idle ones closed%s); before→held→after closing (%v): %s; host (all its work) while open: %s",
			o.idle, o.active, openTook.Round(time.Second), o.duration, len(samples), o.sample, warm, ok, failed, closedIdle, strings.TrimSuffix(": "+ends, ": "),
			took.Round(100*time.Millisecond), strings.Join(figures, "; "), net1.since(net0))
		return outcome{note: note, problem: strings.Join(problems, "; ")}, nil
	}
}

// flat says which counts grew while the connections were held: the mean
// of the last third of the samples against the first third, beyond noise
// (the waypoints' pools of connections to the backends grow and shrink
// with the requests in flight; RSS moves with the garbage collector).
func flat(samples []map[string]sample) []string {
	if len(samples) < 3 {
		return []string{fmt.Sprintf("only %d samples: hold the connections longer", len(samples))}
	}
	third := len(samples) / 3
	mean := func(from, to int, f func(sample) float64, name string) float64 {
		sum := 0.0
		for _, s := range samples[from:to] {
			sum += f(s[name])
		}
		return sum / float64(to-from)
	}
	var out []string
	for _, name := range soakProcesses {
		for _, m := range []struct {
			what     string
			f        func(sample) float64
			rel, abs float64
			unit     string
		}{
			{"goroutines", func(s sample) float64 { return float64(s.goroutines) }, 0.02, 64, ""},
			{"file descriptors", func(s sample) float64 { return float64(s.fds) }, 0.02, 32, ""},
			{"live heap", func(s sample) float64 { return float64(s.live) / (1 << 20) }, 0.10, 4, " MiB"},
			// Looser: see sample.
			{"RSS", func(s sample) float64 { return float64(s.rss) / (1 << 20) }, 0.25, 32, " MiB"},
		} {
			first, last := mean(0, third, m.f, name), mean(len(samples)-third, len(samples), m.f, name)
			if last > first*(1+m.rel)+m.abs {
				out = append(out, fmt.Sprintf("%s %s grew from %.0f%s to %.0f%s while the connections were held", name, m.what, first, m.unit, last, m.unit))
			}
		}
	}
	return out
}

// notReleased says which counts stayed up after the connections closed:
// at most the worth of 5 % of them (a proxied connection costs 2
// goroutines and a descriptor) may stay, the pooled connections that
// outlive their tunnels until an idle timeout (HBONE, one per 100 tunnels,
// 5 minutes; the waypoints' keep-alive connections to the backends).
func notReleased(base, down map[string]sample, conns int) []string {
	var out []string
	names := make([]string, 0, len(down))
	for n := range down {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		b, d := base[n], down[n]
		if d.goroutines-b.goroutines > 50+conns/10 || d.fds-b.fds > 20+conns/20 {
			out = append(out, fmt.Sprintf("%s holds %d goroutines and %d fds after the %d connections closed, %d and %d before",
				n, d.goroutines, d.fds, conns, b.goroutines, b.fds))
		}
	}
	return out
}
