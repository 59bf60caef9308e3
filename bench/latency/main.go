// Command latency measures the latency the mesh adds to a request at a
// fixed request rate (issue 36's measurement, on loopback): fortio's load
// runner (fortio.org/fortio, its standard HTTP/1.1 client, one keep-alive
// connection per thread) sends GETs at -rates requests per second over
// -conns connections to a fortio server, on these paths:
//
//	direct        pod A -> the server's app address (no mesh)
//	l4            pod A -> SOCKS5 -> node proxy A -> HBONE -> node proxy B -> server
//	l7            pod A -> SOCKS5 -> node proxy A -> HBONE -> waypoint (allow-all policy) -> HBONE -> node proxy B -> server
//	nginx_stream  pod A -> nginx A -> mutual TLS -> nginx B -> server: two proxies a user
//	              could run instead of the node proxies (bench/internal/peers), what any
//	              two hops through user space with TLS cost on this host (l4's anchor)
//	nginx_plain   pod A -> nginx A -> plain TCP -> nginx B -> server: the same pair without
//	              TLS, two hops that only copy bytes (the floor under any proxy pair here)
//
// Paths and rates are interleaved within each round; every figure is the
// median over the rounds, and an added figure is the median of each round's
// difference against the direct path of the same round. Each request's
// latency is kept exactly (fortio's histogram buckets are ~20 % wide).
//
//	go run ./bench/latency [-rates 100,1000] [-conns 64] [-duration 10s] [-rounds 3]
//	    [-paths direct,l4,l7,nginx_stream,nginx_plain] [-trace-dir DIR] [-keep]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"fortio.org/log"
	"golang.org/x/net/proxy"

	"github.com/causeway-mesh/causeway/bench/internal/benchmesh"
	"github.com/causeway-mesh/causeway/bench/internal/fortioload"
	"github.com/causeway-mesh/causeway/bench/internal/peers"
	"github.com/causeway-mesh/causeway/bench/internal/schedtrace"
	"github.com/causeway-mesh/causeway/pkg/localmesh"
)

// The benchmark's own addresses, apart from bench/nodeproxy (127.0.90.x)
// and bench/waypoint (127.0.91.x).
const (
	clientIP   = "127.0.125.1"   // pod lat/client, on node-a
	serverIP   = "127.0.125.2"   // pod lat/server, on node-b
	waypointIP = "127.0.125.3"   // pod lat/waypoint-0, on node-a
	appIP      = "127.0.125.102" // the server's app address (fortio)
	l4VIP      = "127.0.125.201" // Service lat/l4: no waypoint
	l7VIP      = "127.0.125.202" // Service lat/l7: through the waypoint
	nginxAIP   = "127.0.125.11"  // nginx_stream's client side
	nginxBIP   = "127.0.125.12"  // nginx_stream's server side
	plainAIP   = "127.0.125.13"  // nginx_plain's client side
	plainBIP   = "127.0.125.14"  // nginx_plain's server side
	appPort    = "8080"
)

var meshYAML = `apiVersion: v1
kind: Namespace
metadata:
  name: lat
  labels:
    causeway.dev/dataplane-mode: mesh
---
` + benchmesh.WaypointYAML("lat", "service", benchmesh.WaypointPod{Node: "node-a", IP: waypointIP}) + `apiVersion: v1
kind: Pod
metadata:
  name: client
  namespace: lat
spec:
  nodeName: node-a
  serviceAccountName: client
  containers:
  - name: client
    image: fortio
status:
  podIP: ` + clientIP + `
---
apiVersion: v1
kind: Pod
metadata:
  name: server
  namespace: lat
  labels:
    app: server
  annotations:
    causeway.dev/app-address: ` + appIP + `
spec:
  nodeName: node-b
  serviceAccountName: server
  containers:
  - name: server
    image: fortio
    ports:
    - containerPort: ` + appPort + `
status:
  podIP: ` + serverIP + `
---
apiVersion: v1
kind: Service
metadata:
  name: l4
  namespace: lat
spec:
  clusterIP: ` + l4VIP + `
  selector:
    app: server
  ports:
  - name: http
    port: 80
    targetPort: ` + appPort + `
    appProtocol: http
---
apiVersion: v1
kind: Service
metadata:
  name: l7
  namespace: lat
  labels:
    causeway.dev/use-waypoint: waypoint
spec:
  clusterIP: ` + l7VIP + `
  selector:
    app: server
  ports:
  - name: http
    port: 80
    targetPort: ` + appPort + `
    appProtocol: http
`

