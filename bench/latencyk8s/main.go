// Command latencyk8s measures what the mesh adds to a request on the test
// cluster (make cluster). Fortio client and server pods talk over three
// paths, each in a namespace of its own: no mesh, node proxies only (L4:
// both namespaces enrolled, no waypoint) and through a waypoint (L7: the
// server's Service bound to a waypoint with an allow-all policy). The
// client calls the server's Service at fixed request rates over a fixed
// number of connections; rounds are interleaved (each round runs every
// rate on every path, the paths' order rotating), and the figures are the
// medians of the rounds: the latency percentiles and what each path adds
// over no mesh, and the CPU (per 1000 requests/s) and peak memory working
// set of each component (node proxy, waypoint, client, server) from their
// pods' cgroup counters over each window. A fourth path, relay, is the
// floor: no mesh, two plain TCP relays between client and server, what any
// pair of proxies adds at least. With two nodes or more it adds the same
// paths with the server on another node.
//
//	latencyk8s -kubeconfig FILE -kubectl PATH [-t 30s] [-rates 100,1000] [-rounds 3] [-c 64]
//		[-uniform] [-trace-dir DIR]
//
// It installs the mesh (unless installed) and its namespaces and removes
// what it installed. bench/latency-k8s.sh (make bench-k8s) brings up or
// uses the cluster, imports the images and runs it.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/causeway-mesh/causeway/internal/testcluster"
)

var logf = testcluster.Logger("latencyk8s")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := runMain(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "latencyk8s:", err)
		os.Exit(1)
	}
}

type options struct {
	kubeconfig, kubectl, repo, image, cgroupRoot string
	traceDir                                     string
	duration, after                              time.Duration
	rates                                        []int
	rounds, conns                                int
	uniform, keep                                bool
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("latencyk8s", flag.ContinueOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "the test cluster's admin kubeconfig (hack/cluster/lib.sh KUBECONFIG_ADMIN)")
	fs.StringVar(&o.kubectl, "kubectl", "kubectl", "kubectl to run")
	fs.StringVar(&o.repo, "repo", ".", "the repository (manifests/)")
	fs.StringVar(&o.image, "image", "", "fortio's image in the cluster's registry, REF@DIGEST (bench/images-k8s.sh fortio)")
	fs.StringVar(&o.cgroupRoot, "cgroup-root", "/sys/fs/cgroup", "where the cgroup v1 hierarchies are mounted")
	fs.DurationVar(&o.duration, "t", 30*time.Second, "how long each window's load runs")
	fs.DurationVar(&o.after, "after", time.Minute, "how long to wait after the last window before reading the memory once more (0: not at all)")
	rates := fs.String("rates", "100,1000", "the fixed request rates (requests/s), comma-separated")
	fs.IntVar(&o.rounds, "rounds", 3, "rounds (each runs every rate on every path); the figures are their medians")
	fs.IntVar(&o.conns, "c", 64, "connections (fortio -c)")
	fs.BoolVar(&o.uniform, "uniform", false, "spread each connection's requests over the interval (fortio -uniform) instead of sending them together")
	fs.StringVar(&o.traceDir, "trace-dir", "", "write 3 s execution traces of the mesh's proxies during the first round's windows at the highest rate into this directory, and print what they show (scheduling delays, the collector's pauses)")
	fs.BoolVar(&o.keep, "keep", false, "leave the mesh and the namespaces installed")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, s := range strings.Split(*rates, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			return o, fmt.Errorf("-rates %q: want positive whole numbers, comma-separated", *rates)
		}
		o.rates = append(o.rates, n)
	}
	switch {
	case o.kubeconfig == "":
		return o, fmt.Errorf("-kubeconfig is required")
	case o.image == "":
		return o, fmt.Errorf("-image is required (bench/images-k8s.sh fortio pushes it)")
	case o.duration < time.Second || o.after < 0:
		return o, fmt.Errorf("-t %v, -after %v: want at least 1s and not negative", o.duration, o.after)
	case o.rounds < 1 || o.conns < 1:
		return o, fmt.Errorf("-rounds %d, -c %d: want at least 1", o.rounds, o.conns)
	}
	return o, nil
}

