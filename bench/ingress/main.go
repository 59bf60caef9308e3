// Command ingress measures the ingress Gateway (GatewayClass causeway, the
// waypoint binary's --ingress role) against nginx doing the same TLS
// termination in front of the same backend, in one run (issue 39 item 4):
//
//	direct            client -> the backend's app address, plain HTTP (the baseline of the added latency)
//	gateway           client -HTTPS-> ingress gateway (HTTPRoute) -HBONE-> node proxy B -> backend
//	nginx             client -HTTPS-> nginx (proxy_pass, upstream keep-alive) -> backend, plain HTTP
//	gateway_waypoint  as gateway, to a Service with a waypoint: gateway -HBONE-> waypoint -HBONE-> node proxy B -> backend
//
// Both proxies serve the same ECDSA P-256 certificate over TLS 1.3 and
// HTTP/1.1; the backend is the fortio server. fortio's client loads each
// path over -conns keep-alive connections at -rate requests per second
// (latency: p50/p90/p99, and what each adds over direct in the same round)
// and as fast as the path answers (requests per second); gateway_newconn and
// nginx_newconn open a connection (a full TLS handshake) per request, as
// fast as they answer. CPU per request is read from /proc: the gateway
// process alone against nginx's master and workers, and the mesh's whole
// path (gateway + node proxy B, + waypoint) said separately. Paths are
// interleaved within each of -rounds rounds; every figure is the median over
// the rounds, every ratio the median of each round's ratio.
//
//	go run ./bench/ingress -bin bin [-rate 1000] [-conns 64] [-duration 10s] [-rounds 3]
//	    [-paths direct,gateway,nginx,gateway_waypoint,gateway_newconn,nginx_newconn]
//	    [-profile FILE] [-keep]
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"fortio.org/log"

	"github.com/causeway-mesh/causeway/bench/internal/benchmesh"
	"github.com/causeway-mesh/causeway/bench/internal/fortioload"
	"github.com/causeway-mesh/causeway/internal/ingresstest"
	"github.com/causeway-mesh/causeway/pkg/backendtls/backendtlstest"
)

// The benchmark's own addresses and ports (127.0.27.x, 27000-27999).
const (
	gatewayIP  = "127.0.27.1"   // pod edge/ingress-0, on node-a
	backendIP  = "127.0.27.2"   // pod bench/backend, on node-b
	waypointIP = "127.0.27.3"   // pod bench/waypoint-0, on node-a
	nginxIP    = "127.0.27.11"  // nginx's listener
	clientIP   = "127.0.27.20"  // fortio's connections come from here
	appIP      = "127.0.27.102" // the backend's app address (fortio server)
	backendVIP = "127.0.27.201" // Service bench/backend: no waypoint
	viaWPVIP   = "127.0.27.202" // Service bench/via-waypoint: through the waypoint
	appPort    = "27080"
	httpsPort  = 27443 // the gateway's listeners and nginx's
	basePort   = 27100 // the mesh's own ports from here

	hostDirect   = "ingress.bench"  // listener direct: routes to bench/backend
	hostWaypoint = "waypoint.bench" // listener waypoint: routes to bench/via-waypoint
	gatewayName  = "ingress-edge-ingress-0"
)

