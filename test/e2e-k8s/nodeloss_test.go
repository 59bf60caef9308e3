package e2ek8s

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A node lost and back, and a node rebooted without a drain, on a cluster
// of three nodes: the shop's waypoint has a replica on each extra node
// (the host's node cannot be stopped: the control plane runs there), the
// frontend and reviews-v2 stay on the host's. hack/cluster/node-stop.sh
// cuts a node off as a power loss would (daemons and pods killed, its
// link down); node-start.sh boots it again, its pods coming back in no
// order of ours, the node proxy among them (docs/cluster.md "Losing a
// node"). make e2e-k8s names the scripts' directory in
// CAUSEWAY_E2E_NODE_SCRIPTS.
const (
	nodeScriptsEnv = "CAUSEWAY_E2E_NODE_SCRIPTS"
	waypointPods   = "gateway.networking.k8s.io/gateway-name=waypoint"
	// inFlightBound: how long a request in flight through the lost node
	// may take to end (with an error). Its connection's next hop no
	// longer answers at all, not even with a reset: the node proxy's HBONE
	// connection ends once its bytes go unacknowledged for 15s (the PING
	// timeout, as TCP_USER_TIMEOUT), with room for a loaded machine. The
	// keepalive alone would take 45s (30s idle, then 15s for the PING's
	// answer); longer is a hang.
	inFlightBound = 30 * time.Second
	// endpointsBound: how long the lost node's waypoint replica may stay a
	// ready endpoint (the test cluster's node-monitor-grace-period, 20s,
	// with room).
	endpointsBound = 60 * time.Second
	// configLag: how long the mesh may take to act on an endpoint update
	// (control plane to node proxy) before every new request must succeed.
	configLag = 5 * time.Second
	// holdsPerRun: held connections through the waypoint; each goes to
	// one of its two replicas, so with eight both carry some.
	holdsPerRun = 8
)

// nodeScripts runs hack/cluster's node-stop.sh and node-start.sh.
type nodeScripts struct {
	dir  string
	down map[string]bool // the nodes stopped and not started since
}

func nodeScriptsFor(t *testing.T) *nodeScripts {
	t.Helper()
	if len(nodes) < 3 {
		t.Skipf("%d node(s): losing one needs three (make e2e-k8s NODES=3)", len(nodes))
	}
	dir := os.Getenv(nodeScriptsEnv)
	if dir == "" {
		t.Skipf("%s is not set (make e2e-k8s sets it): no way to stop a node", nodeScriptsEnv)
	}
	return &nodeScripts{dir: dir, down: map[string]bool{}}
}

// run runs script (node-stop.sh, node-start.sh) for node, after flags,
// and returns when it is done.
func (s *nodeScripts) run(script, node string, flags ...string) error {
	i := strings.TrimPrefix(node, nodeName+"-")
	if i == node {
		return fmt.Errorf("%s is not an extra node (%s-<i>)", node, nodeName)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(s.dir, script), append(flags, i)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v\n%s", script, i, err, out)
	}
	return nil
}

// stop cuts node off (node-stop.sh with flags) and returns when; the node
// is started again when the test ends, if start did not.
func (s *nodeScripts) stop(t *testing.T, node string, flags ...string) time.Time {
	t.Helper()
	at := time.Now()
	s.down[node] = true
	t.Cleanup(func() {
		if s.down[node] {
			if err := s.run("node-start.sh", node); err != nil {
				t.Error(err)
			}
			s.down[node] = false
		}
	})
	if err := s.run("node-stop.sh", node, flags...); err != nil {
		t.Fatal(err)
	}
	return at
}

// startDaemons starts node's containerd, kubelet and kube-proxy again and
// returns when it began.
func (s *nodeScripts) startDaemons(t *testing.T, node string) time.Time {
	t.Helper()
	at := time.Now()
	if err := s.run("node-start.sh", node); err != nil {
		t.Fatal(err)
	}
	s.down[node] = false
	return at
}

