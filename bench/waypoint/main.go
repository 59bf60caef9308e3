// Command waypoint benchmarks the waypoint (docs/design.md §5.2) against nginx in
// the same run, with the same load generator and the same backend:
//
//	load -> HBONE (mTLS) -> waypoint (HTTPRoute, OPA allow) -> HBONE (mTLS) -> backend
//	load -> TLS (mTLS)   -> nginx    (proxy_pass)           -> TLS (mTLS)   -> backend
//
// and, as a reference for the waypoint's own HTTP cost, the same load
// through its TCP port (the same tunnels, one authorization per connection,
// bytes relayed).
//
// The waypoint is the real binary in a local mesh; nginx is Debian's, run
// as a child with a configuration of its own. The backend is one Go HTTP
// server in this process behind both fronts: an HBONE server presenting the
// backend workload's mesh identity (where a node proxy would answer) and a
// TLS server. Clients send HTTP/1.1 keep-alive requests in a closed loop,
// one connection each (HBONE tunnels share pooled connections as a node
// proxy's do). It prints `bench: <name> <value> <unit>` lines: requests per
// second, p50/p99 latency, CPU time per request of each proxy process, and
// the policy decision's CPU time in-process as a share of the waypoint's.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/causeway-mesh/causeway/bench/internal/benchmesh"
	"github.com/causeway-mesh/causeway/pkg/hbone"
	"github.com/causeway-mesh/causeway/pkg/localmesh"
	"github.com/causeway-mesh/causeway/pkg/trust"
)

// The benchmark's own addresses, apart from the sample (127.0.10.x), the
// end-to-end suite (127.0.40.x) and bench/nodeproxy (127.0.90.x).
const (
	loadgenIP   = "127.0.91.1"  // pod load/loadgen: the load generator's source
	waypointIP  = "127.0.91.2"  // pod bench/waypoint-0
	backendIP   = "127.0.91.3"  // pod bench/backend (its HBONE is served here)
	nginxIP     = "127.0.91.10" // nginx's listener
	backendApp  = "127.0.191.3" // the backend's app address (TLS for nginx)
	serviceVIP  = "127.0.192.1" // Service bench/backend
	nginxPort   = "8443"
	backendTLS  = "8443"
	trustDomain = trust.DefaultTrustDomain
)

var meshYAML = `apiVersion: v1
kind: Namespace
metadata:
  name: load
  labels:
    causeway.dev/dataplane-mode: mesh
---
apiVersion: v1
kind: Namespace
metadata:
  name: bench
  labels:
    causeway.dev/dataplane-mode: mesh
    causeway.dev/use-waypoint: waypoint
---
` + benchmesh.WaypointYAML("bench", "all", benchmesh.WaypointPod{Node: "node-a", IP: waypointIP}) + `apiVersion: v1
kind: Pod
metadata:
  name: loadgen
  namespace: load
spec:
  nodeName: node-a
  serviceAccountName: loadgen
  containers:
  - name: loadgen
    image: bench
status:
  podIP: ` + loadgenIP + `
---
apiVersion: v1
kind: Pod
metadata:
  name: backend
  namespace: bench
  labels:
    app: backend
  annotations:
    causeway.dev/app-address: ` + backendApp + `
spec:
  nodeName: node-b
  serviceAccountName: backend
  containers:
  - name: backend
    image: bench
    ports:
    - containerPort: 8080
      name: http
status:
  podIP: ` + backendIP + `
---
apiVersion: v1
kind: Service
metadata:
  name: backend
  namespace: bench
spec:
  clusterIP: ` + serviceVIP + `
  selector:
    app: backend
  ports:
  - name: http
    port: 80
    targetPort: 8080
    appProtocol: http
  - name: tcp
    port: 81
    targetPort: 8080
    appProtocol: tcp
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: backend
  namespace: bench
spec:
  parentRefs:
  - group: ""
    kind: Service
    name: backend
    port: 80
  rules:
  - matches:
    - path:
        type: PathPrefix
        value: /bench
    backendRefs:
    - name: backend
      port: 80
`

