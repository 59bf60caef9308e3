// Package gwstatus writes the status the mesh owes the Gateway API objects
// it serves: waypoint Gateways (Accepted, Programmed once the waypoint's
// pods are ready, addresses), ingress Gateways (the same, and each
// listener's conditions and attached routes: see syncIngress), their
// GatewayClasses (Accepted), the parent entries of HTTPRoutes and
// GRPCRoutes attached to Services or ingress Gateways (Accepted,
// ResolvedRefs), the load-balancer addresses of Kubernetes Ingresses
// served by an ingress Gateway (Warning events for refused ones), a causeway.dev/WaypointBound condition on Services that
// name a waypoint, the ancestors of BackendTLSPolicies (the Services they
// target), and Accepted and ResolvedRefs on ConnectionPolicies (false, with
// a Warning event, while the translation refuses one or its policy set
// cannot be enforced). What a route's status says comes from the
// translation itself (config.Analyze), so status and served configuration
// cannot disagree.
//
// Status is written only when it changes: a condition keeps its
// lastTransitionTime while its status holds, and an object whose status
// would not change is not written at all, so a new leader taking over
// writes nothing. Run it on the leader only.
package gwstatus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"time"

	"go.uber.org/zap"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	networkinglisters "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	gwinformers "sigs.k8s.io/gateway-api/pkg/client/informers/externalversions"
	gwlisters "sigs.k8s.io/gateway-api/pkg/client/listers/apis/v1"

	"github.com/causeway-mesh/causeway/pkg/config"
	"github.com/causeway-mesh/causeway/pkg/config/kubesource"
)

// ControllerName is the waypoint GatewayClass's controller (docs/design.md
// §10); IngressControllerName the ingress class's (docs/ingress.md).
const (
	ControllerName        gwv1.GatewayController = config.WaypointController
	IngressControllerName gwv1.GatewayController = config.IngressController
)

// ConditionWaypointBound is the condition on a Service naming a waypoint,
// and on a route's entry for each Service parent: whether a waypoint
// serves that Service (only a waypoint applies a route; docs/kubernetes.md).
const ConditionWaypointBound = "causeway.dev/WaypointBound"

// Options configure a Writer.
type Options struct {
	Client      kubernetes.Interface
	Gateways    gwclient.Interface
	Translation config.Options
	Logger      *zap.Logger
	// Addresses are the static addresses ingress Gateways may hold
	// (config.ResolveAddresses); empty: none.
	Addresses config.AddressPool
	// Dynamic reads ConnectionPolicies and writes their status; nil: they
	// are left alone.
	Dynamic dynamic.Interface
	// PolicySet, when set, says whether a connection policy set can be
	// enforced (its active revision, or why not), for the ResolvedRefs
	// condition of the ConnectionPolicies naming it. Call Resync when its
	// answers change.
	PolicySet func(name string) (revision, problem string)
	// Debounce gathers a burst of changes into one pass (default 100ms).
	Debounce time.Duration
}

// Writer computes and writes status. Build it with New; Run owns its
// informers and returns when its context ends.
type Writer struct {
	opts     Options
	log      *zap.Logger
	recorder record.EventRecorder
	kick     chan struct{}

	namespaces  corelisters.NamespaceLister
	services    corelisters.ServiceLister
	deployments appslisters.DeploymentLister
	classes     gwlisters.GatewayClassLister
	gateways    gwlisters.GatewayLister
	httpRoutes  gwlisters.HTTPRouteLister
	grpcRoutes  gwlisters.GRPCRouteLister
	grants      gwlisters.ReferenceGrantLister
	tlsPolicies gwlisters.BackendTLSPolicyLister
	configMaps  corelisters.ConfigMapLister
	secrets     corelisters.SecretLister // kubernetes.io/tls only
	ingresses   networkinglisters.IngressLister
	ingClasses  networkinglisters.IngressClassLister
	// ingressProblems: the refusal last reported (an event) per Ingress.
	ingressProblems map[string]string
	policies        *kubesource.ConnectionPolicies // nil: no Dynamic client
}

// New checks the options.
func New(o Options) (*Writer, error) {
	if o.Client == nil || o.Gateways == nil || o.Logger == nil {
		return nil, errors.New("gwstatus: Client, Gateways and Logger are required")
	}
	if o.Debounce <= 0 {
		o.Debounce = 100 * time.Millisecond
	}
	return &Writer{opts: o, log: o.Logger, kick: make(chan struct{}, 1), ingressProblems: map[string]string{}}, nil
}

