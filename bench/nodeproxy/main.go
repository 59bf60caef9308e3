// Command nodeproxy benchmarks the node proxy pair on the direct path
// (docs/design.md §5.1): pod A -> SOCKS5 -> node proxy A -> HBONE -> node proxy B
// -> pod B, with the real binaries of a two-node local mesh, in the same run
// as the TLS tunnel pairs a user could run instead (nginx stream, stunnel;
// peers.go) and two references: plain TCP from pod A's address straight to
// pod B's app, and TLS straight to it. It prints `bench: <name> <value>
// <unit>` lines:
//
//   - memory: node proxy RSS (VmRSS) with -idle-conns open idle
//     connections through the pair, per connection;
//   - throughput: one bulk stream for -duration, best of -rounds;
//   - connections per second: -cps-clients clients in a loop of connect,
//     64-byte exchange, close.
//
// The client (pod A) and the servers of pod B run in this process, so the
// same code measures both paths. Build the binaries first (make build).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/proxy"
	"golang.org/x/sys/unix"

	"github.com/causeway-mesh/causeway/bench/internal/benchmesh"
	"github.com/causeway-mesh/causeway/bench/internal/peers"
	"github.com/causeway-mesh/causeway/pkg/localmesh"
)

// The benchmark's own addresses, apart from the sample (127.0.10.x), the
// end-to-end suite (127.0.40.x) and bench/waypoint (127.0.91.x).
const (
	clientIP = "127.0.90.1"  // pod A, on node-a
	sinkIP   = "127.0.90.2"  // pod B, on node-b (owned by node proxy B)
	appIP    = "127.0.190.2" // pod B's app address, served by this program
	bulkPort = "9000"        // reads everything, reports the byte count
	rrPort   = "9001"        // reads 64 bytes, writes them back, closes
	holdPort = "9002"        // echoes one byte, then holds the connection
	rrSize   = 64
)

const meshYAML = `apiVersion: v1
kind: Namespace
metadata:
  name: bench
  labels:
    causeway.dev/dataplane-mode: mesh
---
apiVersion: v1
kind: Pod
metadata:
  name: client
  namespace: bench
spec:
  nodeName: node-a
  serviceAccountName: client
  containers:
  - name: client
    image: bench
status:
  podIP: ` + clientIP + `
---
apiVersion: v1
kind: Pod
metadata:
  name: sink
  namespace: bench
  annotations:
    causeway.dev/app-address: ` + appIP + `
spec:
  nodeName: node-b
  serviceAccountName: sink
  containers:
  - name: sink
    image: bench
    ports:
    - containerPort: ` + bulkPort + `
    - containerPort: ` + rrPort + `
    - containerPort: ` + holdPort + `
status:
  podIP: ` + sinkIP + `
`

type options struct {
	bin, work     string
	basePort      int
	duration      time.Duration
	rounds        int
	cpsDuration   time.Duration
	cpsClients    int
	idleConns     int
	keep          bool
	skipMemory    bool
	dialParallel  int
	settle        time.Duration
	rest          time.Duration
	afterLoad     time.Duration
	bulkWriteSize int
	peers         string
	profileDir    string
}

