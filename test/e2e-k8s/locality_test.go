package e2ek8s

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Locality (docs/design.md §5, "Endpoint choice and locality"): a Service's
// trafficDistribution is honoured by whoever chooses its endpoint, the
// client's node proxy or the waypoint, relative to itself, and when no
// close endpoint is left the traffic falls back to the next tier.
//
// The nodes get zones for the test: the client's node and the waypoint's
// share one, the destination node has its own. One echo pod per node
// serves two Services (PreferSameNode, PreferSameZone) and one without a
// preference (the control: it must reach all three, which also shows that
// the node proxy knows every endpoint before the others are checked). In
// the waypoint's namespace, two pods (on the waypoint's node and the
// destination node) serve a PreferSameNode Service bound to the waypoint.
func testLocality(t *testing.T, frontend corev1.Pod) {
	if placed(clientNode) == "" {
		t.Skip("locality needs three nodes (make e2e-k8s NODES=3)")
	}
	ctx := context.Background()
	const zoneA, zoneB = "e2e-zone-a", "e2e-zone-b"
	zones := map[string]string{nodes[clientNode]: zoneA, nodes[waypointNode]: zoneA, nodes[destinationNode]: zoneB}
	for _, node := range slices.Sorted(maps.Keys(zones)) {
		kc(t, time.Minute, "label", "node", node, "--overwrite", corev1.LabelTopologyZone+"="+zones[node])
	}
	t.Cleanup(func() {
		for node := range zones {
			if out, err := runKubectl(ctx, "label", "node", node, corev1.LabelTopologyZone+"-"); err != nil {
				t.Errorf("remove the zone label: %v: %s", err, out)
			}
		}
	})

	ns := newNamespace(t, "e2e-locality")
	kc(t, time.Minute, "label", "namespace", ns, "causeway.dev/dataplane-mode=mesh")
	at := func(place int) string { return fmt.Sprintf("at-%d", place) }
	var pods []*corev1.Pod
	for _, place := range []int{clientNode, waypointNode, destinationNode} {
		pods = append(pods, localityPod(ns, at(place), "loc", place))
	}
	// In the waypoint's namespace: bound to it by the namespace's label.
	near, far := "loc-wp-near", "loc-wp-far"
	pods = append(pods, localityPod("shop", near, "loc-wp", waypointNode), localityPod("shop", far, "loc-wp", destinationNode))
	t.Cleanup(func() {
		for _, p := range []string{near, far} {
			_ = client.CoreV1().Pods("shop").Delete(context.Background(), p, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		}
	})
	if _, err := startPods(ctx, "", pods...); err != nil {
		t.Fatal(err)
	}
	for _, s := range []struct{ ns, name, app, distribution string }{
		{ns, "same-node", "loc", corev1.ServiceTrafficDistributionPreferSameNode},
		{ns, "close", "loc", corev1.ServiceTrafficDistributionPreferSameZone}, // PreferClose's newer name
		{ns, "spread", "loc", ""},
		{"shop", "loc-wp", "loc-wp", corev1.ServiceTrafficDistributionPreferSameNode},
		{"shop", "loc-wp-spread", "loc-wp", ""},
	} {
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: s.ns},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": s.app},
				// HTTP: the shop's waypoint policy allows the frontend's GETs.
				Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http"), AppProtocol: new("http")}}},
		}
		if s.distribution != "" {
			svc.Spec.TrafficDistribution = &s.distribution
		}
		if _, err := client.CoreV1().Services(s.ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if s.ns == "shop" {
			t.Cleanup(func() {
				_ = client.CoreV1().Services("shop").Delete(context.Background(), s.name, metav1.DeleteOptions{})
			})
		}
	}

	// answeredBy checks that n requests from the frontend to a fresh path
	// of Service name are all answered, each by one of want (and with
	// all, by every one of them).
	answeredBy := func(name, ns string, n int, all bool, want ...string) func() error {
		return func() error {
			url := "http://" + name + "." + ns + "/e2e-" + randomHex()
			answers, err := fetchFrom("web", frontend.Name, slices.Repeat([]string{url}, n)...)
			if err != nil {
				return err
			}
			seen := map[string]int{}
			for _, a := range answers {
				seen[a.Pod]++
			}
			for p := range seen {
				if !slices.Contains(want, p) {
					return fmt.Errorf("%s: answers by %v, want only %v", url, seen, want)
				}
			}
			if all && len(seen) != len(want) {
				return fmt.Errorf("%s: answers by %v, want each of %v", url, seen, want)
			}
			return nil
		}
	}
	// The controls first: every endpoint known to the client's node proxy
	// and to the waypoint.
	eventually(t, time.Minute, "the Service without a preference reaches all three nodes",
		answeredBy("spread", ns, 24, true, at(clientNode), at(waypointNode), at(destinationNode)))
	eventually(t, time.Minute, "the waypoint-bound Service without a preference reaches both pods",
		answeredBy("loc-wp-spread", "shop", 16, true, near, far))
	// 20 answers: all from the preferred endpoints by chance at most once
	// in a million when they are not preferred.
	expect := func(what, name, ns string, want ...string) {
		t.Helper()
		eventually(t, 30*time.Second, what, answeredBy(name, ns, 20, false, want...))
	}
	expect("PreferSameNode: the client's node", "same-node", ns, at(clientNode))
	expect("PreferSameZone: the client's zone", "close", ns, at(clientNode), at(waypointNode))
	expect("PreferSameNode through the waypoint: the waypoint's node", "loc-wp", "shop", near)

	// Fallback: the closest endpoints go, the next tier takes over.
	gone := func(ns string, names ...string) {
		t.Helper()
		for _, p := range names {
			if err := client.CoreV1().Pods(ns).Delete(ctx, p, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	gone(ns, at(clientNode))
	gone("shop", near)
	expect("PreferSameNode, none left on the node: its zone", "same-node", ns, at(waypointNode))
	expect("PreferSameZone, one left in the zone", "close", ns, at(waypointNode))
	expect("PreferSameNode through the waypoint, none left on its node: the other", "loc-wp", "shop", far)
	gone(ns, at(waypointNode))
	expect("PreferSameNode, none left in the zone: any", "same-node", ns, at(destinationNode))
	expect("PreferSameZone, none left in the zone: any", "close", ns, at(destinationNode))
}

// localityPod is an echo pod labelled app on the node of place.
func localityPod(ns, name, app string, place int) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": app}}, Spec: echoPodSpec()}
	placeOn(&p.Spec, placed(place))
	return p
}

// moves is how many times testPodMoves moves its pod (the figure is their
// median).
const moves = 3

// testPodMoves moves a mesh pod (a Deployment pinned to a node, recreated
// on another): each time the new node's node proxy fetches the pod's
// certificate and the old node's drops it, and the time from the new
// container's start to the first answer through the mesh is measured (a
// client sends steadily to a Service that selects the new pod alone, so it
// is answered once the pod is ready, its endpoint published and the two
// node proxies have their certificates).
func testPodMoves(t *testing.T, frontend corev1.Pod) {
	if placed(clientNode) == "" {
		t.Skip("moving a pod between nodes needs three nodes (make e2e-k8s NODES=3)")
	}
	ctx := context.Background()
	ns := newNamespace(t, "e2e-move")
	kc(t, time.Minute, "label", "namespace", ns, "causeway.dev/dataplane-mode=mesh")
	if _, err := client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "mover"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	identity := "spiffe://cluster.local/ns/" + ns + "/sa/mover"
	proxies := readyPods(t, systemNS, "app.kubernetes.io/name="+nodeProxy, len(nodes))
	proxyOn := func(place int) corev1.Pod {
		t.Helper()
		p, err := nodeProxyOn(proxies, nodes[place])
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	// loggedSince finds a node proxy's line with msg for the identity.
	loggedSince := func(p corev1.Pod, msg string, since time.Time) func() error {
		return func() error {
			st := metav1.NewTime(since.Add(-time.Second)) // the log's clock is in seconds
			found := false
			err := podLogLines(ctx, p, &corev1.PodLogOptions{Container: "nodeproxy", SinceTime: &st}, func(line map[string]any) {
				found = found || line["msg"] == msg && line["identity"] == identity
			})
			if err == nil && !found {
				err = fmt.Errorf("node proxy %s on %s: no %q line for %s", p.Name, p.Spec.NodeName, msg, identity)
			}
			return err
		}
	}

	// The pod alternates between the waypoint's node and the destination
	// node (the client's stays the client's).
	placeOf := func(move int) int {
		if move%2 == 0 {
			return waypointNode
		}
		return destinationNode
	}
	pod := func(move int) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("mover-%d", move), Labels: map[string]string{"app": "mover", "move": fmt.Sprint(move)}}, Spec: echoPodSpec()}
		p.Spec.ServiceAccountName = "mover"
		placeOn(&p.Spec, placed(placeOf(move)))
		return p
	}
	if _, err := startPods(ctx, ns, pod(0)); err != nil {
		t.Fatal(err)
	}
	var took []time.Duration
	for move := 1; move <= moves; move++ {
		from, to := placeOf(move-1), placeOf(move)
		svc := fmt.Sprintf("mover-%d", move)
		if _, err := client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: svc},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "mover", "move": fmt.Sprint(move)},
				Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// Steady requests to the new pod's Service, from before it exists.
		load := startLoad(t, frontend, "http://"+svc+"."+ns+"/move", "-interval", "20ms", "-timeout", "1s")
		began := time.Now()
		// Deleted, then recreated on the other node.
		if err := client.CoreV1().Pods(ns).Delete(ctx, fmt.Sprintf("mover-%d", move-1), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		ready, err := startPods(ctx, ns, pod(move))
		if err != nil {
			t.Fatal(err)
		}
		if ready[0].Spec.NodeName != nodes[to] {
			t.Fatalf("%s on %s, want %s", ready[0].Name, ready[0].Spec.NodeName, nodes[to])
		}
		load.answered(t) // by the moved pod: the old one is gone
		sum, _ := load.stop(t, fmt.Sprintf("move %d", move))
		started, err := containerStarted(ctx, *ready[0])
		if err != nil {
			t.Fatal(err)
		}
		if sum.FirstAnswer.IsZero() || !sum.First.Before(started) {
			t.Fatalf("load %+v: its first request must precede the container's start (%s) and it must have an answer", sum, started)
		}
		took = append(took, sum.FirstAnswer.Sub(started))
		t.Logf("move %d (%s -> %s): pod start to first byte through the mesh %s", move, nodes[from], nodes[to], took[len(took)-1].Round(time.Millisecond))
		eventually(t, 30*time.Second, "the new node's node proxy fetched the certificate", loggedSince(proxyOn(to), "certificate fetched", began))
		eventually(t, 30*time.Second, "the old node's node proxy dropped the certificate", loggedSince(proxyOn(from), "certificate dropped: no workload of its identity is left on this node", began))
	}
	slices.Sort(took)
	t.Logf("FIGURE pod start to first byte through the mesh, moved across nodes: median %s of %v", took[len(took)/2].Round(time.Millisecond), took)
}

// containerStarted is when a pod's echo container started serving: the
// runtime's timestamp of its first log line (nanoseconds; the pod status
// has seconds).
func containerStarted(ctx context.Context, p corev1.Pod) (time.Time, error) {
	raw, err := client.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: "echo", Timestamps: true, LimitBytes: new(int64(4096))}).DoRaw(ctx)
	if err != nil {
		return time.Time{}, err
	}
	ts, _, ok := strings.Cut(string(raw), " ")
	if !ok {
		return time.Time{}, fmt.Errorf("%s: no log line yet: %q", p.Name, raw)
	}
	return time.Parse(time.RFC3339Nano, ts)
}
