package gwstatus

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/causeway-mesh/causeway/pkg/config"
	"github.com/causeway-mesh/causeway/pkg/config/kubesource"
)

// ingressGateway is an ingress Gateway of ours as one pass sees it: its
// listeners resolved (config.Listeners) and the routes attached to each.
type ingressGateway struct {
	gw        *gwv1.Gateway
	listeners []config.ListenerReport
	attached  []int32 // by listener
	addresses config.GatewayAddresses
}

// ingressGateways resolves the listeners of every Gateway of class
// causeway whose GatewayClass names the ingress controller, by "ns/name".
func (w *Writer) ingressGateways() map[string]*ingressGateway {
	out := map[string]*ingressGateway{}
	if c, err := w.classes.Get(config.IngressClass); err != nil || c.Spec.ControllerName != IngressControllerName {
		return out
	}
	grants := map[string][]*gwv1.ReferenceGrant{}
	rgs, _ := w.grants.List(labels.Everything())
	for _, g := range rgs {
		grants[g.Namespace] = append(grants[g.Namespace], g)
	}
	secrets := kubesource.SecretLookup(w.secrets)
	gws, _ := w.gateways.List(labels.Everything())
	for _, gw := range gws {
		if string(gw.Spec.GatewayClassName) != config.IngressClass {
			continue
		}
		ls := config.Listeners(gw, secrets, grants)
		out[gw.Namespace+"/"+gw.Name] = &ingressGateway{gw: gw, listeners: ls, attached: make([]int32, len(ls)),
			addresses: config.ResolveAddresses(gw, w.opts.Addresses, gws)}
	}
	return out
}

// ingressParent is a route's parentRef naming an ingress Gateway of ours:
// its index in spec.parentRefs and what attaching found.
type ingressParent struct {
	index   int
	reason  gwv1.RouteConditionReason
	message string
}

// attachRoute attaches a route's parentRefs that name ingress Gateways of
// ours, counting each listener's attached routes, and returns them.
func (w *Writer) attachRoute(ingress map[string]*ingressGateway, kind, ns string, refs []gwv1.ParentReference, hostnames []gwv1.Hostname) []ingressParent {
	var out []ingressParent
	for i, ref := range refs {
		if ref.Group != nil && *ref.Group != gwv1.GroupName || ref.Kind != nil && *ref.Kind != "Gateway" {
			continue
		}
		gns := ns
		if ref.Namespace != nil && *ref.Namespace != "" {
			gns = string(*ref.Namespace)
		}
		ig := ingress[gns+"/"+string(ref.Name)]
		if ig == nil {
			continue // no Gateway of ours: another controller's to answer
		}
		var nsLabels map[string]string
		if n, err := w.namespaces.Get(ns); err == nil {
			nsLabels = n.Labels
		}
		atts, reason, msg := config.Attach(ig.gw, ig.listeners, ref, kind, ns, nsLabels, hostnames)
		for _, a := range atts {
			ig.attach(a.Listener)
		}
		if len(atts) > 0 {
			names := make([]string, len(atts))
			for j, a := range atts {
				names[j] = string(a.Listener)
			}
			msg = fmt.Sprintf("attached to Gateway %s/%s, listeners %s", gns, ref.Name, strings.Join(names, ", "))
		}
		out = append(out, ingressParent{index: i, reason: reason, message: msg})
	}
	return out
}

// attachKubeIngresses counts each Kubernetes Ingress that the translation
// serves on an ingress Gateway of ours on the listeners it attaches to (a
// refused one nowhere): an Ingress is served as an HTTPRoute of its
// namespace, and counts as one.
func attachKubeIngresses(ingress map[string]*ingressGateway, rep *config.Reports) {
	for _, ir := range rep.Ingresses {
		if ig := ingress[ir.Gateway]; ig != nil {
			for _, l := range ir.Listeners {
				ig.attach(l)
			}
		}
	}
}

// attach counts a route attached to listener name.
func (ig *ingressGateway) attach(name gwv1.SectionName) {
	for j, l := range ig.gw.Spec.Listeners {
		if l.Name == name {
			ig.attached[j]++
		}
	}
}

