package kubesource_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/causeway-mesh/causeway/pkg/internal/kubetest"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/caclient"
	"github.com/causeway-mesh/causeway/pkg/xds"
)

// BenchmarkKubernetesScale measures the control plane (the real binary,
// --source kubernetes) against an apiserver holding 10,000 pods, 1,000
// services and 100 namespaces, with 100 node proxies subscribed to
// everything. See bench/README.md ("Control plane on Kubernetes"); run it
// with bench/controlplane-k8s.sh.
func BenchmarkKubernetesScale(b *testing.B) {
	const (
		namespaces   = 100
		svcPerNS     = 10
		podsPerSvc   = 10
		nodes        = 100
		podChanges   = 100
		createWorker = 32
	)
	env := kubetest.Start(b)
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = 5000, 10000 // the apiserver is the limit, not the client
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()

	// One node proxy per node, each with a bound token, as on a cluster.
	env.Create(b, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "causeway-system"}})
	tokens := make([]string, nodes)
	for i := range nodes {
		p := env.Create(b, pod("causeway-system", fmt.Sprintf("nodeproxy-%d", i), nodeName(i), "nodeproxy", fmt.Sprintf("10.200.0.%d", i+1)))[0].(*corev1.Pod)
		tr, err := kube.CoreV1().ServiceAccounts("causeway-system").CreateToken(ctx, "nodeproxy", &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
			Audiences: []string{"causeway-ca"}, BoundObjectRef: &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID},
		}}, metav1.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		tokens[i] = tr.Status.Token
	}

	bin := buildControlPlane(b)
	cp := startControlPlane(b, bin, env.Kubeconfig)
	clients := make([]*scaleClient, nodes)
	for i := range nodes {
		clients[i] = connect(b, cp, i, tokens[i])
	}

	// Creation while the control plane runs and the clients are subscribed.
	created := time.Now()
	for n := range namespaces {
		ns := fmt.Sprintf("scale-%d", n)
		if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
			Labels: map[string]string{"causeway.dev/dataplane-mode": "mesh"}}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		for s := range svcPerNS {
			if _, err := kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("sa-%d", s)}}, metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
		}
	}
	type job struct{ ns, svc int }
	jobs := make(chan job)
	var wg sync.WaitGroup
	var failed atomic.Value
	for range createWorker {
		wg.Go(func() {
			for j := range jobs {
				if err := createService(ctx, kube, j.ns, j.svc, podsPerSvc, nodes); err != nil {
					failed.Store(err)
				}
			}
		})
	}
	for n := range namespaces {
		for s := range svcPerNS {
			jobs <- job{n, s}
		}
	}
	close(jobs)
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	lastCreate := time.Now()
	total := namespaces * svcPerNS * podsPerSvc
	for _, c := range clients {
		c.waitWorkloads(b, total+nodes)
	}
	converged := time.Now()
	fmt.Printf("bench: k8s_objects_created %d pods, %d services, %d namespaces in %.1f s\n", total, namespaces*svcPerNS, namespaces, lastCreate.Sub(created).Seconds())
	fmt.Printf("bench: k8s_last_create_to_push_all_clients %.3f s\n", converged.Sub(lastCreate).Seconds())
	fmt.Printf("bench: k8s_create_start_to_push_all_clients %.3f s\n", converged.Sub(created).Seconds())

	// One pod changes at a time; latency until every client has it.
	pods := kube.CoreV1().Pods("scale-0")
	target, err := pods.Get(ctx, "svc-0-0", metav1.GetOptions{})
	if err != nil {
		b.Fatal(err)
	}
	uid := string(target.UID)
	watched.Store(uid)
	// Where a change's time goes: the API call (apiserver and etcd), the
	// control plane from its informer's event until every response is
	// queued (debounce included; its push latency histogram), and the
	// spread from the first client holding the change to the last.
	var perChange, perClient, apiCall, spread []time.Duration
	cpuBefore := procCPU(b, cp.cmd.Process.Pid)
	pushBefore := pushLatency(b, cp)
	for i := range podChanges {
		rev := strconv.Itoa(i)
		target.Labels["rev"] = rev
		start := time.Now()
		if target, err = pods.Update(ctx, target, metav1.UpdateOptions{}); err != nil {
			b.Fatal(err)
		}
		apiCall = append(apiCall, time.Since(start))
		var first, worst time.Duration
		for j, c := range clients {
			d := c.waitLabel(b, uid, rev).Sub(start)
			perClient = append(perClient, d)
			if j == 0 || d < first {
				first = d
			}
			worst = max(worst, d)
		}
		perChange = append(perChange, worst)
		spread = append(spread, worst-first)
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Printf("bench: k8s_pod_change_push_all_clients_p50 %.0f ms\n", ms(percentile(perChange, 50)))
	fmt.Printf("bench: k8s_pod_change_push_all_clients_p99 %.0f ms\n", ms(percentile(perChange, 99)))
	fmt.Printf("bench: k8s_pod_change_push_per_client_p99 %.0f ms\n", ms(percentile(perClient, 99)))
	fmt.Printf("bench: k8s_pod_change_api_call_p50/p99 %.0f / %.0f ms\n", ms(percentile(apiCall, 50)), ms(percentile(apiCall, 99)))
	push := pushLatency(b, cp).since(pushBefore)
	fmt.Printf("bench: controlplane_push_latency_mean/p99 %.0f ms / <= %s s (event to responses queued, debounce included)\n", 1000*push.sum/push.count(), push.quantile(0.99))
	fmt.Printf("bench: k8s_pod_change_first_to_last_client_p50/p99 %.0f / %.0f ms\n", ms(percentile(spread, 50)), ms(percentile(spread, 99)))
	// CPU per change says what a change costs whatever else the machine runs.
	fmt.Printf("bench: controlplane_cpu_per_pod_change %.0f ms\n", ms(procCPU(b, cp.cmd.Process.Pid)-cpuBefore)/podChanges)
	rss, hwm := procMemory(b, cp.cmd.Process.Pid)
	fmt.Printf("bench: controlplane_rss %.0f MiB\n", rss)
	fmt.Printf("bench: controlplane_peak_rss %.0f MiB\n", hwm)

	// A control plane starting against the full cluster.
	for _, c := range clients[1:] {
		c.stop()
	}
	start := time.Now()
	cold := startControlPlane(b, bin, env.Kubeconfig)
	c := connect(b, cold, 0, tokens[0])
	c.waitWorkloads(b, total+nodes)
	fmt.Printf("bench: k8s_cold_start_to_first_full_push %.3f s\n", time.Since(start).Seconds())
	rss, _ = procMemory(b, cold.cmd.Process.Pid)
	fmt.Printf("bench: controlplane_cold_rss_one_client %.0f MiB\n", rss)
}

