package analyze

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/causeway-mesh/causeway/pkg/config"
	"github.com/causeway-mesh/causeway/pkg/gwstatus"
	"github.com/causeway-mesh/causeway/pkg/internal/kubetest"
)

// analyze on a real API server: what it reports comes from the status
// conditions and the bindings as the objects hold them, and what works
// is not reported.
func TestAnalyzeReportsWhatWillNotWork(t *testing.T) {
	env := kubetest.Start(t)
	ctx := context.Background()
	cs, gw := env.Clientset(t), env.Gateway(t)
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	accepted := func(t string, ok bool, reason, msg string) metav1.Condition {
		s := metav1.ConditionTrue
		if !ok {
			s = metav1.ConditionFalse
		}
		return metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg, LastTransitionTime: metav1.Now(), ObservedGeneration: 1}
	}

	gc, err := gw.GatewayV1().GatewayClasses().Create(ctx, &gwv1.GatewayClass{ObjectMeta: metav1.ObjectMeta{Name: config.WaypointClass},
		Spec: gwv1.GatewayClassSpec{ControllerName: gwstatus.ControllerName}}, metav1.CreateOptions{})
	must(gc, err)
	gc.Status.Conditions = []metav1.Condition{accepted("Accepted", true, "Accepted", "")}
	must(gw.GatewayV1().GatewayClasses().UpdateStatus(ctx, gc, metav1.UpdateOptions{}))

	// shop: a programmed waypoint, a Service bound to it, and a route
	// whose backend does not exist; lost: bound to a waypoint that is not there.
	for _, ns := range []*corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{config.LabelUseWaypoint: "waypoint"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "lost", Labels: map[string]string{config.LabelUseWaypoint: "gone"}}},
	} {
		must(cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}))
	}
	g, err := gw.GatewayV1().Gateways("shop").Create(ctx, &gwv1.Gateway{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "waypoint"},
		Spec: gwv1.GatewaySpec{GatewayClassName: config.WaypointClass, Listeners: []gwv1.Listener{{Name: "mesh", Port: 15008, Protocol: "HBONE"}}}}, metav1.CreateOptions{})
	must(g, err)
	g.Status.Conditions = []metav1.Condition{accepted("Accepted", true, "Accepted", ""), accepted("Programmed", true, "Programmed", "")}
	must(gw.GatewayV1().Gateways("shop").UpdateStatus(ctx, g, metav1.UpdateOptions{}))
	must(cs.CoreV1().Services("shop").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "reviews"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{}))
	svcKind, port := gwv1.Kind("Service"), gwv1.PortNumber(80)
	group := gwv1.Group("")
	ref := gwv1.ParentReference{Group: &group, Kind: &svcKind, Name: "reviews", Port: &port}
	route := func(name string, resolved bool) {
		t.Helper()
		r, err := gw.GatewayV1().HTTPRoutes("shop").Create(ctx, &gwv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name},
			Spec: gwv1.HTTPRouteSpec{CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{ref}}}}, metav1.CreateOptions{})
		must(r, err)
		refs := accepted("ResolvedRefs", true, "ResolvedRefs", "all references resolve")
		if !resolved {
			refs = accepted("ResolvedRefs", false, "BackendNotFound", "Service shop/missing not found")
		}
		r.Status.Parents = []gwv1.RouteParentStatus{{ParentRef: ref, ControllerName: gwstatus.ControllerName,
			Conditions: []metav1.Condition{accepted("Accepted", true, "Accepted", "attached"), refs}}}
		must(gw.GatewayV1().HTTPRoutes("shop").UpdateStatus(ctx, r, metav1.UpdateOptions{}))
	}
	route("good", true)
	route("broken", false)

	findings, err := Run(ctx, Clients{Kube: cs, Gateway: gw, Dynamic: env.Dynamic(t)}, "")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"HTTPRoute shop/broken": "BackendNotFound: parent Service shop/reviews: ResolvedRefs is False: Service shop/missing not found",
		"Namespace lost":        "WaypointNotFound: bound (causeway.dev/use-waypoint=gone) to waypoint lost/gone, which does not exist",
	}
	for _, f := range findings {
		key := f.Kind + " " + f.Object
		w, ok := want[key]
		if !ok {
			t.Errorf("unexpected finding %+v", f)
			continue
		}
		if got := f.Reason + ": " + f.Message; f.Level != LevelError || !strings.HasPrefix(got, w) {
			t.Errorf("%s: %s %q, want Error %q", key, f.Level, got, w)
		}
		delete(want, key)
	}
	for k := range want {
		t.Errorf("not reported: %s", k)
	}
}