// run is the installed benchmark: the paths and the pods that make them.
type run struct {
	o     options
	c     *testcluster.Cluster
	g     cgroups
	paths []path
	// urls are the Services the clients call: the server's, the first
	// relay's on a relay path (ClusterIP: no DNS in the way).
	urls             map[path]string
	clients, servers map[path]corev1.Pod
	nodeProxies      map[string]corev1.Pod // by node
	waypoints        map[path][]corev1.Pod // L7 paths'
	relays           map[path][]corev1.Pod // relay paths'
}

func runMain(ctx context.Context, args []string) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	r := &run{o: o, c: &testcluster.Cluster{Kubectl: o.kubectl, Kubeconfig: o.kubeconfig, Repo: o.repo},
		g: cgroups{root: o.cgroupRoot}}
	nodes, err := r.nodes(ctx)
	if err != nil {
		return err
	}
	r.paths = paths(nodes)
	installed, err := r.c.MeshInstalled(ctx)
	if err != nil {
		return err
	}
	start := time.Now()
	logf("nodes %s; installing the mesh and %d paths; load average %s", strings.Join(nodes, ", "), len(r.paths), testcluster.LoadAvg())
	defer testcluster.Remove(o.keep, start, logf, func(ctx context.Context) error { return r.uninstall(ctx, !installed) })
	if err := r.c.InstallMesh(ctx); err != nil {
		return fmt.Errorf("install: %w", err)
	}
	if err := r.setUp(ctx); err != nil {
		return err
	}
	logf("installed after %v", time.Since(start).Round(time.Second))
	before, err := r.tallies(ctx)
	if err != nil {
		return err
	}
	if err := r.warmUp(ctx); err != nil {
		return err
	}
	idle, err := r.memory()
	if err != nil {
		return err
	}
	ws, loads, err := r.windows(ctx)
	if err != nil {
		return err
	}
	var after []counters
	if o.after > 0 {
		logf("waiting %v before reading the memory again", o.after)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(o.after):
		}
		if after, err = r.memory(); err != nil {
			return err
		}
	}
	end, err := r.tallies(ctx)
	if err != nil {
		return err
	}
	var problems []string
	seen := map[path]tally{}
	for _, p := range r.paths {
		var sent int64
		for _, q := range o.rates {
			for _, w := range ws[key{p, q}] {
				sent += w.res.requests
			}
		}
		if why := checkCapture(p, before[p], end[p], sent); why != "" {
			problems = append(problems, p.name()+": "+why)
		}
		seen[p] = tally{outbound: end[p].outbound - before[p].outbound, inbound: end[p].inbound - before[p].inbound,
			any: end[p].any - before[p].any, waypointRequests: end[p].waypointRequests - before[p].waypointRequests}
	}
	rep := report{o: o, paths: r.paths, windows: ws, idle: idle, after: after, loads: loads, seen: seen,
		waypointPods: len(r.waypoints[path{mode: l7, client: r.paths[0].client, server: r.paths[0].client}])}
	rep.print(os.Stdout)
	if f := rep.failed(); f > 0 {
		problems = append(problems, fmt.Sprintf("%d requests failed", f))
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return nil
}

// nodes are the cluster's Ready, schedulable nodes, sorted by name.
func (r *run) nodes(ctx context.Context) ([]string, error) {
	out, err := r.c.Run(ctx, time.Minute, "", "get", "nodes", "-o", "json")
	if err != nil {
		return nil, err
	}
	var list corev1.NodeList
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return nil, fmt.Errorf("nodes: %w", err)
	}
	var names []string
	for _, n := range list.Items {
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue && !n.Spec.Unschedulable {
				names = append(names, n.Name)
			}
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("no Ready node")
	}
	sort.Strings(names)
	return names, nil
}

