// Package admission is the control plane's validating admission webhook: it
// refuses, when an object is applied, what the translation (pkg/config)
// would otherwise only report later, with the translation's own words:
//
//   - an HTTPRoute or GRPCRoute for the mesh (a Service parentRef) whose
//     matches, filters, timeouts or retries the mesh rejects or cannot
//     carry out (config.CheckRoute);
//   - a Namespace, Service or Pod whose causeway.dev/use-waypoint names a
//     waypoint in another namespace that does not admit it (config.WaypointAdmits);
//   - a Pod running as a waypoint's service account that is not one of the
//     waypoint's own: it could obtain the waypoint's certificate;
//   - a ConnectionPolicy the translation refuses (config.CheckConnectionPolicy),
//     or whose policy set this control plane cannot enforce (not loaded, or
//     no revision that compiled and passed its tests: Options.PolicySet, the
//     same answer as the policy's ResolvedRefs status). Either would deny
//     every connection the policy selects;
//   - a BackendTLSPolicy whose validation, options or reference kinds the
//     mesh refuses (config.CheckBackendTLSPolicy): its waypoints would
//     refuse the traffic it applies to.
//
// References to objects that do not exist (yet) are not refused: objects
// are applied in any order, and the status reports what stays dangling.
//
// The webhook has no side effects (sideEffects: None) and is served by every
// control plane replica over TLS from the mesh CA. Its failure policy
// differs by webhook (see Configuration): Fail for routes and policies, whose
// edits can wait for the control plane; Ignore for workloads, so that a control plane
// outage never stops pods from starting cluster-wide. Ignoring loses only
// the early message: the translation refuses the same bindings and
// identities, so nothing unsafe is served either way.
package admission

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	networkingv1beta1 "k8s.io/api/networking/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	corelisters "k8s.io/client-go/listers/core/v1"
	networkinglisters "k8s.io/client-go/listers/networking/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwlisters "sigs.k8s.io/gateway-api/pkg/client/listers/apis/v1"

	"github.com/causeway-mesh/causeway/pkg/config"
	"github.com/causeway-mesh/causeway/pkg/config/kubesource"
)

// Path is where the webhook is served.
const Path = "/validate"

// maxReviewBytes bounds a request: an AdmissionReview carries an object and
// its old version, each at most the apiserver's 3 MiB request limit.
const maxReviewBytes = 8 << 20

// Options configure a Webhook.
type Options struct {
	// Gateways, Namespaces and IngressClasses are informer listers of the
	// cluster's objects.
	Gateways       gwlisters.GatewayLister
	Namespaces     corelisters.NamespaceLister
	IngressClasses networkinglisters.IngressClassLister
	// PolicySet says whether the control plane can enforce a connection
	// policy set: its active revision, or why not. Nil: sets are not checked.
	PolicySet  func(name string) (revision, problem string)
	Logger     *zap.Logger
	Registerer prometheus.Registerer // optional
}

// Webhook answers AdmissionReviews. It is safe for concurrent use.
type Webhook struct {
	opts    Options
	reviews *prometheus.CounterVec
}

// New builds a Webhook.
func New(o Options) (*Webhook, error) {
	if o.Gateways == nil || o.Namespaces == nil || o.IngressClasses == nil || o.Logger == nil {
		return nil, errors.New("admission: Gateways, Namespaces, IngressClasses and Logger are required")
	}
	w := &Webhook{opts: o, reviews: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "causeway_admission_reviews_total",
		Help: "Admission reviews answered, by kind of object and whether it was allowed.",
	}, []string{"kind", "allowed"})}
	if o.Registerer != nil {
		if err := o.Registerer.Register(w.reviews); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// ServeHTTP reads one AdmissionReview (admission.k8s.io/v1) and answers it.
func (w *Webhook) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(rw, "POST an AdmissionReview", http.StatusMethodNotAllowed)
		return
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		http.Error(rw, "want Content-Type application/json, got "+ct, http.StatusUnsupportedMediaType)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(rw, r.Body, maxReviewBytes))
	if err != nil {
		http.Error(rw, "reading the review: "+err.Error(), http.StatusRequestEntityTooLarge)
		return
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
		http.Error(rw, fmt.Sprintf("not an AdmissionReview with a request: %v", err), http.StatusBadRequest)
		return
	}
	if review.APIVersion != admissionv1.SchemeGroupVersion.String() {
		http.Error(rw, "want admission.k8s.io/v1, got "+review.APIVersion, http.StatusBadRequest)
		return
	}
	resp := w.Review(review.Request)
	out, err := json.Marshal(admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp})
	if err != nil {
		http.Error(rw, err.Error(), http.StatusInternalServerError)
		return
	}
	rw.Header().Set("Content-Type", "application/json")
	_, _ = rw.Write(out)
}

