package gwstatus

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	"sigs.k8s.io/yaml"

	"github.com/causeway-mesh/causeway/pkg/config"
	"github.com/causeway-mesh/causeway/pkg/internal/kubetest"
	"github.com/causeway-mesh/causeway/pkg/leader"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
)

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }

type fixture struct {
	t   *testing.T
	ctx context.Context
	cs  kubernetes.Interface
	gw  gwclient.Interface
	env *kubetest.Env
}

func newFixture(t *testing.T) *fixture { return fixtureOn(t, kubetest.Shared(t)) }

func fixtureOn(t *testing.T, env *kubetest.Env) *fixture {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	f := &fixture{t: t, ctx: ctx, cs: env.Clientset(t), env: env}
	var err error
	if f.gw, err = gwclient.NewForConfig(env.Config); err != nil {
		t.Fatal(err)
	}
	return f
}

// startWriter runs a status writer until the test ends; set changes its
// options.
func (f *fixture) startWriter(set ...func(*Options)) *Writer {
	// As the control plane's ServiceAccount: a status it cannot write fails the test.
	cfg := f.env.ControlPlane(f.t)
	o := Options{Client: kubernetes.NewForConfigOrDie(cfg), Gateways: gwclient.NewForConfigOrDie(cfg), Dynamic: dynamic.NewForConfigOrDie(cfg), Logger: zaptest.NewLogger(f.t)}
	for _, s := range set {
		s(&o)
	}
	w, err := New(o)
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	f.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			f.t.Errorf("status writer: %v", err)
		}
	})
	return w
}

func (f *fixture) waitFor(what string, cond func() (bool, error)) {
	f.t.Helper()
	if err := kubetest.WaitFor(f.ctx, 20*time.Second, cond); err != nil {
		f.t.Fatalf("%s: %v", what, err)
	}
}

// create decodes YAML into obj and creates it.
func (f *fixture) create(doc string) {
	f.t.Helper()
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
		f.t.Fatal(err)
	}
	var err error
	switch tm.Kind {
	case "Namespace":
		var o corev1.Namespace
		f.decode(doc, &o)
		_, err = f.cs.CoreV1().Namespaces().Create(f.ctx, &o, metav1.CreateOptions{})
	case "Service":
		var o corev1.Service
		f.decode(doc, &o)
		_, err = f.cs.CoreV1().Services(o.Namespace).Create(f.ctx, &o, metav1.CreateOptions{})
	case "GatewayClass":
		var o gwv1.GatewayClass
		f.decode(doc, &o)
		_, err = f.gw.GatewayV1().GatewayClasses().Create(f.ctx, &o, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			err = nil
		}
	case "Gateway":
		var o gwv1.Gateway
		f.decode(doc, &o)
		_, err = f.gw.GatewayV1().Gateways(o.Namespace).Create(f.ctx, &o, metav1.CreateOptions{})
	case "HTTPRoute":
		var o gwv1.HTTPRoute
		f.decode(doc, &o)
		_, err = f.gw.GatewayV1().HTTPRoutes(o.Namespace).Create(f.ctx, &o, metav1.CreateOptions{})
	case "GRPCRoute":
		var o gwv1.GRPCRoute
		f.decode(doc, &o)
		_, err = f.gw.GatewayV1().GRPCRoutes(o.Namespace).Create(f.ctx, &o, metav1.CreateOptions{})
	case "ReferenceGrant":
		var o gwv1.ReferenceGrant
		f.decode(doc, &o)
		_, err = f.gw.GatewayV1().ReferenceGrants(o.Namespace).Create(f.ctx, &o, metav1.CreateOptions{})
	case "BackendTLSPolicy":
		var o gwv1.BackendTLSPolicy
		f.decode(doc, &o)
		_, err = f.gw.GatewayV1().BackendTLSPolicies(o.Namespace).Create(f.ctx, &o, metav1.CreateOptions{})
	case "ConfigMap":
		var o corev1.ConfigMap
		f.decode(doc, &o)
		_, err = f.cs.CoreV1().ConfigMaps(o.Namespace).Create(f.ctx, &o, metav1.CreateOptions{})
	case "IngressClass":
		var o networkingv1.IngressClass
		f.decode(doc, &o)
		_, err = f.cs.NetworkingV1().IngressClasses().Create(f.ctx, &o, metav1.CreateOptions{})
	case "Ingress":
		var o networkingv1.Ingress
		f.decode(doc, &o)
		_, err = f.cs.NetworkingV1().Ingresses(o.Namespace).Create(f.ctx, &o, metav1.CreateOptions{})
	default:
		f.t.Fatalf("kind %q", tm.Kind)
	}
	if err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) decode(doc string, o any) {
	f.t.Helper()
	if err := yaml.UnmarshalStrict([]byte(doc), o); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) gateway(ns, name string) *gwv1.Gateway {
	f.t.Helper()
	gw, err := f.gw.GatewayV1().Gateways(ns).Get(f.ctx, name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return gw
}

func (f *fixture) route(ns, name string) *gwv1.HTTPRoute {
	f.t.Helper()
	r, err := f.gw.GatewayV1().HTTPRoutes(ns).Get(f.ctx, name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return r
}

// gatewayDeployment makes the Deployment the deployer would, owned by gw.
func (f *fixture) gatewayDeployment(gw *gwv1.Gateway, replicas int32) (owner metav1.OwnerReference, selector map[string]string) {
	f.t.Helper()
	owner = metav1.OwnerReference{APIVersion: gwv1.GroupVersion.String(), Kind: "Gateway", Name: gw.Name, UID: gw.UID, Controller: ptr(true)}
	sel := map[string]string{config.LabelGatewayName: gw.Name}
	_, err := f.cs.AppsV1().Deployments(gw.Namespace).Create(f.ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: gw.Name, Labels: sel, OwnerReferences: []metav1.OwnerReference{owner}},
		Spec: appsv1.DeploymentSpec{Replicas: &replicas, Selector: &metav1.LabelSelector{MatchLabels: sel},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: sel},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "waypoint", Image: "i"}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return owner, sel
}

// waypointDeployment makes the Deployment and Service the deployer would,
// owned by gw.
func (f *fixture) waypointDeployment(gw *gwv1.Gateway, replicas int32) {
	f.t.Helper()
	owner, sel := f.gatewayDeployment(gw, replicas)
	_, err := f.cs.CoreV1().Services(gw.Namespace).Create(f.ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: gw.Name, Labels: sel, OwnerReferences: []metav1.OwnerReference{owner}},
		Spec:       corev1.ServiceSpec{Selector: sel, Ports: []corev1.ServicePort{{Name: "mesh", Port: 15008}}},
	}, metav1.CreateOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
}

