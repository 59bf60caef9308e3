// Package deployer runs waypoints for Gateways of class causeway-waypoint
// (docs/design.md §10) and ingress gateways for Gateways of class causeway
// whose GatewayClass names the ingress controller (docs/ingress.md): each
// becomes a ServiceAccount, a ConfigMap of the mesh roots, a Service, a
// PodDisruptionBudget and a Deployment rendered from its class's template,
// applied with server-side apply (field manager "causeway") and owned by the
// Gateway, so that deleting the Gateway removes them by garbage collection.
//
// The deployer is a controller in the client-go style: informers on Gateways
// and on the objects it made feed a work queue of Gateway names; a child's
// change re-enqueues its Gateway, so a deleted or edited Deployment comes
// back as the template says. It never takes over an object it did not make
// (one without its owner reference to the Gateway): it refuses and reports.
// Run it on the leader only: two deployers would fight over nothing, but
// would double the writes.
package deployer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"reflect"
	"sync"
	"time"

	"go.uber.org/zap"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	policyv1ac "k8s.io/client-go/applyconfigurations/policy/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	gwinformers "sigs.k8s.io/gateway-api/pkg/client/informers/externalversions"
	gwlisters "sigs.k8s.io/gateway-api/pkg/client/listers/apis/v1"

	"github.com/causeway-mesh/causeway/pkg/config"
)

// FieldManager is the server-side apply field manager of everything the
// control plane writes.
const FieldManager = "causeway"

// Options configure a Deployer.
type Options struct {
	Client   kubernetes.Interface
	Metadata metadata.Interface // reads and deletes children of any kind
	Gateways gwclient.Interface
	// TemplateFile is the waypoint template, IngressTemplateFile the
	// ingress Gateways'; empty: the built-in one. They are re-read every
	// TemplateCheck, and a change re-applies every Gateway.
	TemplateFile        string
	IngressTemplateFile string
	TemplateCheck       time.Duration // default 10s
	// Values returns the template's values; it is called for every
	// reconciliation, and checked for changes every TemplateCheck.
	Values func() Values
	// Addresses are the static addresses ingress Gateways may hold
	// (config.ResolveAddresses); empty: none.
	Addresses config.AddressPool
	Logger    *zap.Logger
	// Workers reconcile different Gateways in parallel (default 2).
	Workers int
}

// Deployer is the waypoint controller. Build it with New; Run owns its
// informers, queue and workers and returns when its context ends.
type Deployer struct {
	opts     Options
	log      *zap.Logger
	queue    workqueue.TypedRateLimitingInterface[types.NamespacedName]
	recorder record.EventRecorder
	events   record.EventBroadcaster

	mu         sync.Mutex
	templates  map[string]*classTemplate // by gatewayClassName
	lastValues Values

	gateways   gwlisters.GatewayLister
	classes    gwlisters.GatewayClassLister
	namespaces corelisters.NamespaceLister
	children   map[string]cache.GenericLister // by kind, only objects with the gateway-name label
}

// classTemplate is the template of one class: built in, or from a file
// (then text is the file's, to notice changes).
type classTemplate struct {
	what string // "waypoint", "ingress"
	file string
	text []byte
	tmpl *Template
	// invalid is the reason of the Warning event on a Gateway the
	// template cannot render.
	invalid string
}

// New checks the options and loads the templates.
func New(o Options) (*Deployer, error) {
	if o.Client == nil || o.Metadata == nil || o.Gateways == nil || o.Values == nil || o.Logger == nil {
		return nil, errors.New("deployer: Client, Metadata, Gateways, Values and Logger are required")
	}
	if o.TemplateCheck <= 0 {
		o.TemplateCheck = 10 * time.Second
	}
	if o.Workers <= 0 {
		o.Workers = 2
	}
	d := &Deployer{opts: o, log: o.Logger, templates: map[string]*classTemplate{
		config.WaypointClass: {what: "waypoint", file: o.TemplateFile, tmpl: DefaultTemplate(), invalid: "InvalidWaypoint"},
		config.IngressClass:  {what: "ingress", file: o.IngressTemplateFile, tmpl: IngressTemplate(), invalid: "InvalidGateway"},
	}}
	for _, ct := range d.templates {
		if ct.file == "" {
			continue
		}
		text, tmpl, err := ct.read()
		if err != nil {
			return nil, err
		}
		ct.tmpl, ct.text = tmpl, text
	}
	return d, nil
}