func nodeName(i int) string { return fmt.Sprintf("node-%d", i) }

// createService creates one Service and its pods (bound to nodes, IPs in
// 10.0.0.0/8, status set as a kubelet would).
func createService(ctx context.Context, kube kubernetes.Interface, n, s, podsPerSvc, nodes int) error {
	ns := fmt.Sprintf("scale-%d", n)
	name := fmt.Sprintf("svc-%d", s)
	if _, err := kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), AppProtocol: ptr("http")}}},
	}, metav1.CreateOptions{}); err != nil {
		return err
	}
	for p := range podsPerSvc {
		idx := (n*10+s)*podsPerSvc + p
		po := pod(ns, fmt.Sprintf("%s-%d", name, p), nodeName(idx%nodes), fmt.Sprintf("sa-%d", s),
			fmt.Sprintf("10.%d.%d.%d", 1+idx/65536, (idx/256)%256, idx%256))
		po.Labels = map[string]string{"app": name}
		po.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}
		st := po.Status
		created, err := kube.CoreV1().Pods(ns).Create(ctx, po, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		created.Status = st
		created.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		if _, err := kube.CoreV1().Pods(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

func buildControlPlane(b *testing.B) string {
	b.Helper()
	if p := os.Getenv("CAUSEWAY_CONTROLPLANE_BIN"); p != "" {
		return p
	}
	out := filepath.Join(b.TempDir(), "controlplane")
	cmd := exec.Command("go", "build", "-o", out, "github.com/causeway-mesh/causeway/cmd/controlplane")
	if msg, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("build the control plane: %v\n%s", err, msg)
	}
	return out
}

type controlPlaneProc struct {
	cmd     *exec.Cmd
	grpc    string
	metrics string
	bundle  *trust.Bundle
}

func startControlPlane(b *testing.B, bin, kubeconfig string) *controlPlaneProc {
	b.Helper()
	dir := b.TempDir()
	grpcAddr, statusAddr := freeAddr(b), freeAddr(b)
	cmd := exec.Command(bin, "--source", "kubernetes", "--kubeconfig", kubeconfig, "--ca-dir", filepath.Join(dir, "ca"),
		"--listen", grpcAddr, "--readiness", statusAddr, "--metrics", statusAddr, "--admin", "", "--webhook-listen", "", "--log-level", "warn")
	logf, err := os.Create(filepath.Join(dir, "controlplane.log"))
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // gone with the benchmark, however it ends
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logf.Close()
	})
	rootPath := filepath.Join(dir, "ca", "root-cert.pem")
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if conn, err := net.Dial("tcp", grpcAddr); err == nil {
			conn.Close()
			if _, err := os.Stat(rootPath); err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logf.Name())
			b.Fatalf("control plane did not start:\n%s", log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	bundle, err := trust.LoadBundleFile(trust.DefaultTrustDomain, rootPath)
	if err != nil {
		b.Fatal(err)
	}
	return &controlPlaneProc{cmd: cmd, grpc: grpcAddr, metrics: statusAddr, bundle: bundle}
}

// histogram is a Prometheus histogram as scraped: cumulative counts by
// upper bound ("le"), and the sum.
type histogram struct {
	bounds []string
	counts []float64
	sum    float64
}

