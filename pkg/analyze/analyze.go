// Package analyze finds what will not work in a cluster's mesh
// configuration, from the status conditions the control plane's leader
// writes (pkg/gwstatus) and the waypoint bindings (meshctl analyze).
package analyze

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/causeway-mesh/causeway/pkg/config"
	"github.com/causeway-mesh/causeway/pkg/gwstatus"
)

// Clients are the API clients an analysis reads with.
type Clients struct {
	Kube    kubernetes.Interface
	Gateway gwclient.Interface
	Dynamic dynamic.Interface
}

// Run analyzes namespace ns ("" for every namespace; the GatewayClass and
// the waypoints named by bindings are read cluster-wide).
func Run(ctx context.Context, c Clients, ns string) ([]Finding, error) {
	a := &analyzer{c: c, ns: ns}
	if err := a.run(ctx); err != nil {
		return nil, err
	}
	return a.findings, nil
}

// Finding levels.
const (
	LevelError   = "Error"
	LevelWarning = "Warning"
)

// Finding is one thing that will not work as written.
type Finding struct {
	Level   string `json:"level"`
	Kind    string `json:"kind"`
	Object  string `json:"object"` // namespace/name, or name
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

type analyzer struct {
	c        Clients
	ns       string // "" for every namespace
	findings []Finding
	// waypoints are the Gateways of the waypoint class, "ns/name" ->
	// exists; other Gateways map to false.
	waypoints map[string]bool
}

func (a *analyzer) add(level, kind, ns, name, reason, format string, args ...any) {
	obj := name
	if ns != "" {
		obj = ns + "/" + name
	}
	a.findings = append(a.findings, Finding{Level: level, Kind: kind, Object: obj, Reason: reason, Message: fmt.Sprintf(format, args...)})
}

func (a *analyzer) run(ctx context.Context) error {
	if err := a.gatewayClass(ctx); err != nil {
		return err
	}
	if err := a.gateways(ctx); err != nil {
		return err
	}
	if err := a.routes(ctx); err != nil {
		return err
	}
	if err := a.bindings(ctx); err != nil {
		return err
	}
	return a.connectionPolicies(ctx)
}

func (a *analyzer) gatewayClass(ctx context.Context) error {
	gc, err := a.c.Gateway.GatewayV1().GatewayClasses().Get(ctx, config.WaypointClass, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		a.add(LevelError, "GatewayClass", "", config.WaypointClass, "NotFound", "no waypoint can be deployed: the control plane's leader creates this class (is the mesh installed?)")
		return nil
	}
	if err != nil {
		return fmt.Errorf("GatewayClass %s: %w", config.WaypointClass, err)
	}
	a.conditions("GatewayClass", "", gc.Name, gc.Generation, gc.Status.Conditions, string(gwv1.GatewayClassConditionStatusAccepted))
	return nil
}

// conditions reports each of the wanted condition types that is not
// True (missing: not yet written), and a status older than the object.
func (a *analyzer) conditions(kind, ns, name string, generation int64, conds []metav1.Condition, want ...string) {
	for _, t := range want {
		c := meta.FindStatusCondition(conds, t)
		switch {
		case c == nil:
			a.add(LevelWarning, kind, ns, name, "NoStatus", "no %s condition yet: the control plane's leader has not processed it (is it running?)", t)
		case c.Status != metav1.ConditionTrue:
			a.add(LevelError, kind, ns, name, c.Reason, "%s is %s: %s", t, c.Status, c.Message)
		case c.ObservedGeneration != 0 && c.ObservedGeneration < generation:
			a.add(LevelWarning, kind, ns, name, "StaleStatus", "%s was written for generation %d, the object is at %d: the control plane has not caught up", t, c.ObservedGeneration, generation)
		}
	}
}

func (a *analyzer) gateways(ctx context.Context) error {
	list, err := a.c.Gateway.GatewayV1().Gateways("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list Gateways: %w", err)
	}
	a.waypoints = map[string]bool{}
	for _, g := range list.Items {
		waypoint := string(g.Spec.GatewayClassName) == config.WaypointClass
		a.waypoints[g.Namespace+"/"+g.Name] = waypoint
		if !waypoint || !a.inScope(g.Namespace) {
			continue
		}
		a.conditions("Gateway", g.Namespace, g.Name, g.Generation, g.Status.Conditions,
			string(gwv1.GatewayConditionAccepted), string(gwv1.GatewayConditionProgrammed))
	}
	return nil
}

func (a *analyzer) inScope(ns string) bool { return a.ns == "" || a.ns == ns }

// routes reports the parents of HTTPRoutes and GRPCRoutes the mesh does
// not accept, or whose backends or waypoint do not work, as the status
// writer explains it.
func (a *analyzer) routes(ctx context.Context) error {
	https, err := a.c.Gateway.GatewayV1().HTTPRoutes(a.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list HTTPRoutes: %w", err)
	}
	for _, r := range https.Items {
		a.route("HTTPRoute", r.Namespace, r.Name, r.Generation, r.Spec.ParentRefs, r.Status.Parents)
	}
	grpcs, err := a.c.Gateway.GatewayV1().GRPCRoutes(a.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list GRPCRoutes: %w", err)
	}
	for _, r := range grpcs.Items {
		a.route("GRPCRoute", r.Namespace, r.Name, r.Generation, r.Spec.ParentRefs, r.Status.Parents)
	}
	return nil
}