func (ct *classTemplate) read() ([]byte, *Template, error) {
	text, err := os.ReadFile(ct.file)
	if err != nil {
		return nil, nil, fmt.Errorf("%s template: %w", ct.what, err)
	}
	tmpl, err := LoadTemplate(ct.file)
	return text, tmpl, err
}

// Run starts the informers and workers and blocks until ctx ends.
func (d *Deployer) Run(ctx context.Context) error {
	d.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.DefaultTypedControllerRateLimiter[types.NamespacedName](),
		workqueue.TypedRateLimitingQueueConfig[types.NamespacedName]{Name: "waypoint-deployer"})
	defer d.queue.ShutDown()
	sch := runtime.NewScheme()
	utilruntime.Must(scheme.AddToScheme(sch))
	utilruntime.Must(gwv1.Install(sch))
	d.events = record.NewBroadcaster(record.WithContext(ctx))
	defer d.events.Shutdown()
	d.events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: d.opts.Client.CoreV1().Events("")})
	d.recorder = d.events.NewRecorder(sch, corev1.EventSource{Component: "causeway-waypoint-deployer"})

	gwf := gwinformers.NewSharedInformerFactory(d.opts.Gateways, 0)
	gwInf := gwf.Gateway().V1().Gateways()
	d.gateways = gwInf.Lister()
	// A class's controller decides whether its Gateways are ours.
	classInf := gwf.Gateway().V1().GatewayClasses()
	d.classes = classInf.Lister()
	if _, err := classInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { d.enqueueAll() },
		UpdateFunc: func(old, cur any) {
			if old.(*gwv1.GatewayClass).Generation != cur.(*gwv1.GatewayClass).Generation {
				d.enqueueAll()
			}
		},
		DeleteFunc: func(any) { d.enqueueAll() },
	}); err != nil {
		return err
	}
	if _, err := gwInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: d.enqueueGateway,
		UpdateFunc: func(old, cur any) {
			o, c := old.(*gwv1.Gateway), cur.(*gwv1.Gateway)
			// Status writes alone change nothing here; annotations (the
			// policy source) do, without a new generation.
			if o.Generation != c.Generation || o.UID != c.UID || !maps.Equal(o.Annotations, c.Annotations) {
				d.enqueueGateway(old)
				d.enqueueGateway(cur)
			}
		},
		DeleteFunc: d.enqueueGateway,
	}); err != nil {
		return err
	}
	// Only the objects carrying the gateway-name label are watched; a
	// same-named object without it is found by a live read (canManage).
	kf := informers.NewSharedInformerFactoryWithOptions(d.opts.Client, 0,
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) { lo.LabelSelector = config.LabelGatewayName }))
	d.children = map[string]cache.GenericLister{}
	for kind, gvr := range kinds {
		inf, err := kf.ForResource(gvr)
		if err != nil {
			return err
		}
		d.children[kind] = inf.Lister()
		if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: d.enqueueOwner,
			UpdateFunc: func(old, cur any) {
				if childChanged(old, cur) {
					d.enqueueOwner(cur)
				}
			},
			DeleteFunc: d.enqueueOwner,
		}); err != nil {
			return err
		}
	}
	// Namespaces: one being deleted gets nothing new.
	nsf := informers.NewSharedInformerFactory(d.opts.Client, 0)
	nsInf := nsf.Core().V1().Namespaces()
	d.namespaces = nsInf.Lister()
	nsInf.Informer()
	gwf.Start(ctx.Done())
	kf.Start(ctx.Done())
	nsf.Start(ctx.Done())
	defer gwf.Shutdown()
	defer kf.Shutdown()
	defer nsf.Shutdown()
	for _, synced := range []map[reflect.Type]bool{gwf.WaitForCacheSync(ctx.Done()), kf.WaitForCacheSync(ctx.Done()), nsf.WaitForCacheSync(ctx.Done())} {
		for typ, ok := range synced {
			if !ok {
				if ctx.Err() != nil {
					return nil // stopped while starting
				}
				return fmt.Errorf("deployer: cache of %v did not sync", typ)
			}
		}
	}
	d.lastValues = d.opts.Values()
	var wg sync.WaitGroup
	for range d.opts.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for d.processNext(ctx) {
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		wait.UntilWithContext(ctx, d.checkForChanges, d.opts.TemplateCheck)
	}()
	d.log.Info("waypoint deployer started")
	<-ctx.Done()
	d.queue.ShutDown()
	wg.Wait()
	return nil
}

