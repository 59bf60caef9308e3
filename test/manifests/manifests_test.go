// Package manifests checks what `kubectl apply -k manifests/...` would
// install: it renders the kustomizations with kubectl (from the cached
// Kubernetes binaries, hack/cluster/build.sh) and holds every object to the
// install's invariants. test/e2e-k8s applies them to the real cluster.
package manifests

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// kubectl finds the kubectl the cluster scripts build, or skips.
func kubectl(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("CAUSEWAY_K8S_BIN")
	if dir == "" {
		home, _ := os.UserHomeDir()
		dir = filepath.Join(home, ".cache", "causeway", "k8s-v1.37.2", "bin")
	}
	bin := filepath.Join(dir, "kubectl")
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("kubectl not found in %s (hack/cluster/build.sh builds it, or set CAUSEWAY_K8S_BIN): %v", dir, err)
	}
	return bin
}

// render returns the objects of a kustomization under manifests/.
func render(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	return renderPath(t, filepath.Join("manifests", dir))
}

// renderPath returns the objects of the kustomization at dir, relative to
// the repository's root.
func renderPath(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	out, err := exec.Command(kubectl(t), "kustomize", filepath.Join("..", "..", dir)).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, ee.Stderr)
		}
		t.Fatal(err)
	}
	return decodeObjects(t, dir, out)
}

// decodeObjects decodes a stream of YAML documents (what came from where).
func decodeObjects(t *testing.T, from string, data []byte) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", from, err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
	return objs
}

func convert[T any](t *testing.T, u *unstructured.Unstructured) *T {
	t.Helper()
	var v T
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &v); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
	return &v
}

// podSpecs returns the pod templates of the workloads, by workload name.
func podSpecs(t *testing.T, objs []*unstructured.Unstructured) map[string]corev1.PodSpec {
	specs := map[string]corev1.PodSpec{}
	for _, u := range objs {
		switch u.GetKind() {
		case "Deployment":
			specs["Deployment/"+u.GetName()] = convert[appsv1.Deployment](t, u).Spec.Template.Spec
		case "DaemonSet":
			specs["DaemonSet/"+u.GetName()] = convert[appsv1.DaemonSet](t, u).Spec.Template.Spec
		}
	}
	return specs
}

// The capabilities each container may add: what in-pod capture needs
// (entering pod network namespaces, writing their nftables rules).
var allowedCaps = map[string][]corev1.Capability{
	"DaemonSet/causeway-nodeproxy/nodeproxy": {"NET_ADMIN", "SYS_ADMIN"},
	"DaemonSet/causeway-nodeproxy/agent":     {"NET_ADMIN", "SYS_ADMIN"},
}

func TestInvariants(t *testing.T) {
	for _, dir := range []string{".", "core"} {
		t.Run(dir, func(t *testing.T) {
			objs := render(t, dir)
			specs := podSpecs(t, objs)
			if len(specs) != 2 {
				t.Fatalf("want the control plane Deployment and the node proxy DaemonSet, found %d workloads", len(specs))
			}
			for name, spec := range specs {
				for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
					where := name + "/" + c.Name
					checkContainer(t, where, c)
				}
				if spec.HostNetwork || spec.HostPID || spec.HostIPC {
					t.Errorf("%s: shares a host namespace", name)
				}
			}
			checkRBAC(t, objs)
		})
	}
}

// The sample of examples/kubernetes renders, enrolls its namespaces, has
// its waypoint, and holds its apps to the same container rules.
func TestExample(t *testing.T) {
	for _, dir := range []string{"examples/kubernetes/shop"} {
		t.Run(dir, func(t *testing.T) {
			objs := renderPath(t, dir)
			enrolled, waypoint := map[string]bool{}, false
			for _, u := range objs {
				switch u.GetKind() {
				case "Namespace":
					enrolled[u.GetName()] = u.GetLabels()["causeway.dev/dataplane-mode"] == "mesh"
				case "Gateway":
					class, _, _ := unstructured.NestedString(u.Object, "spec", "gatewayClassName")
					waypoint = waypoint || (u.GetNamespace() == "shop" && class == "causeway-waypoint")
				}
			}
			if !enrolled["web"] || !enrolled["shop"] || enrolled["outside"] {
				t.Errorf("namespaces enrolled %v, want web and shop, not outside", enrolled)
			}
			if !waypoint {
				t.Error("no causeway-waypoint Gateway in shop")
			}
			specs := podSpecs(t, objs)
			if len(specs) != 6 {
				t.Errorf("%d workloads, want the sample's six", len(specs))
			}
			for name, spec := range specs {
				for _, c := range spec.Containers {
					checkContainer(t, name+"/"+c.Name, c)
				}
			}
		})
	}
}

func checkContainer(t *testing.T, where string, c corev1.Container) {
	t.Helper()
	sc := c.SecurityContext
	if sc == nil {
		t.Errorf("%s: no securityContext", where)
		return
	}
	if sc.Privileged != nil && *sc.Privileged {
		t.Errorf("%s: privileged", where)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("%s: allowPrivilegeEscalation is not false", where)
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("%s: root filesystem is writable", where)
	}
	if sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Errorf("%s: capabilities do not drop ALL", where)
	}
	if sc.Capabilities != nil {
		allowed := allowedCaps[where]
		for _, add := range sc.Capabilities.Add {
			ok := false
			for _, a := range allowed {
				ok = ok || a == add
			}
			if !ok {
				t.Errorf("%s: adds capability %s", where, add)
			}
		}
	}
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := c.Resources.Requests[r]; !ok {
			t.Errorf("%s: no %s request", where, r)
		}
		if _, ok := c.Resources.Limits[r]; !ok {
			t.Errorf("%s: no %s limit", where, r)
		}
	}
}

// checkRBAC: no wildcards; nothing may read Secrets but the control plane
// (its own by name, and for ingress listeners' certificates, which its
// informers ask for by type: the ClusterRole causeway-controlplane reads
// them, no other role); only the control plane creates TokenReviews.
func checkRBAC(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, u := range objs {
		var rules []rbacv1.PolicyRule
		switch u.GetKind() {
		case "ClusterRole":
			rules = convert[rbacv1.ClusterRole](t, u).Rules
		case "Role":
			rules = convert[rbacv1.Role](t, u).Rules
		default:
			continue
		}
		where := u.GetKind() + "/" + u.GetName()
		for _, r := range rules {
			for _, list := range [][]string{r.APIGroups, r.Resources, r.Verbs, r.ResourceNames} {
				for _, v := range list {
					if v == "*" {
						t.Errorf("%s: wildcard in %v", where, r)
					}
				}
			}
			for _, res := range r.Resources {
				if res != "secrets" {
					continue
				}
				for _, v := range r.Verbs {
					certs := where == "ClusterRole/causeway-controlplane" && (v == "get" || v == "list" || v == "watch")
					if v != "create" && !certs && (len(r.ResourceNames) == 0 || u.GetKind() != "Role") {
						t.Errorf("%s: %s on secrets beyond named ones in its own namespace", where, v)
					}
				}
			}
		}
	}
}