// Review decides one request.
func (w *Webhook) Review(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	var reasons []string
	var err error
	if req.Operation == admissionv1.Create || req.Operation == admissionv1.Update {
		reasons, err = w.check(req)
	}
	kind := req.Kind.Kind
	switch {
	case err != nil:
		// An object the apiserver sent that does not decode: refuse rather than
		// let an unchecked object in (the apiserver decoded it, so this is a bug).
		resp.Allowed = false
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusBadRequest, Reason: metav1.StatusReasonBadRequest,
			Message: fmt.Sprintf("causeway: %s %s: %v", kind, objectName(req), err)}
	case len(reasons) > 0:
		resp.Allowed = false
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusForbidden, Reason: metav1.StatusReasonForbidden,
			Message: fmt.Sprintf("causeway: %s %s: %s", kind, objectName(req), strings.Join(reasons, "; "))}
	}
	if !resp.Allowed {
		w.opts.Logger.Info("admission refused", zap.String("kind", kind), zap.String("object", objectName(req)),
			zap.String("user", req.UserInfo.Username), zap.String("reason", resp.Result.Message))
	}
	w.reviews.WithLabelValues(kind, fmt.Sprint(resp.Allowed)).Inc()
	return resp
}

func objectName(req *admissionv1.AdmissionRequest) string {
	if req.Namespace == "" {
		return req.Name
	}
	return req.Namespace + "/" + req.Name
}

func (w *Webhook) check(req *admissionv1.AdmissionRequest) ([]string, error) {
	gk := req.Kind.Group + "/" + req.Kind.Kind
	switch gk {
	case gwv1.GroupName + "/HTTPRoute":
		var r gwv1.HTTPRoute
		return decodeRoute(req, &r, &r.Spec.ParentRefs)
	case gwv1.GroupName + "/GRPCRoute":
		var r gwv1.GRPCRoute
		return decodeRoute(req, &r, &r.Spec.ParentRefs)
	case "/Namespace":
		var n corev1.Namespace
		if err := json.Unmarshal(req.Object.Raw, &n); err != nil {
			return nil, err
		}
		return w.checkUseWaypoint(n.Name, n.Labels, n.Labels), nil
	case "/Service":
		var s corev1.Service
		if err := json.Unmarshal(req.Object.Raw, &s); err != nil {
			return nil, err
		}
		return w.checkUseWaypoint(req.Namespace, s.Labels, w.namespaceLabels(req.Namespace)), nil
	case "/Pod":
		var p corev1.Pod
		if err := json.Unmarshal(req.Object.Raw, &p); err != nil {
			return nil, err
		}
		return append(w.checkUseWaypoint(req.Namespace, p.Labels, w.namespaceLabels(req.Namespace)), w.checkPodIdentity(req.Namespace, &p)...), nil
	case config.CausewayGroupVersion.Group + "/ConnectionPolicy":
		var u unstructured.Unstructured
		if err := u.UnmarshalJSON(req.Object.Raw); err != nil {
			return nil, err
		}
		return w.checkConnectionPolicy(kubesource.ConnectionPolicy(&u)), nil
	case gwv1.GroupName + "/BackendTLSPolicy":
		var p gwv1.BackendTLSPolicy
		if err := json.Unmarshal(req.Object.Raw, &p); err != nil {
			return nil, err
		}
		return config.CheckBackendTLSPolicy(&p), nil
	case networkingv1.GroupName + "/Ingress":
		var ing networkingv1.Ingress
		if err := json.Unmarshal(req.Object.Raw, &ing); err != nil {
			return nil, err
		}
		if !w.ourIngress(&ing) {
			return nil, nil
		}
		return config.CheckIngress(&ing), nil
	}
	return nil, nil // not ours to judge
}

// decodeRoute decodes the request's route into r, whose parentRefs are
// *parents, and checks it.
func decodeRoute(req *admissionv1.AdmissionRequest, r metav1.Object, parents *[]gwv1.ParentReference) ([]string, error) {
	if err := json.Unmarshal(req.Object.Raw, r); err != nil {
		return nil, err
	}
	r.SetNamespace(req.Namespace)
	return checkRoute(r, *parents), nil
}