// kinds are the resources of a waypoint's children, by kind; the deployer
// reads and deletes them through the metadata client, which needs no type.
var kinds = map[string]schema.GroupVersionResource{
	"ServiceAccount":      corev1.SchemeGroupVersion.WithResource("serviceaccounts"),
	"ConfigMap":           corev1.SchemeGroupVersion.WithResource("configmaps"),
	"Service":             corev1.SchemeGroupVersion.WithResource("services"),
	"PodDisruptionBudget": policyv1.SchemeGroupVersion.WithResource("poddisruptionbudgets"),
	"Deployment":          appsv1.SchemeGroupVersion.WithResource("deployments"),
}

// childChanged ignores updates that change only an object's status (a
// Deployment's replica counts move with every pod).
func childChanged(old, cur any) bool {
	o, ok1 := old.(metav1.Object)
	c, ok2 := cur.(metav1.Object)
	if !ok1 || !ok2 {
		return true
	}
	if c.GetGeneration() == 0 {
		return o.GetResourceVersion() != c.GetResourceVersion()
	}
	return o.GetGeneration() != c.GetGeneration() ||
		!reflect.DeepEqual(o.GetLabels(), c.GetLabels()) ||
		!reflect.DeepEqual(o.GetAnnotations(), c.GetAnnotations()) ||
		!reflect.DeepEqual(o.GetOwnerReferences(), c.GetOwnerReferences())
}

// enqueueGateway enqueues a Gateway, and when it claims static addresses
// every other Gateway claiming one too: who holds an address depends on
// the others' claims (config.ResolveAddresses).
func (d *Deployer) enqueueGateway(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if gw, ok := obj.(*gwv1.Gateway); ok && len(config.StaticAddresses(gw)) > 0 {
		all, _ := d.gateways.List(labels.Everything())
		for _, o := range all {
			if len(config.StaticAddresses(o)) > 0 {
				d.queue.Add(types.NamespacedName{Namespace: o.Namespace, Name: o.Name})
			}
		}
	}
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		return
	}
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err == nil {
		d.queue.Add(types.NamespacedName{Namespace: ns, Name: name})
	}
}

// enqueueOwner enqueues the Gateway that controls a child.
func (d *Deployer) enqueueOwner(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	m, ok := obj.(metav1.Object)
	if !ok {
		return
	}
	if ref := metav1.GetControllerOf(m); ref != nil && ref.Kind == "Gateway" && ref.APIVersion == gwv1.GroupVersion.String() {
		d.queue.Add(types.NamespacedName{Namespace: m.GetNamespace(), Name: ref.Name})
	}
}

// checkForChanges re-reads the template files and the values; a change
// re-applies every Gateway.
func (d *Deployer) checkForChanges(ctx context.Context) {
	changed := false
	for _, ct := range d.templates {
		if ct.file == "" {
			continue
		}
		text, tmpl, err := ct.read()
		d.mu.Lock()
		switch {
		case err != nil:
			if !bytes.Equal(text, ct.text) {
				d.log.Error(ct.what+" template rejected; the previous one stays in force", zap.Error(err))
				ct.text = text // report once per change
			}
		case !bytes.Equal(text, ct.text):
			ct.tmpl, ct.text = tmpl, text
			changed = true
			d.log.Info(ct.what+" template changed", zap.String("file", ct.file))
		}
		d.mu.Unlock()
	}
	if v := d.opts.Values(); v != d.lastValues {
		d.lastValues = v
		changed = true
	}
	if changed {
		d.enqueueAll()
	}
}

