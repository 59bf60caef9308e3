package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/causeway-mesh/causeway/bench/internal/faultload"
	"github.com/causeway-mesh/causeway/internal/testcluster"
)

const (
	clientPod = "faults-client"
	// The waypoint's Deployment and its pods' label (the deployer's).
	waypoint         = "waypoint"
	waypointSelector = "gateway.networking.k8s.io/gateway-name=waypoint"
)

// cluster is the test cluster with the sample the rows run against.
type cluster struct {
	testcluster.Cluster
}

// sample is the sample with the cluster registry's images
// (hack/cluster/images.sh writes the overlay).
func (c *cluster) sample() string { return c.Path("bin", "cluster-images", "sample") }

// install installs the mesh (testcluster.InstallMesh), then the sample
// with the run's policy and route, and the client pod, and waits until all
// of it is ready.
func (c *cluster) install(ctx context.Context, image string) error {
	if err := c.InstallMesh(ctx); err != nil {
		return err
	}
	if err := c.Do(ctx, []string{"apply", "-k", c.sample()}); err != nil {
		return err
	}
	if err := c.Apply(ctx, policyConfigMap(0)+"---\n"+faultload.Route(50, 50, "", "")+"---\n"+clientPodYAML(image)); err != nil {
		return err
	}
	return c.Do(ctx,
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
	if err := c.Do(ctx, []string{"delete", "-k", c.sample(), "--ignore-not-found", "--wait=true"}); err != nil {
		return err
	}
	return c.UninstallMesh(ctx)
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

// replaced waits until none of the old pods (by name) remains and n pods
// matching the selector are ready, and says when each happened after
// start (when the fault was sent).
func (c *cluster) replaced(ctx context.Context, ns, selector string, old []corev1.Pod, n int, start time.Time, limit time.Duration) (readyAfter, goneAfter time.Duration, err error) {
	olds := map[string]bool{}
	for _, p := range old {
		olds[p.Name] = true
	}
	_, ok, err := testcluster.Until(ctx, limit, func() (bool, error) {
		ps, err := c.Pods(ctx, ns, selector)
		if err != nil {
			return false, err
		}
		fresh, left := 0, 0
		for _, p := range ps {
			switch {
			case olds[p.Name]:
				left++
			case testcluster.Ready(p):
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