// Run watches the objects and writes status until ctx ends.
func (w *Writer) Run(ctx context.Context) error {
	sch := runtime.NewScheme()
	utilruntime.Must(scheme.AddToScheme(sch))
	utilruntime.Must(gwv1.Install(sch))
	events := record.NewBroadcaster(record.WithContext(ctx))
	defer events.Shutdown()
	events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: w.opts.Client.CoreV1().Events("")})
	w.recorder = events.NewRecorder(sch, corev1.EventSource{Component: "causeway-status"})

	kf := informers.NewSharedInformerFactory(w.opts.Client, 0)
	df := informers.NewSharedInformerFactoryWithOptions(w.opts.Client, 0,
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) { lo.LabelSelector = config.LabelGatewayName }))
	// ConfigMaps (for BackendTLSPolicies' CA certificates) keep only their ca.crt.
	cf := informers.NewSharedInformerFactoryWithOptions(w.opts.Client, 0, informers.WithTransform(config.Trim))
	gf := gwinformers.NewSharedInformerFactory(w.opts.Gateways, 0)
	// Secrets (ingress listeners' certificates): kubernetes.io/tls only.
	sf := kubesource.TLSSecretInformers(w.opts.Client)
	w.secrets = sf.Core().V1().Secrets().Lister()
	w.namespaces = kf.Core().V1().Namespaces().Lister()
	w.services = kf.Core().V1().Services().Lister()
	w.deployments = df.Apps().V1().Deployments().Lister()
	w.classes = gf.Gateway().V1().GatewayClasses().Lister()
	w.gateways = gf.Gateway().V1().Gateways().Lister()
	w.httpRoutes = gf.Gateway().V1().HTTPRoutes().Lister()
	w.grpcRoutes = gf.Gateway().V1().GRPCRoutes().Lister()
	w.grants = gf.Gateway().V1().ReferenceGrants().Lister()
	w.tlsPolicies = gf.Gateway().V1().BackendTLSPolicies().Lister()
	w.configMaps = cf.Core().V1().ConfigMaps().Lister()
	w.ingresses, w.ingClasses = kf.Networking().V1().Ingresses().Lister(), kf.Networking().V1().IngressClasses().Lister()
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { w.trigger() },
		UpdateFunc: func(any, any) { w.trigger() },
		DeleteFunc: func(any) { w.trigger() },
	}
	for _, inf := range []cache.SharedIndexInformer{
		kf.Core().V1().Namespaces().Informer(), kf.Core().V1().Services().Informer(),
		df.Apps().V1().Deployments().Informer(),
		gf.Gateway().V1().GatewayClasses().Informer(), gf.Gateway().V1().Gateways().Informer(),
		gf.Gateway().V1().HTTPRoutes().Informer(), gf.Gateway().V1().GRPCRoutes().Informer(),
		gf.Gateway().V1().ReferenceGrants().Informer(), gf.Gateway().V1().BackendTLSPolicies().Informer(),
		cf.Core().V1().ConfigMaps().Informer(), sf.Core().V1().Secrets().Informer(),
		kf.Networking().V1().Ingresses().Informer(), kf.Networking().V1().IngressClasses().Informer(),
	} {
		if _, err := inf.AddEventHandler(handler); err != nil {
			return err
		}
	}
	// On return the informers are stopped, then waited for.
	ctx, stop := context.WithCancel(ctx)
	defer kf.Shutdown()
	defer df.Shutdown()
	defer cf.Shutdown()
	defer sf.Shutdown()
	defer gf.Shutdown()
	defer stop()
	kf.Start(ctx.Done())
	df.Start(ctx.Done())
	cf.Start(ctx.Done())
	sf.Start(ctx.Done())
	gf.Start(ctx.Done())
	if w.opts.Dynamic != nil {
		policies, err := kubesource.NewConnectionPolicies(w.opts.Dynamic, w.opts.Client.Discovery(), w.log, 30*time.Second, w.trigger)
		if err != nil {
			return err
		}
		defer policies.Shutdown()
		synced, err := policies.Start(ctx)
		if err != nil {
			return err
		}
		if synced != nil && !cache.WaitForCacheSync(ctx.Done(), synced) {
			if ctx.Err() != nil {
				return nil
			}
			return errors.New("gwstatus: cache of ConnectionPolicies did not sync")
		}
		w.policies = policies
	}
	for _, synced := range []map[reflect.Type]bool{kf.WaitForCacheSync(ctx.Done()), df.WaitForCacheSync(ctx.Done()),
		cf.WaitForCacheSync(ctx.Done()), sf.WaitForCacheSync(ctx.Done()), gf.WaitForCacheSync(ctx.Done())} {
		for typ, ok := range synced {
			if !ok {
				if ctx.Err() != nil {
					return nil // stopped while starting
				}
				return fmt.Errorf("gwstatus: cache of %v did not sync", typ)
			}
		}
	}
	w.log.Info("status writer started")
	w.trigger()
	backoff := time.Duration(0)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-w.kick:
		}
		// Gather the burst, then write.
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(w.opts.Debounce + backoff):
		}
		drain(w.kick)
		if err := w.Sync(ctx); err != nil {
			// A conflict or an apiserver error: the next pass recomputes
			// from fresh caches.
			w.log.Warn("status not fully written; retrying", zap.Error(err))
			backoff = min(2*backoff+100*time.Millisecond, 10*time.Second)
			w.trigger()
			continue
		}
		backoff = 0
	}
}

