package gwstatus

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A Kubernetes Ingress of an IngressClass of ours gets the address of the
// ingress Gateway serving it (the Gateway's Service's cluster IP, then its
// load balancer's), written as the control plane's ServiceAccount; a
// refused one gets a Warning event naming why and no address; another
// controller's Ingress is left alone. The served one counts in the
// attachedRoutes of the listener it attaches to.
func TestKubeIngressStatus(t *testing.T) {
	const ns, app = "st-ki", "st-ki-app"
	f := newFixture(t)
	f.startWriter()
	f.create("kind: GatewayClass\nmetadata: {name: causeway}\nspec: {controllerName: causeway.dev/gateway-controller}\n")
	for _, n := range []string{ns, app} {
		f.create("kind: Namespace\nmetadata: {name: " + n + "}\n")
	}
	f.create(`
kind: Gateway
metadata: {name: public, namespace: st-ki}
spec:
  gatewayClassName: causeway
  listeners:
  - {name: http, port: 80, protocol: HTTP, allowedRoutes: {namespaces: {from: All}}}
  - {name: same, port: 8080, protocol: HTTP}
`)
	f.create(`
kind: IngressClass
metadata: {name: causeway-st-ki}
spec:
  controller: causeway.dev/ingress-controller
  parameters: {apiGroup: gateway.networking.k8s.io, kind: Gateway, scope: Namespace, namespace: st-ki, name: public}
`)
	f.create("kind: IngressClass\nmetadata: {name: other-st-ki}\nspec: {controller: example.com/ingress}\n")
	ingress := func(name, class, backend string) string {
		return "kind: Ingress\nmetadata: {name: " + name + ", namespace: st-ki-app}\nspec:\n  ingressClassName: " + class + "\n  defaultBackend: " + backend + "\n"
	}
	f.create(ingress("web", "causeway-st-ki", "{service: {name: web, port: {number: 80}}}"))
	f.create(ingress("bucket", "causeway-st-ki", "{resource: {apiGroup: x.example.com, kind: Bucket, name: b}}"))
	f.create(ingress("foreign", "other-st-ki", "{service: {name: web, port: {number: 80}}}"))

	svc := f.ingressDeployment(f.gateway(ns, "public"), 1)
	lb := func(name string) []string {
		ing, err := f.cs.NetworkingV1().Ingresses(app).Get(f.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, in := range ing.Status.LoadBalancer.Ingress {
			out = append(out, in.IP+in.Hostname)
		}
		return out
	}
	f.waitFor("the Gateway's cluster IP on the Ingress", func() (bool, error) {
		a := lb("web")
		return len(a) == 1 && a[0] == svc.Spec.ClusterIP, nil
	})
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.20"}, {Hostname: "public.lb.example.com"}}
	if _, err := f.cs.CoreV1().Services(ns).UpdateStatus(f.ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("the load balancer's addresses on the Ingress", func() (bool, error) {
		a := lb("web")
		return len(a) == 2 && a[0] == "192.0.2.20" && a[1] == "public.lb.example.com", nil
	})
	f.waitFor("a Warning event on the refused Ingress", func() (bool, error) {
		evs, err := f.cs.CoreV1().Events(app).List(f.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=bucket"})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Type == corev1.EventTypeWarning && e.Reason == "IngressRefused" && strings.Contains(e.Message, "resource backends are not supported") {
				return true, nil
			}
		}
		return false, nil
	})
	if a, b := lb("bucket"), lb("foreign"); len(a) > 0 || len(b) > 0 {
		t.Errorf("the refused Ingress has addresses %v, another controller's %v", a, b)
	}
	// The served Ingress attaches to the listener admitting its namespace,
	// as an HTTPRoute of st-ki-app would, and counts there; the refused
	// one, another controller's, and the listener of st-ki only, do not.
	f.waitFor("the served Ingress alone in the listener's attachedRoutes", func() (bool, error) {
		gw := f.gateway(ns, "public")
		h, s := listenerStatus(gw, "http"), listenerStatus(gw, "same")
		return h != nil && s != nil && h.AttachedRoutes == 1 && s.AttachedRoutes == 0, nil
	})
}
