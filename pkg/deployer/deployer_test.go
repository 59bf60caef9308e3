package deployer

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/causeway-mesh/causeway/pkg/config"
	"github.com/causeway-mesh/causeway/pkg/internal/kubetest"
)

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }

// mutableValues lets a test change the deployer's values as it runs.
type mutableValues struct {
	mu sync.Mutex
	v  Values
}

func (m *mutableValues) get() Values {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.v
}

func (m *mutableValues) set(f func(*Values)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f(&m.v)
}

type fixture struct {
	t      *testing.T
	ctx    context.Context
	cs     kubernetes.Interface
	md     metadata.Interface
	gw     gwclient.Interface
	ns     string
	values *mutableValues
	tmpl   string // template file
	logs   *observer.ObservedLogs
}

func startDeployer(t *testing.T, ns string) *fixture {
	return startDeployerWithAddresses(t, ns, config.AddressPool{})
}

// startDeployerWithAddresses starts a deployer whose ingress Gateways may
// hold the static addresses of pool.
func startDeployerWithAddresses(t *testing.T, ns string, pool config.AddressPool) *fixture {
	env := kubetest.Shared(t)
	ctx, cancel := context.WithCancel(context.Background())
	f := &fixture{t: t, ctx: ctx, cs: env.Clientset(t), ns: ns, values: &mutableValues{v: testValues()},
		tmpl: filepath.Join(t.TempDir(), "waypoint.yaml")}
	var err error
	if f.gw, err = gwclient.NewForConfig(env.Config); err != nil {
		t.Fatal(err)
	}
	if f.md, err = metadata.NewForConfig(env.Config); err != nil {
		t.Fatal(err)
	}
	if _, err := f.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.tmpl, []byte(defaultTemplate), 0o644); err != nil {
		t.Fatal(err)
	}
	// As the control plane's ServiceAccount: an object it cannot write fails the test.
	cfg := env.ControlPlane(t)
	obs, logs := observer.New(zap.DebugLevel)
	f.logs = logs
	log := zaptest.NewLogger(t, zaptest.WrapOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core { return zapcore.NewTee(c, obs) })))
	d, err := New(Options{Client: kubernetes.NewForConfigOrDie(cfg), Metadata: metadata.NewForConfigOrDie(cfg), Gateways: gwclient.NewForConfigOrDie(cfg), TemplateFile: f.tmpl, TemplateCheck: 100 * time.Millisecond,
		Values: f.values.get, Addresses: pool, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("deployer: %v", err)
		}
	})
	return f
}

func (f *fixture) createGateway(name string, port int32) *gwv1.Gateway {
	f.t.Helper()
	gw, err := f.gw.GatewayV1().Gateways(f.ns).Create(f.ctx, &gwv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: gwv1.GatewaySpec{GatewayClassName: config.WaypointClass,
			Listeners: []gwv1.Listener{{Name: "mesh", Port: gwv1.PortNumber(port), Protocol: config.WaypointProtocol}}},
	}, metav1.CreateOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return gw
}

// waitFor polls cond for up to 20 s (a busy two-core machine), failing with what.
func (f *fixture) waitFor(what string, cond func() (bool, error)) {
	f.t.Helper()
	if err := kubetest.WaitFor(f.ctx, 20*time.Second, cond); err != nil {
		f.t.Fatalf("%s: %v", what, err)
	}
}

// children returns a waypoint's objects that exist.
func (f *fixture) children(name string) map[string]metav1.Object {
	out := map[string]metav1.Object{}
	for kind, gvr := range kinds {
		if o, err := f.md.Resource(gvr).Namespace(f.ns).Get(f.ctx, name, metav1.GetOptions{}); err == nil {
			out[kind] = o
		}
	}
	return out
}

func appliedByCauseway(o metav1.Object) bool {
	for _, mf := range o.GetManagedFields() {
		if mf.Manager == FieldManager && mf.Operation == metav1.ManagedFieldsOperationApply {
			return true
		}
	}
	return false
}