func main() {
	var o options
	flag.StringVar(&o.bin, "bin", "bin", "directory of the built binaries (make build)")
	flag.StringVar(&o.work, "work", "", "work directory for configuration, state and logs (default: a temporary one)")
	flag.IntVar(&o.basePort, "base-port", 18000, "first port of the benchmark mesh")
	flag.DurationVar(&o.duration, "duration", 5*time.Second, "length of each throughput measurement")
	flag.IntVar(&o.rounds, "rounds", 2, "throughput rounds per path (the best is reported)")
	flag.DurationVar(&o.cpsDuration, "cps-duration", 4*time.Second, "length of each connections-per-second measurement")
	flag.IntVar(&o.cpsClients, "cps-clients", 16, "concurrent clients in the connections-per-second measurement")
	flag.IntVar(&o.idleConns, "idle-conns", 10000, "idle connections held open for the memory measurement")
	flag.IntVar(&o.dialParallel, "dial-parallel", 64, "concurrent dials while opening the idle connections")
	flag.DurationVar(&o.settle, "settle", 2*time.Second, "wait before reading memory figures")
	flag.DurationVar(&o.rest, "rest", 8*time.Second, "after the idle-connection readings, wait this long for the proxies to return idle memory and read again (0: not)")
	flag.IntVar(&o.bulkWriteSize, "write-size", 256<<10, "bytes per write in the throughput measurement")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory (logs)")
	flag.BoolVar(&o.skipMemory, "skip-memory", false, "skip the idle-connection memory measurement")
	flag.DurationVar(&o.afterLoad, "after-load", time.Minute, "how long after the last measurement the proxies' RSS is read again (0: not read)")
	flag.StringVar(&o.peers, "peers", "nginx_stream,nginx_plain,stunnel", "peer pairs to measure: nginx_stream, stunnel (TLS tunnels), nginx_plain (plain TCP between nginx's sides, the floor) (comma-separated; empty: none)")
	flag.StringVar(&o.profileDir, "profile-dir", "", "write the node proxies' heap and goroutine profiles with the idle connections open and after the load, and CPU profiles of the nodeproxy throughput and connection rounds, into this directory")
	app := flag.Bool("app", false, "run as pod B's app (the benchmark starts itself so)")
	appTLSDir := flag.String("app-tls", "", "with -app: also serve TLS with the certificates in this directory")
	flag.Parse()
	if *app {
		if err := runApp(*appTLSDir); err != nil {
			os.Exit(1)
		}
		return
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "nodeproxy bench:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	if o.rounds < 1 || o.cpsClients < 1 || o.idleConns < 0 || o.dialParallel < 1 || o.bulkWriteSize < 1 {
		return errors.New("-rounds, -cps-clients, -dial-parallel and -write-size must be positive, -idle-conns not negative")
	}
	// Each process (this client, pod B's app, both node proxies) holds one
	// socket per idle connection; the children inherit the limit.
	limit, err := benchmesh.RaiseNoFile(uint64(o.idleConns + 4096))
	if err != nil {
		return err
	}
	if room := int(limit) - 1024; o.idleConns > room {
		fmt.Fprintf(os.Stderr, "nodeproxy bench: RLIMIT_NOFILE is %d: measuring %d idle connections, not %d\n", limit, room, o.idleConns)
		o.idleConns = room
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	keep := o.keep
	work, cleanup, err := benchmesh.WorkDir(o.work, "nodeproxy", &keep)
	if err != nil {
		return err
	}
	defer cleanup()

	// Pod B asks for no local app: its app is this program's servers.
	mesh, err := benchmesh.Start(ctx, benchmesh.Setup{BinDir: o.bin, WorkDir: work, Mesh: meshYAML, BasePort: o.basePort})
	if err != nil {
		keep = true
		return fmt.Errorf("start mesh: %w", err)
	}
	defer mesh.Stop()

	pkiDir := filepath.Join(work, "pki")
	peerClient, err := peers.NewPKI(pkiDir)
	if err != nil {
		return err
	}
	app, err := startApp(ctx, pkiDir)
	if err != nil {
		return err
	}
	defer app.stop()

	pod, err := mesh.Plan.Pod("bench/client")
	if err != nil {
		return err
	}
	pa, err := benchmesh.PID(mesh, "nodeproxy-node-a")
	if err != nil {
		return err
	}
	pb, err := benchmesh.PID(mesh, "nodeproxy-node-b")
	if err != nil {
		return err
	}
	viaSOCKS, err := socksDialer(pod.SOCKS5)
	if err != nil {
		return err
	}
	self, appPID := os.Getpid(), app.cmd.Process.Pid
	ends := pidsCPU(self, appPID)
	nodeProxies := pidsCPU(pa, pb)
	paths := []path{
		{name: "direct", dial: directDialer(), target: appIP, ends: ends},
		{name: "tls_direct", dial: tlsDialer(peerClient), target: tlsAppIP, ends: ends},
		{name: "nodeproxy", dial: viaSOCKS, target: sinkIP, ends: ends, pair: nodeProxies},
	}
	for _, name := range strings.Split(o.peers, ",") {
		if name = strings.TrimSpace(name); name == "" {
			continue
		}
		peer, err := startPeer(name, work, pkiDir, runtime.NumCPU(), o.idleConns+4096)
		var miss *peers.ErrMissing
		if errors.As(err, &miss) {
			fmt.Fprintf(os.Stderr, "nodeproxy bench: %s skipped: %v\n", name, err)
			continue
		}
		if err != nil {
			keep = true
			return err
		}
		defer peer.Stop()
		paths = append(paths, path{name: name, dial: directDialer(), target: peer.Listen, ends: ends, pair: peer.CPU})
	}
	b := &bench{o: o, mesh: mesh, app: app, paths: paths, proxyA: pa, proxyB: pb}
	// Every path must work before anything is measured.
	for _, p := range paths {
		if err := exchange(ctx, p); err != nil {
			keep = true
			return fmt.Errorf("%s path does not work: %w", p.name, err)
		}
	}

	if err := b.startMemory(ctx); err != nil {
		return err
	}
	steps := []func(context.Context) error{b.throughput, b.connectionsPerSecond}
	if !o.skipMemory {
		// First, while the proxies are fresh: later steps leave heap behind
		// that would absorb the idle connections' memory.
		steps = append([]func(context.Context) error{b.memory}, steps...)
	}
	for _, step := range steps {
		if err := step(ctx); err != nil {
			keep = true
			return err
		}
		select {
		case died := <-mesh.Died:
			keep = true
			return fmt.Errorf("a mesh process died: %s", died)
		default:
		}
	}
	return b.memoryAfterLoad(ctx)
}

// path is one way from pod A to pod B.
type path struct {
	name   string
	dial   func(ctx context.Context, addr string) (net.Conn, error)
	target string // pod B's address on this path
	// CPU time used so far by the client and pod B's app, and by the
	// path's proxies (nil: none).
	ends, pair func() (time.Duration, error)
}

// cpu is the CPU time the path's processes have used so far.
func (p path) cpu() (ends, pair time.Duration, err error) {
	if ends, err = p.ends(); err != nil || p.pair == nil {
		return ends, 0, err
	}
	pair, err = p.pair()
	return ends, pair, err
}

// pidsCPU is the CPU time of the processes pids.
func pidsCPU(pids ...int) func() (time.Duration, error) {
	return func() (time.Duration, error) {
		var sum time.Duration
		for _, pid := range pids {
			t, err := benchmesh.CPUTime(pid)
			if err != nil {
				return 0, err
			}
			sum += t
		}
		return sum, nil
	}
}

func (p path) addr(port string) string { return net.JoinHostPort(p.target, port) }

// localDialer binds to pod A's address. IP_BIND_ADDRESS_NO_PORT leaves the
// port choice to connect(), where TIME_WAIT ports of other destinations are
// reusable: the connection loops would otherwise run out of ports.
func localDialer() *net.Dialer {
	return &net.Dialer{
		LocalAddr: &net.TCPAddr{IP: net.ParseIP(clientIP)},
		Timeout:   10 * time.Second,
		Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1)
			}); err != nil {
				return err
			}
			return serr
		},
	}
}

