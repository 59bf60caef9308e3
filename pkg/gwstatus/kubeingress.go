package gwstatus

import (
	"context"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/causeway-mesh/causeway/pkg/config"
)

// syncKubeIngress writes the status of a Kubernetes Ingress of an
// IngressClass of ours (rep.Ingresses): status.loadBalancer.ingress are
// the addresses of the ingress Gateway serving it (ingressAddresses), none
// while it is refused; a refusal is a Warning event, once per change of
// its reasons. Another controller's Ingresses are left alone.
func (w *Writer) syncKubeIngress(ctx context.Context, ing *networkingv1.Ingress, rep *config.Reports) error {
	key := ing.Namespace + "/" + ing.Name
	ir, ours := rep.Ingresses[key]
	if !ours {
		delete(w.ingressProblems, key)
		return nil
	}
	problem := strings.Join(rep.Problems["Ingress "+key], "; ")
	if problem != "" && w.ingressProblems[key] != problem {
		w.recorder.Event(ing, corev1.EventTypeWarning, "IngressRefused", problem)
	}
	w.ingressProblems[key] = problem
	var want []networkingv1.IngressLoadBalancerIngress
	if ns, name, ok := strings.Cut(ir.Gateway, "/"); ok {
		if gw, err := w.gateways.Gateways(ns).Get(name); err == nil {
			for _, a := range w.ingressAddresses(gw) {
				if a.Type != nil && *a.Type == gwv1.HostnameAddressType {
					want = append(want, networkingv1.IngressLoadBalancerIngress{Hostname: a.Value})
				} else {
					want = append(want, networkingv1.IngressLoadBalancerIngress{IP: a.Value})
				}
			}
		}
	}
	if equality.Semantic.DeepEqual(want, ing.Status.LoadBalancer.Ingress) || len(want) == 0 && len(ing.Status.LoadBalancer.Ingress) == 0 {
		return nil
	}
	up := ing.DeepCopy()
	up.Status.LoadBalancer.Ingress = want
	_, err := w.opts.Client.NetworkingV1().Ingresses(ing.Namespace).UpdateStatus(ctx, up, metav1.UpdateOptions{FieldManager: "causeway"})
	return ignoreGone(err)
}