func drain(c chan struct{}) {
	select {
	case <-c:
	default:
	}
}

// Resync makes the writer compute every status again (soon, debounced).
func (w *Writer) Resync() { w.trigger() }

func (w *Writer) trigger() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// Sync computes every status from the caches and writes what differs.
func (w *Writer) Sync(ctx context.Context) error {
	objs, err := w.objects()
	if err != nil {
		return err
	}
	rep := config.Analyze(objs, w.opts.Translation)
	var errs []error
	classes, _ := w.classes.List(labels.Everything())
	for _, c := range classes {
		errs = append(errs, w.syncClass(ctx, c))
	}
	// Routes (and Kubernetes Ingresses) attach to ingress Gateways before
	// either's status is written: a listener's status counts its routes.
	ingress := w.ingressGateways()
	hrs, _ := w.httpRoutes.List(labels.Everything())
	hrParents := make([][]ingressParent, len(hrs))
	for i, r := range hrs {
		hrParents[i] = w.attachRoute(ingress, "HTTPRoute", r.Namespace, r.Spec.ParentRefs, r.Spec.Hostnames)
	}
	grs, _ := w.grpcRoutes.List(labels.Everything())
	grParents := make([][]ingressParent, len(grs))
	for i, r := range grs {
		grParents[i] = w.attachRoute(ingress, "GRPCRoute", r.Namespace, r.Spec.ParentRefs, r.Spec.Hostnames)
	}
	attachKubeIngresses(ingress, rep)
	gws, _ := w.gateways.List(labels.Everything())
	for _, gw := range gws {
		if ig := ingress[gw.Namespace+"/"+gw.Name]; ig != nil {
			errs = append(errs, w.syncIngress(ctx, ig))
			continue
		}
		errs = append(errs, w.syncGateway(ctx, gw, rep))
	}
	for i, r := range hrs {
		errs = append(errs, syncRoute(ctx, w, rep, "HTTPRoute", r, r.Spec.ParentRefs, hrParents[i],
			func(r *gwv1.HTTPRoute) *gwv1.RouteStatus { return &r.Status.RouteStatus }, w.opts.Gateways.GatewayV1().HTTPRoutes(r.Namespace).UpdateStatus))
	}
	for i, r := range grs {
		errs = append(errs, syncRoute(ctx, w, rep, "GRPCRoute", r, r.Spec.ParentRefs, grParents[i],
			func(r *gwv1.GRPCRoute) *gwv1.RouteStatus { return &r.Status.RouteStatus }, w.opts.Gateways.GatewayV1().GRPCRoutes(r.Namespace).UpdateStatus))
	}
	svcs, _ := w.services.List(labels.Everything())
	for _, s := range svcs {
		errs = append(errs, w.syncService(ctx, s, rep))
	}
	tps, _ := w.tlsPolicies.List(labels.Everything())
	for _, p := range tps {
		errs = append(errs, w.syncBackendTLSPolicy(ctx, p, rep))
	}
	for _, p := range w.connectionPolicies() {
		errs = append(errs, w.syncConnectionPolicy(ctx, p, rep))
	}
	ings, _ := w.ingresses.List(labels.Everything())
	for _, ing := range ings {
		errs = append(errs, w.syncKubeIngress(ctx, ing, rep))
	}
	return errors.Join(errs...)
}