func (h histogram) count() float64 { return h.counts[len(h.counts)-1] }

// since is h less an earlier scrape of the same histogram.
func (h histogram) since(o histogram) histogram {
	d := histogram{bounds: h.bounds, counts: slices.Clone(h.counts), sum: h.sum - o.sum}
	for i := range d.counts {
		d.counts[i] -= o.counts[i]
	}
	return d
}

// quantile is the upper bound of the bucket holding quantile q.
func (h histogram) quantile(q float64) string {
	for i, c := range h.counts {
		if c >= q*h.count() {
			return h.bounds[i]
		}
	}
	return "+Inf"
}

// pushLatency scrapes the control plane's causeway_xds_push_latency_seconds.
func pushLatency(b *testing.B, cp *controlPlaneProc) histogram {
	b.Helper()
	resp, err := http.Get("http://" + cp.metrics + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var h histogram
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, `causeway_xds_push_latency_seconds_bucket{le="`); ok {
			le, v, _ := strings.Cut(rest, `"} `)
			n, _ := strconv.ParseFloat(v, 64)
			h.bounds, h.counts = append(h.bounds, le), append(h.counts, n)
		} else if v, ok := strings.CutPrefix(line, "causeway_xds_push_latency_seconds_sum "); ok {
			h.sum, _ = strconv.ParseFloat(v, 64)
		}
	}
	if len(h.counts) == 0 {
		b.Fatal("the control plane's /metrics has no causeway_xds_push_latency_seconds")
	}
	return h
}

func freeAddr(b *testing.B) string {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// scaleClient is one node proxy's xDS client.
type scaleClient struct {
	c      *xds.Client
	cancel func()
	mu     sync.Mutex
	seen   map[string]time.Time // "uid=rev" -> when first seen
	count  int                  // workloads held
	change chan struct{}
}

func connect(b *testing.B, cp *controlPlaneProc, node int, token string) *scaleClient {
	b.Helper()
	sc := &scaleClient{seen: map[string]time.Time{}, change: make(chan struct{}, 1)}
	c, err := xds.NewClient(xds.ClientOptions{
		Address: cp.grpc, Bundle: cp.bundle, Token: caclient.StaticToken(token), NodeID: xds.NodeProxyID(nodeName(node)),
		Subscriptions: xds.NodeProxySubscriptions(),
		OnChange: func(s *xds.State, _ []string) {
			now := time.Now()
			sc.mu.Lock()
			sc.count = len(s.Workloads)
			if w, ok := s.Workloads[sc.watchUID()]; ok {
				key := w.GetUid() + "=" + w.GetLabels()["rev"]
				if _, ok := sc.seen[key]; !ok {
					sc.seen[key] = now
				}
			}
			sc.mu.Unlock()
			select {
			case sc.change <- struct{}{}:
			default:
			}
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c.Run(ctx); close(done) }()
	sc.c = c
	sc.cancel = func() { cancel(); <-done }
	b.Cleanup(sc.stop)
	return sc
}

var watched atomic.Value // the uid whose changes the clients record

func (sc *scaleClient) watchUID() string { s, _ := watched.Load().(string); return s }

func (sc *scaleClient) stop() {
	if sc.cancel != nil {
		sc.cancel()
		sc.cancel = nil
	}
}

func (sc *scaleClient) waitWorkloads(b *testing.B, n int) {
	b.Helper()
	deadline := time.After(10 * time.Minute)
	for {
		sc.mu.Lock()
		have := sc.count
		sc.mu.Unlock()
		if have >= n {
			return
		}
		select {
		case <-sc.change:
		case <-time.After(time.Second):
		case <-deadline:
			b.Fatalf("client holds %d of %d workloads after 10 minutes", have, n)
		}
	}
}

// waitLabel returns when the client first held workload uid at rev.
func (sc *scaleClient) waitLabel(b *testing.B, uid, rev string) time.Time {
	b.Helper()
	deadline := time.After(time.Minute)
	for {
		sc.mu.Lock()
		at, ok := sc.seen[uid+"="+rev]
		sc.mu.Unlock()
		if ok {
			return at
		}
		select {
		case <-sc.change:
		case <-time.After(10 * time.Millisecond):
		case <-deadline:
			b.Fatalf("client never saw revision %s of %s", rev, uid)
		}
	}
}

func percentile(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[max(0, min(len(s)-1, i-1))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// procCPU reads the user and system CPU time pid has used.
func procCPU(b *testing.B, pid int) time.Duration {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command name (which may hold spaces): state is
	// field 3; utime and stime are fields 14 and 15, in clock ticks (100/s).
	rest := string(data[strings.LastIndexByte(string(data), ')')+2:])
	f := strings.Fields(rest)
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// procMemory reads VmRSS and VmHWM (peak) of pid in MiB.
func procMemory(b *testing.B, pid int) (rss, hwm float64) {
	b.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
		switch k {
		case "VmRSS":
			rss = kb / 1024
		case "VmHWM":
			hwm = kb / 1024
		}
	}
	return rss, hwm
}