// setReady sets the ready replicas, as the deployment controller would.
func (f *fixture) setReady(ns, name string, ready int32) {
	f.t.Helper()
	d, err := f.cs.AppsV1().Deployments(ns).Get(f.ctx, name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	d.Status.Replicas, d.Status.ReadyReplicas, d.Status.AvailableReplicas = *d.Spec.Replicas, ready, ready
	if _, err := f.cs.AppsV1().Deployments(ns).UpdateStatus(f.ctx, d, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

func ptr[T any](v T) *T { return &v }

func cond(conds []metav1.Condition, typ string) *metav1.Condition {
	return meta.FindStatusCondition(conds, typ)
}

func is(c *metav1.Condition, status metav1.ConditionStatus, reason string) bool {
	return c != nil && c.Status == status && c.Reason == reason
}

func ourParent(r *gwv1.HTTPRoute) *gwv1.RouteParentStatus { return ours(r.Status.Parents) }

func ours(ps []gwv1.RouteParentStatus) *gwv1.RouteParentStatus {
	for i := range ps {
		if ps[i].ControllerName == ControllerName {
			return &ps[i]
		}
	}
	return nil
}

func (f *fixture) sample(ns string) {
	f.create(`
kind: GatewayClass
metadata: {name: causeway-waypoint}
spec: {controllerName: causeway.dev/waypoint-controller}
`)
	f.create(fmt.Sprintf("kind: Namespace\nmetadata: {name: %s}\n", ns))
	f.create(fmt.Sprintf("kind: Namespace\nmetadata: {name: %s-other}\n", ns))
	f.create(fmt.Sprintf(`
kind: Gateway
metadata: {name: wp, namespace: %s}
spec:
  gatewayClassName: causeway-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
`, ns))
	for _, s := range []string{ns + "/reviews", ns + "/v2", ns + "-other/private"} {
		nsName := strings.Split(s, "/")
		f.create(fmt.Sprintf("kind: Service\nmetadata: {name: %s, namespace: %s}\nspec: {ports: [{port: 80}]}\n", nsName[1], nsName[0]))
	}
	f.create(fmt.Sprintf(`
kind: HTTPRoute
metadata: {name: r1, namespace: %[1]s}
spec:
  parentRefs: [{group: "", kind: Service, name: reviews, port: 80}]
  rules: [{backendRefs: [{name: v2, port: 80}, {name: private, namespace: %[1]s-other, port: 80}]}]
`, ns))
}

// A route attached to a Service no waypoint serves is accepted (it is
// valid and attached), but its entry says that nothing applies it, until
// the Service names a waypoint.
func TestRouteParentWithoutWaypoint(t *testing.T) {
	f := newFixture(t)
	f.startWriter()
	f.sample("st-nw")
	f.waitFor("r1 attached to reviews, no waypoint serving it", func() (bool, error) {
		p := ourParent(f.route("st-nw", "r1"))
		if p == nil {
			return false, nil
		}
		a, b := cond(p.Conditions, "Accepted"), cond(p.Conditions, ConditionWaypointBound)
		return is(a, metav1.ConditionTrue, "Accepted") && a.Message == "attached to Service st-nw/reviews" &&
			is(b, metav1.ConditionFalse, "NoWaypoint") && strings.Contains(b.Message, "no waypoint serves Service st-nw/reviews, so nothing applies this route"), nil
	})
	svc, err := f.cs.CoreV1().Services("st-nw").Get(f.ctx, "reviews", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Labels = map[string]string{config.LabelUseWaypoint: "wp"}
	if _, err := f.cs.CoreV1().Services("st-nw").Update(f.ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("r1 applied by the waypoint once reviews names it", func() (bool, error) {
		p := ourParent(f.route("st-nw", "r1"))
		if p == nil {
			return false, nil
		}
		b := cond(p.Conditions, ConditionWaypointBound)
		return is(cond(p.Conditions, "Accepted"), metav1.ConditionTrue, "Accepted") &&
			is(b, metav1.ConditionTrue, "Bound") && b.Message == "applied by waypoint st-nw/wp for Service st-nw/reviews", nil
	})
}

func TestGatewayStatus(t *testing.T) {
	f := newFixture(t)
	f.startWriter()
	f.sample("st-gw")
	f.waitFor("the GatewayClass accepted", func() (bool, error) {
		c, err := f.gw.GatewayV1().GatewayClasses().Get(f.ctx, "causeway-waypoint", metav1.GetOptions{})
		return err == nil && is(cond(c.Status.Conditions, "Accepted"), metav1.ConditionTrue, "Accepted"), err
	})
	f.waitFor("Accepted, not Programmed without a Deployment", func() (bool, error) {
		gw := f.gateway("st-gw", "wp")
		return is(cond(gw.Status.Conditions, "Accepted"), metav1.ConditionTrue, "Accepted") &&
			is(cond(gw.Status.Conditions, "Programmed"), metav1.ConditionFalse, "Pending"), nil
	})
	accepted := *cond(f.gateway("st-gw", "wp").Status.Conditions, "Accepted")
	f.waypointDeployment(f.gateway("st-gw", "wp"), 2)
	f.waitFor("not Programmed while no pod is ready, with an address", func() (bool, error) {
		gw := f.gateway("st-gw", "wp")
		p := cond(gw.Status.Conditions, "Programmed")
		return is(p, metav1.ConditionFalse, "Pending") && strings.Contains(p.Message, "0 of 2 ready") && len(gw.Status.Addresses) == 1, nil
	})
	svc, err := f.cs.CoreV1().Services("st-gw").Get(f.ctx, "wp", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := f.gateway("st-gw", "wp").Status.Addresses[0].Value; got != svc.Spec.ClusterIP {
		t.Errorf("address %s, want the waypoint Service's cluster IP %s", got, svc.Spec.ClusterIP)
	}
	f.setReady("st-gw", "wp", 1)
	f.waitFor("Programmed once a pod is ready", func() (bool, error) {
		return is(cond(f.gateway("st-gw", "wp").Status.Conditions, "Programmed"), metav1.ConditionTrue, "Programmed"), nil
	})
	gw := f.gateway("st-gw", "wp")
	if a := cond(gw.Status.Conditions, "Accepted"); !a.LastTransitionTime.Equal(&accepted.LastTransitionTime) {
		t.Errorf("Accepted moved from %v to %v though it stayed true", accepted.LastTransitionTime, a.LastTransitionTime)
	}
	if len(gw.Status.Listeners) != 1 || !is(cond(gw.Status.Listeners[0].Conditions, "Programmed"), metav1.ConditionTrue, "Programmed") {
		t.Errorf("listener status %+v", gw.Status.Listeners)
	}
	f.setReady("st-gw", "wp", 0)
	f.waitFor("not Programmed when no pod is ready any more", func() (bool, error) {
		return is(cond(f.gateway("st-gw", "wp").Status.Conditions, "Programmed"), metav1.ConditionFalse, "Pending"), nil
	})
}

func TestRouteStatus(t *testing.T) {
	f := newFixture(t)
	f.startWriter()
	f.sample("st-rt")
	f.waitFor("r1 accepted, a backend not permitted", func() (bool, error) {
		p := ourParent(f.route("st-rt", "r1"))
		if p == nil {
			return false, nil
		}
		rr := cond(p.Conditions, "ResolvedRefs")
		return is(cond(p.Conditions, "Accepted"), metav1.ConditionTrue, "Accepted") && is(rr, metav1.ConditionFalse, "RefNotPermitted") &&
			strings.Contains(rr.Message, "Service st-rt-other/private is not permitted by a ReferenceGrant"), nil
	})
	f.create(`
kind: ReferenceGrant
metadata: {name: allow, namespace: st-rt-other}
spec:
  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: st-rt}]
  to: [{group: "", kind: Service}]
`)
	f.waitFor("refs resolved once granted", func() (bool, error) {
		p := ourParent(f.route("st-rt", "r1"))
		return p != nil && is(cond(p.Conditions, "ResolvedRefs"), metav1.ConditionTrue, "ResolvedRefs"), nil
	})

	// Another controller's entry is kept; ours says the Service parent is missing.
	f.create(`
kind: HTTPRoute
metadata: {name: r2, namespace: st-rt}
spec:
  parentRefs: [{name: ingress}, {group: "", kind: Service, name: gone}]
  rules: [{backendRefs: [{name: v2, port: 80}]}]
`)
	r2 := f.route("st-rt", "r2")
	r2.Status.Parents = []gwv1.RouteParentStatus{{ParentRef: r2.Spec.ParentRefs[0], ControllerName: "example.com/ingress",
		Conditions: []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionTrue, Reason: "Accepted", LastTransitionTime: metav1.Now()}}}}
	if _, err := f.gw.GatewayV1().HTTPRoutes("st-rt").UpdateStatus(f.ctx, r2, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
		t.Fatal(err)
	}
	f.waitFor("r2: not accepted for the missing Service, the ingress entry kept", func() (bool, error) {
		r := f.route("st-rt", "r2")
		p := ourParent(r)
		if p == nil || len(r.Status.Parents) != 2 {
			return false, nil
		}
		return is(cond(p.Conditions, "Accepted"), metav1.ConditionFalse, "NoMatchingParent") && p.ParentRef.Name == "gone", nil
	})

	// A filter the mesh cannot carry out.
	f.create(`
kind: HTTPRoute
metadata: {name: r3, namespace: st-rt}
spec:
  parentRefs: [{group: "", kind: Service, name: reviews}]
  rules: [{filters: [{type: ExtensionRef, extensionRef: {group: example.com, kind: Magic, name: m}}], backendRefs: [{name: v2, port: 80}]}]
`)
	f.waitFor("r3: not accepted, the filter named", func() (bool, error) {
		p := ourParent(f.route("st-rt", "r3"))
		if p == nil {
			return false, nil
		}
		a := cond(p.Conditions, "Accepted")
		return is(a, metav1.ConditionFalse, "UnsupportedValue") && strings.Contains(a.Message, "unsupported filter ExtensionRef"), nil
	})

	// A GRPCRoute's status, through the same path.
	f.create(`
kind: GRPCRoute
metadata: {name: g1, namespace: st-rt}
spec:
  parentRefs: [{group: "", kind: Service, name: v2, port: 80}]
  rules: [{backendRefs: [{name: absent, port: 80}]}]
`)
	f.waitFor("g1: accepted, its backend not found", func() (bool, error) {
		g, err := f.gw.GatewayV1().GRPCRoutes("st-rt").Get(f.ctx, "g1", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		p := ours(g.Status.Parents)
		return p != nil && is(cond(p.Conditions, "Accepted"), metav1.ConditionTrue, "Accepted") &&
			is(cond(p.Conditions, "ResolvedRefs"), metav1.ConditionFalse, "BackendNotFound"), nil
	})

	// Services naming a waypoint.
	f.create("kind: Service\nmetadata: {name: bound, namespace: st-rt, labels: {causeway.dev/use-waypoint: wp}}\nspec: {ports: [{port: 80}]}\n")
	f.create("kind: Service\nmetadata: {name: lost, namespace: st-rt, labels: {causeway.dev/use-waypoint: nowhere}}\nspec: {ports: [{port: 80}]}\n")
	f.waitFor("WaypointBound on both", func() (bool, error) {
		b, err1 := f.cs.CoreV1().Services("st-rt").Get(f.ctx, "bound", metav1.GetOptions{})
		l, err2 := f.cs.CoreV1().Services("st-rt").Get(f.ctx, "lost", metav1.GetOptions{})
		if err1 != nil || err2 != nil {
			return false, nil
		}
		lc := cond(l.Status.Conditions, ConditionWaypointBound)
		return is(cond(b.Status.Conditions, ConditionWaypointBound), metav1.ConditionTrue, "Bound") &&
			is(lc, metav1.ConditionFalse, "NotBound") && strings.Contains(lc.Message, "waypoint st-rt/nowhere does not exist"), nil
	})
	f.waitFor("an event on the unbound Service", func() (bool, error) {
		evs, err := f.cs.CoreV1().Events("st-rt").List(f.ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == "lost" && e.Reason == "WaypointNotBound" {
				return true, nil
			}
		}
		return false, nil
	})
	f.assertNoWrites("st-rt", func() {
		// A change that alters no status: a pass runs and writes nothing.
		f.create("kind: Service\nmetadata: {name: unrelated, namespace: st-rt}\nspec: {ports: [{port: 81}]}\n")
	})
}

// versions are the resourceVersions of the objects whose status is written.
func (f *fixture) versions(ns string) map[string]string {
	f.t.Helper()
	out := map[string]string{}
	gws, err := f.gw.GatewayV1().Gateways(ns).List(f.ctx, metav1.ListOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	for _, o := range gws.Items {
		out["Gateway "+o.Name] = o.ResourceVersion
	}
	rs, err := f.gw.GatewayV1().HTTPRoutes(ns).List(f.ctx, metav1.ListOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	for _, o := range rs.Items {
		out["HTTPRoute "+o.Name] = o.ResourceVersion
	}
	ss, err := f.cs.CoreV1().Services(ns).List(f.ctx, metav1.ListOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	for _, o := range ss.Items {
		out["Service "+o.Name] = o.ResourceVersion
	}
	return out
}

// assertNoWrites runs change and checks that no status was rewritten.
func (f *fixture) assertNoWrites(ns string, change func()) {
	f.t.Helper()
	time.Sleep(time.Second) // let the last pass finish
	before := f.versions(ns)
	change()
	time.Sleep(2 * time.Second)
	after := f.versions(ns)
	for k, v := range before {
		if after[k] != v {
			f.t.Errorf("%s rewritten (resourceVersion %s -> %s)", k, v, after[k])
		}
	}
}

// Two control planes, one status writer at a time: the one taking over
// writes nothing that was already right, then keeps status current.
func TestFailoverWritesNoStatus(t *testing.T) {
	f := newFixture(t)
	if _, err := f.cs.CoreV1().Namespaces().Create(f.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "causeway-system"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	type replica struct {
		e      *leader.Elector
		cancel context.CancelFunc
		done   chan struct{}
	}
	start := func(id string) *replica {
		e, err := leader.New(leader.Options{Client: f.cs, Namespace: "causeway-system", Name: "status-failover", Identity: id,
			LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond, Logger: zaptest.NewLogger(t).Named(id)})
		if err != nil {
			t.Fatal(err)
		}
		w, err := New(Options{Client: f.cs, Gateways: f.gw, Logger: zaptest.NewLogger(t).Named(id)})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(f.ctx)
		r := &replica{e: e, cancel: cancel, done: make(chan struct{})}
		go func() {
			defer close(r.done)
			_ = e.Run(ctx, func(ctx context.Context) {
				if err := w.Run(ctx); err != nil {
					t.Errorf("%s: %v", id, err)
				}
			})
		}()
		t.Cleanup(func() { cancel(); <-r.done })
		return r
	}
	a := start("a")
	f.waitFor("a leads", func() (bool, error) { return a.e.Leading(), nil })
	b := start("b")
	f.sample("st-fo")
	f.waitFor("status written", func() (bool, error) {
		p := ourParent(f.route("st-fo", "r1"))
		return p != nil && cond(f.gateway("st-fo", "wp").Status.Conditions, "Programmed") != nil, nil
	})
	if b.e.Leading() {
		t.Fatal("both lead")
	}
	f.assertNoWrites("st-fo", func() {
		a.cancel()
		<-a.done
		f.waitFor("b leads", func() (bool, error) { return b.e.Leading(), nil })
	})
	// b is writing: a new route gets its status.
	f.create(`
kind: HTTPRoute
metadata: {name: after, namespace: st-fo}
spec:
  parentRefs: [{group: "", kind: Service, name: reviews}]
`)
	f.waitFor("b writes status", func() (bool, error) { return ourParent(f.route("st-fo", "after")) != nil, nil })
}

// A BackendTLSPolicy's ancestor (the Service it targets) says whether the
// mesh applies it and whether its CA certificate reference resolves, and
// follows the ConfigMap as it appears; a second policy for the same
// Service is Conflicted, one for a missing Service TargetNotFound.
func TestBackendTLSPolicyStatus(t *testing.T) {
	f := newFixture(t)
	f.startWriter()
	ca := trusttest.NewCA(t, "pay.example")
	f.create(`{apiVersion: v1, kind: Namespace, metadata: {name: tlsstatus}}`)
	f.create(`{apiVersion: v1, kind: Service, metadata: {name: pay, namespace: tlsstatus}, spec: {ports: [{name: https, port: 443}]}}`)
	policy := func(name, svc string) string {
		return `{apiVersion: gateway.networking.k8s.io/v1, kind: BackendTLSPolicy, metadata: {name: ` + name + `, namespace: tlsstatus},
		  spec: {targetRefs: [{group: "", kind: Service, name: ` + svc + `}],
		    validation: {hostname: pay.example, caCertificateRefs: [{group: "", kind: ConfigMap, name: pay-ca}]}}}`
	}
	f.create(policy("pay-tls", "pay"))
	ancestor := func(name string) *gwv1.PolicyAncestorStatus {
		p, err := f.gw.GatewayV1().BackendTLSPolicies("tlsstatus").Get(f.ctx, name, metav1.GetOptions{})
		if err != nil {
			f.t.Fatal(err)
		}
		for i := range p.Status.Ancestors {
			if a := &p.Status.Ancestors[i]; a.ControllerName == ControllerName {
				return a
			}
		}
		return nil
	}
	conditions := func(name string, accepted metav1.ConditionStatus, acceptedReason string, resolved metav1.ConditionStatus, resolvedReason string) func() (bool, error) {
		return func() (bool, error) {
			a := ancestor(name)
			return a != nil && string(a.AncestorRef.Name) == "pay" && ptrValue(a.AncestorRef.Kind) == "Service" &&
				is(cond(a.Conditions, "Accepted"), accepted, acceptedReason) && is(cond(a.Conditions, "ResolvedRefs"), resolved, resolvedReason), nil
		}
	}
	f.waitFor("missing CA ConfigMap reported", conditions("pay-tls", metav1.ConditionFalse, "NoValidCACertificate", metav1.ConditionFalse, "InvalidCACertificateRef"))
	if c := cond(ancestor("pay-tls").Conditions, "ResolvedRefs"); !strings.Contains(c.Message, "ConfigMap tlsstatus/pay-ca does not exist") {
		t.Errorf("ResolvedRefs message %q", c.Message)
	}
	pemData := strings.ReplaceAll(strings.TrimSpace(string(ca.Authority.RootsPEM())), "\n", "\\n")
	f.create(`{apiVersion: v1, kind: ConfigMap, metadata: {name: pay-ca, namespace: tlsstatus}, data: {ca.crt: "` + pemData + `"}}`)
	f.waitFor("accepted once the ConfigMap exists", conditions("pay-tls", metav1.ConditionTrue, "Accepted", metav1.ConditionTrue, "ResolvedRefs"))

	time.Sleep(1100 * time.Millisecond) // creation timestamps have a resolution of a second
	f.create(policy("pay-tls-2", "pay"))
	f.waitFor("the newer policy Conflicted", conditions("pay-tls-2", metav1.ConditionFalse, "Conflicted", metav1.ConditionTrue, "ResolvedRefs"))
	f.create(policy("lost", "nope"))
	f.waitFor("a missing Service is TargetNotFound", func() (bool, error) {
		a := ancestor("lost")
		return a != nil && is(cond(a.Conditions, "Accepted"), metav1.ConditionFalse, "TargetNotFound"), nil
	})
}

func ptrValue[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// A ConnectionPolicy the translation refuses (here past a CRD that takes
// anything; the mesh's schema refuses it at once) says so in its Accepted
// condition and a Warning event; one it takes, and the refused one once
// fixed, are Accepted. ResolvedRefs follows the policy set: false while it
// has no revision, true with its revision after Resync.
func TestConnectionPolicyStatus(t *testing.T) {
	env := kubetest.Start(t) // its own apiserver: the CRD is replaced
	env.DeleteCRD(t, kubetest.ConnectionPolicyCRD)
	env.InstallPermissiveConnectionPolicyCRD(t)
	f := fixtureOn(t, env)
	const ns = "st-connpolicy"
	f.create("apiVersion: v1\nkind: Namespace\nmetadata: {name: " + ns + "}\n")
	policies := env.Dynamic(t).Resource(config.ConnectionPolicyResource).Namespace(ns)
	policy := func(name, spec string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		f.decode("apiVersion: causeway.dev/v1alpha1\nkind: ConnectionPolicy\nmetadata: {name: "+name+", namespace: "+ns+"}\nspec: "+spec+"\n", &u.Object)
		return u
	}
	for name, spec := range map[string]string{
		"good": "{selector: {matchLabels: {app: db}}, policy: db}",
		"both": "{selector: {matchLabels: {app: db}}, targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: w}], policy: db}",
	} {
		if _, err := policies.Create(f.ctx, policy(name, spec), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var revision atomic.Value
	revision.Store("")
	w := f.startWriter(func(o *Options) {
		o.PolicySet = func(name string) (string, string) {
			if rev := revision.Load().(string); name == "db" && rev != "" {
				return rev, ""
			}
			return "", "policy set " + name + " has no good revision"
		}
	})
	condOf := func(name, typ string) *metav1.Condition {
		u, err := policies.Get(f.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var p config.ConnectionPolicy
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &p); err != nil {
			t.Fatal(err)
		}
		if c := cond(p.Status.Conditions, typ); c != nil && c.ObservedGeneration == p.Generation {
			return c
		}
		return nil
	}
	accepted := func(name string) *metav1.Condition { return condOf(name, "Accepted") }
	f.waitFor("ResolvedRefs false without a revision", func() (bool, error) {
		c := condOf("good", "ResolvedRefs")
		return is(c, metav1.ConditionFalse, "PolicySetNotActive") && strings.Contains(c.Message, "denies every connection it selects"), nil
	})
	revision.Store("r1")
	w.Resync()
	f.waitFor("ResolvedRefs true at the revision", func() (bool, error) {
		c := condOf("good", "ResolvedRefs")
		return is(c, metav1.ConditionTrue, "ResolvedRefs") && strings.Contains(c.Message, "r1"), nil
	})
	f.waitFor("good Accepted", func() (bool, error) { return is(accepted("good"), metav1.ConditionTrue, "Accepted"), nil })
	f.waitFor("both refused", func() (bool, error) {
		c := accepted("both")
		return is(c, metav1.ConditionFalse, "Invalid") && strings.Contains(c.Message, "spec.selector and spec.targetRefs are exclusive"), nil
	})
	f.waitFor("a Warning event on the refused policy", func() (bool, error) {
		evs, err := f.cs.CoreV1().Events(ns).List(f.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=both"})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Reason == "ConnectionPolicyRefused" && e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, "exclusive") {
				return true, nil
			}
		}
		return false, nil
	})
	fixed := policy("both", "{selector: {matchLabels: {app: db}}, policy: db}")
	cur, err := policies.Get(f.ctx, "both", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fixed.SetResourceVersion(cur.GetResourceVersion())
	if _, err := policies.Update(f.ctx, fixed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("the fixed policy Accepted", func() (bool, error) { return is(accepted("both"), metav1.ConditionTrue, "Accepted"), nil })
}