// objects are what the route and Service reports depend on, in a fixed
// order so that messages do not reorder from pass to pass.
func (w *Writer) objects() ([]config.Object, error) {
	nss, err := w.namespaces.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	var objs []config.Object
	objs = appendObjects(objs, "Namespace", nss)
	svcs, _ := w.services.List(labels.Everything())
	objs = appendObjects(objs, "Service", svcs)
	gws, _ := w.gateways.List(labels.Everything())
	objs = appendObjects(objs, "Gateway", gws)
	hrs, _ := w.httpRoutes.List(labels.Everything())
	objs = appendObjects(objs, "HTTPRoute", hrs)
	grs, _ := w.grpcRoutes.List(labels.Everything())
	objs = appendObjects(objs, "GRPCRoute", grs)
	rgs, _ := w.grants.List(labels.Everything())
	objs = appendObjects(objs, "ReferenceGrant", rgs)
	tps, _ := w.tlsPolicies.List(labels.Everything())
	objs = appendObjects(objs, "BackendTLSPolicy", tps)
	cms, _ := w.configMaps.List(labels.Everything())
	objs = appendObjects(objs, "ConfigMap", cms)
	objs = appendObjects(objs, "ConnectionPolicy", w.connectionPolicies())
	// Kubernetes Ingresses, their classes and the Secrets their tls names.
	ics, _ := w.ingClasses.List(labels.Everything())
	objs = appendObjects(objs, "IngressClass", ics)
	ings, _ := w.ingresses.List(labels.Everything())
	objs = appendObjects(objs, "Ingress", ings)
	secs, _ := w.secrets.List(labels.Everything())
	objs = appendObjects(objs, "Secret", secs)
	sort.SliceStable(objs, func(i, j int) bool { return objs[i].Origin < objs[j].Origin })
	return objs, nil
}

// appendObjects adds copies of cached objects (the translation must not
// touch the cache's).
func appendObjects[T interface {
	runtime.Object
	metav1.Object
}](objs []config.Object, kind string, list []T) []config.Object {
	for _, o := range list {
		objs = append(objs, config.Object{Origin: "kubernetes " + kind + " " + o.GetNamespace() + "/" + o.GetName(), Obj: o.DeepCopyObject()})
	}
	return objs
}

// setConditions applies want to a copy of cur, keeping each condition's
// lastTransitionTime while its status holds.
func setConditions(cur []metav1.Condition, want ...metav1.Condition) []metav1.Condition {
	out := append([]metav1.Condition(nil), cur...)
	for _, c := range want {
		meta.SetStatusCondition(&out, c)
	}
	return out
}

func condition(typ string, ok bool, reason, message string, generation int64) metav1.Condition {
	st := metav1.ConditionFalse
	if ok {
		st = metav1.ConditionTrue
	}
	return metav1.Condition{Type: typ, Status: st, Reason: reason, Message: truncate(message), ObservedGeneration: generation}
}

// truncate keeps a message within the API's 32768-byte limit.
func truncate(s string) string {
	const limit = 32768
	if len(s) <= limit {
		return s
	}
	return s[:limit-3] + "..."
}

func (w *Writer) syncClass(ctx context.Context, c *gwv1.GatewayClass) error {
	if c.Spec.ControllerName != ControllerName && c.Spec.ControllerName != IngressControllerName {
		return nil
	}
	conds := setConditions(c.Status.Conditions, condition(string(gwv1.GatewayClassConditionStatusAccepted), true,
		string(gwv1.GatewayClassReasonAccepted), "handled by the Causeway control plane", c.Generation))
	if equality.Semantic.DeepEqual(conds, c.Status.Conditions) {
		return nil
	}
	cp := c.DeepCopy()
	cp.Status.Conditions = conds
	_, err := w.opts.Gateways.GatewayV1().GatewayClasses().UpdateStatus(ctx, cp, metav1.UpdateOptions{FieldManager: "causeway"})
	return ignoreGone(err)
}

