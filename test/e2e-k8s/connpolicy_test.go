package e2ek8s

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// testConnectionPolicy: a ConnectionPolicy read from the API server, at
// workloads without a waypoint, naming the install's policy set "default"
// (testdata/connection-policy: only the service account "allowed" of the
// workload's namespace). The server's node proxy admits the allowed pod and
// refuses another; an edit that selects the server again closes the other
// pod's open connection and leaves the allowed one's. kubectl runs
// kubectl against the cluster, failing the test on an error.
func testConnectionPolicy(t *testing.T, kubectl func(args ...string)) {
	ctx := context.Background()
	ns := newNamespace(t, "e2e-connpolicy")
	kubectl("label", "namespace", ns, "causeway.dev/dataplane-mode=mesh")
	if _, err := client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "allowed"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// On three nodes, each on its own.
	pod := func(name, sa string, place int) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name}}, Spec: echoPodSpec()}
		p.Spec.ServiceAccountName = sa
		placeOn(&p.Spec, placed(place))
		return p
	}
	pods, err := startPods(ctx, ns, pod("server", "default", destinationNode), pod("allowed", "allowed", clientNode), pod("other", "default", waypointNode))
	if err != nil {
		t.Fatal(err)
	}
	server := "http://" + net.JoinHostPort(pods[0].Status.PodIP, "8080")

	// The policy, applied as a user would (the CRD's schema checks it).
	file := filepath.Join(t.TempDir(), "connection-policy.yaml")
	apply := func(app string) {
		t.Helper()
		doc := fmt.Sprintf("apiVersion: causeway.dev/v1alpha1\nkind: ConnectionPolicy\nmetadata: {name: only-allowed, namespace: %s}\nspec:\n  selector: {matchLabels: {app: %s}}\n  policy: default\n", ns, app)
		if err := os.WriteFile(file, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		kubectl("apply", "-f", file)
	}
	apply("server")
	// The leader's status: accepted, and the set (the ConfigMap mounted
	// into the control plane) active.
	for _, c := range []string{"Accepted", "ResolvedRefs"} {
		kubectl("-n", ns, "wait", "--for=condition="+c, "--timeout=60s", "connectionpolicy/only-allowed")
	}
	eventually(t, 30*time.Second, "the other pod refused", func() error { return refusedConnection(ns, "other", server+"/refused") })
	fetchOK(t, ns, "allowed", server+"/allowed")

	// Selecting nothing, the policy admits both; both hold a connection
	// open. Selecting the server again closes the other's only.
	apply("nothing")
	fetchOK(t, ns, "other", server+"/unselected")
	allowed, other := startHold(t, ns, "allowed", server+"/hold"), startHold(t, ns, "other", server+"/hold")
	allowed.answered(t, 1)
	other.answered(t, 1)
	apply("server")
	select {
	case <-other.done:
		if !strings.Contains(other.stderr.String(), "connection ended") {
			t.Fatalf("the other pod's hold ended with %v: %s", other.err, other.stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the other pod's open connection is still open 30s after the policy selected its server (%d answers)", other.count.Load())
	case <-allowed.done:
		t.Fatalf("the allowed pod's connection ended: %v: %s", allowed.err, allowed.stderr.String())
	}
	// The node proxy said which policy, at which revision, closed it.
	eventually(t, 30*time.Second, "the node proxy's log line of the closed connection", func() error {
		found := false
		err := eachLogLine(ctx, systemNS, "app.kubernetes.io/name="+nodeProxy, "nodeproxy", func(line map[string]any) {
			if line["msg"] == "open connection no longer authorized; closed" && line["policy"] == ns+"/only-allowed" && line["policy_revision"] != "" {
				found = true
			}
		})
		if err == nil && !found {
			err = errors.New("no line names the policy and its revision")
		}
		return err
	})
	allowed.answered(t, allowed.count.Load()+5) // still answering on the same connection
	if err := refusedConnection(ns, "other", server+"/again"); err != nil {
		t.Error(err)
	}
}

// testConnectionPolicyAdmission: `kubectl apply` of a ConnectionPolicy
// naming the install's set "e2e-broken" (its Rego does not compile) is
// refused by the control plane's webhook with the compiler's message; one
// naming the good set "default" is accepted.
func testConnectionPolicyAdmission(t *testing.T, kubectl func(args ...string)) {
	ns := newNamespace(t, "e2e-cpadmission")
	dir := t.TempDir()
	write := func(name, set string) string {
		t.Helper()
		file := filepath.Join(dir, name+".yaml")
		doc := fmt.Sprintf("apiVersion: causeway.dev/v1alpha1\nkind: ConnectionPolicy\nmetadata: {name: %s, namespace: %s}\nspec:\n  selector: {matchLabels: {app: db}}\n  policy: %s\n", name, ns, set)
		if err := os.WriteFile(file, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return file
	}
	broken := write("broken", "e2e-broken")
	want := []string{`admission webhook "policies.validation.causeway.dev" denied the request`,
		"causeway: ConnectionPolicy " + ns + `/broken: spec.policy: policy set "e2e-broken" has no good revision at the control plane: `,
		"authz.rego"} // the compiler names the file
	eventually(t, 30*time.Second, "the broken policy refused by the webhook", func() error {
		out, err := runKubectl(context.Background(), "apply", "-f", broken)
		if err == nil {
			_, _ = runKubectl(context.Background(), "delete", "-f", broken, "--ignore-not-found")
			return fmt.Errorf("admitted: %s", out)
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				return fmt.Errorf("refused without %q: %s", w, out)
			}
		}
		return nil
	})
	kubectl("apply", "-f", write("good", "default"))
	kubectl("-n", ns, "wait", "--for=condition=ResolvedRefs", "--timeout=60s", "connectionpolicy/good")
}

// refusedConnection: a GET from the pod fails for its connection (no HTTP
// status: the destination's node proxy refused it).
func refusedConnection(ns, pod, url string) error {
	body, err := kubectlExec(ns, pod, "echo", "/usr/local/bin/echo", "fetch", "-timeout", "3s", url)
	var ee *execError
	if errors.As(err, &ee) && strings.Contains(ee.stderr, "echo fetch") && !strings.Contains(ee.stderr, "status ") {
		return nil
	}
	return fmt.Errorf("want the connection refused, got %q (%v)", body, err)
}

// hold is an `echo hold` running in a pod, through kubectl exec.
type hold struct {
	what   string
	count  atomic.Int64 // answers so far
	last   atomic.Int64 // when the latest answer was read (Unix nanoseconds)
	ended  time.Time    // when it ended, once done
	done   chan struct{}
	err    error         // once done
	stderr *bytes.Buffer // once done
}

// startHold holds one connection from the pod to url open, a request every
// 100ms, for at most two minutes (flags: more of echo hold's, which may
// say otherwise); it is stopped when the test ends.
func startHold(t *testing.T, ns, pod, url string, flags ...string) *hold {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	h := &hold{what: ns + "/" + pod + " holding " + url, done: make(chan struct{}), stderr: &bytes.Buffer{}}
	argv := append([]string{"--kubeconfig", kubeconfig, "-n", ns, "exec", pod, "-c", "echo", "--",
		"/usr/local/bin/echo", "hold", "-interval", "100ms", "-for", "2m"}, flags...)
	cmd := exec.CommandContext(ctx, kubectl, append(argv, url)...)
	cmd.Stderr = h.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "answer ") {
				h.last.Store(time.Now().UnixNano())
				h.count.Add(1)
			}
		}
		h.err = cmd.Wait()
		h.ended = time.Now()
		close(h.done)
	}()
	t.Cleanup(func() { cancel(); <-h.done })
	return h
}

// answered waits until the hold has n answers; it fails the test at once
// if the hold ends first.
func (h *hold) answered(t *testing.T, n int64) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for h.count.Load() < n {
		select {
		case <-h.done:
			t.Fatalf("%s ended after %d answers, want %d: %v: %s", h.what, h.count.Load(), n, h.err, h.stderr.String())
		case <-deadline:
			t.Fatalf("%s: %d answers within 30s, want %d", h.what, h.count.Load(), n)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
