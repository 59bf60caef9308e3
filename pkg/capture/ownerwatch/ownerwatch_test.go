package ownerwatch

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/causeway-mesh/causeway/pkg/internal/kubetest"
)

// countForbidden counts the requests answered 403.
type countForbidden struct {
	next http.RoundTripper
	n    *atomic.Int32
}

func (c countForbidden) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(r)
	if err == nil && resp.StatusCode == http.StatusForbidden {
		c.n.Add(1)
	}
	return resp, err
}

// Uninstalled as helm uninstall does it: the DaemonSet deleted, then the
// agent's RBAC, before the agent is told to stop. The agent decides to
// uninstall from what its watch saw, asking the API server nothing it
// would now refuse.
func TestGoneAsSeenAfterTheRBACIsDeleted(t *testing.T) {
	env := kubetest.Start(t)
	admin := env.Clientset(t)
	ctx := t.Context()
	const ns, name, account = "causeway-system", "causeway-nodeproxy", "nodeproxy"
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "agent"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get", "list", "watch"}},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "agent"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "agent"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: account}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": name}
	if _, err := admin.AppsV1().DaemonSets(ns).Create(ctx, &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: labels},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: "causeway/nodeproxy:test"}}},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	asAgent := func(forbidden *atomic.Int32) kubernetes.Interface {
		cfg := rest.CopyConfig(env.Config)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":" + account}
		if forbidden != nil {
			cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countForbidden{rt, forbidden} })
		}
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return cs
	}
	var forbidden atomic.Int32
	w := New(ctx, asAgent(&forbidden), ns, name, zaptest.NewLogger(t))
	if err := kubetest.WaitFor(ctx, 30*time.Second, func() (bool, error) {
		return w.informer.HasSynced() && w.nsInformer.HasSynced(), nil
	}); err != nil {
		t.Fatalf("the watches did not sync: %v", err)
	}
	if gone, why := w.Gone(ctx); gone {
		t.Fatalf("gone before the uninstall: %s", why)
	}

	if err := admin.AppsV1().DaemonSets(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := admin.RbacV1().ClusterRoleBindings().Delete(ctx, "agent", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	probe := asAgent(nil)
	if err := kubetest.WaitFor(ctx, 30*time.Second, func() (bool, error) {
		_, err := probe.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsForbidden(err), nil
	}); err != nil {
		t.Fatalf("the agent's permissions still hold: %v", err)
	}
	if err := kubetest.WaitFor(ctx, 30*time.Second, func() (bool, error) {
		_, exists, _ := w.informer.GetStore().GetByKey(ns + "/" + name)
		return !exists, nil
	}); err != nil {
		t.Fatalf("the watch did not see the DaemonSet deleted: %v", err)
	}
	before := forbidden.Load()
	gone, why := w.Gone(ctx)
	if !gone || !strings.Contains(why, "seen deleted") {
		t.Errorf("after the uninstall: gone %v (%s), want gone as the watch saw it", gone, why)
	}
	if n := forbidden.Load() - before; n != 0 {
		t.Errorf("deciding, the agent was refused %d request(s)", n)
	}
}
