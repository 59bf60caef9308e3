package e2ek8s

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A waypoint rolls (kubectl rollout restart, as every upgrade does) under
// a steady stream of requests through it: 20 a second from the frontend
// to reviews, each on a new connection with a 3 s bound, from before the
// rollout until its old pods are gone and a moment after. None may fail:
// node proxies must stop choosing a pod before it stops listening, and
// not choose a new one before it can serve. That no node proxy found a
// waypoint pod refusing or not answering (its "hop unreachable" line) is
// checked as well: a connect that fails over to another pod costs no
// request, but where the address leads nowhere it costs the connect
// timeout, which the window of a quieter run may not show.
func testWaypointRollout(t *testing.T, frontend corev1.Pod) {
	const selector = "gateway.networking.k8s.io/gateway-name=waypoint"
	ctx := context.Background()
	old := readyPods(t, "shop", selector, 2)
	load := startLoad(t, frontend, "http://reviews.shop/e2e-rollout-"+randomHex(), "-c", "2", "-interval", "100ms", "-timeout", "3s")
	load.answered(t)
	time.Sleep(2 * time.Second) // traffic before the rollout as well
	began := time.Now()
	kc(t, time.Minute, "-n", "shop", "rollout", "restart", "deployment/waypoint")
	kc(t, 3*time.Minute, "-n", "shop", "rollout", "status", "deployment/waypoint", "--timeout=180s")
	eventually(t, 2*time.Minute, "the old waypoint pods gone", func() error {
		for _, p := range old {
			got, err := client.CoreV1().Pods("shop").Get(ctx, p.Name, metav1.GetOptions{})
			if err == nil && got.UID == p.UID {
				return fmt.Errorf("pod %s still there (%s)", p.Name, got.Status.Phase)
			}
			if err != nil && !apierrors.IsNotFound(err) {
				return err
			}
		}
		return nil
	})
	rolled := time.Since(began)
	time.Sleep(3 * time.Second) // and after it
	sum, _ := load.stop(t, "waypoint rollout")
	waypointIPs := map[string]string{}
	for _, p := range append(old, readyPods(t, "shop", selector, 2)...) {
		waypointIPs[p.Status.PodIP] = p.Name
	}
	proxies, err := client.CoreV1().Pods(systemNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + nodeProxy})
	if err != nil {
		t.Fatal(err)
	}
	since := metav1.NewTime(began.Add(-time.Second)) // the log's clock is in seconds
	for _, np := range proxies.Items {
		err := podLogLines(ctx, np, &corev1.PodLogOptions{Container: "nodeproxy", SinceTime: &since}, func(line map[string]any) {
			hop, _ := line["hop"].(string)
			host, _, _ := net.SplitHostPort(hop)
			if pod := waypointIPs[host]; pod != "" && line["msg"] == "hop unreachable: tried last for a while" {
				t.Errorf("node proxy %s dialled waypoint pod %s (%s) while it did not accept tunnels: %v", np.Name, pod, hop, line["error"])
			}
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("waypoint rolled (old pods gone) in %v; %d requests across it, %d failed", rolled.Round(100*time.Millisecond), sum.Sent, sum.Failed)
	if sum.Sent == 0 {
		t.Fatal("no request was sent")
	}
	if sum.Failed > 0 {
		t.Errorf("%d of %d requests through the waypoint failed while it rolled (from %s):\n%s", sum.Failed, sum.Sent,
			began.UTC().Format(time.RFC3339Nano), strings.Join(sum.Errors, "\n"))
	}
	readyPods(t, "shop", selector, 2)
}