// meshYAML is the mesh: the ingress Gateway in namespace edge with two
// HTTPS listeners on one port (one certificate each, chosen by SNI) and an
// HTTPRoute for each; the backend in namespace bench behind two Services,
// one of them through the namespace's waypoint.
var meshYAML = `apiVersion: v1
kind: Namespace
metadata: {name: edge}
---
apiVersion: v1
kind: Namespace
metadata: {name: bench, labels: {causeway.dev/dataplane-mode: mesh}}
---
` + benchmesh.WaypointYAML("bench", "service", benchmesh.WaypointPod{Node: "node-a", IP: waypointIP}) +
	ingresstest.GatewayYAML("edge", "ingress",
		ingresstest.Listener{Name: "direct", Port: httpsPort, Protocol: "HTTPS", Hostname: hostDirect, Certificates: []string{"direct-cert"}},
		ingresstest.Listener{Name: "waypoint", Port: httpsPort, Protocol: "HTTPS", Hostname: hostWaypoint, Certificates: []string{"waypoint-cert"}}) +
	ingresstest.PodYAML("edge", "ingress", "node-a", gatewayIP) +
	ingresstest.HTTPRouteYAML("edge", "direct", []ingresstest.Parent{{Name: "ingress", Section: "direct"}}, nil,
		ingresstest.Backend{Namespace: "bench", Name: "backend", Port: 80}) +
	ingresstest.HTTPRouteYAML("edge", "waypoint", []ingresstest.Parent{{Name: "ingress", Section: "waypoint"}}, nil,
		ingresstest.Backend{Namespace: "bench", Name: "via-waypoint", Port: 80}) +
	ingresstest.GrantYAML("bench", "from-edge", "edge", "Service", "HTTPRoute") + `apiVersion: v1
kind: Pod
metadata:
  name: backend
  namespace: bench
  labels: {app: backend}
  annotations: {causeway.dev/app-address: ` + appIP + `}
spec:
  nodeName: node-b
  serviceAccountName: backend
  containers: [{name: backend, image: fortio, ports: [{containerPort: ` + appPort + `}]}]
status: {podIP: ` + backendIP + `}
---
apiVersion: v1
kind: Service
metadata: {name: backend, namespace: bench}
spec:
  clusterIP: ` + backendVIP + `
  selector: {app: backend}
  ports: [{name: http, port: 80, targetPort: ` + appPort + `, appProtocol: http}]
---
apiVersion: v1
kind: Service
metadata: {name: via-waypoint, namespace: bench, labels: {causeway.dev/use-waypoint: waypoint}}
spec:
  clusterIP: ` + viaWPVIP + `
  selector: {app: backend}
  ports: [{name: http, port: 80, targetPort: ` + appPort + `, appProtocol: http}]
`

const allowAll = "package envoy.authz\n\nallow := true\n"

// allPaths in the order each round runs them.
var allPaths = []string{"direct", "gateway", "nginx", "gateway_waypoint", "gateway_newconn", "nginx_newconn"}

type options struct {
	bin, work    string
	nginxBin     string
	nginxWorkers int
	rate         float64
	conns        int
	duration     time.Duration
	warmup       time.Duration
	rounds       int
	paths        []string
	profile      string
	keep         bool
}

func main() {
	o, serve, err := parseFlags(flag.CommandLine, os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "ingress bench:", err)
		os.Exit(2)
	}
	// fortio's warnings of threads behind their schedule come once per
	// thread; fortioload says once per run what rate was reached.
	log.SetLogLevel(log.Error)
	if serve != "" {
		fmt.Fprintln(os.Stderr, "ingress bench:", fortioload.Serve(serve))
		os.Exit(1)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "ingress bench:", err)
		os.Exit(1)
	}
}

// parseFlags reads the options; serve is set when the program runs as the
// backend (the benchmark starts itself so).
func parseFlags(fs *flag.FlagSet, args []string) (o options, serve string, err error) {
	var paths string
	fs.StringVar(&o.bin, "bin", "bin", "directory of the built binaries (make build)")
	fs.StringVar(&o.work, "work", "", "work directory for configuration, state and logs (default: a temporary one)")
	fs.StringVar(&o.nginxBin, "nginx", "nginx", "nginx binary (Debian's nginx)")
	fs.IntVar(&o.nginxWorkers, "nginx-workers", runtime.NumCPU(), "nginx worker processes (the gateway uses every CPU)")
	fs.Float64Var(&o.rate, "rate", 1000, "request rate of the latency measurements (requests per second)")
	fs.IntVar(&o.conns, "conns", 64, "connections (fortio -c)")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "length of each measurement")
	fs.DurationVar(&o.warmup, "warmup", 2*time.Second, "unmeasured load on each path before the rounds")
	fs.IntVar(&o.rounds, "rounds", 3, "rounds; paths are interleaved within each, figures are medians over them")
	fs.StringVar(&paths, "paths", strings.Join(allPaths, ","), "paths to measure (direct is the baseline of the added latency; gateway and nginx are compared)")
	fs.StringVar(&o.profile, "profile", "", "write a CPU profile of the gateway over the first round's gateway run at max rate to this file")
	fs.BoolVar(&o.keep, "keep", false, "keep the work directory (logs)")
	fs.StringVar(&serve, "serve", "", "run as the backend (fortio server) on this address")
	if err = fs.Parse(args); err != nil {
		return o, "", err
	}
	if serve != "" {
		return o, serve, nil
	}
	if o.rate <= 0 || o.conns < 1 || o.duration <= 0 || o.rounds < 1 || o.nginxWorkers < 1 {
		return o, "", errors.New("-rate, -conns, -duration, -rounds and -nginx-workers must be positive")
	}
	for _, p := range strings.Split(paths, ",") {
		p = strings.TrimSpace(p)
		if !slices.Contains(allPaths, p) {
			return o, "", fmt.Errorf("-paths: unknown path %q (%s)", p, strings.Join(allPaths, ", "))
		}
		if !slices.Contains(o.paths, p) {
			o.paths = append(o.paths, p)
		}
	}
	// Keep the rounds' order whatever the flag's.
	slices.SortFunc(o.paths, func(a, b string) int { return slices.Index(allPaths, a) - slices.Index(allPaths, b) })
	return o, "", nil
}

