package kubetest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

// ControlPlaneManifest is the shipped manifest whose ServiceAccount, roles
// and bindings ControlPlane applies, relative to the repository's root.
const ControlPlaneManifest = "manifests/core/controlplane.yaml"

// ControlPlaneNamespace and ControlPlaneServiceAccount name the control
// plane's own ServiceAccount in that manifest.
const (
	ControlPlaneNamespace      = "causeway-system"
	ControlPlaneServiceAccount = "controlplane"
)

// ControlPlane returns a config that acts as the control plane's own
// ServiceAccount, with the ClusterRole, Role and bindings of the shipped
// manifest applied (so a permission the code needs and the manifest lacks
// fails here, not first on a user's cluster), instead of as the cluster
// administrator. Every request refused for want of permission (403 other
// than a terminating namespace's) fails the test when it ends, even if the
// code under test logged the error and retried. The namespace
// causeway-system is created if missing.
func (e *Env) ControlPlane(t testing.TB) *rest.Config {
	t.Helper()
	if err := e.applyControlPlaneRBAC(context.Background()); err != nil {
		t.Fatalf("kubetest: apply the control plane's RBAC: %v", err)
	}
	cfg := rest.CopyConfig(e.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: controlPlaneUser, Groups: controlPlaneGroups}
	rec := &forbiddenLog{}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return forbiddenRecorder{rt, rec} })
	t.Cleanup(func() {
		if denied := rec.denied(); len(denied) > 0 {
			t.Errorf("the control plane's ServiceAccount (RBAC of %s) was refused %d request(s):\n%s",
				ControlPlaneManifest, len(denied), strings.Join(denied, "\n"))
		}
	})
	return cfg
}

// The control plane's ServiceAccount as the apiserver knows it.
var (
	controlPlaneUser   = "system:serviceaccount:" + ControlPlaneNamespace + ":" + ControlPlaneServiceAccount
	controlPlaneGroups = []string{"system:serviceaccounts", "system:serviceaccounts:" + ControlPlaneNamespace, "system:authenticated"}
)

// forbiddenLog holds the requests refused for want of permission.
type forbiddenLog struct {
	mu   sync.Mutex
	seen []string
}

// forbiddenRecorder passes requests on and notes in log each one answered
// 403 for want of permission.
type forbiddenRecorder struct {
	next http.RoundTripper
	log  *forbiddenLog
}

func (r forbiddenRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.next.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusForbidden {
		return resp, err
	}
	// Bounded: a Status is small; the body is handed on whole.
	head, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(head), resp.Body), resp.Body}
	// A Status, in JSON or protobuf as the client asked.
	msg := fmt.Sprintf("%q", head)
	if obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(head, nil, nil); err == nil {
		if st, ok := obj.(*metav1.Status); ok {
			if st.Details != nil {
				for _, c := range st.Details.Causes {
					if c.Type == corev1.NamespaceTerminatingCause {
						return resp, nil // not a permission: the namespace is going
					}
				}
			}
			msg = st.Message
		}
	}
	r.log.mu.Lock()
	r.log.seen = append(r.log.seen, fmt.Sprintf("  %s %s: %s", req.Method, req.URL.Path, msg))
	r.log.mu.Unlock()
	return resp, nil
}

func (r *forbiddenLog) denied() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.seen...)
}

// rbacKinds are the manifest's kinds ControlPlane applies, by resource.
var rbacKinds = map[string]schema.GroupVersionResource{
	"ServiceAccount":     {Version: "v1", Resource: "serviceaccounts"},
	"ClusterRole":        {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"},
	"ClusterRoleBinding": {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"},
	"Role":               {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "roles"},
	"RoleBinding":        {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "rolebindings"},
}

// applyControlPlaneRBAC applies (server-side, as the administrator) the
// manifest's ServiceAccount, roles and bindings, after their namespace.
func (e *Env) applyControlPlaneRBAC(ctx context.Context) error {
	root, err := moduleDir("")
	if err != nil {
		return err
	}
	f, err := os.Open(filepath.Join(root, ControlPlaneManifest))
	if err != nil {
		return err
	}
	defer f.Close()
	cs, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(e.Config)
	if err != nil {
		return err
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ControlPlaneNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	applied := 0
	var probes []authorizationv1.ResourceAttributes // a rule of each role
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 64<<10)
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); err == io.EOF {
			break
		} else if err != nil {
			return fmt.Errorf("%s: %w", ControlPlaneManifest, err)
		}
		gvr, ok := rbacKinds[u.GetKind()]
		if !ok {
			continue
		}
		var ri dynamic.ResourceInterface = dyn.Resource(gvr)
		if u.GetNamespace() != "" {
			ri = dyn.Resource(gvr).Namespace(u.GetNamespace())
		}
		if _, err := ri.Apply(ctx, u.GetName(), &u, metav1.ApplyOptions{FieldManager: "kubetest", Force: true}); err != nil {
			return fmt.Errorf("%s: %s %s: %w", ControlPlaneManifest, u.GetKind(), u.GetName(), err)
		}
		applied++
		if p, ok := firstRule(&u); ok {
			probes = append(probes, p)
		}
	}
	if applied < len(rbacKinds) {
		return fmt.Errorf("%s: only %d ServiceAccount, role and binding objects in it", ControlPlaneManifest, applied)
	}
	// The apiserver's authorizer learns roles and bindings from its own
	// informers: until it has, the control plane's first requests are
	// refused (the test then fails, under load). Wait for a rule of each.
	for _, p := range probes {
		if err := waitAllowed(ctx, cs, p); err != nil {
			return err
		}
	}
	return nil
}

// firstRule is the first verb on the first resource of a Role's or
// ClusterRole's first rule.
func firstRule(u *unstructured.Unstructured) (authorizationv1.ResourceAttributes, bool) {
	if k := u.GetKind(); k != "Role" && k != "ClusterRole" {
		return authorizationv1.ResourceAttributes{}, false
	}
	rules, _, _ := unstructured.NestedSlice(u.Object, "rules")
	if len(rules) == 0 {
		return authorizationv1.ResourceAttributes{}, false
	}
	r, _ := rules[0].(map[string]any)
	groups, _, _ := unstructured.NestedStringSlice(r, "apiGroups")
	resources, _, _ := unstructured.NestedStringSlice(r, "resources")
	verbs, _, _ := unstructured.NestedStringSlice(r, "verbs")
	if len(groups) == 0 || len(resources) == 0 || len(verbs) == 0 {
		return authorizationv1.ResourceAttributes{}, false
	}
	return authorizationv1.ResourceAttributes{Namespace: u.GetNamespace(), Group: groups[0], Resource: resources[0], Verb: verbs[0]}, true
}

// waitAllowed asks the apiserver (SubjectAccessReview) until the control
// plane's ServiceAccount may do ra, for up to 15 s.
func waitAllowed(ctx context.Context, cs kubernetes.Interface, ra authorizationv1.ResourceAttributes) error {
	review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: controlPlaneUser, Groups: controlPlaneGroups, ResourceAttributes: &ra}}
	deadline := time.Now().Add(15 * time.Second)
	for {
		res, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
		if err == nil && res.Status.Allowed {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: the control plane may still not %s %s (group %q, namespace %q) 15 s after applying it (%v)",
				ControlPlaneManifest, ra.Verb, ra.Resource, ra.Group, ra.Namespace, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