func directDialer() func(context.Context, string) (net.Conn, error) {
	d := localDialer()
	return func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }
}

// socksDialer connects as pod A does in local mode: from its address,
// through its node proxy's SOCKS5 port (what localmesh.PodClient does, with
// the dialer above).
func socksDialer(socks string) (func(context.Context, string) (net.Conn, error), error) {
	d, err := proxy.SOCKS5("tcp", socks, nil, localDialer())
	if err != nil {
		return nil, fmt.Errorf("SOCKS5 dialer for %s: %w", socks, err)
	}
	cd, ok := d.(proxy.ContextDialer)
	if !ok {
		return nil, errors.New("SOCKS5 dialer without DialContext")
	}
	return func(ctx context.Context, addr string) (net.Conn, error) {
		c, err := cd.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("via SOCKS5 %s: %w", socks, err)
		}
		return c, nil
	}, nil
}

// exchange makes one connect/exchange/close round on p.
func exchange(ctx context.Context, p path) error {
	c, err := p.dial(ctx, p.addr(rrPort))
	if err != nil {
		return err
	}
	defer c.Close()
	return requestResponse(c)
}

var rrPayload = make([]byte, rrSize)

// requestResponse writes rrSize bytes and reads them back and the server's
// close.
func requestResponse(c net.Conn) error {
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return err
	}
	if _, err := c.Write(rrPayload); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	var buf [rrSize + 1]byte
	if _, err := io.ReadFull(c, buf[:rrSize]); err != nil {
		return fmt.Errorf("read answer: %w", err)
	}
	if n, err := c.Read(buf[:]); n != 0 || err != io.EOF {
		return fmt.Errorf("expected the server's close, got %d bytes, %v", n, err)
	}
	return nil
}