// path is one way to the backend.
type path struct {
	fortioload.Target
	newConns bool
	gateway  int // the gateway's pid, whose CPU is also counted alone; 0 for none
}

// sample is one measurement of a path.
type sample struct {
	fortioload.Result
	gatewayUS float64 // the gateway's CPU time alone per request
}

// mode is a kind of measurement: at the fixed rate, or as fast as a path answers.
type mode struct {
	name string
	rate float64 // 0: as fast as the path answers
}

func run(o options) error {
	nginxBin, err := benchmesh.LookTool(o.nginxBin, "/usr/sbin/nginx")
	if err != nil {
		return fmt.Errorf("%w (apt-get install -y nginx)", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	keep := o.keep
	work, cleanup, err := benchmesh.WorkDir(o.work, "ingress", &keep)
	if err != nil {
		return err
	}
	defer cleanup()
	fail := func(err error) error {
		keep = true
		return err
	}

	ca, err := backendtlstest.NewCA("ingress bench")
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.PEM)
	direct, err := ca.TLSData(hostDirect)
	if err != nil {
		return err
	}
	viaWP, err := ca.TLSData(hostWaypoint)
	if err != nil {
		return err
	}
	secrets := backendtlstest.SecretYAML("edge", "direct-cert", direct) + "---\n" + backendtlstest.SecretYAML("edge", "waypoint-cert", viaWP)

	mesh, err := benchmesh.Start(ctx, benchmesh.Setup{BinDir: o.bin, WorkDir: work, Mesh: meshYAML + "---\n" + secrets,
		Policies: map[string]string{"authz.rego": allowAll}, BasePort: basePort})
	if err != nil {
		return fail(fmt.Errorf("start mesh: %w", err))
	}
	defer mesh.Stop()
	var gwAdmin string
	for _, w := range mesh.Plan.Waypoints {
		if w.Ingress {
			gwAdmin = w.Admin
		}
	}
	pids := map[string]int{}
	for _, name := range []string{gatewayName, "nodeproxy-node-b", "waypoint-bench-waypoint-0"} {
		if pids[name], err = benchmesh.PID(mesh, name); err != nil {
			return fail(err)
		}
	}
	srv, err := fortioload.StartServer(ctx, net.JoinHostPort(appIP, appPort), "-serve", net.JoinHostPort(appIP, appPort))
	if err != nil {
		return fail(err)
	}
	defer srv.Stop()

	// nginx serves the ingress listener's own certificate and key.
	ndir := filepath.Join(work, "nginx")
	if err := os.MkdirAll(ndir, 0o700); err != nil {
		return err
	}
	for name, data := range direct { // tls.crt, tls.key
		if err := os.WriteFile(filepath.Join(ndir, name), data, 0o600); err != nil {
			return err
		}
	}
	ngx, err := nginxProxy(ndir, o.nginxWorkers).Start(nginxBin)
	if err != nil {
		return fail(err)
	}
	defer ngx.Stop()
	nginxPIDs, err := workerPIDs(ctx, ngx, o.nginxWorkers)
	if err != nil {
		return fail(err)
	}

	local := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(clientIP)}, Timeout: 10 * time.Second}
	to := func(addr string) func(ctx context.Context, _, _ string) (net.Conn, error) {
		return func(ctx context.Context, _, _ string) (net.Conn, error) { return local.DialContext(ctx, "tcp", addr) }
	}
	clientTLS := func(host string) *tls.Config {
		return &tls.Config{MinVersion: tls.VersionTLS13, ServerName: host, RootCAs: roots, NextProtos: []string{"http/1.1"}}
	}
	gw, nb, wp := pids[gatewayName], pids["nodeproxy-node-b"], pids["waypoint-bench-waypoint-0"]
	// URLs name addresses, Host headers and SNI the listeners' names.
	https := func(addr, host string, pids ...int) fortioload.Target {
		return fortioload.Target{URL: "https://" + addr + "/", Host: host, Dial: to(addr), TLS: clientTLS(host), PIDs: pids}
	}
	gwAddr := net.JoinHostPort(gatewayIP, strconv.Itoa(httpsPort))
	gateway := path{Target: https(gwAddr, hostDirect, gw, nb), gateway: gw}
	nginx := path{Target: https(net.JoinHostPort(nginxIP, strconv.Itoa(httpsPort)), hostDirect, nginxPIDs...)}
	paths := map[string]path{
		"direct":           {Target: fortioload.Target{URL: "http://" + net.JoinHostPort(appIP, appPort) + "/", Dial: to(net.JoinHostPort(appIP, appPort))}},
		"gateway":          gateway,
		"nginx":            nginx,
		"gateway_waypoint": {Target: https(gwAddr, hostWaypoint, gw, wp, nb), gateway: gw},
		"gateway_newconn":  {Target: gateway.Target, gateway: gw, newConns: true},
		"nginx_newconn":    {Target: nginx.Target, newConns: true},
	}
	for _, p := range o.paths {
		if err := paths[p].Check(ctx); err != nil {
			return fail(fmt.Errorf("%s path does not work: %w", p, err))
		}
	}
	for _, p := range o.paths {
		if _, err := paths[p].Run(fortioload.Load{Rate: o.rate, Conns: o.conns, Duration: o.warmup, NewConns: paths[p].newConns}); err != nil {
			return fail(fmt.Errorf("%s warm-up: %w", p, err))
		}
	}

	modes := []mode{{name: strconv.FormatFloat(o.rate, 'f', -1, 64) + "rps", rate: o.rate}, {name: "max"}}
	results := map[string]map[string][]sample{} // mode -> path -> each round's
	for round := 1; round <= o.rounds; round++ {
		for _, m := range modes {
			if results[m.name] == nil {
				results[m.name] = map[string][]sample{}
			}
			for _, name := range o.paths {
				p := paths[name]
				if p.newConns && m.rate > 0 {
					continue // new connections: their rate and cost only
				}
				var profiling chan error
				if o.profile != "" && round == 1 && m.rate == 0 && name == "gateway" {
					profiling = make(chan error, 1)
					go func() { profiling <- benchmesh.Profile(ctx, gwAdmin, o.duration-time.Second, o.profile) }()
				}
				s, err := measure(p, fortioload.Load{Rate: m.rate, Conns: o.conns, Duration: o.duration, NewConns: p.newConns})
				if profiling != nil {
					if perr := <-profiling; perr != nil {
						return fail(perr)
					}
				}
				if err != nil {
					return fail(fmt.Errorf("%s %s: %w", name, m.name, err))
				}
				fmt.Fprintf(os.Stderr, "# round %d %s %s: %.0f requests/s, p50 %.3f p90 %.3f p99 %.3f ms; path %.0f us CPU per request, gateway %.0f\n",
					round, name, m.name, s.RPS, s.MS(0.50), s.MS(0.90), s.MS(0.99), s.CPUUS, s.gatewayUS)
				results[m.name][name] = append(results[m.name][name], s)
			}
			select {
			case died := <-mesh.Died:
				return fail(fmt.Errorf("a mesh process died: %s", died))
			default:
			}
		}
	}
	report(modes, o.paths, results)
	return nil
}