// start boots node again and waits until it is Ready and its node proxy
// and its waypoint replica run again, in containers started since; it
// returns when the node's daemons were started.
func (s *nodeScripts) start(t *testing.T, node string) time.Time {
	t.Helper()
	at := s.startDaemons(t, node)
	ready := time.Now()
	ctx := context.Background()
	eventually(t, 2*time.Minute, "the node proxy and the waypoint replica of "+node+" back", func() error {
		if err := backOn(ctx, systemNS, "app.kubernetes.io/name="+nodeProxy, node, at); err != nil {
			return err
		}
		return backOn(ctx, "shop", waypointPods, node, at)
	})
	t.Logf("%s: Ready %.1fs after its daemons started, its node proxy and waypoint replica back after %.1fs", node, ready.Sub(at).Seconds(), time.Since(at).Seconds())
	return at
}

// backOn: the pod of selector on node is ready, every container of it
// started since then (the API's times are in whole seconds).
func backOn(ctx context.Context, ns, selector, node string, since time.Time) error {
	list, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector, FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return err
	}
	for _, p := range list.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		if !podReady(p) {
			return fmt.Errorf("%s not ready", p.Name)
		}
		for _, c := range p.Status.ContainerStatuses {
			if c.State.Running == nil || c.State.Running.StartedAt.Time.Before(since.Truncate(time.Second)) {
				return fmt.Errorf("%s: container %s not started again since %s", p.Name, c.Name, since.Format(time.RFC3339))
			}
		}
		return nil
	}
	return fmt.Errorf("no pod %q on %s", selector, node)
}

// spreadWaypoint puts one replica of the shop's waypoint on each extra
// node (it was on one) and returns them by node.
func spreadWaypoint(t *testing.T) map[string]corev1.Pod {
	t.Helper()
	extra := nodes[1:3]
	patch := fmt.Sprintf(`[
  {"op": "remove", "path": "/spec/template/spec/nodeSelector"},
  {"op": "add", "path": "/spec/template/spec/affinity", "value": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
    {"nodeSelectorTerms": [{"matchExpressions": [{"key": %q, "operator": "In", "values": [%q, %q]}]}]}}}},
  {"op": "add", "path": "/spec/template/spec/topologySpreadConstraints", "value": [{"maxSkew": 1, "topologyKey": %q,
    "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"gateway.networking.k8s.io/gateway-name": "waypoint"}},
    "matchLabelKeys": ["pod-template-hash"]}]}
]`, corev1.LabelHostname, extra[0], extra[1], corev1.LabelHostname)
	kc(t, time.Minute, "-n", "shop", "patch", "deployment", "waypoint", "--type", "json", "-p", patch)
	kc(t, 3*time.Minute, "-n", "shop", "rollout", "status", "deployment/waypoint", "--timeout=180s")
	on := map[string]corev1.Pod{}
	eventually(t, time.Minute, "a waypoint replica on each of "+strings.Join(extra, ", "), func() error {
		list, err := client.CoreV1().Pods("shop").List(context.Background(), metav1.ListOptions{LabelSelector: waypointPods})
		if err != nil {
			return err
		}
		clear(on)
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil && podReady(p) {
				on[p.Spec.NodeName] = p
			}
		}
		if len(on) != 2 || on[extra[0]].Name == "" || on[extra[1]].Name == "" || len(list.Items) != 2 {
			return fmt.Errorf("%d pods, ready on %v", len(list.Items), slices.Collect(maps.Keys(on)))
		}
		return nil
	})
	return on
}

// requestOutcome is one request of `echo load -each` (cmd/echo Outcome).
type requestOutcome struct {
	Began, Ended time.Time
	Status       int
	Pod          string
	Principal    string
	Error        string
}

// parseOutcomes reads echo load -each's lines.
func parseOutcomes(lines []string) ([]requestOutcome, error) {
	out := make([]requestOutcome, 0, len(lines))
	for _, l := range lines {
		var o requestOutcome
		if err := json.Unmarshal([]byte(l), &o); err != nil || o.Began.IsZero() {
			return nil, fmt.Errorf("not a request's outcome: %q (%v)", l, err)
		}
		out = append(out, o)
	}
	return out, nil
}