func TestDeployerCreatesUpdatesAndCollects(t *testing.T) {
	f := startDeployer(t, "deploy-life")
	gw := f.createGateway("waypoint", 15008)

	f.waitFor("all five children", func() (bool, error) { return len(f.children("waypoint")) == len(kinds), nil })
	for kind, o := range f.children("waypoint") {
		if !ownedBy(o, gw) || metav1.GetControllerOf(o) == nil {
			t.Errorf("%s: owner references %v, want the Gateway (uid %s) as controller", kind, o.GetOwnerReferences(), gw.UID)
		}
		if !appliedByCauseway(o) {
			t.Errorf("%s: not server-side applied by %q: %v", kind, FieldManager, o.GetManagedFields())
		}
		if o.GetLabels()[config.LabelGatewayName] != "waypoint" {
			t.Errorf("%s: labels %v", kind, o.GetLabels())
		}
	}
	dep, err := f.cs.AppsV1().Deployments(f.ns).Get(f.ctx, "waypoint", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod := dep.Spec.Template
	if pod.Labels[config.LabelGatewayName] != "waypoint" || pod.Labels[config.LabelDataplaneMode] != config.DataplaneModeNone {
		t.Errorf("pod labels %v: want the gateway name and dataplane-mode none", pod.Labels)
	}
	if pod.Spec.ServiceAccountName != "waypoint" {
		t.Errorf("pods run as %q, want the waypoint's ServiceAccount", pod.Spec.ServiceAccountName)
	}

	// A changed Gateway: the new listener port reaches the Service and the pods.
	cur, err := f.gw.GatewayV1().Gateways(f.ns).Get(f.ctx, "waypoint", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.Listeners[0].Port = 15009
	if _, err := f.gw.GatewayV1().Gateways(f.ns).Update(f.ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("the Service on the new port", func() (bool, error) {
		s, err := f.cs.CoreV1().Services(f.ns).Get(f.ctx, "waypoint", metav1.GetOptions{})
		return err == nil && len(s.Spec.Ports) == 1 && s.Spec.Ports[0].Port == 15009, err
	})

	// A changed policy annotation (no new generation) reaches the pods,
	// once the port change has settled (its own re-applies would carry it).
	f.waitFor("the pods on the new port", func() (bool, error) {
		d, err := f.cs.AppsV1().Deployments(f.ns).Get(f.ctx, "waypoint", metav1.GetOptions{})
		return err == nil && d.Spec.Template.Spec.Containers[0].Ports[0].ContainerPort == 15009, err
	})
	time.Sleep(time.Second)
	cur, err = f.gw.GatewayV1().Gateways(f.ns).Get(f.ctx, "waypoint", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Annotations = map[string]string{AnnotationPolicyConfigMap: "shop-rego"}
	if _, err := f.gw.GatewayV1().Gateways(f.ns).Update(f.ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("the policies from the annotation's ConfigMap", func() (bool, error) {
		d, err := f.cs.AppsV1().Deployments(f.ns).Get(f.ctx, "waypoint", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == "policies" && v.ConfigMap != nil && v.ConfigMap.Name == "shop-rego" {
				return true, nil
			}
		}
		return false, nil
	})

	// Changed values (new roots) reach the ConfigMap.
	f.values.set(func(v *Values) { v.RootCert = "NEW ROOTS" })
	f.waitFor("the new roots", func() (bool, error) {
		cm, err := f.cs.CoreV1().ConfigMaps(f.ns).Get(f.ctx, "waypoint", metav1.GetOptions{})
		return err == nil && cm.Data["root-cert.pem"] == "NEW ROOTS", err
	})

	// A changed template: more replicas, and no PodDisruptionBudget any more.
	text := strings.Replace(defaultTemplate, "replicas: {{.Replicas}}", "replicas: 5", 1)
	i := strings.Index(text, "apiVersion: policy/v1")
	j := strings.Index(text[i:], "---\n")
	text = text[:i] + text[i+j+4:]
	if err := os.WriteFile(f.tmpl, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	f.waitFor("five replicas and no PodDisruptionBudget", func() (bool, error) {
		d, err := f.cs.AppsV1().Deployments(f.ns).Get(f.ctx, "waypoint", metav1.GetOptions{})
		if err != nil || *d.Spec.Replicas != 5 {
			return false, err
		}
		_, err = f.cs.PolicyV1().PodDisruptionBudgets(f.ns).Get(f.ctx, "waypoint", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})

	// A deleted child comes back.
	if err := f.cs.AppsV1().Deployments(f.ns).Delete(f.ctx, "waypoint", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("the Deployment re-created", func() (bool, error) {
		d, err := f.cs.AppsV1().Deployments(f.ns).Get(f.ctx, "waypoint", metav1.GetOptions{})
		return err == nil && d.UID != dep.UID, nil
	})

	// A Gateway that stops being a waypoint loses its children.
	cur, err = f.gw.GatewayV1().Gateways(f.ns).Get(f.ctx, "waypoint", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.GatewayClassName = "someone-elses"
	if _, err := f.gw.GatewayV1().Gateways(f.ns).Update(f.ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("children deleted", func() (bool, error) { return len(f.children("waypoint")) == 0, nil })
}

// Garbage collection is the controller-manager's work; the test runs the
// real one against the test apiserver.
func TestDeletedGatewayIsCollected(t *testing.T) {
	f := startDeployer(t, "deploy-gc")
	startGarbageCollector(t, kubetest.Shared(t))
	f.createGateway("waypoint", 15008)
	f.waitFor("all five children", func() (bool, error) { return len(f.children("waypoint")) == len(kinds), nil })
	if err := f.gw.GatewayV1().Gateways(f.ns).Delete(f.ctx, "waypoint", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("children collected", func() (bool, error) { return len(f.children("waypoint")) == 0, nil })
}

func TestDeployerRefusesObjectsItDidNotMake(t *testing.T) {
	f := startDeployer(t, "deploy-foreign")
	if _, err := f.cs.CoreV1().ServiceAccounts(f.ns).Create(f.ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: "waypoint", Labels: map[string]string{"team": "payments"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	gw := f.createGateway("waypoint", 15008)
	f.waitFor("a NotOwned event on the Gateway", func() (bool, error) {
		evs, err := f.cs.CoreV1().Events(f.ns).List(f.ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.UID == gw.UID && e.Reason == "NotOwned" && strings.Contains(e.Message, "ServiceAccount deploy-foreign/waypoint exists and is not owned") {
				return true, nil
			}
		}
		return false, nil
	})
	sa, err := f.cs.CoreV1().ServiceAccounts(f.ns).Get(f.ctx, "waypoint", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(sa.OwnerReferences) != 0 || appliedByCauseway(sa) || sa.Labels[config.LabelGatewayName] != "" {
		t.Errorf("the foreign ServiceAccount was touched: %+v", sa.ObjectMeta)
	}
	if _, err := f.cs.AppsV1().Deployments(f.ns).Get(f.ctx, "waypoint", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a Deployment was made for a waypoint whose identity is someone else's: %v", err)
	}
}

// startGarbageCollector runs kube-controller-manager's garbage collector
// against env until the test ends.
func startGarbageCollector(t *testing.T, env *kubetest.Env) {
	bin := filepath.Join(kubetest.BinDir(), "kube-controller-manager")
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("kube-controller-manager not found in %s: garbage collection not tested (owner references are, in TestDeployerCreatesUpdatesAndCollects)", kubetest.BinDir())
	}
	logf, err := os.Create(filepath.Join(t.TempDir(), "kube-controller-manager.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--kubeconfig="+env.Kubeconfig, "--controllers=garbagecollector",
		"--leader-elect=false", "--secure-port=0", "--v=1")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		_ = cmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("kube-controller-manager log:\n%s", b)
		}
	})
}

// A namespace being deleted gets nothing new: the children its deletion
// removes stay removed, and nothing is retried or complained about. (No
// namespace controller runs here, so the namespace stays Terminating and
// the test removes a child as that controller would.)
func TestTerminatingNamespaceIsLeftAlone(t *testing.T) {
	f := startDeployer(t, "deploy-ending")
	f.createGateway("waypoint", 15008)
	f.waitFor("all five children", func() (bool, error) { return len(f.children("waypoint")) == len(kinds), nil })

	if err := f.cs.CoreV1().Namespaces().Delete(f.ctx, f.ns, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("the namespace terminating", func() (bool, error) {
		n, err := f.cs.CoreV1().Namespaces().Get(f.ctx, f.ns, metav1.GetOptions{})
		return err == nil && n.Status.Phase == corev1.NamespaceTerminating, err
	})
	before := f.logs.Len()
	for _, kind := range []string{"Deployment", "Service"} {
		if err := f.md.Resource(kinds[kind]).Namespace(f.ns).Delete(f.ctx, "waypoint", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The deletions re-enqueue the Gateway; give the deployer time to act
	// on them (and, before the fix, to fail and retry).
	time.Sleep(3 * time.Second)
	if got := f.children("waypoint"); got["Deployment"] != nil || got["Service"] != nil {
		t.Errorf("children re-created in a terminating namespace: %v", slices.Sorted(maps.Keys(got)))
	}
	// This deployer sees the other tests' namespaces too.
	for _, e := range f.logs.All()[before:] {
		if e.Level >= zap.WarnLevel && strings.Contains(fmt.Sprint(e.ContextMap()), f.ns+"/") {
			t.Errorf("logged %s: %s %v", e.Level, e.Message, e.ContextMap())
		}
	}
}

// An ingress Gateway is deployed only while its GatewayClass names the
// ingress controller; its Service exposes its listeners' ports, follows
// them as they change, and takes its type from the annotation.
func TestIngressGatewayDeployed(t *testing.T) {
	f := startDeployer(t, "deploy-ingress")
	classes := f.gw.GatewayV1().GatewayClasses()
	class, err := classes.Create(f.ctx, &gwv1.GatewayClass{ObjectMeta: metav1.ObjectMeta{Name: config.IngressClass},
		Spec: gwv1.GatewayClassSpec{ControllerName: "example.com/another-controller"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = classes.Delete(context.Background(), config.IngressClass, metav1.DeleteOptions{}) })
	gw, err := f.gw.GatewayV1().Gateways(f.ns).Create(f.ctx, &gwv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: "edge"},
		Spec: gwv1.GatewaySpec{GatewayClassName: config.IngressClass, Listeners: []gwv1.Listener{
			{Name: "http", Port: 80, Protocol: gwv1.HTTPProtocolType},
			{Name: "https", Port: 443, Protocol: gwv1.HTTPSProtocolType},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Another controller's class: its Gateways are not ours.
	time.Sleep(2 * time.Second)
	if got := f.children("edge"); len(got) != 0 {
		t.Fatalf("children made for a Gateway of another controller's class: %v", slices.Sorted(maps.Keys(got)))
	}
	// The class deleted and made again with our controller (its
	// controllerName cannot change).
	if err := classes.Delete(f.ctx, class.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := classes.Create(f.ctx, &gwv1.GatewayClass{ObjectMeta: metav1.ObjectMeta{Name: config.IngressClass},
		Spec: gwv1.GatewayClassSpec{ControllerName: config.IngressController}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("all five children", func() (bool, error) { return len(f.children("edge")) == len(kinds), nil })
	for kind, o := range f.children("edge") {
		if !ownedBy(o, gw) || !appliedByCauseway(o) {
			t.Errorf("%s: not applied by %q and owned by the Gateway: %v %v", kind, FieldManager, o.GetOwnerReferences(), o.GetManagedFields())
		}
	}
	ports := func(s *corev1.Service) map[string]int32 {
		out := map[string]int32{}
		for _, p := range s.Spec.Ports {
			out[p.Name] = p.Port
		}
		return out
	}
	svc, err := f.cs.CoreV1().Services(f.ns).Get(f.ctx, "edge", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer || !maps.Equal(ports(svc), map[string]int32{"http-80": 80, "https-443": 443}) {
		t.Errorf("Service %s with ports %v: want LoadBalancer with http-80 and https-443", svc.Spec.Type, ports(svc))
	}
	dep, err := f.cs.AppsV1().Deployments(f.ns).Get(f.ctx, "edge", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod := dep.Spec.Template
	if pod.Spec.ServiceAccountName != "edge" || pod.Labels[config.LabelDataplaneMode] != config.DataplaneModeNone ||
		!slices.Contains(pod.Spec.Containers[0].Args, "--ingress") {
		t.Errorf("pods as %q, labels %v, args %v: want the Gateway's ServiceAccount, not captured, in the ingress role",
			pod.Spec.ServiceAccountName, pod.Labels, pod.Spec.Containers[0].Args)
	}

	// A listener added, one removed, the Service made a ClusterIP.
	cur, err := f.gw.GatewayV1().Gateways(f.ns).Get(f.ctx, "edge", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Annotations = map[string]string{AnnotationServiceType: "ClusterIP"}
	cur.Spec.Listeners = []gwv1.Listener{cur.Spec.Listeners[1], {Name: "alt", Port: 8080, Protocol: gwv1.HTTPProtocolType}}
	if _, err := f.gw.GatewayV1().Gateways(f.ns).Update(f.ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("the Service on the new ports, a ClusterIP", func() (bool, error) {
		s, err := f.cs.CoreV1().Services(f.ns).Get(f.ctx, "edge", metav1.GetOptions{})
		return err == nil && s.Spec.Type == corev1.ServiceTypeClusterIP && maps.Equal(ports(s), map[string]int32{"https-443": 443, "http-8080": 8080}), err
	})

	// Infrastructure parameters (an ingress Gateway takes none): rejected,
	// it runs nothing; without them again, everything comes back.
	cur, err = f.gw.GatewayV1().Gateways(f.ns).Get(f.ctx, "edge", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.Infrastructure = &gwv1.GatewayInfrastructure{ParametersRef: &gwv1.LocalParametersReference{Group: "invalid.io", Kind: "InvalidParameters", Name: "invalid"}}
	if cur, err = f.gw.GatewayV1().Gateways(f.ns).Update(f.ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("a rejected Gateway's children deleted", func() (bool, error) { return len(f.children("edge")) == 0, nil })
	cur.Spec.Infrastructure = nil
	if _, err := f.gw.GatewayV1().Gateways(f.ns).Update(f.ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("all five children back", func() (bool, error) { return len(f.children("edge")) == len(kinds), nil })

	// The class deleted: the Gateway is no longer ours, and loses its children.
	if err := classes.Delete(f.ctx, config.IngressClass, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("children deleted", func() (bool, error) { return len(f.children("edge")) == 0, nil })
}

// An ingress Gateway's Service holds, as externalIPs, the static addresses
// of its spec that are in the operator's pool and that no Gateway claimed
// before it; when the first claimant goes, the next one takes the address.
func TestIngressStaticAddresses(t *testing.T) {
	pool, err := config.ParseAddressPool("192.0.2.0/28")
	if err != nil {
		t.Fatal(err)
	}
	f := startDeployerWithAddresses(t, "deploy-static", pool)
	classes := f.gw.GatewayV1().GatewayClasses()
	if _, err := classes.Create(f.ctx, &gwv1.GatewayClass{ObjectMeta: metav1.ObjectMeta{Name: config.IngressClass},
		Spec: gwv1.GatewayClassSpec{ControllerName: config.IngressController}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = classes.Delete(context.Background(), config.IngressClass, metav1.DeleteOptions{}) })
	create := func(name string, addrs ...string) {
		t.Helper()
		gw := &gwv1.Gateway{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: gwv1.GatewaySpec{GatewayClassName: config.IngressClass, Listeners: []gwv1.Listener{{Name: "http", Port: 80, Protocol: gwv1.HTTPProtocolType}}}}
		for _, a := range addrs {
			gw.Spec.Addresses = append(gw.Spec.Addresses, gwv1.GatewaySpecAddress{Type: new(gwv1.IPAddressType), Value: a})
		}
		if _, err := f.gw.GatewayV1().Gateways(f.ns).Create(f.ctx, gw, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	externalIPs := func(name string, want ...string) func() (bool, error) {
		return func() (bool, error) {
			s, err := f.cs.CoreV1().Services(f.ns).Get(f.ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			return err == nil && slices.Equal(s.Spec.ExternalIPs, want), err
		}
	}
	create("first", "198.51.100.1", "192.0.2.1")
	f.waitFor("first's Service holding 192.0.2.1 alone (198.51.100.1 is off the pool)", externalIPs("first", "192.0.2.1"))
	// The creation timestamps have a one-second resolution.
	time.Sleep(1100 * time.Millisecond)
	create("second", "192.0.2.1")
	f.waitFor("second's children", func() (bool, error) { return len(f.children("second")) == len(kinds), nil })
	if ok, err := externalIPs("second")(); !ok {
		t.Fatalf("second's Service holds an address first claimed before it (%v)", err)
	}
	if err := f.gw.GatewayV1().Gateways(f.ns).Delete(f.ctx, "first", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("second's Service holding 192.0.2.1 once first is gone", externalIPs("second", "192.0.2.1"))
}