const allowAll = "package envoy.authz\n\nallow := true\n"

type options struct {
	bin, work string
	basePort  int
	rates     []float64
	conns     int
	duration  time.Duration
	warmup    time.Duration
	rounds    int
	paths     []string
	uniform   bool
	traceDir  string
	afterLoad time.Duration
	keep      bool
}

func main() {
	var o options
	var rates, paths string
	flag.StringVar(&o.bin, "bin", "bin", "directory of the built binaries (make build)")
	flag.StringVar(&o.work, "work", "", "work directory for configuration, state and logs (default: a temporary one)")
	flag.IntVar(&o.basePort, "base-port", 25000, "first port of the benchmark mesh")
	flag.StringVar(&rates, "rates", "100,1000", "request rates to measure (requests per second, comma-separated)")
	flag.IntVar(&o.conns, "conns", 64, "connections (fortio -c)")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "length of each measurement")
	flag.DurationVar(&o.warmup, "warmup", 2*time.Second, "unmeasured load on each path before the rounds")
	flag.IntVar(&o.rounds, "rounds", 3, "rounds; paths and rates are interleaved within each, figures are medians over them")
	flag.StringVar(&paths, "paths", "direct,l4,l7,nginx_stream,nginx_plain", "paths to measure: direct (the baseline of the added figures), l4, l7, nginx_stream, nginx_plain (the nginx paths are skipped when nginx is not installed)")
	flag.BoolVar(&o.uniform, "uniform", false, "stagger the connections' requests evenly (fortio -uniform); default: as fortio load -qps -c")
	flag.StringVar(&o.traceDir, "trace-dir", "", "write execution traces (go tool trace) of the node proxies and the waypoint, 3 s of the first round's l4 and l7 runs at the highest rate, into this directory")
	flag.DurationVar(&o.afterLoad, "after-load", 0, "read the node proxies' memory before the load and this long after it (0: not)")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory (logs)")
	serve := flag.String("serve", "", "run as the fortio server on this address (the benchmark starts itself so)")
	flag.Parse()
	log.SetLogLevel(log.Warning)
	if *serve != "" {
		fmt.Fprintln(os.Stderr, "latency bench:", fortioload.Serve(*serve))
		os.Exit(1)
	}
	var err error
	if o.rates, err = parseRates(rates); err == nil {
		o.paths, err = parsePaths(paths)
	}
	if err == nil {
		err = run(o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "latency bench:", err)
		os.Exit(1)
	}
}

// load is a measurement at rate for d.
func (o options) load(rate float64, d time.Duration) fortioload.Load {
	return fortioload.Load{Rate: rate, Conns: o.conns, Duration: d, Uniform: o.uniform}
}

func parseRates(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		r, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || r <= 0 {
			return nil, fmt.Errorf("-rates: %q is not a positive rate", f)
		}
		out = append(out, r)
	}
	return out, nil
}

func parsePaths(s string) ([]string, error) {
	var out []string
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if !slices.Contains([]string{"direct", "l4", "l7", "nginx_stream", "nginx_plain"}, p) {
			return nil, fmt.Errorf("-paths: unknown path %q (direct, l4, l7, nginx_stream, nginx_plain)", p)
		}
		out = append(out, p)
	}
	return out, nil
}