func (w *Writer) syncGateway(ctx context.Context, gw *gwv1.Gateway, rep *config.Reports) error {
	if string(gw.Spec.GatewayClassName) != config.WaypointClass {
		return nil
	}
	problems := rep.Problems["Gateway "+gw.Namespace+"/"+gw.Name]
	accepted := len(problems) == 0
	acc := condition(string(gwv1.GatewayConditionAccepted), true, string(gwv1.GatewayReasonAccepted), "a waypoint", gw.Generation)
	if !accepted {
		acc = condition(string(gwv1.GatewayConditionAccepted), false, string(gwv1.GatewayReasonInvalid), strings.Join(problems, "; "), gw.Generation)
	}
	ready, total, why := w.gatewayPods(gw, "waypoint")
	prog := condition(string(gwv1.GatewayConditionProgrammed), true, string(gwv1.GatewayReasonProgrammed),
		fmt.Sprintf("%d of %d waypoint pods ready", ready, total), gw.Generation)
	switch {
	case !accepted:
		prog = condition(string(gwv1.GatewayConditionProgrammed), false, string(gwv1.GatewayReasonInvalid), "the Gateway is not accepted", gw.Generation)
	case ready == 0:
		prog = condition(string(gwv1.GatewayConditionProgrammed), false, string(gwv1.GatewayReasonPending), why, gw.Generation)
	}
	st := gw.Status.DeepCopy()
	st.Conditions = setConditions(gw.Status.Conditions, acc, prog)
	st.Addresses = w.addresses(gw)
	var listeners []gwv1.ListenerStatus
	for _, l := range gw.Spec.Listeners {
		var cur []metav1.Condition
		for _, ls := range gw.Status.Listeners {
			if ls.Name == l.Name {
				cur = ls.Conditions
			}
		}
		lc := []metav1.Condition{
			condition(string(gwv1.ListenerConditionAccepted), accepted, pick(accepted, string(gwv1.ListenerReasonAccepted), string(gwv1.ListenerReasonUnsupportedProtocol)), "", gw.Generation),
			condition(string(gwv1.ListenerConditionProgrammed), prog.Status == metav1.ConditionTrue, prog.Reason, "", gw.Generation),
			condition(string(gwv1.ListenerConditionResolvedRefs), true, string(gwv1.ListenerReasonResolvedRefs), "", gw.Generation),
		}
		listeners = append(listeners, gwv1.ListenerStatus{Name: l.Name, SupportedKinds: []gwv1.RouteGroupKind{}, Conditions: setConditions(cur, lc...)})
	}
	st.Listeners = listeners
	return w.writeGatewayStatus(ctx, gw, st)
}

// writeGatewayStatus writes st as gw's status, unless it is what gw has.
func (w *Writer) writeGatewayStatus(ctx context.Context, gw *gwv1.Gateway, st *gwv1.GatewayStatus) error {
	if equality.Semantic.DeepEqual(st, &gw.Status) {
		return nil
	}
	cp := gw.DeepCopy()
	cp.Status = *st
	_, err := w.opts.Gateways.GatewayV1().Gateways(gw.Namespace).UpdateStatus(ctx, cp, metav1.UpdateOptions{FieldManager: "causeway"})
	return ignoreGone(err)
}

func pick(ok bool, yes, no string) string {
	if ok {
		return yes
	}
	return no
}

// gatewayPods counts the ready pods of the Deployment the deployer made
// for gw (what: "waypoint" or "ingress gateway").
func (w *Writer) gatewayPods(gw *gwv1.Gateway, what string) (ready, total int32, why string) {
	d, err := w.deployments.Deployments(gw.Namespace).Get(gw.Name)
	if err != nil || !controlledBy(d, gw) {
		return 0, 0, fmt.Sprintf("no %s Deployment %s/%s yet", what, gw.Namespace, gw.Name)
	}
	total = 1
	if d.Spec.Replicas != nil {
		total = *d.Spec.Replicas
	}
	return d.Status.ReadyReplicas, total, fmt.Sprintf("waiting for the %s's pods: %d of %d ready", what, d.Status.ReadyReplicas, total)
}

func controlledBy(d *appsv1.Deployment, gw *gwv1.Gateway) bool {
	ref := metav1.GetControllerOf(d)
	return ref != nil && ref.UID == gw.UID
}

// addresses are the cluster IPs of the waypoint's Service.
func (w *Writer) addresses(gw *gwv1.Gateway) []gwv1.GatewayStatusAddress {
	if s := w.gatewayService(gw); s != nil {
		return clusterIPs(s)
	}
	return nil
}

// clusterIPs are a Service's cluster IPs, as Gateway addresses.
func clusterIPs(s *corev1.Service) []gwv1.GatewayStatusAddress {
	ipType := gwv1.IPAddressType
	var out []gwv1.GatewayStatusAddress
	for _, ip := range s.Spec.ClusterIPs {
		if ip != "" && ip != corev1.ClusterIPNone {
			out = append(out, gwv1.GatewayStatusAddress{Type: &ipType, Value: ip})
		}
	}
	return out
}