// benchPolicy has the shape of examples/local's: an object decision, rules
// collected in a set, a denial reason otherwise.
const benchPolicy = `package envoy.authz

loadgen := "spiffe://cluster.local/ns/load/sa/loadgen"

default allow := {"allowed": false, "http_status": 403, "body": "denied: no rule allows this request\n"}

allow := {"allowed": true, "headers": {"x-causeway-policy": concat(",", sort(allowed_by))}} if count(allowed_by) > 0

principal := input.attributes.source.principal

method := input.attributes.request.http.method

allowed_by contains "loadgen-read" if {
	principal == loadgen
	method in {"GET", "HEAD"}
	input.parsed_path[0] == "bench"
}

# The TCP port (the L4 reference path): a connection has no request. (Not
# "not input.attributes.request": reading the whole request, whose id is
# new each time, would keep the decision cache from ever answering.)
allowed_by contains "loadgen-connection" if {
	principal == loadgen
	not method
}
`

const benchPolicyTest = `package envoy.authz_test

import data.envoy.authz

test_loadgen_reads if {
	authz.allow.allowed with input as {"attributes": {"source": {"principal": "spiffe://cluster.local/ns/load/sa/loadgen"}, "request": {"http": {"method": "GET"}}}, "parsed_path": ["bench", "item"]}
}

test_others_denied if {
	not authz.allow.allowed with input as {"attributes": {"source": {"principal": "spiffe://cluster.local/ns/load/sa/other"}, "request": {"http": {"method": "GET"}}}, "parsed_path": ["bench"]}
}

test_loadgen_connects if {
	authz.allow.allowed with input as {"attributes": {"source": {"principal": "spiffe://cluster.local/ns/load/sa/loadgen"}}}
}

test_others_cannot_connect if {
	not authz.allow.allowed with input as {"attributes": {"source": {"principal": "spiffe://cluster.local/ns/load/sa/other"}}}
}
`

type options struct {
	bin, work, nginxBin string
	basePort            int
	conns               int
	warmup, window      time.Duration
	rounds              int
	nginxWorkers        int
	policyN             int
	skipDirect, skipL4  bool
	keep                bool
	profile             string
	rigProfile          string
	afterLoad           time.Duration
	waypointArgs        string
}

func main() {
	var o options
	flag.StringVar(&o.bin, "bin", "bin", "directory of the built binaries (make build)")
	flag.StringVar(&o.work, "work", "", "work directory for configuration, state and logs (default: a temporary one)")
	flag.StringVar(&o.nginxBin, "nginx", "nginx", "nginx binary (Debian: apt-get install nginx)")
	flag.IntVar(&o.basePort, "base-port", 18200, "first port of the benchmark mesh")
	flag.IntVar(&o.conns, "conns", 32, "concurrent client connections (closed loop, keep-alive)")
	flag.DurationVar(&o.warmup, "warmup", time.Second, "load before each measured window")
	flag.DurationVar(&o.window, "duration", 5*time.Second, "measured window per run")
	flag.IntVar(&o.rounds, "rounds", 2, "rounds (waypoint, nginx, direct each); the best run of each is reported, and the median of the rounds' waypoint/nginx ratios")
	flag.IntVar(&o.nginxWorkers, "nginx-workers", 0, "nginx worker_processes (default: the number of CPUs, as the waypoint's GOMAXPROCS)")
	flag.IntVar(&o.policyN, "policy-decisions", 20000, "decisions timed in-process for the policy cost")
	flag.BoolVar(&o.skipDirect, "skip-direct", false, "skip the reference run straight to the backend")
	flag.BoolVar(&o.skipL4, "skip-l4", false, "skip the reference run through the waypoint's TCP port (tunnels and relay only)")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory (logs)")
	flag.DurationVar(&o.afterLoad, "after-load", time.Minute, "how long after the last load the waypoint's RSS is read again (0: not read)")
	flag.StringVar(&o.profile, "waypoint-profile", "", "write a CPU profile of the waypoint during its first measured window to this file (go tool pprof bin/waypoint FILE)")
	flag.StringVar(&o.rigProfile, "rig-profile", "", "write a CPU profile of this program (the HBONE load generator and backend) during the waypoint's first measured window to this file")
	flag.StringVar(&o.waypointArgs, "waypoint-args", "", "extra flags for the waypoint, space-separated (e.g. \"--tracing-endpoint=127.0.0.1:4317 --tracing-sampling=1\")")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "waypoint bench:", err)
		os.Exit(1)
	}
}