// throughWaypoint checks the requests to a waypoint-bound Service: each
// either reached a pod of the destination told the caller's identity
// (which only the waypoint tells it), or got no answer at all (refused,
// reset, timed out). An answer of any other kind came from a path
// without the waypoint: plain traffic, or the destination's node proxy
// hairpinning it as unauthenticated. It returns the refused ones.
func throughWaypoint(outcomes []requestOutcome, destination, identity string) (refused []requestOutcome, err error) {
	for _, o := range outcomes {
		switch {
		case o.Status == 0:
			refused = append(refused, o)
		case o.Status != 200 || !strings.HasPrefix(o.Pod, destination+"-") || o.Principal != identity:
			return refused, fmt.Errorf("a request begun %s was answered %d by %q told %q (%s): want %s told %s, or no answer",
				o.Began.Format(time.RFC3339Nano), o.Status, o.Pod, o.Principal, o.Error, destination, identity)
		}
	}
	return refused, nil
}

// waypointsOfHolds reads which waypoint replica logged each hold's path:
// the one its connection's tunnel goes to.
func waypointsOfHolds(ctx context.Context, paths []string) (map[string]string, error) {
	list, err := client.CoreV1().Pods("shop").List(ctx, metav1.ListOptions{LabelSelector: waypointPods})
	if err != nil {
		return nil, err
	}
	via := map[string]string{}
	for _, p := range list.Items {
		rc, err := client.CoreV1().Pods("shop").GetLogs(p.Name, &corev1.PodLogOptions{Container: "waypoint"}).Stream(ctx)
		if err != nil {
			return nil, fmt.Errorf("logs of %s: %w", p.Name, err)
		}
		sc := bufio.NewScanner(rc)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var line struct{ Msg, Path string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "request" && slices.Contains(paths, line.Path) {
				via[line.Path] = p.Spec.NodeName
			}
		}
		rc.Close()
	}
	if len(via) != len(paths) {
		return via, fmt.Errorf("%d of %d held connections seen at a waypoint", len(via), len(paths))
	}
	return via, nil
}

// endpointGone waits until the waypoint Service's endpoint of pod is
// gone or not ready, and returns when that was seen.
func endpointGone(ctx context.Context, pod corev1.Pod) (time.Time, error) {
	for {
		slices, err := client.DiscoveryV1().EndpointSlices("shop").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=waypoint"})
		if err == nil && !readyEndpoint(slices.Items, pod.Name) {
			return time.Now(), nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("the waypoint's endpoint %s still ready (%v)", pod.Name, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func readyEndpoint(slices []discoveryv1.EndpointSlice, pod string) bool {
	for _, s := range slices {
		for _, e := range s.Endpoints {
			if e.TargetRef != nil && e.TargetRef.Name == pod && (e.Conditions.Ready == nil || *e.Conditions.Ready) {
				return true
			}
		}
	}
	return false
}

// sender is a pod on an extra node whose one container, from its start,
// sends a request every 50ms to a waypoint-bound Service by its ClusterIP
// (no DNS on its way) and logs each outcome (echo load -each): what
// leaves it in the first moments of a boot is on record.
type sender struct {
	pod      corev1.Pod
	identity string
}

func startSenders(t *testing.T, ns, url string, on ...string) map[string]sender {
	t.Helper()
	ctx := context.Background()
	kc(t, time.Minute, "label", "namespace", ns, "causeway.dev/dataplane-mode=mesh")
	var pods []*corev1.Pod
	for i, node := range on {
		spec := echoPodSpec()
		spec.Containers[0].Args = []string{"load", "-each", "-interval", "50ms", "-timeout", "2s", "-for", "30m", url}
		spec.Containers[0].ReadinessProbe = nil
		placeOn(&spec, node)
		pods = append(pods, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("sender-%d", i)}, Spec: spec})
	}
	ready, err := startPods(ctx, ns, pods...)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]sender{}
	for _, p := range ready {
		out[p.Spec.NodeName] = sender{pod: *p, identity: "spiffe://" + trustDom + "/ns/" + ns + "/sa/default"}
	}
	return out
}

// expectNoPlainAfterBoot: the sender, whose node booted at booted, runs
// again in a new container and has reached the destination through the
// waypoint, and neither before the boot nor after did any of its
// requests reach the destination without the waypoint (throughWaypoint).
// It logs when the new container's requests began, and how the pod's
// sandbox fared meanwhile (the CNI plugin refusing it while the node's
// agent was not up).
func expectNoPlainAfterBoot(t *testing.T, s sender, destination string, booted time.Time) {
	t.Helper()
	ctx := context.Background()
	var after []requestOutcome
	eventually(t, 2*time.Minute, s.pod.Name+" sending again after its node's boot", func() error {
		p, err := clientPod(ctx, s.pod.Namespace, s.pod.Name)
		if err != nil {
			return err
		}
		if p.UID != s.pod.UID || len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].RestartCount == 0 ||
			p.Status.ContainerStatuses[0].State.Running == nil {
			return fmt.Errorf("not restarted in a new container yet: %+v", p.Status.ContainerStatuses)
		}
		after, err = senderLog(ctx, s.pod, false)
		if err != nil {
			return err
		}
		for _, o := range after {
			if o.Status == 200 {
				return nil
			}
		}
		return fmt.Errorf("%d requests since its restart, none answered", len(after))
	})
	before, err := senderLog(ctx, s.pod, true)
	if err != nil {
		t.Fatal(err)
	}
	for what, outcomes := range map[string][]requestOutcome{"before the boot": before, "after it": after} {
		refused, err := throughWaypoint(outcomes, destination, s.identity)
		if err != nil {
			t.Errorf("%s on %s, %s: %v", s.pod.Name, s.pod.Spec.NodeName, what, err)
		}
		t.Logf("%s on %s, %s: %d requests, %d refused, the rest through the waypoint", s.pod.Name, s.pod.Spec.NodeName, what, len(outcomes), len(refused))
	}
	if len(after) > 0 {
		first := slices.IndexFunc(after, func(o requestOutcome) bool { return o.Status == 200 })
		t.Logf("%s: its new container's first request %.1fs after the node's daemons started, its first answer %.1fs", s.pod.Name,
			after[0].Began.Sub(booted).Seconds(), after[first].Ended.Sub(booted).Seconds())
	}
	events, err := client.CoreV1().Events(s.pod.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + s.pod.Name + ",reason=FailedCreatePodSandBox"})
	if err == nil && len(events.Items) > 0 {
		t.Logf("%s: its sandbox refused %d time(s) after the boot, first: %s", s.pod.Name, events.Items[0].Count, events.Items[0].Message)
	}
}