// syncRoute writes the status.parents of an HTTPRoute or GRPCRoute when
// they changed: ingress are its parentRefs naming ingress Gateways of
// ours, status finds a route's RouteStatus, update is the kind's
// UpdateStatus.
func syncRoute[R any, PR interface {
	*R
	metav1.Object
	DeepCopy() *R
}](ctx context.Context, w *Writer, rep *config.Reports, kind string, r PR, refs []gwv1.ParentReference, ingress []ingressParent,
	status func(PR) *gwv1.RouteStatus, update func(context.Context, PR, metav1.UpdateOptions) (PR, error)) error {
	parents, changed := w.routeParents(status(r).Parents, refs, rep.Routes[kind+" "+r.GetNamespace()+"/"+r.GetName()], ingress, rep.Services, r.GetGeneration())
	if !changed {
		return nil
	}
	cp := PR(r.DeepCopy())
	status(cp).Parents = parents
	_, err := update(ctx, cp, metav1.UpdateOptions{FieldManager: "causeway"})
	return ignoreGone(err)
}

// routeParents computes a route's status.parents: other controllers'
// entries as they are, ours one per Service parentRef of the report
// (controller ControllerName) and one per parentRef naming an ingress
// Gateway of ours (IngressControllerName).
func (w *Writer) routeParents(cur []gwv1.RouteParentStatus, refs []gwv1.ParentReference, rr *config.RouteReport, ingress []ingressParent,
	services map[string]config.WaypointBinding, generation int64) ([]gwv1.RouteParentStatus, bool) {
	var out []gwv1.RouteParentStatus
	ours := map[string][]metav1.Condition{}
	for _, p := range cur {
		if p.ControllerName == ControllerName || p.ControllerName == IngressControllerName {
			ours[parentKey(p.ParentRef)] = p.Conditions
			continue
		}
		out = append(out, p)
	}
	for _, ip := range ingress {
		ref := refs[ip.index]
		out = append(out, gwv1.RouteParentStatus{ParentRef: ref, ControllerName: IngressControllerName,
			Conditions: setConditions(ours[parentKey(ref)], ingressRouteConditions(rr, ip, generation)...)})
	}
	if rr != nil {
		for _, pr := range rr.Parents {
			if pr.Index >= len(refs) {
				continue
			}
			ref := refs[pr.Index]
			conds := routeConditions(rr, pr, services, generation)
			out = append(out, gwv1.RouteParentStatus{ParentRef: ref, ControllerName: ControllerName,
				Conditions: setConditions(ours[parentKey(ref)], conds...)})
		}
	}
	if len(out) == 0 {
		out = nil
	}
	cmp := cur
	if len(cmp) == 0 {
		cmp = nil
	}
	return out, !equality.Semantic.DeepEqual(out, cmp)
}

func parentKey(r gwv1.ParentReference) string {
	s := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	port := ""
	if r.Port != nil {
		port = fmt.Sprint(*r.Port)
	}
	return strings.Join([]string{s((*string)(r.Group)), s((*string)(r.Kind)), s((*string)(r.Namespace)), string(r.Name), s((*string)(r.SectionName)), port}, "/")
}

// routeConditions are a route's conditions for one Service parent: Accepted
// says whether the route is valid and attached to the parent;
// ResolvedRefs whether every backend resolves; and, once attached,
// causeway.dev/WaypointBound whether a waypoint serves the parent Service,
// since only a waypoint applies a route (the Gateway API has no reason for
// "attached, but nothing carries it out": Accepted speaks of the route,
// this condition of the parent).
func routeConditions(rr *config.RouteReport, pr config.ParentReport, services map[string]config.WaypointBinding, gen int64) []metav1.Condition {
	accType := string(gwv1.RouteConditionAccepted)
	accepted, refused := routeRefused(rr, "mesh", gen)
	switch {
	case pr.Problem != "":
		accepted = condition(accType, false, string(gwv1.RouteReasonNoMatchingParent), pr.Problem, gen)
	case !refused:
		accepted = condition(accType, true, string(gwv1.RouteReasonAccepted), "attached to Service "+pr.Service, gen)
	}
	out := []metav1.Condition{accepted, resolvedRefs(rr, gen)}
	if pr.Problem != "" {
		return out
	}
	b, named := services[pr.Service]
	switch {
	case !named:
		out = append(out, condition(ConditionWaypointBound, false, "NoWaypoint",
			"no waypoint serves Service "+pr.Service+", so nothing applies this route: label the Service or its namespace "+config.LabelUseWaypoint, gen))
	case b.Problem != "":
		out = append(out, condition(ConditionWaypointBound, false, "NotBound",
			"Service "+pr.Service+" is not bound to waypoint "+b.Waypoint+", so nothing applies this route: "+b.Problem, gen))
	default:
		out = append(out, condition(ConditionWaypointBound, true, "Bound", "applied by waypoint "+b.Waypoint+" for Service "+pr.Service, gen))
	}
	return out
}

