package kubecontrollers

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/causeway-mesh/causeway/pkg/admission"
	"github.com/causeway-mesh/causeway/pkg/config"
	"github.com/causeway-mesh/causeway/pkg/deployer"
	"github.com/causeway-mesh/causeway/pkg/gwstatus"
	"github.com/causeway-mesh/causeway/pkg/internal/kubetest"
	"github.com/causeway-mesh/causeway/pkg/leader"
	"github.com/causeway-mesh/causeway/pkg/trust"
)

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }

// controlPlaneCA is a new mesh CA and the control plane's identity.
func controlPlaneCA(t *testing.T) (*trust.Authority, trust.Identity) {
	t.Helper()
	authority, err := trust.LoadOrCreateCA(t.TempDir(), "cluster.local", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	id, err := trust.ControlPlaneIdentity("cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	return authority, id
}

// The controllers together against a real apiserver: the leader fills the
// webhook configuration's CA bundle, after which the webhook (served with a
// certificate from the mesh CA) refuses what it must; the deployer and the
// status writer act on a waypoint Gateway.
func TestKubeControllers(t *testing.T) {
	env := kubetest.Shared(t)
	authority, id := controlPlaneCA(t)
	const vwcName = "causeway-validation"
	opts := Options{
		Config: env.ControlPlane(t), Authority: authority, Identity: id,
		Election: leader.Options{Namespace: "causeway-system", Name: "causeway-controlplane", Identity: "replica-1",
			LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond},
		Waypoint:      deployer.Values{Image: "causeway/waypoint:test", XDSAddress: "causeway-controlplane.causeway-system.svc:15012", TokenAudience: "causeway-ca"},
		WebhookListen: "127.0.0.1:0", WebhookDNSNames: []string{"127.0.0.1"}, WebhookConfiguration: vwcName,
		Logger: zaptest.NewLogger(t),
	}
	cs := env.Clientset(t)
	gw, err := gwclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, ns := range []string{"causeway-system", "shop"} {
		labels := map[string]string{config.LabelDataplaneMode: config.DataplaneModeMesh}
		if _, err := cs.CoreV1().Namespaces().Apply(ctx, corev1ac.Namespace(ns).WithLabels(labels), metav1.ApplyOptions{FieldManager: "test"}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	kc, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	url := "https://" + kc.WebhookAddr().String() + admission.Path
	if _, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx,
		admission.Configuration(vwcName, "causeway-system", admissionregistrationv1.WebhookClientConfig{URL: &url}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- kc.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("controllers: %v", err)
		}
	}()

	if _, err := gw.GatewayV1().Gateways("shop").Create(ctx, &gwv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: "waypoint"},
		Spec: gwv1.GatewaySpec{GatewayClassName: config.WaypointClass,
			Listeners: []gwv1.Listener{{Name: "mesh", Port: 15008, Protocol: config.WaypointProtocol}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait := func(what string, cond func() (bool, error)) {
		t.Helper()
		if err := kubetest.WaitFor(ctx, 30*time.Second, cond); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	wait("the CA bundle set to the mesh roots", func() (bool, error) {
		v, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, vwcName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, w := range v.Webhooks {
			if !bytes.Equal(w.ClientConfig.CABundle, authority.RootsPEM()) {
				return false, nil
			}
		}
		return len(v.Webhooks) == len(admission.Webhooks) && v.Webhooks[3].Name == admission.WorkloadsWebhook &&
			*v.Webhooks[3].FailurePolicy == admissionregistrationv1.Ignore && *v.Webhooks[1].FailurePolicy == admissionregistrationv1.Ignore, nil
	})
	wait("the waypoint deployed, its service account made", func() (bool, error) {
		d, err := cs.AppsV1().Deployments("shop").Get(ctx, "waypoint", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		args := strings.Join(d.Spec.Template.Spec.Containers[0].Args, " ")
		return strings.Contains(args, "--controlplane-identity="+id.String()) && strings.Contains(args, "--xds-address="+opts.Waypoint.XDSAddress), nil
	})
	wait("the webhook refuses a captured pod running as the waypoint", func() (bool, error) {
		_, err := cs.CoreV1().Pods("shop").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "thief"},
			Spec:       corev1.PodSpec{ServiceAccountName: "waypoint", Containers: []corev1.Container{{Name: "c", Image: "i"}}},
		}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "is the identity of waypoint shop/waypoint"), nil
	})
	wait("the Gateway accepted", func() (bool, error) {
		g, err := gw.GatewayV1().Gateways("shop").Get(ctx, "waypoint", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(g.Status.Conditions, "Accepted")
		return c != nil && c.Status == metav1.ConditionTrue, nil
	})
	for class, controller := range map[string]gwv1.GatewayController{config.WaypointClass: gwstatus.ControllerName, config.IngressClass: gwstatus.IngressControllerName} {
		wait("the leader creates the GatewayClass "+class+", which the status writer accepts", func() (bool, error) {
			c, err := gw.GatewayV1().GatewayClasses().Get(ctx, class, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			if err != nil {
				return false, err
			}
			if c.Spec.ControllerName != controller {
				return false, fmt.Errorf("GatewayClass %s has controller %q", c.Name, c.Spec.ControllerName)
			}
			a := meta.FindStatusCondition(c.Status.Conditions, "Accepted")
			return a != nil && a.Status == metav1.ConditionTrue, nil
		})
	}
	if err := kc.Healthy(); err != nil {
		t.Errorf("healthy: %v", err)
	}
}

// Uninstalled as helm uninstall does it: the control plane's Deployment
// deleted, then its RBAC, before the replica is told to stop. Once it has
// seen its Deployment go it leads no more and asks nothing of the Lease,
// neither a renewal nor, at the stop, a release: either would be refused
// (the ServiceAccount's config fails the test on any refusal).
func TestUninstallLeavesTheLease(t *testing.T) {
	env := kubetest.Shared(t)
	authority, id := controlPlaneCA(t)
	const lease, deployment = "uninstall-test", "causeway-controlplane"
	kc, err := New(Options{
		Config: env.ControlPlane(t), Authority: authority, Identity: id,
		Election: leader.Options{Namespace: "causeway-system", Name: lease, Identity: "replica-1",
			LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 200 * time.Millisecond},
		Deployment: deployment,
		Waypoint:   deployer.Values{Image: "causeway/waypoint:test", XDSAddress: "causeway-controlplane.causeway-system.svc:15012", TokenAudience: "causeway-ca"},
		Logger:     zaptest.NewLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	cs := env.Clientset(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	labels := map[string]string{"app": "causeway-controlplane"}
	if _, err := cs.AppsV1().Deployments("causeway-system").Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: deployment},
		Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: labels},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "controlplane", Image: "causeway/controlplane:test"}}},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- kc.Run(ctx) }()
	if err := kubetest.WaitFor(ctx, 30*time.Second, func() (bool, error) { return kc.Leading(), nil }); err != nil {
		t.Fatalf("not leading: %v", err)
	}

	if err := cs.AppsV1().Deployments("causeway-system").Delete(ctx, deployment, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kubetest.WaitFor(ctx, 5*time.Second, func() (bool, error) { return !kc.Leading(), nil }); err != nil {
		t.Fatalf("still leading after its Deployment was deleted: %v", err)
	}
	if err := cs.RbacV1().RoleBindings("causeway-system").Delete(ctx, "causeway-controlplane", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cs.RbacV1().ClusterRoleBindings().Delete(ctx, "causeway-controlplane", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * 200 * time.Millisecond) // renewals, had they gone on, would be refused
	cancel()
	if err := <-done; err != nil {
		t.Errorf("controllers: %v", err)
	}
	l, err := cs.CoordinationV1().Leases("causeway-system").Get(context.Background(), lease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := l.Spec.HolderIdentity; h == nil || *h != "replica-1" {
		t.Errorf("the Lease's holder is %v, want replica-1 (left to expire, not released)", h)
	}
}