// senderLog reads a sender's outcomes from its current container, or its
// previous one.
func senderLog(ctx context.Context, p corev1.Pod, previous bool) ([]requestOutcome, error) {
	b, err := client.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: "echo", Previous: previous,
		LimitBytes: new(int64(maxLogBytes))}).DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("logs of %s (previous %v): %w", p.Name, previous, err)
	}
	var lines []string
	for l := range strings.Lines(string(b)) {
		// A line cut short by the limit is left out.
		if strings.HasPrefix(l, `{"began"`) && strings.HasSuffix(l, "\n") {
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	return parseOutcomes(lines)
}

// testNodeLoss: with steady requests from the frontend to reviews-v2
// through the waypoint's two replicas, and connections held through both,
// the node of one replica is lost. The connections through it end, with
// an error, within inFlightBound; those through the other replica carry
// on; new requests succeed through the other replica once the lost one's
// endpoint is gone; no request reaches reviews-v2 without the waypoint.
// The node then comes back, its pods with it (a sender there among them,
// checked as after any boot).
func testNodeLoss(t *testing.T, nc *nodeScripts, frontend corev1.Pod, senders map[string]sender) (lost string) {
	ctx := context.Background()
	replicas := spreadWaypoint(t)
	identity := "spiffe://" + trustDom + "/ns/web/sa/frontend"
	base := "http://reviews-v2.shop/e2e-" + randomHex()
	paths := make([]string, holdsPerRun)
	holds := make([]*hold, holdsPerRun)
	for i := range holds {
		paths[i] = fmt.Sprintf("/e2e-held-%s-%d", randomHex(), i)
		// A bound on each answer far past inFlightBound: the hold ends when
		// the mesh ends its connection, not at its own timeout.
		holds[i] = startHold(t, frontend.Namespace, frontend.Name, "http://reviews-v2.shop"+paths[i], "-timeout", "5m", "-for", "10m")
	}
	for _, h := range holds {
		h.answered(t, 1)
	}
	load := startLoad(t, frontend, base, "-each", "-c", loadClients, "-interval", loadInterval, "-timeout", "10s")
	load.answered(t)
	var via map[string]string
	eventually(t, 30*time.Second, "the waypoint replica of each held connection", func() (err error) {
		via, err = waypointsOfHolds(ctx, paths)
		return err
	})
	// The node whose replica carries more of the held connections.
	count := map[string]int{}
	for _, n := range via {
		count[n]++
	}
	lost = nodes[1]
	if count[nodes[2]] > count[lost] {
		lost = nodes[2]
	}
	t.Logf("held connections by the node of their waypoint replica: %v; losing %s", count, lost)

	stopped := nc.stop(t, lost)
	ectx, cancel := context.WithTimeout(ctx, endpointsBound)
	gone, err := endpointGone(ectx, replicas[lost])
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	// The held connections through the lost node end, with an error.
	var ended []string
	for i, h := range holds {
		if via[paths[i]] != lost {
			continue
		}
		select {
		case <-h.done:
		case <-time.After(time.Until(stopped.Add(inFlightBound))):
			t.Fatalf("%s through the lost node's waypoint replica still open %s after the node was lost (%d answers, the last %.1fs after): a hang",
				h.what, inFlightBound, h.count.Load(), time.Unix(0, h.last.Load()).Sub(stopped).Seconds())
		}
		if h.err == nil {
			t.Errorf("%s ended without an error: %s", h.what, h.stderr.String())
		}
		ended = append(ended, fmt.Sprintf("%.1fs", h.ended.Sub(stopped).Seconds()))
	}
	// New requests keep going a little past both.
	time.Sleep(2 * time.Second)
	sum, lines := load.stop(t, "node loss")
	outcomes, err := parseOutcomes(lines)
	if err != nil {
		t.Fatal(err)
	}
	refused, err := throughWaypoint(outcomes, "reviews-v2", identity)
	if err != nil {
		t.Error(err)
	}
	var lastFailed time.Time
	for _, o := range refused {
		if o.Began.After(gone.Add(configLag)) {
			t.Errorf("a request begun %.1fs after the lost replica's endpoint was gone failed: %s", o.Began.Sub(gone).Seconds(), o.Error)
		}
		if o.Ended.After(lastFailed) {
			lastFailed = o.Ended
		}
	}
	gap := 0.0
	if !lastFailed.IsZero() {
		gap = lastFailed.Sub(stopped).Seconds()
	}
	// The longest wait for an answer from the loss on, and the slowest
	// request begun after it (one the node proxy first sent to the lost
	// replica waits for that to fail).
	answered := stopped
	var wait, slowest time.Duration
	for _, o := range outcomes {
		if o.Began.After(stopped) {
			slowest = max(slowest, o.Ended.Sub(o.Began))
		}
		if o.Status == 200 && o.Ended.After(answered) {
			wait = max(wait, o.Ended.Sub(answered))
			answered = o.Ended
		}
	}
	// The connections through the other replica never noticed.
	for i, h := range holds {
		if via[paths[i]] == lost {
			continue
		}
		select {
		case <-h.done:
			t.Errorf("%s through the replica on %s ended: %v: %s", h.what, via[paths[i]], h.err, h.stderr.String())
		default:
		}
	}
	t.Logf("node %s lost: held connections through it ended after %s; its waypoint endpoint gone after %.1fs; %d requests over %.1fs, %d failed, the last failure ending %.1fs after the loss; the longest wait for an answer after it %.1fs, the slowest request begun after it %.1fs",
		lost, strings.Join(ended, ", "), gone.Sub(stopped).Seconds(), sum.Sent, sum.Last.Sub(sum.First).Seconds(), len(refused), gap, wait.Seconds(), slowest.Seconds())

	booted := nc.start(t, lost)
	expectNoPlainAfterBoot(t, senders[lost], "reviews-v2", booted)
	expectCaptured(t, frontend)
	return lost
}

// testRebootWithoutDrain: first node's containerd, kubelet and kube-proxy
// crash and start again, its pods running on: the sender there is
// untouched. Then node is stopped and at once started again, as a reboot
// without a drain: its pods come back with its node proxy, in no order;
// the sender there never sends a byte past the mesh.
func testRebootWithoutDrain(t *testing.T, nc *nodeScripts, node string, s sender) {
	ctx := context.Background()
	np, err := client.CoreV1().Pods(systemNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + nodeProxy, FieldSelector: "spec.nodeName=" + node})
	if err != nil || len(np.Items) != 1 {
		t.Fatalf("the node proxy pod of %s: %v (%d)", node, err, len(np.Items))
	}
	crashed := nc.stop(t, node, "--daemons")
	nc.startDaemons(t, node)
	eventually(t, time.Minute, s.pod.Name+" sending on through the runtime's and the kubelet's restart", func() error {
		return untouched(ctx, s, np.Items[0], crashed)
	})
	t.Logf("%s: containerd, kubelet and kube-proxy killed and started again: the pods, the sender's capture and its traffic untouched", node)

	nc.stop(t, node)
	booted := nc.start(t, node)
	expectNoPlainAfterBoot(t, s, "reviews-v2", booted)
}