// setUp applies every path's objects, waits until they are ready and
// finds their pods, the node proxies and the waypoints.
func (r *run) setUp(ctx context.Context) error {
	var all strings.Builder
	for _, p := range r.paths {
		all.WriteString(p.manifests(r.o.image))
	}
	if err := r.c.Apply(ctx, all.String()); err != nil {
		return err
	}
	r.urls, r.clients, r.servers = map[path]string{}, map[path]corev1.Pod{}, map[path]corev1.Pod{}
	r.waypoints, r.relays, r.nodeProxies = map[path][]corev1.Pod{}, map[path][]corev1.Pod{}, map[string]corev1.Pod{}
	for _, p := range r.paths {
		ns := p.namespace()
		pods := []string{"-n", ns, "wait", "--for=condition=Ready", "--timeout=180s", "pod", "client", "server"}
		if p.mode == relay {
			pods = append(pods, relayFirst, relaySecond)
		}
		if err := r.c.Do(ctx, pods); err != nil {
			return err
		}
		if p.mode == l7 {
			if err := r.c.Do(ctx,
				[]string{"-n", ns, "wait", "--for=create", "--timeout=120s", "deployment/" + waypoint},
				[]string{"-n", ns, "rollout", "status", "deployment/" + waypoint, "--timeout=180s"},
				[]string{"-n", ns, "wait", "--for=condition=Programmed", "--timeout=120s", "gateway/" + waypoint},
			); err != nil {
				return err
			}
			wps, err := r.readyPods(ctx, ns, waypointSelector)
			if err != nil {
				return err
			}
			r.waypoints[p] = wps
			logf("%s: waypoint on %s", p.name(), podNodes(wps))
		}
		called := "server"
		if p.mode == relay {
			called = relayFirst
		}
		ip, err := r.c.Run(ctx, time.Minute, "", "-n", ns, "get", "service", called, "-o", "jsonpath={.spec.clusterIP}")
		if err != nil {
			return err
		}
		r.urls[p] = fmt.Sprintf("http://%s:%d/echo", strings.TrimSpace(ip), serverPort)
		for role, into := range map[string]map[path]corev1.Pod{"client": r.clients, "server": r.servers} {
			ps, err := r.readyPods(ctx, ns, "app="+role)
			if err != nil {
				return err
			}
			into[p] = ps[0]
		}
		if p.mode == relay {
			for _, name := range []string{relayFirst, relaySecond} {
				ps, err := r.readyPods(ctx, ns, "app="+name)
				if err != nil {
					return err
				}
				r.relays[p] = append(r.relays[p], ps[0])
			}
		}
	}
	nps, err := r.readyPods(ctx, testcluster.SystemNS, testcluster.NodeProxySelector)
	if err != nil {
		return err
	}
	for _, np := range nps {
		r.nodeProxies[np.Spec.NodeName] = np
	}
	for _, p := range r.paths {
		for _, n := range []string{p.client, p.server} {
			if _, ok := r.nodeProxies[n]; !ok {
				return fmt.Errorf("no ready node proxy on node %s", n)
			}
		}
	}
	return nil
}

// readyPods are the pods matching selector, all ready, at least one.
func (r *run) readyPods(ctx context.Context, ns, selector string) ([]corev1.Pod, error) {
	ps, err := r.c.Pods(ctx, ns, selector)
	if err != nil {
		return nil, err
	}
	for _, p := range ps {
		if !testcluster.Ready(p) {
			return nil, fmt.Errorf("pod %s/%s is not ready", ns, p.Name)
		}
	}
	if len(ps) == 0 {
		return nil, fmt.Errorf("no pod %s in %s", selector, ns)
	}
	return ps, nil
}

func podNodes(ps []corev1.Pod) string {
	var ns []string
	for _, p := range ps {
		ns = append(ns, p.Spec.NodeName)
	}
	return strings.Join(ns, ", ")
}

// uninstall removes the paths' namespaces and, if mesh, the mesh.
func (r *run) uninstall(ctx context.Context, mesh bool) error {
	args := []string{"delete", "namespace", "--ignore-not-found", "--wait=true"}
	for _, p := range r.paths {
		args = append(args, p.namespace())
	}
	if err := r.c.Do(ctx, args); err != nil || !mesh {
		return err
	}
	return r.c.UninstallMesh(ctx)
}

// fortio runs a load from a path's client pod.
func (r *run) fortio(ctx context.Context, p path, l load) (result, error) {
	args := append([]string{"-n", p.namespace(), "exec", "client", "-c", "fortio", "--"}, l.args(r.urls[p])...)
	out, err := r.c.Run(ctx, l.duration+2*time.Minute, "", args...)
	if err != nil {
		return result{}, fmt.Errorf("%s: %w", p.name(), err)
	}
	return parseFortio([]byte(out))
}

// warmUp sends a few requests on every path until all of them succeed
// (the waypoint and the node proxies may still be taking the paths'
// configuration in), so the first window does not pay for it.
func (r *run) warmUp(ctx context.Context) error {
	for _, p := range r.paths {
		var last string
		_, ok, err := testcluster.Until(ctx, 2*time.Minute, func() (bool, error) {
			res, err := r.fortio(ctx, p, load{qps: 20, conns: 2, duration: 2 * time.Second})
			switch {
			case err != nil:
				last = err.Error()
			case res.failed > 0:
				last = fmt.Sprintf("%d of %d requests failed", res.failed, res.requests)
			default:
				return true, nil
			}
			return false, nil
		})
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%s: requests still failing after 2 minutes: %s", p.name(), last)
		}
	}
	return nil
}