// routeRefused is a route's Accepted=False for a problem of its own, the
// same for every parent: the translation refuses it, or who (the mesh, the
// gateway) cannot carry out some of its filters. refused is false when
// neither holds.
func routeRefused(rr *config.RouteReport, who string, gen int64) (accepted metav1.Condition, refused bool) {
	accType, reason := string(gwv1.RouteConditionAccepted), string(gwv1.RouteReasonUnsupportedValue)
	switch {
	case len(rr.Problems) > 0:
		return condition(accType, false, reason, "refused, not programmed: "+strings.Join(rr.Problems, "; "), gen), true
	case len(rr.Unsupported) > 0:
		return condition(accType, false, reason,
			"the "+who+" cannot carry out these filters (their requests are answered with 500): "+strings.Join(rr.Unsupported, "; "), gen), true
	}
	return metav1.Condition{}, false
}

// resolvedRefs says whether every backend of a route resolves.
func resolvedRefs(rr *config.RouteReport, gen int64) metav1.Condition {
	refsType := string(gwv1.RouteConditionResolvedRefs)
	if len(rr.Refs) == 0 {
		return condition(refsType, true, string(gwv1.RouteReasonResolvedRefs), "all references resolve", gen)
	}
	reason, msgs := rr.Refs[0].Reason, make([]string, 0, len(rr.Refs))
	for _, ri := range rr.Refs {
		if refRank(ri.Reason) < refRank(reason) {
			reason = ri.Reason
		}
		msgs = append(msgs, ri.Message)
	}
	return condition(refsType, false, string(reason), strings.Join(msgs, "; ")+" (requests for these backends are answered with 500)", gen)
}

// refRank orders ResolvedRefs reasons: a refused reference says most.
func refRank(r gwv1.RouteConditionReason) int {
	switch r {
	case gwv1.RouteReasonRefNotPermitted:
		return 0
	case gwv1.RouteReasonInvalidKind:
		return 1
	}
	return 2
}

func (w *Writer) syncService(ctx context.Context, s *corev1.Service, rep *config.Reports) error {
	b, named := rep.Services[s.Namespace+"/"+s.Name]
	cur := meta.FindStatusCondition(s.Status.Conditions, ConditionWaypointBound)
	if !named && cur == nil {
		return nil
	}
	conds := append([]metav1.Condition(nil), s.Status.Conditions...)
	var event string
	switch {
	case !named:
		meta.RemoveStatusCondition(&conds, ConditionWaypointBound)
	case b.Problem == "":
		conds = setConditions(conds, condition(ConditionWaypointBound, true, "Bound", "bound to waypoint "+b.Waypoint, s.Generation))
	default:
		conds = setConditions(conds, condition(ConditionWaypointBound, false, "NotBound", b.Problem, s.Generation))
		if cur == nil || cur.Status != metav1.ConditionFalse || cur.Message != b.Problem {
			event = b.Problem
		}
	}
	if equality.Semantic.DeepEqual(conds, s.Status.Conditions) {
		return nil
	}
	cp := s.DeepCopy()
	cp.Status.Conditions = conds
	if _, err := w.opts.Client.CoreV1().Services(s.Namespace).UpdateStatus(ctx, cp, metav1.UpdateOptions{FieldManager: "causeway"}); err != nil {
		return ignoreGone(err)
	}
	if event != "" {
		w.recorder.Event(s, corev1.EventTypeWarning, "WaypointNotBound", event)
	}
	return nil
}

// maxAncestors is the API's limit on a policy's status.ancestors.
const maxAncestors = 16