type bench struct {
	o     options
	mesh  *localmesh.Mesh
	app   *appProcess
	paths []path
	// node proxy pids
	proxyA, proxyB int
}

// measurement is what one run on a path did and cost.
type measurement struct {
	work    float64       // bytes or connections
	elapsed time.Duration // wall clock
	cpu     time.Duration // the path's processes
	pairCPU time.Duration // the proxies alone
}

// measure runs f on p and accounts the CPU time it cost.
func (b *bench) measure(p path, f func() (float64, time.Duration, error)) (measurement, error) {
	ends0, pair0, err := p.cpu()
	if err != nil {
		return measurement{}, err
	}
	work, elapsed, err := f()
	if err != nil {
		return measurement{}, err
	}
	ends1, pair1, err := p.cpu()
	if err != nil {
		return measurement{}, err
	}
	return measurement{work: work, elapsed: elapsed, cpu: ends1 - ends0 + pair1 - pair0, pairCPU: pair1 - pair0}, nil
}

func (m measurement) rate() float64 { return m.work / m.elapsed.Seconds() }

// perCPU is work per CPU-second of the path's processes.
func (m measurement) perCPU() float64 { return m.work / max(m.cpu.Seconds(), 0.01) }

// memory opens idle connections through the pair and reports the growth of
// both node proxies' RSS per connection.
func (b *bench) memory(ctx context.Context) error {
	if b.o.idleConns == 0 {
		return nil
	}
	pa, pb := b.proxyA, b.proxyB
	mesh := b.path("nodeproxy")
	// Warm up: pooled HBONE connection, certificates, goroutine stacks.
	for range 64 {
		if err := exchange(ctx, mesh); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	benchmesh.Sleep(ctx, b.o.settle)
	beforeA, errA := benchmesh.RSS(pa)
	beforeB, errB := benchmesh.RSS(pb)
	rtA, errC := b.runtimeFigures("node-a")
	rtB, errD := b.runtimeFigures("node-b")
	if err := errors.Join(errA, errB, errC, errD); err != nil {
		return err
	}
	restBefore, err := b.atRest(ctx)
	if err != nil {
		return err
	}

	conns := make([]net.Conn, b.o.idleConns)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	start := time.Now()
	var next atomic.Int64
	errs := make(chan error, b.o.dialParallel)
	for range b.o.dialParallel {
		go func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(conns) {
					errs <- nil
					return
				}
				c, err := openHeld(ctx, mesh)
				if err != nil {
					errs <- fmt.Errorf("idle connection %d: %w", i, err)
					return
				}
				conns[i] = c
			}
		}()
	}
	var firstErr error
	for range b.o.dialParallel {
		if err := <-errs; err != nil && firstErr == nil {
			firstErr = err
			next.Store(int64(len(conns))) // stop the others
		}
	}
	if firstErr != nil {
		return firstErr
	}
	opened := time.Since(start)
	benchmesh.Sleep(ctx, b.o.settle)
	afterA, errA := benchmesh.RSS(pa)
	afterB, errB := benchmesh.RSS(pb)
	rtA2, errC := b.runtimeFigures("node-a")
	rtB2, errD := b.runtimeFigures("node-b")
	if err := errors.Join(errA, errB, errC, errD); err != nil {
		return err
	}
	restAfter, err := b.atRest(ctx)
	if err != nil {
		return err
	}
	if b.o.profileDir != "" {
		for _, node := range []string{"node-a", "node-b"} {
			for _, prof := range []string{"heap?gc=1", "goroutine"} { // the heap after a GC: what is live
				name, _, _ := strings.Cut(prof, "?")
				if err := b.saveProfile(ctx, node, prof, "idle-"+name+"-"+node+".pb.gz"); err != nil {
					return err
				}
			}
		}
	}
	n := float64(len(conns))
	kib := func(before, after int64) float64 { return float64(after-before) / 1024 / n }
	benchmesh.Report("nodeproxy_idle_conns", n, "conns")
	benchmesh.Report("nodeproxy_idle_open_rate", n/opened.Seconds(), "conns/s")
	benchmesh.Report("nodeproxy_a_rss_before_mib", float64(beforeA)/(1<<20), "MiB")
	benchmesh.Report("nodeproxy_a_rss_idle_mib", float64(afterA)/(1<<20), "MiB")
	benchmesh.Report("nodeproxy_b_rss_before_mib", float64(beforeB)/(1<<20), "MiB")
	benchmesh.Report("nodeproxy_b_rss_idle_mib", float64(afterB)/(1<<20), "MiB")
	benchmesh.Report("nodeproxy_a_kib_per_conn", kib(beforeA, afterA), "KiB")
	benchmesh.Report("nodeproxy_b_kib_per_conn", kib(beforeB, afterB), "KiB")
	benchmesh.Report("nodeproxy_pair_kib_per_conn", kib(beforeA+beforeB, afterA+afterB), "KiB")
	// Where it goes, from the Go runtime's own figures.
	for _, side := range []struct {
		name          string
		before, after map[string]float64
	}{{"a", rtA, rtA2}, {"b", rtB, rtB2}} {
		grow := func(metric string) float64 { return (side.after[metric] - side.before[metric]) / n }
		benchmesh.Report("nodeproxy_"+side.name+"_goroutines_per_conn", grow("go_goroutines"), "goroutines")
		benchmesh.Report("nodeproxy_"+side.name+"_stack_kib_per_conn", grow("go_memstats_stack_inuse_bytes")/1024, "KiB")
		benchmesh.Report("nodeproxy_"+side.name+"_heap_kib_per_conn", grow("go_memstats_heap_inuse_bytes")/1024, "KiB")
		benchmesh.Report("nodeproxy_"+side.name+"_heap_objects_per_conn", grow("go_memstats_heap_objects"), "objects")
		// Freed heap pages the runtime has not returned yet count in RSS
		// too, and so does what it holds besides heap and stacks.
		before, after := benchmesh.Memory{Runtime: side.before}, benchmesh.Memory{Runtime: side.after}
		benchmesh.Report("nodeproxy_"+side.name+"_heap_free_kib_per_conn", (after.HeapFree()-before.HeapFree())/n/1024, "KiB")
		benchmesh.Report("nodeproxy_"+side.name+"_runtime_held_kib_per_conn", (after.RuntimeHeld()-before.RuntimeHeld())/n/1024, "KiB")
	}
	if restBefore == nil || restAfter == nil {
		return nil
	}
	// The same at rest (atRest), without the garbage of opening the
	// connections that the collector had not reached at the reading above.
	for i, side := range []string{"a", "b"} {
		before, after := restBefore[i], restAfter[i]
		benchmesh.Report("nodeproxy_"+side+"_kib_per_conn_at_rest", kib(before.rss, after.rss), "KiB")
		grow := func(metric string) float64 { return (after.rt[metric] - before.rt[metric]) / n / 1024 }
		benchmesh.Report("nodeproxy_"+side+"_heap_kib_per_conn_at_rest", grow("go_memstats_heap_inuse_bytes"), "KiB")
		benchmesh.Report("nodeproxy_"+side+"_heap_free_mib_at_rest", benchmesh.Memory{Runtime: after.rt}.HeapFree()/(1<<20), "MiB")
	}
	benchmesh.Report("nodeproxy_pair_kib_per_conn_at_rest",
		kib(restBefore[0].rss+restBefore[1].rss, restAfter[0].rss+restAfter[1].rss), "KiB")
	return nil
}