// ingressRouteConditions are a route's conditions for one ingress Gateway
// parent: Accepted with Attach's reason (or the route's own refusal), and
// ResolvedRefs for its backends.
func ingressRouteConditions(rr *config.RouteReport, p ingressParent, gen int64) []metav1.Condition {
	if rr == nil {
		rr = &config.RouteReport{}
	}
	accepted, refused := routeRefused(rr, "gateway", gen)
	if p.reason != gwv1.RouteReasonAccepted || !refused {
		accepted = condition(string(gwv1.RouteConditionAccepted), p.reason == gwv1.RouteReasonAccepted, string(p.reason), p.message, gen)
	}
	return []metav1.Condition{accepted, resolvedRefs(rr, gen)}
}

// syncIngress writes an ingress Gateway's status: Accepted (ListenersNotValid
// when some listeners cannot serve, false when none can), Programmed once
// a pod of its Deployment is ready and its Service holds every static
// address it names (AddressNotUsable), its addresses, and each listener's
// Accepted, Conflicted, ResolvedRefs and Programmed with the routes
// attached to it.
func (w *Writer) syncIngress(ctx context.Context, ig *ingressGateway) error {
	gw := ig.gw
	gen := gw.Generation
	serving, invalid := 0, []string{}
	for i, l := range ig.listeners {
		if l.Serves() {
			serving++
			continue
		}
		invalid = append(invalid, string(gw.Spec.Listeners[i].Name))
	}
	accType := string(gwv1.GatewayConditionAccepted)
	var acc metav1.Condition
	rejected, rejectedWhy := config.GatewayRejection(gw, w.opts.Addresses)
	switch {
	case rejected != "":
		acc = condition(accType, false, string(rejected), rejectedWhy, gen)
	case serving == 0:
		acc = condition(accType, false, string(gwv1.GatewayReasonListenersNotValid), "no listener can serve: "+strings.Join(invalid, ", "), gen)
	case len(invalid) > 0:
		acc = condition(accType, true, string(gwv1.GatewayReasonListenersNotValid),
			"listeners that cannot serve (their status says why): "+strings.Join(invalid, ", ")+"; the others serve", gen)
	default:
		acc = condition(accType, true, string(gwv1.GatewayReasonAccepted), "an ingress gateway", gen)
	}
	accepted := acc.Status == metav1.ConditionTrue
	ready, total, why := w.gatewayPods(gw, "ingress gateway")
	progType := string(gwv1.GatewayConditionProgrammed)
	prog := condition(progType, true, string(gwv1.GatewayReasonProgrammed), fmt.Sprintf("%d of %d gateway pods ready", ready, total), gen)
	addresses := w.ingressAddresses(gw)
	unheld := notHeld(ig.addresses.Usable, addresses)
	switch {
	case !accepted:
		prog = condition(progType, false, string(gwv1.GatewayReasonInvalid), "the Gateway is not accepted", gen)
	case len(ig.addresses.Unusable) > 0:
		prog = condition(progType, false, string(gwv1.GatewayReasonAddressNotUsable),
			"spec.addresses: "+strings.Join(ig.addresses.Unusable, "; ")+" (remove the address, or ask the operator for one of the allowed ones)", gen)
	case ready == 0:
		prog = condition(progType, false, string(gwv1.GatewayReasonPending), why, gen)
	case len(unheld) > 0:
		prog = condition(progType, false, string(gwv1.GatewayReasonAddressNotUsable),
			fmt.Sprintf("the gateway's Service does not hold %s in its externalIPs (yet: the deployer's events on the Gateway say why not)", strings.Join(unheld, ", ")), gen)
	}
	st := gw.Status.DeepCopy()
	st.Conditions = setConditions(gw.Status.Conditions, acc, prog)
	st.Addresses = addresses
	programmed := prog.Status == metav1.ConditionTrue
	st.Listeners = nil
	for i, l := range ig.listeners {
		var cur []metav1.Condition
		for _, ls := range gw.Status.Listeners {
			if ls.Name == l.Name {
				cur = ls.Conditions
			}
		}
		conflict := condition(string(gwv1.ListenerConditionConflicted), false, string(gwv1.ListenerReasonNoConflicts), "", gen)
		if l.Conflicted {
			conflict = condition(string(gwv1.ListenerConditionConflicted), true, string(l.ConflictedReason),
				"another listener shares its port with another protocol or the same hostname", gen)
		}
		lprog := condition(string(gwv1.ListenerConditionProgrammed), true, string(gwv1.ListenerReasonProgrammed), "", gen)
		switch {
		case !l.Serves():
			lprog = condition(string(gwv1.ListenerConditionProgrammed), false, string(gwv1.ListenerReasonInvalid), "the listener cannot serve", gen)
		case !programmed:
			lprog = condition(string(gwv1.ListenerConditionProgrammed), false, string(gwv1.ListenerReasonPending), prog.Message, gen)
		}
		refsMsg := ""
		if !l.ResolvedRefs {
			refsMsg = l.Message
		}
		accMsg := ""
		if !l.Accepted {
			accMsg = l.Message
		}
		lc := []metav1.Condition{
			condition(string(gwv1.ListenerConditionAccepted), l.Accepted, string(l.AcceptedReason), accMsg, gen),
			conflict,
			condition(string(gwv1.ListenerConditionResolvedRefs), l.ResolvedRefs, string(l.RefsReason), refsMsg, gen),
			lprog,
		}
		kinds := l.SupportedKinds
		if kinds == nil {
			kinds = []gwv1.RouteGroupKind{}
		}
		st.Listeners = append(st.Listeners, gwv1.ListenerStatus{Name: l.Name, SupportedKinds: kinds,
			AttachedRoutes: ig.attached[i], Conditions: setConditions(cur, lc...)})
	}
	return w.writeGatewayStatus(ctx, gw, st)
}