func run(o options) error {
	if o.rounds < 1 || o.conns < 1 || o.duration <= 0 {
		return errors.New("-rounds, -conns and -duration must be positive")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	keep := o.keep
	work, cleanup, err := benchmesh.WorkDir(o.work, "latency", &keep)
	if err != nil {
		return err
	}
	defer cleanup()
	mesh, err := benchmesh.Start(ctx, benchmesh.Setup{BinDir: o.bin, WorkDir: work, Mesh: meshYAML,
		Policies: map[string]string{"authz.rego": allowAll}, BasePort: o.basePort})
	if err != nil {
		keep = true
		return fmt.Errorf("start mesh: %w", err)
	}
	defer mesh.Stop()
	srv, err := fortioload.StartServer(ctx, net.JoinHostPort(appIP, appPort), "-serve", net.JoinHostPort(appIP, appPort))
	if err != nil {
		return err
	}
	defer srv.Stop()

	pod, err := mesh.Plan.Pod("lat/client")
	if err != nil {
		return err
	}
	local := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(clientIP)}, Timeout: 10 * time.Second}
	socks, err := proxy.SOCKS5("tcp", pod.SOCKS5, nil, local)
	if err != nil {
		return err
	}
	viaMesh := socks.(proxy.ContextDialer).DialContext
	pids := map[string]int{}
	for _, name := range []string{"nodeproxy-node-a", "nodeproxy-node-b", "waypoint-lat-waypoint-0"} {
		if pids[name], err = benchmesh.PID(mesh, name); err != nil {
			return err
		}
	}
	nodes := []int{pids["nodeproxy-node-a"], pids["nodeproxy-node-b"]}
	targets := map[string]fortioload.Target{
		"direct": {URL: "http://" + net.JoinHostPort(appIP, appPort) + "/", Dial: local.DialContext},
		"l4":     {URL: "http://" + net.JoinHostPort(l4VIP, "80") + "/", Dial: viaMesh, PIDs: nodes},
		"l7": {URL: "http://" + net.JoinHostPort(l7VIP, "80") + "/", Dial: viaMesh,
			PIDs: append(slices.Clone(nodes), pids["waypoint-lat-waypoint-0"])},
	}
	for _, name := range []string{"nginx_stream", "nginx_plain"} {
		if !slices.Contains(o.paths, name) {
			continue
		}
		peer, err := startNginx(work, name)
		var miss *peers.ErrMissing
		switch {
		case errors.As(err, &miss):
			fmt.Fprintf(os.Stderr, "latency bench: %s skipped: %v\n", name, err)
			o.paths = slices.DeleteFunc(o.paths, func(p string) bool { return p == name })
		case err != nil:
			keep = true
			return err
		default:
			defer peer.Stop()
			pids, err := peer.PIDs()
			if err != nil {
				return err
			}
			targets[name] = fortioload.Target{URL: "http://" + net.JoinHostPort(peer.Listen, appPort) + "/", Dial: local.DialContext, PIDs: pids}
		}
	}
	for _, p := range o.paths {
		if err := targets[p].Check(ctx); err != nil {
			keep = true
			return fmt.Errorf("%s path does not work: %w", p, err)
		}
	}
	if o.afterLoad > 0 {
		if err := nodeProxyMemory(ctx, mesh, "start"); err != nil {
			return err
		}
	}
	admins := traceTargets(mesh.Plan)
	top := slices.Max(o.rates)
	for _, p := range o.paths {
		if _, err := targets[p].Run(o.load(top, o.warmup)); err != nil {
			keep = true
			return fmt.Errorf("%s warm-up: %w", p, err)
		}
	}
	// results[rate][path] holds each round's percentiles.
	results := map[float64]map[string][]fortioload.Result{}
	for round := 1; round <= o.rounds; round++ {
		for _, rate := range o.rates {
			if results[rate] == nil {
				results[rate] = map[string][]fortioload.Result{}
			}
			for _, p := range o.paths {
				var (
					traces sync.WaitGroup
					traced map[string]string
				)
				if o.traceDir != "" && round == 1 && rate == top && p != "direct" {
					traces.Go(func() { traced = traceAll(ctx, o.traceDir, p, admins) })
				}
				res, err := targets[p].Run(o.load(rate, o.duration))
				traces.Wait()
				// Read after the measurement, whose client this process is.
				for _, name := range slices.Sorted(maps.Keys(traced)) {
					reportTrace("latency_"+p+"_"+strings.ReplaceAll(name, "-", "_"), traced[name])
				}
				if err != nil {
					keep = true
					return fmt.Errorf("%s at %g/s: %w", p, rate, err)
				}
				fmt.Fprintf(os.Stderr, "# round %d %s %g/s: %d requests, p50 %.3f p90 %.3f p99 %.3f p99.9 %.3f ms; mesh %.0f us CPU, %.1f context switches per request\n",
					round, p, rate, res.N, res.MS(0.50), res.MS(0.90), res.MS(0.99), res.MS(0.999), res.CPUUS, res.Switches)
				results[rate][p] = append(results[rate][p], res)
			}
			select {
			case died := <-mesh.Died:
				keep = true
				return fmt.Errorf("a mesh process died: %s", died)
			default:
			}
		}
	}
	report(o, results)
	if o.afterLoad <= 0 {
		return nil
	}
	for _, node := range []string{"node-a", "node-b"} {
		peak, err := benchmesh.PeakRSS(pids["nodeproxy-"+node])
		if err != nil {
			return err
		}
		benchmesh.Report("latency_"+memoryPrefix(node)+"_rss_peak_mib", float64(peak)/(1<<20), "MiB")
	}
	benchmesh.Sleep(ctx, o.afterLoad)
	return nodeProxyMemory(ctx, mesh, "after_load")
}

