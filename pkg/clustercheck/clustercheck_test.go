package clustercheck

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/causeway-mesh/causeway/pkg/config"
	"github.com/causeway-mesh/causeway/pkg/gwstatus"
	"github.com/causeway-mesh/causeway/pkg/internal/kubetest"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/certmanager"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
)

// statusOf is a certificate manager's view of a chain.
func statusOf(id string, chain ...*x509.Certificate) certmanager.CertificateStatus {
	return certmanager.CertificateStatus{Identity: id, State: certmanager.StateAvailable, CertChain: certmanager.ChainInfo(chain)}
}

// check's certificate rules: valid, renewed in time, Available.
func TestCertificateProblems(t *testing.T) {
	ca := trusttest.NewCA(t, "cluster.local")
	id := trusttest.Identity(t, "spiffe://cluster.local/ns/web/sa/frontend")
	cert := ca.Certificate(t, id, time.Hour)
	good := statusOf(id.String(), cert.Leaf) // the test CA's root lives two days: see the root's rule below
	life := cert.Leaf.NotAfter.Sub(cert.Leaf.NotBefore)
	if p := CertificateProblems([]certmanager.CertificateStatus{good}, cert.Leaf.NotBefore.Add(life/2)); len(p) != 0 {
		t.Errorf("half way through its life: %v", p)
	}
	if p := CertificateProblems([]certmanager.CertificateStatus{good}, cert.Leaf.NotBefore.Add(life*8/10)); len(p) != 1 || !strings.Contains(p[0], "not being renewed") {
		t.Errorf("past three quarters of its life: %v", p)
	}
	if p := CertificateProblems([]certmanager.CertificateStatus{good}, cert.Leaf.NotAfter.Add(time.Second)); len(p) != 1 || !strings.Contains(p[0], "expired") {
		t.Errorf("expired: %v", p)
	}
	down := certmanager.CertificateStatus{Identity: "spiffe://cluster.local/ns/shop/sa/x", State: "Unavailable: CA says no"}
	if p := CertificateProblems([]certmanager.CertificateStatus{down}, time.Now()); len(p) != 1 || !strings.Contains(p[0], "CA says no") {
		t.Errorf("unavailable: %v", p)
	}
	root := ca.Bundle.Roots()[0]
	if p := certProblem(root.NotBefore, root.NotAfter, root.NotAfter.Add(-24*time.Hour), true); !strings.Contains(p, "within 30 days") {
		t.Errorf("a root a day from expiry: %q", p)
	}
}