func (a *analyzer) route(kind, ns, name string, generation int64, refs []gwv1.ParentReference, parents []gwv1.RouteParentStatus) {
	for _, ref := range refs {
		pns := ns
		if ref.Namespace != nil {
			pns = string(*ref.Namespace)
		}
		parent := pns + "/" + string(ref.Name)
		isService := ref.Kind != nil && *ref.Kind == "Service" && (ref.Group == nil || *ref.Group == "" || *ref.Group == "core")
		if !isService && !a.waypoints[parent] {
			continue // another controller's Gateway
		}
		what := "Service " + parent
		if !isService {
			what = "waypoint " + parent
		}
		var st *gwv1.RouteParentStatus
		for i := range parents {
			p := &parents[i]
			if p.ControllerName == gwstatus.ControllerName && sameParent(p.ParentRef, ref, ns) {
				st = p
				break
			}
		}
		if st == nil {
			a.add(LevelWarning, kind, ns, name, "NoStatus", "parent %s: no status from %s: the control plane's leader has not processed it (is it running?)", what, gwstatus.ControllerName)
			continue
		}
		for _, c := range st.Conditions {
			switch {
			case c.Status != metav1.ConditionTrue:
				a.add(LevelError, kind, ns, name, c.Reason, "parent %s: %s is %s: %s", what, c.Type, c.Status, c.Message)
			case c.ObservedGeneration != 0 && c.ObservedGeneration < generation:
				a.add(LevelWarning, kind, ns, name, "StaleStatus", "parent %s: %s was written for generation %d, the route is at %d", what, c.Type, c.ObservedGeneration, generation)
			}
		}
	}
}

// sameParent reports whether a status entry's parentRef is ref (a route's
// own namespace when none is named).
func sameParent(got, ref gwv1.ParentReference, routeNS string) bool {
	ns := func(r gwv1.ParentReference) string {
		if r.Namespace != nil {
			return string(*r.Namespace)
		}
		return routeNS
	}
	str := func(s *gwv1.SectionName) string {
		if s == nil {
			return ""
		}
		return string(*s)
	}
	port := func(p *gwv1.PortNumber) int32 {
		if p == nil {
			return 0
		}
		return int32(*p)
	}
	return got.Name == ref.Name && ns(got) == ns(ref) && str(got.SectionName) == str(ref.SectionName) && port(got.Port) == port(ref.Port)
}

// bindings reports namespaces, Services and pods bound (label
// causeway.dev/use-waypoint) to a waypoint that does not exist, and the
// Services the status writer says are not bound.
func (a *analyzer) bindings(ctx context.Context) error {
	// check: the object kind/ns/name (ns "" for a Namespace) in
	// namespace home, where its waypoint is unless it names another.
	check := func(kind, ns, name, home string, labels map[string]string) {
		wp := labels[config.LabelUseWaypoint]
		if wp == "" || wp == config.UseWaypointNone {
			return
		}
		wns := home
		if v := labels[config.LabelUseWaypointNamespace]; v != "" {
			wns = v
		}
		isWaypoint, exists := a.waypoints[wns+"/"+wp]
		switch {
		case !exists:
			a.add(LevelError, kind, ns, name, "WaypointNotFound", "bound (%s=%s) to waypoint %s/%s, which does not exist: its traffic is refused", config.LabelUseWaypoint, wp, wns, wp)
		case !isWaypoint:
			a.add(LevelError, kind, ns, name, "NotAWaypoint", "bound (%s=%s) to Gateway %s/%s, which is not of class %s: its traffic is refused", config.LabelUseWaypoint, wp, wns, wp, config.WaypointClass)
		}
	}
	sel := metav1.ListOptions{LabelSelector: config.LabelUseWaypoint}
	nss, err := a.c.Kube.CoreV1().Namespaces().List(ctx, sel)
	if err != nil {
		return fmt.Errorf("list namespaces: %w", err)
	}
	for _, n := range nss.Items {
		if a.inScope(n.Name) {
			check("Namespace", "", n.Name, n.Name, n.Labels)
		}
	}
	svcs, err := a.c.Kube.CoreV1().Services(a.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list services: %w", err)
	}
	for _, s := range svcs.Items {
		check("Service", s.Namespace, s.Name, s.Namespace, s.Labels)
		if c := meta.FindStatusCondition(s.Status.Conditions, gwstatus.ConditionWaypointBound); c != nil && c.Status != metav1.ConditionTrue {
			a.add(LevelError, "Service", s.Namespace, s.Name, c.Reason, "%s is %s: %s", c.Type, c.Status, c.Message)
		}
	}
	pods, err := a.c.Kube.CoreV1().Pods(a.ns).List(ctx, sel)
	if err != nil {
		return fmt.Errorf("list pods: %w", err)
	}
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning || p.Status.Phase == corev1.PodPending {
			check("Pod", p.Namespace, p.Name, p.Namespace, p.Labels)
		}
	}
	return nil
}

// connectionPolicies reports the ConnectionPolicies the control plane
// refuses or whose policy set is not active.
func (a *analyzer) connectionPolicies(ctx context.Context) error {
	list, err := a.c.Dynamic.Resource(config.ConnectionPolicyResource).Namespace(a.ns).List(ctx, metav1.ListOptions{})
	if apierrors.IsNotFound(err) {
		return nil // the CRD is not installed: there are none
	}
	if err != nil {
		return fmt.Errorf("list ConnectionPolicies: %w", err)
	}
	for _, item := range list.Items {
		var p config.ConnectionPolicy
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(item.Object, &p); err != nil {
			a.add(LevelError, "ConnectionPolicy", item.GetNamespace(), item.GetName(), "Unreadable", "%v", err)
			continue
		}
		a.conditions("ConnectionPolicy", p.Namespace, p.Name, p.Generation, p.Status.Conditions, "Accepted", "ResolvedRefs")
	}
	return nil
}