// restReading is one proxy's RSS and runtime figures at rest.
type restReading struct {
	rss int64
	rt  map[string]float64
}

// atRest waits -rest, then reads both proxies (nil, nil with -rest 0).
// A proxy that allocated little for 5 s collects and returns its free
// heap to the system (pkg/bootstrap's idle memory), so that by then an
// idle connection holds only what it keeps. Nothing else may touch the
// proxies meanwhile: a scrape of their metrics allocates enough to count
// as load.
func (b *bench) atRest(ctx context.Context) ([]restReading, error) {
	if b.o.rest <= 0 {
		return nil, nil
	}
	benchmesh.Sleep(ctx, b.o.rest)
	var out []restReading
	for _, p := range b.proxies() {
		rss, err := benchmesh.RSS(p.pid)
		if err != nil {
			return nil, err
		}
		rt, err := b.runtimeFigures(p.node)
		if err != nil {
			return nil, err
		}
		out = append(out, restReading{rss, rt})
	}
	return out, ctx.Err()
}

// nodeProxy is one node proxy of the pair: its figures' prefix, node and
// process.
type nodeProxy struct {
	side, node string
	pid        int
}

func (b *bench) proxies() []nodeProxy {
	return []nodeProxy{{"a", "node-a", b.proxyA}, {"b", "node-b", b.proxyB}}
}