// longRoot is a self-signed root valid for ten years, as the mesh's CA
// makes one.
func longRoot(t *testing.T) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{Organization: []string{"cluster.local"}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(10 * 365 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// results maps each check to "STATUS: message".
func results(rs []Result) map[string]string {
	out := map[string]string{}
	for _, r := range rs {
		out[r.Check] = r.Status + ": " + r.Message
	}
	return out
}

// On a real API server: before the install the check fails, saying the
// mesh is not there; --pre-install passes for an administrator and fails
// for a user without the rights; with every component's objects in place
// and ready (no kubelet here: their status is written as the controllers
// would) the check passes, and a proxy's expired certificate fails it.
func TestRunBeforeAndAfterTheInstall(t *testing.T) {
	env := kubetest.Start(t)
	ctx := context.Background()
	cs, gw := env.Clientset(t), env.Gateway(t)
	ca := trusttest.NewCA(t, "cluster.local")
	id := trusttest.Identity(t, "spiffe://cluster.local/ns/web/sa/frontend")
	leaf := ca.Certificate(t, id, time.Hour).Leaf
	proxies := []ProxyCertificates{{Proxy: "node proxy causeway-system/np-a", Certificates: []certmanager.CertificateStatus{statusOf(id.String(), leaf)}}}
	opts := Options{Kube: cs, Gateway: gw, Now: time.Now(),
		Proxies: func(context.Context) ([]ProxyCertificates, error) { return proxies, nil }}

	before := results(Run(ctx, opts))
	for check, want := range map[string]string{
		"kubernetes":       "PASS: API server v1.37",
		"nodes":            "FAIL: the cluster has no nodes",
		"Gateway API CRDs": "PASS",
		"control plane":    "FAIL: namespace causeway-system: not found: the mesh is not installed",
	} {
		if !strings.HasPrefix(before[check], want) {
			t.Errorf("before the install, %s: %q, want %q", check, before[check], want)
		}
	}
	pre := opts
	pre.PreInstall = true
	if got := results(Run(ctx, pre))["permissions"]; got != "PASS: you may create everything the chart creates" {
		t.Errorf("pre-install as an administrator: permissions %q", got)
	}
	nobody := rest.CopyConfig(env.Config)
	nobody.Impersonate = rest.ImpersonationConfig{UserName: "nobody"}
	pre.Kube = kubernetes.NewForConfigOrDie(nobody)
	if got := results(Run(ctx, pre))["permissions"]; !strings.HasPrefix(got, "FAIL: you may not create namespaces, create apiextensions.k8s.io/customresourcedefinitions") {
		t.Errorf("pre-install as nobody: permissions %q", got)
	}

	install(t, cs, gw, longRoot(t))
	after := Run(ctx, opts)
	for _, r := range after {
		if r.Status != Pass {
			t.Errorf("after the install, %s: %s: %s", r.Check, r.Status, r.Message)
		}
	}
	if len(after) != 11 {
		t.Errorf("%d checks after the install, want 11: %+v", len(after), after)
	}
	late := opts
	late.Now = leaf.NotAfter.Add(time.Minute)
	if got := results(Run(ctx, late))["node proxy causeway-system/np-a certificates"]; !strings.HasPrefix(got, "FAIL: "+id.String()+": leaf") || !strings.Contains(got, "expired") {
		t.Errorf("an expired certificate: %q", got)
	}
}

// install writes the objects of an installed, ready mesh on one node.
func install(t *testing.T, cs kubernetes.Interface, gw gwclient.Interface, root *x509.Certificate) {
	t.Helper()
	ctx := context.Background()
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	now := metav1.Now()
	node, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{})
	must(node, err)
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: now, LastTransitionTime: now}}
	node.Status.NodeInfo = corev1.NodeSystemInfo{OperatingSystem: "linux", Architecture: "amd64", KernelVersion: "6.1.0-13-amd64", ContainerRuntimeVersion: "containerd://1.6.20"}
	must(cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}))

	ns := trust.SystemNamespace
	must(cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}))
	// No controller manager here makes the namespace's default account.
	must(cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}))
	labels := func(name string) map[string]string { return map[string]string{"app.kubernetes.io/name": name} }
	template := func(name string) corev1.PodTemplateSpec {
		return corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels(name)},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}}}
	}
	replicas := int32(2)
	d, err := cs.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: ControlPlaneName},
		Spec: appsv1.DeploymentSpec{Replicas: &replicas, Selector: &metav1.LabelSelector{MatchLabels: labels(ControlPlaneName)}, Template: template(ControlPlaneName)}}, metav1.CreateOptions{})
	must(d, err)
	d.Status.Replicas, d.Status.ReadyReplicas, d.Status.UpdatedReplicas = 2, 2, 2
	must(cs.AppsV1().Deployments(ns).UpdateStatus(ctx, d, metav1.UpdateOptions{}))
	ds, err := cs.AppsV1().DaemonSets(ns).Create(ctx, &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: NodeProxyName},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels(NodeProxyName)}, Template: template(NodeProxyName)}}, metav1.CreateOptions{})
	must(ds, err)
	ds.Status.DesiredNumberScheduled, ds.Status.NumberReady = 1, 1
	must(cs.AppsV1().DaemonSets(ns).UpdateStatus(ctx, ds, metav1.UpdateOptions{}))
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "np-a", Labels: labels(NodeProxyName)}, Spec: template(NodeProxyName).Spec}
	pod.Spec.NodeName = "node-a"
	pod, err = cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	must(pod, err)
	pod.Status.Phase = corev1.PodRunning
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now}}
	must(cs.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}))

	gc, err := gw.GatewayV1().GatewayClasses().Create(ctx, &gwv1.GatewayClass{ObjectMeta: metav1.ObjectMeta{Name: config.WaypointClass},
		Spec: gwv1.GatewayClassSpec{ControllerName: gwstatus.ControllerName}}, metav1.CreateOptions{})
	must(gc, err)
	gc.Status.Conditions = []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionTrue, Reason: "Accepted", LastTransitionTime: now, ObservedGeneration: 1}}
	must(gw.GatewayV1().GatewayClasses().UpdateStatus(ctx, gc, metav1.UpdateOptions{}))

	// The webhook matches nothing this test creates: no server answers it.
	fail, none, path := admissionv1.Ignore, admissionv1.SideEffectClassNone, "/validate"
	must(cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &admissionv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: webhookName},
		Webhooks: []admissionv1.ValidatingWebhook{{Name: "routes.validation.causeway.dev", FailurePolicy: &fail, SideEffects: &none, AdmissionReviewVersions: []string{"v1"},
			ClientConfig: admissionv1.WebhookClientConfig{CABundle: []byte(pemOf(root)), Service: &admissionv1.ServiceReference{Namespace: ns, Name: ControlPlaneName, Path: &path}},
			Rules: []admissionv1.RuleWithOperations{{Operations: []admissionv1.OperationType{admissionv1.Create},
				Rule: admissionv1.Rule{APIGroups: []string{"example.invalid"}, APIVersions: []string{"v1"}, Resources: []string{"things"}}}}}},
	}, metav1.CreateOptions{}))
	must(cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: rootsConfigMap},
		Data: map[string]string{"root-cert.pem": pemOf(root)}}, metav1.CreateOptions{}))
}

func pemOf(c *x509.Certificate) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}))
}