// untouched: since crashed, the sender's container and the node proxy's
// ran on (not restarted), and the sender's requests, 2s worth after the
// daemons' crash at least, all went through the waypoint, none refused.
func untouched(ctx context.Context, s sender, proxy corev1.Pod, crashed time.Time) error {
	for _, p := range []corev1.Pod{s.pod, proxy} {
		cur, err := clientPod(ctx, p.Namespace, p.Name)
		if err != nil {
			return err
		}
		for _, c := range cur.Status.ContainerStatuses {
			if c.State.Running == nil || !c.State.Running.StartedAt.Time.Before(crashed.Truncate(time.Second)) {
				return fmt.Errorf("%s: container %s restarted: %+v", p.Name, c.Name, c.State)
			}
		}
	}
	outcomes, err := senderLog(ctx, s.pod, false)
	if err != nil {
		return err
	}
	since := slices.DeleteFunc(outcomes, func(o requestOutcome) bool { return o.Began.Before(crashed) })
	refused, err := throughWaypoint(since, "reviews-v2", s.identity)
	switch {
	case err != nil:
		return err
	case len(refused) > 0:
		return fmt.Errorf("%d of %d requests since the crash refused, the first %s", len(refused), len(since), refused[0].Error)
	case len(since) < 40:
		return fmt.Errorf("%d requests since the crash, want 40", len(since))
	}
	return nil
}