// startMemory reports both node proxies' memory before any connection,
// once their configuration has arrived and settled.
func (b *bench) startMemory(ctx context.Context) error {
	benchmesh.Sleep(ctx, b.o.settle)
	for _, p := range b.proxies() {
		if err := b.reportMemory(p, "start"); err != nil {
			return err
		}
	}
	return nil
}

// reportMemory reports what a node proxy holds (benchmesh.Memory).
func (b *bench) reportMemory(p nodeProxy, when string) error {
	np, ok := b.mesh.Plan.Node(p.node)
	if !ok {
		return fmt.Errorf("no node %s in the plan", p.node)
	}
	m, err := benchmesh.ReadMemory(p.pid, "http://"+np.Status+"/metrics")
	if err != nil {
		return err
	}
	m.Report("nodeproxy_"+p.side, when)
	return nil
}

// memoryAfterLoad reports both node proxies' peak RSS over the whole run
// (the idle connections, bulk streams and connection loops) and, after
// -after-load with no traffic, their RSS and what the Go runtime holds:
// the memory a proxy keeps once the load is gone.
func (b *bench) memoryAfterLoad(ctx context.Context) error {
	if b.o.afterLoad <= 0 {
		return nil
	}
	for _, p := range b.proxies() {
		peak, err := benchmesh.PeakRSS(p.pid)
		if err != nil {
			return err
		}
		benchmesh.Report("nodeproxy_"+p.side+"_rss_peak_mib", float64(peak)/(1<<20), "MiB")
	}
	benchmesh.Sleep(ctx, b.o.afterLoad)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	for _, p := range b.proxies() {
		if err := b.reportMemory(p, "after_load"); err != nil {
			return err
		}
		if b.o.profileDir != "" {
			for _, prof := range []string{"heap?gc=1", "goroutine"} {
				name, _, _ := strings.Cut(prof, "?")
				if err := b.saveProfile(ctx, p.node, prof, "after-load-"+name+"-"+p.node+".pb.gz"); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// saveProfile writes the pprof profile prof (with its query) of a node's
// proxy to file in the profile directory.
func (b *bench) saveProfile(ctx context.Context, node, prof, file string) error {
	np, ok := b.mesh.Plan.Node(node)
	if !ok {
		return fmt.Errorf("no node %s in the plan", node)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+np.Admin+"/debug/pprof/"+prof, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s profile of %s: %w", prof, node, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s profile of %s: %s", prof, node, resp.Status)
	}
	if err := os.MkdirAll(b.o.profileDir, 0o755); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(b.o.profileDir, file))
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// runtimeFigures reads the Go runtime's memory figures of a node's proxy.
func (b *bench) runtimeFigures(node string) (map[string]float64, error) {
	np, ok := b.mesh.Plan.Node(node)
	if !ok {
		return nil, fmt.Errorf("no node %s in the plan", node)
	}
	return benchmesh.Scrape("http://"+np.Status+"/metrics", benchmesh.RuntimeMetrics...)
}

// openHeld opens a connection to the hold port and checks it reaches pod B
// with a one-byte echo.
func openHeld(ctx context.Context, p path) (net.Conn, error) {
	c, err := p.dial(ctx, p.addr(holdPort))
	if err != nil {
		return nil, err
	}
	if err := c.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		c.Close()
		return nil, err
	}
	var b [1]byte
	if _, err := c.Write([]byte{'h'}); err != nil {
		c.Close()
		return nil, err
	}
	if _, err := io.ReadFull(c, b[:]); err != nil {
		c.Close()
		return nil, fmt.Errorf("echo: %w", err)
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// throughput measures one bulk stream per path, interleaving the paths
// round by round; the best round of each is reported, with the CPU time
// the path's processes spent per byte in that round.
func (b *bench) throughput(ctx context.Context) error {
	best, err := b.bestOf("throughput", b.o.duration, func(p path) (float64, time.Duration, error) { return b.bulk(ctx, p) })
	if err != nil {
		return fmt.Errorf("throughput: %w", err)
	}
	d, n := best["direct"], best["nodeproxy"]
	gbit := func(bytesPerSec float64) float64 { return bytesPerSec * 8 / 1e9 }
	cpuPerGiB := func(m measurement) float64 { return m.pairCPU.Seconds() / (m.work / (1 << 30)) }
	for _, p := range b.paths {
		benchmesh.Report(p.name+"_throughput_gbps", gbit(best[p.name].rate()), "Gbit/s")
	}
	benchmesh.Report("nodeproxy_throughput_ratio", n.rate()/d.rate(), "x")
	benchmesh.Report("tls_direct_throughput_ratio", best["tls_direct"].rate()/d.rate(), "x")
	// Contention from other work on the machine moves the rates; CPU time
	// per byte it hardly moves. On an otherwise idle machine whose cores
	// the path keeps busy, the throughput ratio tends to this one.
	for _, p := range b.paths {
		benchmesh.Report(p.name+"_gbit_per_cpu_sec", gbit(best[p.name].perCPU()), "Gbit/cpu-s")
	}
	benchmesh.Report("nodeproxy_throughput_per_cpu_ratio", n.perCPU()/d.perCPU(), "x")
	benchmesh.Report("nodeproxy_pair_cpu_sec_per_gib", cpuPerGiB(n), "cpu-s/GiB")
	for _, p := range b.peers() {
		m := best[p.name]
		benchmesh.Report(p.name+"_pair_cpu_sec_per_gib", cpuPerGiB(m), "cpu-s/GiB")
		benchmesh.Report("nodeproxy_vs_"+p.name+"_throughput_ratio", n.rate()/m.rate(), "x")
		benchmesh.Report("nodeproxy_vs_"+p.name+"_cpu_per_gib_ratio", cpuPerGiB(n)/cpuPerGiB(m), "x")
	}
	return nil
}

// bestOf runs f on every path, interleaving the paths round by round, and
// returns each path's best round.
// With -profile-dir, the node proxies' CPU is profiled over the first
// nodeproxy round (step names the files) for length.
func (b *bench) bestOf(step string, length time.Duration, f func(path) (float64, time.Duration, error)) (map[string]measurement, error) {
	best := map[string]measurement{}
	for round := range b.o.rounds {
		for _, p := range b.paths {
			var profiled chan error
			if b.o.profileDir != "" && round == 0 && p.name == "nodeproxy" {
				profiled = make(chan error, 2)
				secs := strconv.Itoa(max(1, int(length.Seconds())))
				for _, node := range []string{"node-a", "node-b"} {
					go func() {
						profiled <- b.saveProfile(context.Background(), node, "profile?seconds="+secs, "cpu-"+step+"-"+node+".pb.gz")
					}()
				}
			}
			m, err := b.measure(p, func() (float64, time.Duration, error) { return f(p) })
			if profiled != nil {
				err = errors.Join(err, <-profiled, <-profiled)
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %w", p.name, err)
			}
			if m.rate() > best[p.name].rate() || best[p.name].elapsed == 0 {
				best[p.name] = m
			}
		}
	}
	return best, nil
}

// path returns the path called name (it exists: run builds them).
func (b *bench) path(name string) path {
	for _, p := range b.paths {
		if p.name == name {
			return p
		}
	}
	panic("no path " + name)
}

// peers are the paths through a peer pair (the proxies are not ours).
func (b *bench) peers() []path {
	var out []path
	for _, p := range b.paths {
		if p.pair != nil && p.name != "nodeproxy" {
			out = append(out, p)
		}
	}
	return out
}

// bulk sends for the configured duration, then closes; the rate is the
// bytes pod B received over the time from the first write to pod B seeing
// the end of the stream.
func (b *bench) bulk(ctx context.Context, p path) (float64, time.Duration, error) {
	c, err := p.dial(ctx, p.addr(bulkPort))
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	buf := make([]byte, b.o.bulkWriteSize)
	start := time.Now()
	end := start.Add(b.o.duration)
	if err := c.SetWriteDeadline(end.Add(30 * time.Second)); err != nil {
		return 0, 0, err
	}
	var sent int64
	for time.Now().Before(end) && ctx.Err() == nil {
		n, err := c.Write(buf)
		sent += int64(n)
		if err != nil {
			return 0, 0, fmt.Errorf("write after %d bytes: %w", sent, err)
		}
	}
	// End the stream but keep reading: a TLS client closing with the
	// server's session tickets unread would reset the connection.
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		if err := cw.CloseWrite(); err != nil {
			return 0, 0, fmt.Errorf("close after %d bytes: %w", sent, err)
		}
	} else {
		c.Close()
	}
	for {
		select {
		case r := <-b.app.bulkDone:
			if r.bytes == 0 && r.err == nil {
				continue // an empty connection: a peer's readiness probe
			}
			return bulkOutcome(r, sent, start)
		case <-time.After(60 * time.Second):
			return 0, 0, errors.New("pod B never saw the end of the stream")
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		}
	}
}

// bulkOutcome checks pod B's report of a stream of sent bytes.
func bulkOutcome(r bulkResult, sent int64, start time.Time) (float64, time.Duration, error) {
	if r.err != nil {
		return 0, 0, r.err
	}
	if r.bytes != sent {
		return 0, 0, fmt.Errorf("pod B received %d bytes of %d", r.bytes, sent)
	}
	return float64(r.bytes), r.at.Sub(start), nil
}

// connectionsPerSecond runs the connect/exchange/close loop on each path,
// the paths interleaved round by round, best round of each.
func (b *bench) connectionsPerSecond(ctx context.Context) error {
	res, err := b.bestOf("conns", b.o.cpsDuration, func(p path) (float64, time.Duration, error) { return b.cps(ctx, p) })
	if err != nil {
		return fmt.Errorf("connections: %w", err)
	}
	d, n := res["direct"], res["nodeproxy"]
	cpuPerConn := func(m measurement) float64 { return float64(m.pairCPU.Microseconds()) / m.work }
	for _, p := range b.paths {
		benchmesh.Report(p.name+"_conns_per_sec", res[p.name].rate(), "conn/s")
	}
	benchmesh.Report("nodeproxy_conns_per_sec_ratio", n.rate()/d.rate(), "x")
	benchmesh.Report("nodeproxy_conns_per_cpu_sec_ratio", n.perCPU()/d.perCPU(), "x")
	benchmesh.Report("nodeproxy_pair_cpu_us_per_conn", cpuPerConn(n), "us")
	for _, p := range b.peers() {
		m := res[p.name]
		benchmesh.Report(p.name+"_pair_cpu_us_per_conn", cpuPerConn(m), "us")
		benchmesh.Report("nodeproxy_vs_"+p.name+"_conns_per_sec_ratio", n.rate()/m.rate(), "x")
		benchmesh.Report("nodeproxy_vs_"+p.name+"_cpu_per_conn_ratio", cpuPerConn(n)/cpuPerConn(m), "x")
	}
	return nil
}

func (b *bench) cps(ctx context.Context, p path) (float64, time.Duration, error) {
	var done, failed atomic.Int64
	var firstErr atomic.Value
	end := time.Now().Add(b.o.cpsDuration)
	start := time.Now()
	var wg sync.WaitGroup
	for range b.o.cpsClients {
		wg.Go(func() {
			for time.Now().Before(end) && ctx.Err() == nil {
				if err := exchange(ctx, p); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	// A benchmark of failures is no benchmark: tolerate a stray error, not more.
	if f := failed.Load(); f > done.Load()/1000 {
		return 0, 0, fmt.Errorf("%d of %d connections failed, first: %v", f, f+done.Load(), firstErr.Load())
	}
	return float64(done.Load()), elapsed, nil
}
