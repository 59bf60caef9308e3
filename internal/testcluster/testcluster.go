// Package testcluster drives the test cluster (hack/cluster) for the
// benchmarks that run on it: kubectl with a bound on every call, the
// mesh's install as a user runs it (README "On Kubernetes"), pods and
// their readiness.
package testcluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// The mesh's own objects (manifests/core).
const (
	SystemNS          = "causeway-system"
	ControlPlane      = "causeway-controlplane"
	NodeProxy         = "causeway-nodeproxy"
	NodeProxySelector = "app.kubernetes.io/name=" + NodeProxy
	// WaypointClass is the GatewayClass the control plane's leader creates.
	WaypointClass = "causeway-waypoint"
)

// StaticAddressRange is the test cluster's range for static ingress
// Gateway addresses (hack/cluster/lib.sh STATIC_ADDRESS_RANGE): the host
// routes it to the node bridge, and no further, as a network routes such
// addresses to the nodes, where kube-proxy serves a Service's externalIPs.
// The tests allow it to the control plane (--gateway-address-cidrs).
const StaticAddressRange = "10.250.1.0/28"

// Cluster runs kubectl against the test cluster.
type Cluster struct {
	Kubectl, Kubeconfig string
	// Repo is the repository the manifests are applied from.
	Repo string
}

// Run runs kubectl with stdin (may be empty), bounded by limit, and returns
// its stdout.
func (c *Cluster) Run(ctx context.Context, limit time.Duration, stdin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.Kubectl, append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Do runs kubectl commands in order, each bounded by 3 minutes.
func (c *Cluster) Do(ctx context.Context, cmds ...[]string) error {
	for _, args := range cmds {
		if _, err := c.Run(ctx, 3*time.Minute, "", args...); err != nil {
			return err
		}
	}
	return nil
}

// Apply applies YAML documents (client-side, as a user's kubectl apply -f).
func (c *Cluster) Apply(ctx context.Context, yaml string) error {
	_, err := c.Run(ctx, time.Minute, yaml, "apply", "-f", "-")
	return err
}

// Path is a path in the repository.
func (c *Cluster) Path(elem ...string) string {
	return filepath.Join(append([]string{c.Repo}, elem...)...)
}

// Overlay is the mesh with the images hack/cluster/images.sh pushed, by
// digest (it writes the overlay).
func (c *Cluster) Overlay() string { return c.Path("bin", "cluster-images", "mesh") }

// MeshInstalled says whether the node proxy DaemonSet exists (the mesh was
// installed before this run).
func (c *Cluster) MeshInstalled(ctx context.Context) (bool, error) {
	out, err := c.Run(ctx, time.Minute, "", "-n", SystemNS, "get", "daemonset", "--ignore-not-found", "-o", "name", NodeProxy)
	return strings.TrimSpace(out) != "", err
}

// InstallMesh installs the mesh as README "On Kubernetes" (and
// TestInstall) does and waits until the control plane, the node proxies
// and the waypoints' GatewayClass are ready.
func (c *Cluster) InstallMesh(ctx context.Context) error {
	return c.Do(ctx,
		[]string{"apply", "--server-side", "-k", c.Path("manifests", "crds")},
		[]string{"apply", "--server-side", "-f", c.Path("manifests", "core", "namespace.yaml")},
		[]string{"wait", "--for=condition=Established", "--timeout=60s", "crd", "--all"},
		[]string{"apply", "--server-side", "-k", c.Overlay()},
		[]string{"-n", SystemNS, "rollout", "status", "deployment/" + ControlPlane, "--timeout=180s"},
		[]string{"-n", SystemNS, "rollout", "status", "daemonset/" + NodeProxy, "--timeout=180s"},
		[]string{"wait", "--for=create", "--timeout=60s", "gatewayclass/" + WaypointClass},
		[]string{"wait", "--for=condition=Accepted", "--timeout=60s", "gatewayclass/" + WaypointClass},
	)
}

// UninstallMesh removes the mesh, waiting until it is gone.
func (c *Cluster) UninstallMesh(ctx context.Context) error {
	return c.Do(ctx, []string{"delete", "-k", c.Overlay(), "--ignore-not-found", "--wait=true"})
}

// Pods lists the pods of a namespace matching a label selector.
func (c *Cluster) Pods(ctx context.Context, ns, selector string) ([]corev1.Pod, error) {
	out, err := c.Run(ctx, time.Minute, "", "-n", ns, "get", "pods", "-l", selector, "-o", "json")
	if err != nil {
		return nil, err
	}
	var list corev1.PodList
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return nil, fmt.Errorf("pods %s in %s: %w", selector, ns, err)
	}
	return list.Items, nil
}

// Ready says whether a pod is ready and not being deleted.
func Ready(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil
		}
	}
	return false
}

// Until calls f every 200 ms until it says done or limit passes; it says
// how long that took and whether f said done.
func Until(ctx context.Context, limit time.Duration, f func() (bool, error)) (time.Duration, bool, error) {
	start := time.Now()
	for {
		done, err := f()
		if err != nil || done {
			return time.Since(start), done, err
		}
		if time.Since(start) > limit || ctx.Err() != nil {
			return time.Since(start), false, ctx.Err()
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Remove runs a benchmark's uninstall at its end unless keep, with a
// context of its own (the run's may have been cancelled: an interrupted
// run still removes what it installed), and logs how long the whole run
// took from start.
func Remove(keep bool, start time.Time, logf func(string, ...any), uninstall func(context.Context) error) {
	if keep {
		logf("left installed (-keep)")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	logf("uninstalling")
	if err := uninstall(ctx); err != nil {
		logf("uninstall: %v", err)
	}
	logf("done in %v", time.Since(start).Round(time.Second))
}

// Logger is a benchmark's log on stderr: "[name hh:mm:ss] message".
func Logger(name string) func(format string, args ...any) {
	return func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "[%s %s] %s\n", name, time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
}

// LoadAvg is the host's 1-minute load average (the machine is shared).
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "unknown"
}
