package e2ek8s

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The cluster's nodes and where the tests put their pods. On a cluster of
// three nodes or more (make e2e-k8s NODES=3) a client, the waypoint and a
// destination sit on three different nodes, and some pairs share one, so
// the mesh is exercised both across nodes and within one; on fewer nodes
// the scheduler places everything (on one node, all together).
var (
	// nodes are the cluster's node names, sorted: the first is this
	// machine's own node (nodeName), the others the extra nodes of
	// hack/cluster (docs/cluster.md).
	nodes []string
	// nodesDir holds an extra node's fixed paths on this machine:
	// <nodesDir>/<node>/root/<path> (make e2e-k8s sets
	// CAUSEWAY_E2E_NODES_DIR).
	nodesDir = os.Getenv("CAUSEWAY_E2E_NODES_DIR")
)

// Places, by index into nodes.
const (
	clientNode      = 0 // the sample's frontend and admin (and reviews-v2)
	waypointNode    = 1 // the shop's waypoint (and ratings)
	destinationNode = 2 // reviews-v1, the outsider
)

// listNodes reads the cluster's nodes into nodes.
func listNodes(ctx context.Context) error {
	list, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	nodes = nodes[:0]
	for _, n := range list.Items {
		nodes = append(nodes, n.Name)
	}
	slices.Sort(nodes)
	if len(nodes) == 0 || nodes[0] != nodeName {
		return fmt.Errorf("nodes %v: want this machine's node %s first", nodes, nodeName)
	}
	if len(nodes) > 1 && nodesDir == "" {
		return fmt.Errorf("%d nodes but CAUSEWAY_E2E_NODES_DIR is not set (make e2e-k8s sets it): the extra nodes' files cannot be checked", len(nodes))
	}
	return nil
}

// placed is the node of a place, or "" (the scheduler's choice) on a
// cluster of fewer than three nodes.
func placed(place int) string {
	if len(nodes) < 3 {
		return ""
	}
	return nodes[place]
}

// placeOn pins the pod to node, unless node is "".
func placeOn(spec *corev1.PodSpec, node string) {
	if node != "" {
		spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
	}
}

// nodeSelectorPatch is a JSON patch pinning a Deployment's pods to node.
func nodeSelectorPatch(node string) string {
	return fmt.Sprintf(`[{"op": "add", "path": "/spec/template/spec/nodeSelector", "value": {%q: %q}}]`, corev1.LabelHostname, node)
}

// placedSample is a kustomization of the sample dir that places its
// Deployments (the sample itself on fewer than three nodes).
func placedSample(dir, sample string) (string, error) {
	if placed(clientNode) == "" {
		return sample, nil
	}
	out := filepath.Join(dir, "placed-sample")
	abs, err := filepath.Abs(sample)
	if err != nil {
		return "", err
	}
	// kustomize takes no absolute path.
	rel, err := filepath.Rel(out, abs)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [%s]\npatches:\n", rel)
	for _, d := range []struct {
		name  string
		place int
	}{
		{"frontend", clientNode}, {"admin", clientNode}, {"reviews-v2", clientNode},
		{"ratings", waypointNode}, {"reviews-v1", destinationNode}, {"outsider", destinationNode},
	} {
		fmt.Fprintf(&b, "- target: {kind: Deployment, name: %s}\n  patch: '%s'\n", d.name, nodeSelectorPatch(placed(d.place)))
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return "", err
	}
	return out, os.WriteFile(filepath.Join(out, "kustomization.yaml"), []byte(b.String()), 0o644)
}

// nodePath is where path on node is on this machine.
func nodePath(node, path string) string {
	if node == nodeName {
		return path
	}
	return filepath.Join(nodesDir, node, "root", path)
}

// nodesOf are the nodes of the running pods of a service account.
func nodesOf(ctx context.Context, ns, serviceAccount string) (map[string]bool, error) {
	list, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	on := map[string]bool{}
	for _, p := range list.Items {
		if p.Spec.ServiceAccountName == serviceAccount && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			on[p.Spec.NodeName] = true
		}
	}
	return on, nil
}

// nodeProxyOn is the ready node proxy pod of node.
func nodeProxyOn(pods []corev1.Pod, node string) (corev1.Pod, error) {
	for _, p := range pods {
		if p.Spec.NodeName == node {
			return p, nil
		}
	}
	return corev1.Pod{}, fmt.Errorf("no node proxy pod on %s", node)
}