// target is one way to the backend.
type target struct {
	name string
	dial dialFunc
	cpu  func() (time.Duration, error) // the proxy's processes; nil for none
}

func run(o options) error {
	if o.conns < 1 || o.rounds < 1 || o.policyN < 1 || o.window <= 0 {
		return errors.New("-conns, -rounds, -policy-decisions and -duration must be positive")
	}
	nginxBin, err := benchmesh.LookTool(o.nginxBin, "/usr/sbin/nginx")
	if err != nil {
		return fmt.Errorf("%w (apt-get install -y nginx)", err)
	}
	if o.nginxWorkers <= 0 {
		o.nginxWorkers = runtimeCPUs()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	work := o.work
	if work == "" {
		if work, err = os.MkdirTemp("", "causeway-bench-waypoint-"); err != nil {
			return err
		}
	}
	keep := o.keep
	defer func() {
		if keep {
			fmt.Fprintln(os.Stderr, "waypoint bench: work directory kept:", work)
		} else {
			os.RemoveAll(work)
		}
	}()
	fail := func(err error) error {
		keep = true
		return err
	}

	mesh, err := benchmesh.Start(ctx, benchmesh.Setup{BinDir: o.bin, WorkDir: work, Mesh: meshYAML, BasePort: o.basePort,
		Policies:     map[string]string{"authz.rego": benchPolicy, "authz_test.rego": benchPolicyTest},
		WaypointArgs: strings.Fields(o.waypointArgs),
		Edit: func(p *localmesh.Plan) error {
			// The backend's HBONE and app (it asks for no local app) are
			// this program's; node-b has nothing else, so it gets no node proxy.
			nodes := p.Nodes[:0]
			for _, n := range p.Nodes {
				if n.Node != "node-b" {
					nodes = append(nodes, n)
				}
			}
			p.Nodes = nodes
			return nil
		}})
	if err != nil {
		return fail(fmt.Errorf("start mesh: %w", err))
	}
	defer mesh.Stop()
	wpName := "waypoint-bench-waypoint-0"
	wpPID, err := benchmesh.PID(mesh, wpName)
	if err != nil {
		return fail(err)
	}
	// Idle, before any request: configuration and certificates loaded.
	if err := sleepCtx(ctx, 2*time.Second); err != nil {
		return fail(err)
	}
	if err := reportRSS(wpPID, "start"); err != nil {
		return fail(err)
	}

	// Mesh identities, signed by the mesh's CA as the control plane would.
	ca, err := trust.LoadCA(filepath.Join(work, "state", "ca"), time.Hour)
	if err != nil {
		return fail(err)
	}
	bundle, err := trust.NewBundle(trustDomain, ca.Roots())
	if err != nil {
		return fail(err)
	}
	loadgenID := mustIdentity("load", "loadgen")
	backendID := mustIdentity("bench", "backend")
	waypointID := mustIdentity("bench", "waypoint")
	loadgenCert, err := issueMesh(ca, loadgenID)
	if err != nil {
		return fail(err)
	}
	backendCert, err := issueMesh(ca, backendID)
	if err != nil {
		return fail(err)
	}

	// nginx's side: its own CA and DNS-named certificates.
	ndir := filepath.Join(work, "nginx")
	if err := os.MkdirAll(ndir, 0o700); err != nil {
		return fail(err)
	}
	pk, err := benchmesh.NewPKI(ndir)
	if err != nil {
		return fail(err)
	}
	certs := map[string]*tls.Certificate{}
	for i, name := range []string{"nginx.bench", "backend.bench", "nginx-client.bench", "loadgen.bench"} {
		if certs[name], err = pk.Issue(name, int64(i+2)); err != nil {
			return fail(err)
		}
	}

	be, err := startBackend(net.JoinHostPort(backendIP, "15008"), net.JoinHostPort(backendApp, backendTLS), bundle, backendCert,
		&tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{*certs["backend.bench"]},
			ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pk.Pool, NextProtos: []string{"http/1.1"}}, zap.NewNop())
	if err != nil {
		return fail(err)
	}
	defer be.close()

	ngx, err := nginxProxy(ndir, net.JoinHostPort(nginxIP, nginxPort), net.JoinHostPort(backendApp, backendTLS), o.nginxWorkers).Start(nginxBin)
	if err != nil {
		return fail(err)
	}
	defer ngx.Stop()

	local := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(loadgenIP)}, Timeout: 10 * time.Second}
	pool, err := hbone.NewPool(hbone.PoolOptions{Bundle: bundle})
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	hboneTarget := hbone.Target{
		LocalAddr: netip.MustParseAddr(loadgenIP),
		Address:   netip.MustParseAddrPort(waypointIP + ":15008"),
		Authority: serviceVIP + ":80",
		Source:    loadgenID,
		Cert:      func() (*tls.Certificate, error) { return loadgenCert, nil },
		Expected:  []trust.Identity{waypointID},
	}
	tlsDial := func(addr, serverName string) dialFunc {
		d := &tls.Dialer{NetDialer: local, Config: &tls.Config{MinVersion: tls.VersionTLS13, ServerName: serverName,
			RootCAs: pk.Pool, Certificates: []tls.Certificate{*certs["loadgen.bench"]}, NextProtos: []string{"http/1.1"}}}
		return func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }
	}
	wpCPUTime := func() (time.Duration, error) { return benchmesh.CPUTime(wpPID) }
	targets := []target{
		{name: "waypoint", dial: func(ctx context.Context) (net.Conn, error) { return pool.Dial(ctx, hboneTarget) }, cpu: wpCPUTime},
		{name: "nginx", dial: tlsDial(net.JoinHostPort(nginxIP, nginxPort), "nginx.bench"), cpu: ngx.CPU},
	}
	if !o.skipL4 {
		// The same requests to the service's TCP port: the waypoint
		// terminates and opens the same tunnels, authorizes each
		// connection once and relays bytes, with no HTTP in between.
		l4Target := hboneTarget
		l4Target.Authority = serviceVIP + ":81"
		targets = append(targets, target{name: "waypoint_l4",
			dial: func(ctx context.Context) (net.Conn, error) { return pool.Dial(ctx, l4Target) }, cpu: wpCPUTime})
	}
	if !o.skipDirect {
		targets = append(targets, target{name: "direct", dial: tlsDial(net.JoinHostPort(backendApp, backendTLS), "backend.bench")})
	}
	for _, t := range targets {
		if err := probe(ctx, t); err != nil {
			return fail(fmt.Errorf("%s path does not work: %w", t.name, err))
		}
	}

	type best struct {
		res loadResult
		cpu time.Duration // the proxy's
		rig time.Duration // this process's: load generator and backend
	}
	results := map[string]best{}
	// Each round's waypoint/nginx ratios: the two ran back to back, so a
	// round's ratio is less at the mercy of a noisy host than the ratio of
	// the best runs, which may come from different rounds.
	var roundRPS, roundCPU []float64
	wantProfile := o.profile != ""
	var profiling chan error // the waypoint's CPU profile being taken
	wantRigProfile := o.rigProfile != ""
	var rigProfile *os.File // this program's, being taken
	for range o.rounds {
		round := map[string]best{}
		for _, t := range targets {
			var cpu0, cpu1, rig0, rig1 time.Duration
			res, err := runLoad(ctx, t.dial, o.conns, o.warmup, o.window, func(start bool) error {
				if start && t.name == "waypoint" && wantProfile {
					wantProfile = false
					profiling = make(chan error, 1)
					go func() { profiling <- benchmesh.Profile(ctx, mesh.Plan.Waypoints[0].Admin, o.window, o.profile) }()
				}
				if err := profileRig(t.name == "waypoint", start, &wantRigProfile, &rigProfile, o.rigProfile); err != nil {
					return err
				}
				rig, err := benchmesh.CPUTime(os.Getpid())
				if err != nil {
					return err
				}
				var c time.Duration
				if t.cpu != nil {
					if c, err = t.cpu(); err != nil {
						return err
					}
				}
				if start {
					cpu0, rig0 = c, rig
				} else {
					cpu1, rig1 = c, rig
				}
				return nil
			})
			if err != nil {
				return fail(fmt.Errorf("%s load: %w", t.name, err))
			}
			if profiling != nil {
				err := <-profiling
				if profiling = nil; err != nil {
					return fail(err)
				}
			}
			if res.errors > res.requests/1000 {
				return fail(fmt.Errorf("%s: %d errors for %d requests, first: %v", t.name, res.errors, res.requests, res.firstErr))
			}
			b := best{res: res, cpu: cpu1 - cpu0, rig: rig1 - rig0}
			round[t.name] = b
			if prev, ok := results[t.name]; !ok || res.rps() > prev.res.rps() {
				results[t.name] = b
			}
		}
		wp, nx := round["waypoint"], round["nginx"]
		roundRPS = append(roundRPS, wp.res.rps()/nx.res.rps())
		roundCPU = append(roundCPU, cpuPerReq(wp.cpu, wp.res)/cpuPerReq(nx.cpu, nx.res))
		select {
		case died := <-mesh.Died:
			return fail(fmt.Errorf("a mesh process died: %s", died))
		default:
		}
	}

	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	usPerReq := func(b best) float64 { return cpuPerReq(b.cpu, b.res) }
	rigPerReq := func(b best) float64 { return cpuPerReq(b.rig, b.res) }
	wp, nx := results["waypoint"], results["nginx"]
	benchmesh.Report("waypoint_conns", float64(o.conns), "conns")
	benchmesh.Report("waypoint_rps", wp.res.rps(), "req/s")
	benchmesh.Report("nginx_rps", nx.res.rps(), "req/s")
	benchmesh.Report("waypoint_rps_ratio", wp.res.rps()/nx.res.rps(), "x")
	benchmesh.Report("waypoint_rps_ratio_round_median", median(roundRPS), "x")
	benchmesh.Report("waypoint_cpu_per_req_ratio_round_median", median(roundCPU), "x")
	benchmesh.Report("waypoint_p50_ms", ms(wp.res.percentile(0.50)), "ms")
	benchmesh.Report("waypoint_p99_ms", ms(wp.res.percentile(0.99)), "ms")
	benchmesh.Report("nginx_p50_ms", ms(nx.res.percentile(0.50)), "ms")
	benchmesh.Report("nginx_p99_ms", ms(nx.res.percentile(0.99)), "ms")
	benchmesh.Report("waypoint_p99_ratio", ms(wp.res.percentile(0.99))/ms(nx.res.percentile(0.99)), "x")
	if d, ok := results["direct"]; ok {
		benchmesh.Report("backend_direct_rps", d.res.rps(), "req/s")
		benchmesh.Report("backend_direct_p99_ms", ms(d.res.percentile(0.99)), "ms")
	}
	wpCPU, nxCPU := usPerReq(wp), usPerReq(nx)
	benchmesh.Report("waypoint_cpu_us_per_req", wpCPU, "us")
	benchmesh.Report("nginx_cpu_us_per_req", nxCPU, "us")
	benchmesh.Report("waypoint_cpu_per_req_ratio", wpCPU/nxCPU, "x")
	// The rest of the machine's CPU per request is this process's: an HBONE
	// client and server cost more than a TLS client and server, so even a
	// waypoint as cheap as nginx would not reach 1.0x here.
	wpRig, nxRig := rigPerReq(wp), rigPerReq(nx)
	benchmesh.Report("rig_cpu_us_per_req_waypoint_path", wpRig, "us")
	benchmesh.Report("rig_cpu_us_per_req_nginx_path", nxRig, "us")
	benchmesh.Report("waypoint_rps_ratio_at_nginx_cpu", (nxCPU+nxRig)/(nxCPU+wpRig), "x")
	if l4, ok := results["waypoint_l4"]; ok {
		l4CPU := usPerReq(l4)
		benchmesh.Report("waypoint_l4_rps", l4.res.rps(), "req/s")
		benchmesh.Report("waypoint_l4_cpu_us_per_req", l4CPU, "us")
		benchmesh.Report("waypoint_l4_cpu_per_req_ratio", l4CPU/nxCPU, "x")
		benchmesh.Report("waypoint_http_cpu_us_per_req", wpCPU-l4CPU, "us")
	}

	if m, err := benchmesh.Scrape("http://"+mesh.Plan.Waypoints[0].Status+"/metrics", "policy_decision_logs_dropped_total"); err == nil {
		dropped := m["policy_decision_logs_dropped_total"]
		benchmesh.Report("waypoint_decision_logs_dropped", dropped, "entries")
	} else {
		fmt.Fprintln(os.Stderr, "waypoint bench: decision log metrics:", err)
	}

	if o.afterLoad > 0 {
		peak, err := benchmesh.PeakRSS(wpPID)
		if err != nil {
			return fail(err)
		}
		benchmesh.Report("waypoint_rss_peak_mib", float64(peak)/(1<<20), "MiB")
		if err := sleepCtx(ctx, o.afterLoad); err != nil {
			return fail(err)
		}
		if err := reportRSS(wpPID, "after_load"); err != nil {
			return fail(err)
		}
	}

	peer, err := handshakePeer(bundle, loadgenCert, backendCert, backendID)
	if err != nil {
		return fail(err)
	}
	pc, err := measurePolicyCost(ctx, filepath.Join(work, "policies"), work, peer, backendID, o.policyN)
	if err != nil {
		return fail(fmt.Errorf("policy cost: %w", err))
	}
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	benchmesh.Report("policy_decide_cpu_us", us(pc.decide), "us")
	benchmesh.Report("policy_decide_logged_cpu_us", us(pc.decideLogged), "us")
	benchmesh.Report("waypoint_policy_cpu_ratio", us(pc.decide)/wpCPU, "x")
	benchmesh.Report("waypoint_policy_logged_cpu_ratio", us(pc.decideLogged)/wpCPU, "x")
	return nil
}