func (d *Deployer) enqueueAll() {
	gws, err := d.gateways.List(labels.Everything())
	if err != nil {
		return
	}
	for _, gw := range gws {
		d.queue.Add(types.NamespacedName{Namespace: gw.Namespace, Name: gw.Name})
	}
}

func (d *Deployer) processNext(ctx context.Context) bool {
	key, quit := d.queue.Get()
	if quit {
		return false
	}
	defer d.queue.Done(key)
	if err := d.Reconcile(ctx, key); err != nil {
		d.log.Warn("gateway not reconciled; retrying", zap.Stringer("gateway", key), zap.Error(err))
		d.queue.AddRateLimited(key)
		return true
	}
	d.queue.Forget(key)
	return true
}

// Reconcile brings one Gateway's children in line with its class's
// template. A Gateway that is gone, or going with its namespace, needs
// nothing: garbage collection (or the namespace's deletion) removes what it
// owned. A Gateway that is no (longer a) waypoint or ingress Gateway of
// ours, or an ingress Gateway rejected as a whole, loses the children it
// owns.
func (d *Deployer) Reconcile(ctx context.Context, key types.NamespacedName) error {
	gw, err := d.gateways.Gateways(key.Namespace).Get(key.Name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if gw.DeletionTimestamp != nil || d.namespaceTerminating(gw.Namespace) {
		return nil
	}
	var children []Child
	if ct := d.templates[string(gw.Spec.GatewayClassName)]; ct != nil && d.ours(gw) && !d.rejectedIngress(gw) {
		d.mu.Lock()
		tmpl := ct.tmpl
		d.mu.Unlock()
		var addresses []string
		if string(gw.Spec.GatewayClassName) == config.IngressClass {
			all, err := d.gateways.List(labels.Everything())
			if err != nil {
				return err
			}
			addresses = config.ResolveAddresses(gw, d.opts.Addresses, all).Usable
		}
		children, err = tmpl.Render(gw, d.opts.Values(), addresses)
		if err != nil {
			d.recorder.Event(gw, corev1.EventTypeWarning, ct.invalid, err.Error())
			return err
		}
	}
	rendered := map[string]bool{}
	for _, c := range children {
		rendered[c.Kind] = true
		if err := d.canManage(ctx, gw, c); err != nil {
			d.recorder.Event(gw, corev1.EventTypeWarning, "NotOwned", err.Error())
			return err
		}
		if err := d.apply(ctx, c); err != nil {
			if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
				// Deleted since the namespace lister last heard: nothing to retry.
				d.log.Debug("namespace terminating; waypoint left to its deletion", zap.Stringer("gateway", key))
				return nil
			}
			d.recorder.Eventf(gw, corev1.EventTypeWarning, "ApplyFailed", "%s %s/%s: %v", c.Kind, c.Namespace, c.Name, err)
			return fmt.Errorf("%s %s/%s: %w", c.Kind, c.Namespace, c.Name, err)
		}
	}
	return d.prune(ctx, gw, rendered)
}

// ours says whether the deployer runs gw: a waypoint always (its class is
// the mesh's own name), an ingress Gateway when its GatewayClass exists
// and names the ingress controller ("causeway" may be another
// implementation's class in a cluster that runs several).
func (d *Deployer) ours(gw *gwv1.Gateway) bool {
	if string(gw.Spec.GatewayClassName) != config.IngressClass {
		return true
	}
	c, err := d.classes.Get(config.IngressClass)
	return err == nil && string(c.Spec.ControllerName) == config.IngressController
}