// nodeProxyMemory reports what both node proxies hold (benchmesh.Memory),
// their figures named for when, once they have had 2 s to settle.
func nodeProxyMemory(ctx context.Context, mesh *localmesh.Mesh, when string) error {
	benchmesh.Sleep(ctx, 2*time.Second)
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, node := range []string{"node-a", "node-b"} {
		np, ok := mesh.Plan.Node(node)
		if !ok {
			return fmt.Errorf("no node %s in the plan", node)
		}
		pid, err := benchmesh.PID(mesh, "nodeproxy-"+node)
		if err != nil {
			return err
		}
		m, err := benchmesh.ReadMemory(pid, "http://"+np.Status+"/metrics")
		if err != nil {
			return err
		}
		m.Report("latency_"+memoryPrefix(node), when)
	}
	return nil
}

// memoryPrefix names a node proxy's memory figures: node-a's are
// nodeproxy_a_*.
func memoryPrefix(node string) string { return "nodeproxy_" + strings.TrimPrefix(node, "node-") }

// startNginx starts the named nginx pair (nginx_stream, nginx_plain) in
// front of the server, one worker process each (a node proxy is one process
// too).
func startNginx(work, name string) (*peers.Pair, error) {
	client, server, pki := plainAIP, plainBIP, ""
	if name == "nginx_stream" {
		client, server, pki = nginxAIP, nginxBIP, filepath.Join(work, "pki")
		if _, err := peers.NewPKI(pki); err != nil {
			return nil, err
		}
	}
	return peers.Start(peers.Config{Name: name, Work: work, PKI: pki, ClientIP: client, ServerIP: server,
		AppIP: appIP, Ports: []string{appPort}, Workers: 1, Files: 4096})
}

// quantiles reported, and their names.
var quantiles = []struct {
	q    float64
	name string
}{{0.50, "p50"}, {0.90, "p90"}, {0.99, "p99"}, {0.999, "p99_9"}}