// senderURL is the address of reviews-v2 (bound to the shop's waypoint)
// by its ClusterIP, on a path the shop's policy lets every caller read.
func senderURL(t *testing.T) string {
	t.Helper()
	svc, err := client.CoreV1().Services("shop").Get(context.Background(), "reviews-v2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return "http://" + net.JoinHostPort(svc.Spec.ClusterIP, "80") + "/public/e2e-sender-" + randomHex()
}

// throughWaypoint, which needs no cluster: an answer that came any other
// way than through the waypoint, with the caller's identity, is caught.
func TestThroughWaypoint(t *testing.T) {
	const id = "spiffe://cluster.local/ns/web/sa/frontend"
	at := time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC)
	through := requestOutcome{Began: at, Ended: at, Status: 200, Pod: "reviews-v2-abc", Principal: id}
	refused := requestOutcome{Began: at, Ended: at, Error: "read: connection reset by peer"}
	for _, tc := range []struct {
		what string
		bad  requestOutcome
	}{
		{"plain, hairpinned as unauthenticated to a path only callers of the mesh may read", requestOutcome{Status: 403, Error: "status 403 Forbidden"}},
		{"plain, to a path anyone may read", requestOutcome{Status: 200, Pod: "reviews-v2-abc"}},
		{"another caller's identity", requestOutcome{Status: 200, Pod: "reviews-v2-abc", Principal: "spiffe://cluster.local/ns/web/sa/admin"}},
		{"another destination", requestOutcome{Status: 200, Pod: "reviews-v1-abc", Principal: id}},
		{"the waypoint's own failure", requestOutcome{Status: 503, Error: "status 503"}},
	} {
		if _, err := throughWaypoint([]requestOutcome{through, refused, tc.bad, through}, "reviews-v2", id); err == nil {
			t.Errorf("%s: not caught", tc.what)
		}
	}
	got, err := throughWaypoint([]requestOutcome{through, refused, through, refused}, "reviews-v2", id)
	if err != nil || len(got) != 2 {
		t.Errorf("answers through the waypoint and refusals: %d refused, %v; want 2 and no error", len(got), err)
	}
}