// profileRig starts this program's CPU profile at the start of the first
// waypoint window (while *want) and stops it at its end.
func profileRig(waypoint, start bool, want *bool, f **os.File, path string) error {
	switch {
	case waypoint && start && *want:
		*want = false
		out, err := os.Create(path)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(out); err != nil {
			out.Close()
			return err
		}
		*f = out
	case !start && *f != nil:
		pprof.StopCPUProfile()
		err := (*f).Close()
		*f = nil
		return err
	}
	return nil
}

// probe makes one request on t.
func probe(ctx context.Context, t target) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	c, err := t.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	return roundTrip(c, newReader(c))
}

func mustIdentity(ns, sa string) trust.Identity {
	id, err := trust.NewIdentity(trustDomain, ns, sa)
	if err != nil {
		panic(err) // constant arguments
	}
	return id
}

// issueMesh signs a workload certificate for id with the mesh's CA.
func issueMesh(ca *trust.Authority, id trust.Identity) (*tls.Certificate, error) {
	key, csrPEM, err := trust.NewKeyAndCSR(id)
	if err != nil {
		return nil, err
	}
	csr, err := trust.ParseCSR(csrPEM)
	if err != nil {
		return nil, err
	}
	chain, err := ca.Sign(csr, id, time.Hour)
	if err != nil {
		return nil, fmt.Errorf("sign %s: %w", id, err)
	}
	return trust.TLSCertificate(chain, key)
}

// cpuPerReq is cpu (a process's CPU time) in microseconds per request of res.
func cpuPerReq(cpu time.Duration, res loadResult) float64 {
	return float64(cpu.Microseconds()) / float64(res.requests)
}

// median of xs (the mean of the middle two for an even count).
func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// reportRSS reports the waypoint's RSS and the part of it that maps its
// binary.
func reportRSS(pid int, when string) error {
	rss, err := benchmesh.RSS(pid)
	if err != nil {
		return err
	}
	file, err := benchmesh.FileRSS(pid)
	if err != nil {
		return err
	}
	benchmesh.Report("waypoint_rss_"+when+"_mib", float64(rss)/(1<<20), "MiB")
	benchmesh.Report("waypoint_rss_file_"+when+"_mib", float64(file)/(1<<20), "MiB")
	return nil
}