func report(o options, results map[float64]map[string][]fortioload.Result) {
	added := map[float64]map[string][]float64{} // rate -> path_quantile -> median added
	for _, rate := range o.rates {
		added[rate] = map[string][]float64{}
		r := strconv.FormatFloat(rate, 'f', -1, 64)
		for _, p := range o.paths {
			runs := results[rate][p]
			for _, q := range quantiles {
				var abs, diff []float64
				for i, res := range runs {
					abs = append(abs, res.MS(q.q))
					if d, ok := results[rate]["direct"]; ok && p != "direct" {
						diff = append(diff, res.MS(q.q)-d[i].MS(q.q))
					}
				}
				benchmesh.Report(fmt.Sprintf("latency_%s_%srps_%s", p, r, q.name), fortioload.Median(abs), "ms")
				if len(diff) > 0 {
					m := fortioload.Median(diff)
					added[rate][p+"_"+q.name] = append(added[rate][p+"_"+q.name], m)
					benchmesh.Report(fmt.Sprintf("latency_%s_added_%srps_%s", p, r, q.name), m, "ms")
				}
			}
		}
		for _, p := range o.paths {
			if p == "direct" {
				continue
			}
			var cpu, sw []float64
			for _, res := range results[rate][p] {
				cpu, sw = append(cpu, res.CPUUS), append(sw, res.Switches)
			}
			benchmesh.Report(fmt.Sprintf("latency_%s_%srps_mesh_cpu_per_request", p, r), fortioload.Median(cpu), "us")
			benchmesh.Report(fmt.Sprintf("latency_%s_%srps_mesh_context_switches_per_request", p, r), fortioload.Median(sw), "count")
		}
	}
	// How the added latency grows from the lowest rate to the highest.
	lo, hi := slices.Min(o.rates), slices.Max(o.rates)
	if lo == hi {
		return
	}
	for _, p := range o.paths {
		for _, q := range []string{"p50", "p99"} {
			a, b := added[lo][p+"_"+q], added[hi][p+"_"+q]
			if len(a) == 0 || len(b) == 0 || a[0] <= 0 {
				continue
			}
			benchmesh.Report(fmt.Sprintf("latency_%s_added_%s_growth_ratio", p, q), b[0]/a[0], "x")
		}
	}
}

// traceTargets are the admin addresses of the processes traced, by name.
func traceTargets(p *localmesh.Plan) map[string]string {
	m := map[string]string{}
	for _, n := range p.Nodes {
		m["nodeproxy-"+n.Node] = n.Admin
	}
	for _, w := range p.Waypoints {
		m["waypoint"] = w.Admin
	}
	return m
}

// traceAll writes 3 s execution traces of every process in admins, taken
// at once from 1 s into the measurement, and returns the files by process.
func traceAll(ctx context.Context, dir, path string, admins map[string]string) map[string]string {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "latency bench: trace:", err)
		return nil
	}
	time.Sleep(time.Second)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		files = map[string]string{}
	)
	for name, addr := range admins {
		if path == "l4" && name == "waypoint" {
			continue
		}
		wg.Go(func() {
			file := filepath.Join(dir, path+"-"+name+".trace")
			if err := schedtrace.Fetch(ctx, &http.Client{Timeout: 30 * time.Second}, "http://"+addr+"/debug/pprof/trace?seconds=3", file); err != nil {
				fmt.Fprintf(os.Stderr, "latency bench: trace of %s: %v\n", name, err)
				return
			}
			mu.Lock()
			files[name] = file
			mu.Unlock()
		})
	}
	wg.Wait()
	return files
}

// reportTrace prints what one traced process's trace shows.
func reportTrace(name, file string) {
	s, err := schedtrace.Read(file)
	if err != nil || len(s.Waits) == 0 {
		fmt.Fprintf(os.Stderr, "latency bench: trace %s: %v (%d waits)\n", file, err, len(s.Waits))
		return
	}
	schedtrace.Report(os.Stdout, name, s)
}
