package config

import (
	"fmt"
	"sort"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// Reports is what translating a set of objects found about each route and
// Service, for whoever writes their status: an object's status tells its
// own story (why it was refused), not the whole configuration's.
type Reports struct {
	// Routes by "HTTPRoute ns/name" or "GRPCRoute ns/name".
	Routes map[string]*RouteReport
	// Problems by object ("Kind ns/name"); a route's parentRefs are in its RouteReport.
	Problems map[string][]string
	// Services by "ns/name": the waypoint each Service with a
	// use-waypoint label (its own or its namespace's) is bound to.
	Services map[string]WaypointBinding
	// Ingresses by "ns/name": every Kubernetes Ingress of an IngressClass
	// of ours whose Gateway exists.
	Ingresses map[string]IngressReport
	// BackendTLSPolicies by "ns/name": one entry per targetRef.
	BackendTLSPolicies map[string][]PolicyAncestor
	// Err is what Translate returns for the same objects: set only when
	// they are not a configuration at all.
	Err error
}

// RouteReport is one route's translation.
type RouteReport struct {
	// Parents lists the route's Service parentRefs, in spec order.
	Parents []ParentReport
	// Problems are reasons the mesh rejects the route itself.
	Problems []string
	// Unsupported names filters the mesh cannot carry out; the rules or
	// backends holding them answer 500.
	Unsupported []string
	// Refs are backend references that do not resolve; their share of
	// requests answers 500.
	Refs []RefIssue
}

// ParentReport is one Service parentRef of a route.
type ParentReport struct {
	Index   int    // in spec.parentRefs
	Problem string // why it does not resolve; empty when it does
	// Service is the "ns/name" the parentRef resolved to (Problem empty);
	// Reports.Services says which waypoint, if any, serves it.
	Service string
}

// RefIssue is a backend reference that does not resolve, with the Gateway
// API reason for the route's ResolvedRefs condition.
type RefIssue struct {
	Reason  gwv1.RouteConditionReason
	Message string
}

// IngressReport is where a Kubernetes Ingress is served.
type IngressReport struct {
	// Gateway is the "ns/name" of the ingress Gateway serving it, or ""
	// when it is refused (Problems).
	Gateway string
	// Listeners are the Gateway's listeners it attaches to, as an
	// HTTPRoute of its namespace would (those whose certificates do not
	// resolve too: they count it in attachedRoutes), by name.
	Listeners []gwv1.SectionName
}

// WaypointBinding is what a Service's use-waypoint label resolves to.
type WaypointBinding struct {
	Waypoint string // "ns/name" of the waypoint named
	Problem  string // why the Service is not bound to it; empty when it is
}

// Analyze translates objs as Translate does and reports on every route and
// waypoint-labelled Service.
func Analyze(objs []Object, opts Options) *Reports {
	t := newTranslator(opts)
	t.reports = &Reports{Routes: map[string]*RouteReport{}, Problems: map[string][]string{}, Services: map[string]WaypointBinding{},
		BackendTLSPolicies: map[string][]PolicyAncestor{}, Ingresses: map[string]IngressReport{}}
	t.run(objs)
	t.reports.Err = t.fatal.err()
	t.reportServiceBindings()
	return t.reports
}

// CheckRoute runs the translation's checks of one HTTPRoute or GRPCRoute on
// its own: the checks of its matches, filters, timeouts and retries, which do
// not depend on other objects. It returns why the mesh would reject the
// route or answer some of its requests with 500; nil when it would not.
// References are not checked: their targets may be created later.
func CheckRoute(route any) []string {
	t := newTranslator(Options{})
	t.reports = &Reports{Routes: map[string]*RouteReport{}}
	var obj string
	switch r := route.(type) {
	case *gwv1.HTTPRoute:
		obj = checkRules(t, "HTTPRoute", &r.ObjectMeta, r.Spec.Rules, t.httpRule)
	case *gwv1.GRPCRoute:
		obj = checkRules(t, "GRPCRoute", &r.ObjectMeta, r.Spec.Rules, t.grpcRule)
	default:
		return []string{fmt.Sprintf("not a route: %T", route)}
	}
	rep := t.reports.Routes[obj]
	return append(rep.Problems, rep.Unsupported...)
}

// checkRules translates a route's rules for CheckRoute and returns the
// route's report name.
func checkRules[GR, R any](t *translator, kind string, m *metav1.ObjectMeta, rules []GR, rule func(routeCtx, int, GR) R) string {
	c := newRouteCtx("admission", kind, m)
	t.reports.route(c.obj)
	for i, r := range rules {
		rule(c, i, r)
	}
	return c.obj
}

// route returns the report of the route named by a problem's object, or nil
// when no reports are kept or the object is no route.
func (r *Reports) route(object string) *RouteReport {
	if r == nil || r.Routes == nil {
		return nil
	}
	if rep := r.Routes[object]; rep != nil {
		return rep
	}
	if len(object) < len("HTTPRoute ") || (object[:len("HTTPRoute ")] != "HTTPRoute " && object[:len("GRPCRoute ")] != "GRPCRoute ") {
		return nil
	}
	rep := &RouteReport{}
	r.Routes[object] = rep
	return rep
}

func (r *RouteReport) addParent(i int, problem, service string) {
	if r != nil {
		r.Parents = append(r.Parents, ParentReport{Index: i, Problem: problem, Service: service})
	}
}

// parentProblem refuses a parentRef that does not resolve: the route is not
// attached to that parent, and the problem is that parent's rather than the
// route's.
func (t *translator) parentProblem(c routeCtx, i int, format string, args ...any) {
	t.ps.add(c.origin, c.obj, "parentRefs[%d]: %s", i, fmt.Sprintf(format, args...))
	t.reports.route(c.obj).addParent(i, fmt.Sprintf(format, args...), "")
}

// unsupported reports a filter the mesh cannot carry out and returns reason.
func (t *translator) unsupported(c routeCtx, where, reason string) string {
	if r := t.reports.route(c.obj); r != nil {
		r.Unsupported = append(r.Unsupported, where+": "+reason)
	}
	return reason
}

// invalidRef marks a backend reference that does not resolve.
func (t *translator) invalidRef(c routeCtx, b *meshv1.BackendRef, reason gwv1.RouteConditionReason, format string, args ...any) {
	b.InvalidReason = fmt.Sprintf(format, args...)
	if r := t.reports.route(c.obj); r != nil {
		r.Refs = append(r.Refs, RefIssue{Reason: reason, Message: b.InvalidReason})
	}
}

// reportServiceBindings records, for every Service whose own or namespace's
// label names a waypoint, whether it is bound to it.
func (t *translator) reportServiceBindings() {
	ids := append([]nsName(nil), t.svcOrder...)
	sort.Slice(ids, func(i, j int) bool { return ids[i].String() < ids[j].String() })
	for _, id := range ids {
		s := t.services[id]
		ref, g := t.resolveWaypoint(s.svc.Labels, id.ns)
		if ref == nil {
			continue
		}
		b := WaypointBinding{Waypoint: ref.String()}
		switch why := t.bindingProblem(ref, id.ns); {
		case why != "":
			b.Problem = why + "; the Service's traffic is refused"
		case g.out.WaypointFor == meshv1.WaypointForWorkload:
			b.Problem = fmt.Sprintf("waypoint %s serves workload traffic only (label %s=%s)", ref, LabelWaypointFor, g.out.WaypointFor)
		case s.out == nil:
			b.Problem = fmt.Sprintf("an %s Service is not part of the mesh", s.svc.Spec.Type)
		}
		t.reports.Services[id.String()] = b
	}
}