// rejectedIngress says whether gw is an ingress Gateway its status rejects
// as a whole (config.GatewayRejection): it runs no pods, and loses those it
// had.
func (d *Deployer) rejectedIngress(gw *gwv1.Gateway) bool {
	if string(gw.Spec.GatewayClassName) != config.IngressClass {
		return false
	}
	reason, _ := config.GatewayRejection(gw, d.opts.Addresses)
	return reason != ""
}

// namespaceTerminating says whether ns is being deleted. One the lister
// has not seen yet is not: the apply's answer settles it.
func (d *Deployer) namespaceTerminating(ns string) bool {
	n, err := d.namespaces.Get(ns)
	return err == nil && n.DeletionTimestamp != nil
}

// canManage refuses a child that exists without the Gateway's owner
// reference: someone else's object, or one left by an earlier Gateway of the
// same name (garbage collection will remove that one, and its deletion
// re-enqueues the Gateway).
func (d *Deployer) canManage(ctx context.Context, gw *gwv1.Gateway, c Child) error {
	existing, err := d.current(ctx, c.Kind, c.Namespace, c.Name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if ownedBy(existing, gw) {
		return nil
	}
	return fmt.Errorf("%s %s/%s exists and is not owned by Gateway %s/%s: not managing it", c.Kind, c.Namespace, c.Name, gw.Namespace, gw.Name)
}

func ownedBy(m metav1.Object, gw *gwv1.Gateway) bool {
	for _, r := range m.GetOwnerReferences() {
		if r.UID == gw.UID {
			return true
		}
	}
	return false
}

// current reads a child from the cache, or from the API server when the
// cache (which holds only labelled objects) does not have it.
func (d *Deployer) current(ctx context.Context, kind, ns, name string) (metav1.Object, error) {
	if obj, err := d.children[kind].ByNamespace(ns).Get(name); err == nil {
		return obj.(metav1.Object), nil
	}
	return d.opts.Metadata.Resource(kinds[kind]).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
}

func (d *Deployer) apply(ctx context.Context, c Child) error {
	opts := metav1.ApplyOptions{FieldManager: FieldManager, Force: true}
	cs := d.opts.Client
	var err error
	switch o := c.Apply.(type) {
	case *corev1ac.ServiceAccountApplyConfiguration:
		_, err = cs.CoreV1().ServiceAccounts(c.Namespace).Apply(ctx, o, opts)
	case *corev1ac.ConfigMapApplyConfiguration:
		_, err = cs.CoreV1().ConfigMaps(c.Namespace).Apply(ctx, o, opts)
	case *corev1ac.ServiceApplyConfiguration:
		_, err = cs.CoreV1().Services(c.Namespace).Apply(ctx, o, opts)
	case *policyv1ac.PodDisruptionBudgetApplyConfiguration:
		_, err = cs.PolicyV1().PodDisruptionBudgets(c.Namespace).Apply(ctx, o, opts)
	case *appsv1ac.DeploymentApplyConfiguration:
		_, err = cs.AppsV1().Deployments(c.Namespace).Apply(ctx, o, opts)
	default:
		err = fmt.Errorf("unexpected apply configuration %T", c.Apply)
	}
	return err
}

// prune deletes the children this Gateway owns that the template no longer
// renders (all of them when the Gateway stopped being ours).
func (d *Deployer) prune(ctx context.Context, gw *gwv1.Gateway, rendered map[string]bool) error {
	for kind, lister := range d.children {
		if rendered[kind] {
			continue
		}
		obj, err := lister.ByNamespace(gw.Namespace).Get(gw.Name)
		if err != nil {
			continue // not there (the cache holds every labelled child)
		}
		m := obj.(metav1.Object)
		if !ownedBy(m, gw) {
			continue
		}
		uid := m.GetUID()
		del := metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}
		err = d.opts.Metadata.Resource(kinds[kind]).Namespace(gw.Namespace).Delete(ctx, gw.Name, del)
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting %s %s/%s: %w", kind, gw.Namespace, gw.Name, err)
		}
		d.log.Info("deleted a gateway object no longer rendered", zap.String("kind", kind), zap.String("name", gw.Namespace+"/"+gw.Name))
	}
	return nil
}