// ingressAddresses are where clients reach an ingress Gateway: the static
// addresses of its spec its Service holds (as externalIPs), and when it
// names none or asks for an address without a value too, the one the
// cluster assigned, as Istio reports it: the Service's load-balancer
// ingress (IPs and host names) once a load balancer has set it, else its
// cluster IPs (a LoadBalancer Service whose load balancer is pending, or a
// ClusterIP or NodePort Service).
func (w *Writer) ingressAddresses(gw *gwv1.Gateway) []gwv1.GatewayStatusAddress {
	s := w.gatewayService(gw)
	if s == nil {
		return nil
	}
	ipType, hostType := gwv1.IPAddressType, gwv1.HostnameAddressType
	var out []gwv1.GatewayStatusAddress
	for _, a := range config.StaticAddresses(gw) {
		if slices.Contains(s.Spec.ExternalIPs, a.String()) {
			out = append(out, gwv1.GatewayStatusAddress{Type: &ipType, Value: a.String()})
		}
	}
	if !config.AssignedAddress(gw) {
		return out
	}
	static := len(out)
	for _, in := range s.Status.LoadBalancer.Ingress {
		switch {
		case in.IP != "":
			out = append(out, gwv1.GatewayStatusAddress{Type: &ipType, Value: in.IP})
		case in.Hostname != "":
			out = append(out, gwv1.GatewayStatusAddress{Type: &hostType, Value: in.Hostname})
		}
	}
	if len(out) > static {
		return out
	}
	return append(out, clusterIPs(s)...)
}

// notHeld are the addresses of want missing from have.
func notHeld(want []string, have []gwv1.GatewayStatusAddress) []string {
	var out []string
	for _, a := range want {
		if !slices.ContainsFunc(have, func(h gwv1.GatewayStatusAddress) bool { return h.Value == a }) {
			out = append(out, a)
		}
	}
	return out
}

// gatewayService is the Service the deployer made for gw, or nil.
func (w *Writer) gatewayService(gw *gwv1.Gateway) *corev1.Service {
	s, err := w.services.Services(gw.Namespace).Get(gw.Name)
	if err != nil {
		return nil
	}
	if ref := metav1.GetControllerOf(s); ref == nil || ref.UID != gw.UID {
		return nil
	}
	return s
}