// Components of a path whose resources are reported, in this order.
const (
	compNodeProxy = iota
	compWaypoint
	compRelay
	compClient
	compServer
)

var componentNames = []string{"nodeproxy", "waypoint", "relay", "client", "server"}

// components are a path's cgroups: the node proxy container of the
// client's and of the server's node (one when they are the same), its
// waypoint's pods (none but for L7), its relays' pods (none but for
// relay), the client and the server pods.
func (r *run) components(p path) ([]component, error) {
	comps := make([]component, len(componentNames))
	for i, n := range componentNames {
		comps[i].name = n
	}
	add := func(i int, pod corev1.Pod, container string) error {
		d, err := r.g.dir(pod, container)
		if err == nil {
			comps[i].dirs = append(comps[i].dirs, d)
		}
		return err
	}
	nodes := []string{p.client}
	if p.cross() {
		nodes = append(nodes, p.server)
	}
	for _, n := range nodes {
		if err := add(compNodeProxy, r.nodeProxies[n], "nodeproxy"); err != nil {
			return nil, err
		}
	}
	for _, wp := range r.waypoints[p] {
		if err := add(compWaypoint, wp, ""); err != nil {
			return nil, err
		}
	}
	for _, rp := range r.relays[p] {
		if err := add(compRelay, rp, ""); err != nil {
			return nil, err
		}
	}
	if err := add(compClient, r.clients[p], ""); err != nil {
		return nil, err
	}
	return comps, add(compServer, r.servers[p], "")
}

// memory reads the memory of the node proxy and the waypoint of the L7
// path on the first node, in components' order (the others zero).
func (r *run) memory() ([]counters, error) {
	comps, err := r.components(path{mode: l7, client: r.paths[0].client, server: r.paths[0].client})
	if err != nil {
		return nil, err
	}
	out := make([]counters, len(comps))
	for _, i := range []int{compNodeProxy, compWaypoint} {
		if out[i], err = r.g.total(comps[i]); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// key names the windows of one path at one rate.
type key struct {
	p   path
	qps int
}

// window is one load's figures.
type window struct {
	res result
	use []usage // by component
}

// windows runs the rounds: in each, every rate on every path, the paths'
// order rotating from round to round. It returns the windows and the
// host's load average after each.
func (r *run) windows(ctx context.Context) (map[key][]window, []float64, error) {
	out := map[key][]window{}
	var loads []float64
	n := len(r.paths)
	for round := range r.o.rounds {
		for _, q := range r.o.rates {
			for i := range n {
				p := r.paths[(i+round)%n]
				comps, err := r.components(p)
				if err != nil {
					return nil, nil, err
				}
				l := load{qps: q, conns: r.o.conns, duration: r.o.duration, uniform: r.o.uniform}
				var traces sync.WaitGroup
				if r.o.traceDir != "" && round == 0 && q == slices.Max(r.o.rates) && p.mode.enrolled() {
					ps, err := r.proxies(p)
					if err != nil {
						return nil, nil, err
					}
					traces.Go(func() { traceProxies(ctx, r.o.traceDir, p.name(), ps, 3*time.Second) })
				}
				var res result
				use, err := r.g.measure(comps, 500*time.Millisecond, func() error {
					var err error
					res, err = r.fortio(ctx, p, l)
					return err
				})
				traces.Wait()
				if err != nil {
					return nil, nil, err
				}
				out[key{p, q}] = append(out[key{p, q}], window{res, use})
				la, _ := strconv.ParseFloat(testcluster.LoadAvg(), 64)
				loads = append(loads, la)
				logf("round %d, %s at %d/s: %.1f/s, p50 %s p99 %s, %d failed; node proxy %s CPU, waypoint %s; load average %.2f",
					round+1, p.name(), q, res.qps, ms(res.latency[0]), ms(res.latency[2]), res.failed,
					use[compNodeProxy].cpu.Round(time.Millisecond), use[compWaypoint].cpu.Round(time.Millisecond), la)
			}
		}
	}
	return out, loads, nil
}
