package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/causeway-mesh/causeway/bench/internal/faultload"
)

const (
	systemNS     = "causeway-system"
	controlPlane = "causeway-controlplane"
	nodeProxy    = "causeway-nodeproxy"
	clientPod    = "faults-client"
	// The waypoint's Deployment and its pods' label (the deployer's).
	waypoint         = "waypoint"
	waypointSelector = "gateway.networking.k8s.io/gateway-name=waypoint"
)

// cluster runs kubectl against the test cluster.
type cluster struct {
	kubectl, kubeconfig, repo string
}

// kc runs kubectl with stdin (may be empty), bounded by limit, and returns
// its stdout.
func (c *cluster) kc(ctx context.Context, limit time.Duration, stdin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.kubectl, append([]string{"--kubeconfig", c.kubeconfig}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// do runs kubectl commands in order, each bounded by 3 minutes.
func (c *cluster) do(ctx context.Context, cmds ...[]string) error {
	for _, args := range cmds {
		if _, err := c.kc(ctx, 3*time.Minute, "", args...); err != nil {
			return err
		}
	}
	return nil
}

// apply applies YAML documents (client-side, as a user's kubectl apply -f).
func (c *cluster) apply(ctx context.Context, yaml string) error {
	_, err := c.kc(ctx, time.Minute, yaml, "apply", "-f", "-")
	return err
}

func (c *cluster) path(elem ...string) string {
	return filepath.Join(append([]string{c.repo}, elem...)...)
}

// The mesh and the sample with the cluster registry's images
// (hack/cluster/images.sh writes these overlays).
func (c *cluster) overlay() string { return c.path("bin", "cluster-images", "mesh") }
func (c *cluster) sample() string  { return c.path("bin", "cluster-images", "sample") }

// install installs the mesh as README "On Kubernetes" (and TestInstall)
// does, then the sample with the run's policy and route, and the client
// pod, and waits until all of it is ready.
func (c *cluster) install(ctx context.Context, image string) error {
	if err := c.do(ctx,
		[]string{"apply", "--server-side", "-k", c.path("manifests", "crds")},
		[]string{"apply", "--server-side", "-f", c.path("manifests", "core", "namespace.yaml")},
		[]string{"wait", "--for=condition=Established", "--timeout=60s", "crd", "--all"},
		[]string{"apply", "--server-side", "-k", c.overlay()},
		[]string{"-n", systemNS, "rollout", "status", "deployment/" + controlPlane, "--timeout=180s"},
		[]string{"-n", systemNS, "rollout", "status", "daemonset/" + nodeProxy, "--timeout=180s"},
		[]string{"wait", "--for=create", "--timeout=60s", "gatewayclass/causeway-waypoint"},
		[]string{"wait", "--for=condition=Accepted", "--timeout=60s", "gatewayclass/causeway-waypoint"},
		[]string{"apply", "-k", c.sample()},
	); err != nil {
		return err
	}
	if err := c.apply(ctx, policyConfigMap(0)+"---\n"+faultload.Route(50, 50, "", "")+"---\n"+clientPodYAML(image)); err != nil {
		return err
	}
	return c.do(ctx,
		[]string{"-n", "shop", "wait", "--for=create", "--timeout=120s", "deployment/" + waypoint},
		[]string{"-n", "shop", "rollout", "status", "deployment/" + waypoint, "--timeout=180s"},
		[]string{"-n", "shop", "wait", "--for=condition=Programmed", "--timeout=120s", "gateway/" + waypoint},
		[]string{"-n", "shop", "wait", "--for=condition=Available", "--timeout=180s", "deployment", "--all"},
		[]string{"-n", "web", "wait", "--for=condition=Ready", "--timeout=180s", "pod/" + clientPod},
	)
}

// uninstall removes the sample (the client pod, policy and route are in
// its namespaces), then the mesh, waiting until they are gone.
func (c *cluster) uninstall(ctx context.Context) error {
	return c.do(ctx,
		[]string{"delete", "-k", c.sample(), "--ignore-not-found", "--wait=true"},
		[]string{"delete", "-k", c.overlay(), "--ignore-not-found", "--wait=true"},
	)
}

// clientPodYAML is the pod the load runs in: in the sample's web namespace
// (enrolled) as the frontend's ServiceAccount, which the policy allows.
func clientPodYAML(image string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: web, labels: {app: %s}}
spec:
  serviceAccountName: frontend
  terminationGracePeriodSeconds: 1
  containers:
  - name: load
    image: %q
    imagePullPolicy: IfNotPresent
    args: [idle]
    resources: {requests: {cpu: 10m, memory: 32Mi}}
    securityContext: {runAsNonRoot: true, runAsUser: 65532, allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
`, clientPod, clientPod, image)
}

// pods lists the pods of a namespace matching a label selector.
func (c *cluster) pods(ctx context.Context, ns, selector string) ([]corev1.Pod, error) {
	out, err := c.kc(ctx, time.Minute, "", "-n", ns, "get", "pods", "-l", selector, "-o", "json")
	if err != nil {
		return nil, err
	}
	var list corev1.PodList
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return nil, fmt.Errorf("pods %s in %s: %w", selector, ns, err)
	}
	return list.Items, nil
}

func ready(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil
		}
	}
	return false
}

// until calls f every 200 ms until it says done or limit passes; it says
// how long that took and whether f said done.
func until(ctx context.Context, limit time.Duration, f func() (bool, error)) (time.Duration, bool, error) {
	start := time.Now()
	for {
		done, err := f()
		if err != nil || done {
			return time.Since(start), done, err
		}
		if time.Since(start) > limit || ctx.Err() != nil {
			return time.Since(start), false, ctx.Err()
		}
		faultload.Sleep(ctx, 200*time.Millisecond)
	}
}

// replaced waits until none of the old pods (by name) remains and n pods
// matching the selector are ready, and says when each happened after
// start (when the fault was sent).
func (c *cluster) replaced(ctx context.Context, ns, selector string, old []corev1.Pod, n int, start time.Time, limit time.Duration) (readyAfter, goneAfter time.Duration, err error) {
	olds := map[string]bool{}
	for _, p := range old {
		olds[p.Name] = true
	}
	_, ok, err := until(ctx, limit, func() (bool, error) {
		ps, err := c.pods(ctx, ns, selector)
		if err != nil {
			return false, err
		}
		fresh, left := 0, 0
		for _, p := range ps {
			switch {
			case olds[p.Name]:
				left++
			case ready(p):
				fresh++
			}
		}
		if readyAfter == 0 && fresh >= n {
			readyAfter = time.Since(start)
		}
		if goneAfter == 0 && left == 0 {
			goneAfter = time.Since(start)
		}
		return readyAfter > 0 && goneAfter > 0, nil
	})
	if err == nil && !ok {
		err = fmt.Errorf("%s in %s: not %d new pods ready and the old ones gone within %v", selector, ns, n, limit)
	}
	return readyAfter, goneAfter, err
}

// policyConfigMap is the waypoint's policy ConfigMap (the one the Gateway
// names by default) holding the run's policy at revision rev.
func policyConfigMap(rev int) string {
	cm := map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]string{"name": waypoint + "-policies", "namespace": "shop"},
		"data":     map[string]string{"authz.rego": faultload.Policy(rev)}}
	b, _ := json.Marshal(cm) // JSON is YAML; strings and maps always marshal
	return string(b) + "\n"
}