// syncBackendTLSPolicy writes a BackendTLSPolicy's status.ancestors: other
// controllers' entries as they are, ours one per targetRef, with the
// targeted Service (and port, for a sectionName) as the ancestor, as the
// translation found it (Accepted: applied, Conflicted, TargetNotFound,
// Invalid or NoValidCACertificate; ResolvedRefs: the CA certificate
// references).
func (w *Writer) syncBackendTLSPolicy(ctx context.Context, p *gwv1.BackendTLSPolicy, rep *config.Reports) error {
	var out []gwv1.PolicyAncestorStatus
	ours := map[string][]metav1.Condition{}
	for _, a := range p.Status.Ancestors {
		if a.ControllerName == ControllerName {
			ours[parentKey(a.AncestorRef)] = a.Conditions
			continue
		}
		out = append(out, a)
	}
	ns := gwv1.Namespace(p.Namespace)
	for _, a := range rep.BackendTLSPolicies[p.Namespace+"/"+p.Name] {
		if a.Index >= len(p.Spec.TargetRefs) || len(out) >= maxAncestors {
			continue
		}
		tr := p.Spec.TargetRefs[a.Index]
		group, kind := tr.Group, tr.Kind
		ref := gwv1.ParentReference{Group: &group, Kind: &kind, Namespace: &ns, Name: tr.Name, SectionName: tr.SectionName}
		acc := condition(string(gwv1.PolicyConditionAccepted), a.Accepted, string(a.AcceptedReason), a.AcceptedMessage, p.Generation)
		res := condition(string(gwv1.BackendTLSPolicyConditionResolvedRefs), a.ResolvedRefs, string(a.ResolvedRefsReason), a.ResolvedRefsMessage, p.Generation)
		out = append(out, gwv1.PolicyAncestorStatus{AncestorRef: ref, ControllerName: ControllerName, Conditions: setConditions(ours[parentKey(ref)], acc, res)})
	}
	if len(out) == 0 {
		out = nil
	}
	cur := p.Status.Ancestors
	if len(cur) == 0 {
		cur = nil
	}
	if equality.Semantic.DeepEqual(out, cur) {
		return nil
	}
	cp := p.DeepCopy()
	cp.Status.Ancestors = out
	_, err := w.opts.Gateways.GatewayV1().BackendTLSPolicies(p.Namespace).UpdateStatus(ctx, cp, metav1.UpdateOptions{FieldManager: "causeway"})
	return ignoreGone(err)
}

func (w *Writer) connectionPolicies() []*config.ConnectionPolicy {
	if w.policies == nil {
		return nil
	}
	return w.policies.List()
}

// syncConnectionPolicy writes a ConnectionPolicy's conditions: Accepted,
// false while the translation refuses it, and ResolvedRefs (with a
// PolicySet), false while its policy set cannot be enforced; either way it
// denies every connection it selects. A condition turning false, or
// changing its reason while false, also makes a Warning event.
func (w *Writer) syncConnectionPolicy(ctx context.Context, p *config.ConnectionPolicy, rep *config.Reports) error {
	const denies = ", so it denies every connection it selects"
	want := []metav1.Condition{condition("Accepted", true, "Accepted", "accepted by the mesh", p.Generation)}
	if problems := rep.Problems["ConnectionPolicy "+p.Namespace+"/"+p.Name]; len(problems) > 0 {
		want[0] = condition("Accepted", false, "Invalid", "refused"+denies+": "+strings.Join(problems, "; "), p.Generation)
	}
	if w.opts.PolicySet != nil {
		rev, problem := w.opts.PolicySet(p.Spec.Policy)
		refs := condition("ResolvedRefs", true, "ResolvedRefs", fmt.Sprintf("policy set %q at revision %s", p.Spec.Policy, rev), p.Generation)
		if problem != "" {
			refs = condition("ResolvedRefs", false, "PolicySetNotActive", problem+denies, p.Generation)
		}
		want = append(want, refs)
	}
	conds := setConditions(p.Status.Conditions, want...)
	if equality.Semantic.DeepEqual(conds, p.Status.Conditions) {
		return nil
	}
	// The resourceVersion makes the patch fail on a conflict, as an
	// update would; the next pass recomputes.
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": p.ResourceVersion},
		"status":   map[string]any{"conditions": conds},
	})
	if err != nil {
		return err
	}
	if _, err := w.opts.Dynamic.Resource(config.ConnectionPolicyResource).Namespace(p.Namespace).Patch(ctx, p.Name,
		types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "causeway"}, "status"); err != nil {
		return ignoreGone(err)
	}
	for _, c := range want {
		cur := meta.FindStatusCondition(p.Status.Conditions, c.Type)
		if c.Status == metav1.ConditionFalse && (cur == nil || cur.Status != metav1.ConditionFalse || cur.Message != c.Message) {
			reason := "ConnectionPolicyRefused"
			if c.Type == "ResolvedRefs" {
				reason = c.Reason
			}
			w.recorder.Event(p, corev1.EventTypeWarning, reason, c.Message)
		}
	}
	return nil
}

// ignoreGone: an object deleted since the cache saw it needs no status.
func ignoreGone(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