// checkRoute judges only routes for the mesh: a route of an ingress
// Gateway belongs to that Gateway's controller.
func checkRoute(route any, parents []gwv1.ParentReference) []string {
	for _, p := range parents {
		if p.Kind != nil && *p.Kind == "Service" && (p.Group == nil || *p.Group == "" || *p.Group == "core") {
			return config.CheckRoute(route)
		}
	}
	return nil
}

// ourIngress: the IngressClass ing names (spec.ingressClassName, else the
// legacy annotation) is of our controller. An Ingress naming none is left
// to the translation (and its events): the default class is decided by
// the set of classes, and the API server fills the name in on creation.
func (w *Webhook) ourIngress(ing *networkingv1.Ingress) bool {
	name := ing.Annotations[networkingv1beta1.AnnotationIngressClass]
	if ing.Spec.IngressClassName != nil {
		name = *ing.Spec.IngressClassName
	}
	if name == "" {
		return false
	}
	c, err := w.opts.IngressClasses.Get(name)
	if err != nil {
		if !apierrors.IsNotFound(err) {
			w.opts.Logger.Warn("admission: reading an IngressClass", zap.String("ingressclass", name), zap.Error(err))
		}
		return false
	}
	return c.Spec.Controller == config.IngressClassController
}

func (w *Webhook) namespaceLabels(ns string) map[string]string {
	n, err := w.opts.Namespaces.Get(ns)
	if err != nil {
		return nil
	}
	return n.Labels
}

// waypoint returns the waypoint Gateway ns/name, or nil.
func (w *Webhook) waypoint(ns, name string) *gwv1.Gateway {
	gw, err := w.opts.Gateways.Gateways(ns).Get(name)
	if err != nil || string(gw.Spec.GatewayClassName) != config.WaypointClass {
		if err != nil && !apierrors.IsNotFound(err) {
			w.opts.Logger.Warn("admission: reading a Gateway", zap.String("gateway", ns+"/"+name), zap.Error(err))
		}
		return nil
	}
	return gw
}

// checkUseWaypoint refuses a binding to a waypoint in another namespace
// that does not admit this one. A waypoint that does not exist (yet) is not
// refused: objects are applied in any order, and the translation reports
// the dangling reference.
func (w *Webhook) checkUseWaypoint(ns string, labels, nsLabels map[string]string) []string {
	name, wns := labels[config.LabelUseWaypoint], labels[config.LabelUseWaypointNamespace]
	if name == "" || name == config.UseWaypointNone || wns == "" || wns == ns {
		return nil
	}
	gw := w.waypoint(wns, name)
	if gw == nil || config.WaypointAdmits(gw, ns, nsLabels) {
		return nil
	}
	return []string{fmt.Sprintf("%s=%s: waypoint %s/%s does not admit namespace %s (its %s listener's allowedRoutes.namespaces must be from All, or a Selector matching the namespace)",
		config.LabelUseWaypoint, name, wns, name, ns, config.WaypointProtocol)}
}

// checkPodIdentity refuses a pod whose service account is a waypoint's
// (the deployer runs a waypoint as the service account bearing its
// Gateway's name), unless it is one of the waypoint's own pods: as the
// translation does, since a captured pod's node proxy would obtain the
// waypoint's certificate, and any pod can present its own token.
func (w *Webhook) checkPodIdentity(ns string, p *corev1.Pod) []string {
	sa := p.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	if w.waypoint(ns, sa) == nil {
		return nil
	}
	if gwName := p.Labels[config.LabelGatewayName]; gwName == sa {
		return nil // the waypoint's own pod
	}
	return []string{fmt.Sprintf("service account %s is the identity of waypoint %s/%s, which only the waypoint's own pods may hold: give the application its own service account",
		sa, ns, sa)}
}

// checkConnectionPolicy refuses what the translation refuses and a policy
// naming a set the control plane cannot enforce now: the node proxies and
// waypoints would deny everything it selects. The set's files are compiled
// and tested by the control plane's engine for it (the node proxies
// compile the same files with the same package), so this answer and the
// data plane's agree.
func (w *Webhook) checkConnectionPolicy(p *config.ConnectionPolicy) []string {
	reasons := config.CheckConnectionPolicy(p)
	if w.opts.PolicySet != nil && p.Spec.Policy != "" {
		if _, problem := w.opts.PolicySet(p.Spec.Policy); problem != "" {
			reasons = append(reasons, "spec.policy: "+problem)
		}
	}
	return reasons
}