// nginxProxy is nginx doing what the gateway does: TLS 1.3 in with the
// listener's certificate (dir's tls.crt and tls.key), HTTP/1.1 to the
// backend in plain HTTP over pooled keep-alive connections.
func nginxProxy(dir string, workers int) benchmesh.NginxProxy {
	return benchmesh.NginxProxy{Dir: dir, Listen: net.JoinHostPort(nginxIP, strconv.Itoa(httpsPort)), Upstream: net.JoinHostPort(appIP, appPort),
		Workers: workers, Cert: "tls.crt", Key: "tls.key"}
}

// workerPIDs waits for nginx's master to have started its workers (it
// listens before it forks them) and returns the master's and theirs.
func workerPIDs(ctx context.Context, d *benchmesh.Daemon, workers int) ([]int, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids, err := d.PIDs()
		if err != nil || len(pids) == 1+workers {
			return pids, err
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("nginx has %d processes, want a master and %d workers", len(pids), workers)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// measure runs l on p, counting the gateway's CPU time alone too.
func measure(p path, l fortioload.Load) (sample, error) {
	var before time.Duration
	var err error
	if p.gateway != 0 {
		if before, err = benchmesh.CPUTime(p.gateway); err != nil {
			return sample{}, err
		}
	}
	res, err := p.Run(l)
	if err != nil {
		return sample{}, err
	}
	s := sample{Result: res}
	if p.gateway != 0 {
		after, err := benchmesh.CPUTime(p.gateway)
		if err != nil {
			return sample{}, err
		}
		s.gatewayUS = float64(after-before) / float64(time.Microsecond) / float64(res.N+l.Conns)
	}
	return s, nil
}

// report prints the figures: medians over the rounds, and ratios as the
// median of each round's.
func report(modes []mode, paths []string, results map[string]map[string][]sample) {
	each := func(runs []sample, f func(int, sample) float64) float64 {
		var v []float64
		for i, s := range runs {
			v = append(v, f(i, s))
		}
		return fortioload.Median(v)
	}
	quantiles := []struct {
		q    float64
		name string
	}{{0.50, "p50"}, {0.90, "p90"}, {0.99, "p99"}}
	for _, m := range modes {
		res := results[m.name]
		direct := res["direct"]
		for _, p := range paths {
			runs := res[p]
			if len(runs) == 0 {
				continue
			}
			prefix := "ingress_" + p + "_" + m.name
			benchmesh.Report(prefix+"_rps", each(runs, func(_ int, s sample) float64 { return s.RPS }), "req/s")
			if m.rate > 0 {
				for _, q := range quantiles {
					benchmesh.Report(prefix+"_"+q.name, each(runs, func(_ int, s sample) float64 { return s.MS(q.q) }), "ms")
					if p != "direct" && len(direct) == len(runs) {
						benchmesh.Report(prefix+"_added_"+q.name, each(runs, func(i int, s sample) float64 { return s.MS(q.q) - direct[i].MS(q.q) }), "ms")
					}
				}
			}
			if p == "direct" {
				continue
			}
			benchmesh.Report(prefix+"_path_cpu_us_per_req", each(runs, func(_ int, s sample) float64 { return s.CPUUS }), "us")
			if runs[0].gatewayUS > 0 {
				benchmesh.Report(prefix+"_gateway_cpu_us_per_req", each(runs, func(_ int, s sample) float64 { return s.gatewayUS }), "us")
			}
		}
		// The ratios gateway/nginx, each round's pair measured back to back.
		for _, pair := range [][2]string{{"gateway", "nginx"}, {"gateway_newconn", "nginx_newconn"}} {
			a, b := res[pair[0]], res[pair[1]]
			if len(a) == 0 || len(a) != len(b) {
				continue
			}
			prefix := "ingress_" + pair[0] + "_vs_nginx_" + m.name
			benchmesh.Report(prefix+"_rps_ratio", each(a, func(i int, s sample) float64 { return s.RPS / b[i].RPS }), "x")
			benchmesh.Report(prefix+"_gateway_cpu_per_req_ratio", each(a, func(i int, s sample) float64 { return s.gatewayUS / b[i].CPUUS }), "x")
			benchmesh.Report(prefix+"_path_cpu_per_req_ratio", each(a, func(i int, s sample) float64 { return s.CPUUS / b[i].CPUUS }), "x")
			// Latency as the client sees it (an added figure's ratio is
			// meaningless when nginx adds about nothing).
			if m.rate > 0 {
				for _, q := range quantiles {
					benchmesh.Report(prefix+"_"+q.name+"_ratio", each(a, func(i int, s sample) float64 { return s.MS(q.q) / b[i].MS(q.q) }), "x")
				}
			}
		}
	}
}
