// Package kubesource is the control plane's configuration source in a
// Kubernetes cluster: shared informers (resync off) on Namespaces, Pods,
// Services, EndpointSlices, ConfigMaps (their ca.crt only), Secrets of
// type kubernetes.io/tls (ingress listeners' certificates: see
// TLSSecretInformers), Nodes (their topology labels only: see
// nodeLocalities), the Gateway
// API Gateways, HTTPRoutes, GRPCRoutes, ReferenceGrants and
// BackendTLSPolicies, Kubernetes Ingresses and IngressClasses, and
// Causeway's ConnectionPolicies (a dynamic
// informer, while the cluster serves the kind: see ConnectionPolicies).
// It hands what the informers hold to the
// same translation as the directory source (config.Translate), so both
// sources give the same snapshot for the same objects. The translation is
// incremental (config.Incremental): informer objects keep their identity
// until they change, so a burst translates only the namespaces it touched.
//
// Changes are debounced: the first change of a burst starts a timer, and
// everything that arrives until it fires becomes one snapshot, so a
// rollout of many pods is one push, never later than the debounce after
// its first change. An object the translation refuses (a pod running as
// a waypoint's service account, a use-waypoint label naming no waypoint, a
// route the mesh cannot serve) is refused alone and fails closed
// (config.Translate); every other object keeps updating. Refusals are
// logged as they come and go, listed in each snapshot (Rejected) and
// written to the objects' status by pkg/gwstatus.
//
// The source also answers the CA's questions from its pod informer: does a
// pod still exist with the uid a token names (tokenreview.PodLookup), and does a
// captured pod of an identity, not refused by the translation, run on a
// node (trust.WorkloadIndex, by an index keyed by node and service account,
// checked against the last good snapshot).
package kubesource

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	networkinglisters "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	gwinformers "sigs.k8s.io/gateway-api/pkg/client/informers/externalversions"
	gwlisters "sigs.k8s.io/gateway-api/pkg/client/listers/apis/v1"

	"github.com/causeway-mesh/causeway/pkg/config"
)

// Origin is the Problem.Origin of objects read from the API server.
const Origin = "kubernetes"

// Options configure a Source.
type Options struct {
	Translate config.Options
	Logger    *zap.Logger
	// Debounce is how long changes are collected after the first one of a
	// burst before they are translated and emitted as one snapshot
	// (default 100ms).
	Debounce time.Duration
	// SyncTimeout bounds the wait for the informers' first list (default 2m).
	SyncTimeout time.Duration
	// KindRecheck is how often a ConnectionPolicy kind the cluster does not
	// serve is looked for again (default 30s).
	KindRecheck time.Duration
	// OnRejected, when set, is called with each rejected configuration's
	// error (an *config.InvalidError).
	OnRejected func(error)
}

// Source watches the cluster and emits snapshots.
type Source struct {
	opts Options
	log  *zap.Logger
	kube kubernetes.Interface
	gw   gwclient.Interface

	factory    informers.SharedInformerFactory
	secFactory informers.SharedInformerFactory // kubernetes.io/tls Secrets only
	gwFactory  gwinformers.SharedInformerFactory
	synced     []cache.InformerSynced
	podsSynced cache.InformerSynced

	namespaces  corelisters.NamespaceLister
	pods        corelisters.PodLister
	podIndex    cache.Indexer
	services    corelisters.ServiceLister
	slices      discoverylisters.EndpointSliceLister
	gateways    gwlisters.GatewayLister
	httpRoutes  gwlisters.HTTPRouteLister
	grpcRoutes  gwlisters.GRPCRouteLister
	grants      gwlisters.ReferenceGrantLister
	tlsPolicies gwlisters.BackendTLSPolicyLister
	configMaps  corelisters.ConfigMapLister
	secrets     corelisters.SecretLister
	ingresses   networkinglisters.IngressLister
	ingClasses  networkinglisters.IngressClassLister
	nodes       nodeLocalities
	policies    *ConnectionPolicies

	changed    chan time.Time // a change was seen, and when; capacity 1
	lastErr    string
	rejections *config.RejectionLog
	translator *config.Incremental
	last       atomic.Pointer[config.Snapshot] // the last good snapshot (IsWaypoint)

	// waitMu guards waiters: closed at the next good snapshot (Changed).
	waitMu  sync.Mutex
	waiters chan struct{}
}

// NewForConfig returns a source reading the cluster cfg points at.
func NewForConfig(cfg *rest.Config, opts Options) (*Source, error) {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	gw, err := gwclient.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return New(kube, gw, dyn, opts)
}

// podIndexName indexes pods by "<node>/<namespace>/<service account>".
const podIndexName = "node-serviceaccount"

// New returns a source over the given clients (dyn reads
// ConnectionPolicies). The informers start in Run.
func New(kube kubernetes.Interface, gw gwclient.Interface, dyn dynamic.Interface, opts Options) (*Source, error) {
	if opts.Debounce <= 0 {
		opts.Debounce = 100 * time.Millisecond
	}
	if opts.SyncTimeout <= 0 {
		opts.SyncTimeout = 2 * time.Minute
	}
	if opts.KindRecheck <= 0 {
		opts.KindRecheck = 30 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	s := &Source{
		opts: opts, log: opts.Logger, kube: kube, gw: gw,
		// Resync off: every change arrives as an event; a periodic resync
		// would only translate the same objects again.
		factory:    informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithTransform(config.Trim)),
		secFactory: TLSSecretInformers(kube),
		gwFactory:  gwinformers.NewSharedInformerFactoryWithOptions(gw, 0, gwinformers.WithTransform(config.Trim)),
		changed:    make(chan time.Time, 1),

		rejections: config.NewRejectionLog(opts.Logger),
		translator: config.NewIncremental(opts.Translate),
	}
	core := s.factory.Core().V1()
	disc := s.factory.Discovery().V1()
	netv1 := s.factory.Networking().V1()
	gwi := s.gwFactory.Gateway().V1()
	podInformer := core.Pods().Informer()
	if err := podInformer.AddIndexers(cache.Indexers{podIndexName: indexPodByNodeAndAccount}); err != nil {
		return nil, err
	}
	s.podIndex = podInformer.GetIndexer()
	s.podsSynced = podInformer.HasSynced
	for _, inf := range []cache.SharedIndexInformer{
		core.Namespaces().Informer(), podInformer, core.Services().Informer(), disc.EndpointSlices().Informer(),
		gwi.Gateways().Informer(), gwi.HTTPRoutes().Informer(), gwi.GRPCRoutes().Informer(), gwi.ReferenceGrants().Informer(),
		gwi.BackendTLSPolicies().Informer(), core.ConfigMaps().Informer(), s.secFactory.Core().V1().Secrets().Informer(),
		netv1.Ingresses().Informer(), netv1.IngressClasses().Informer(),
	} {
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { s.notify() },
			UpdateFunc: func(any, any) { s.notify() },
			DeleteFunc: func(any) { s.notify() },
		}); err != nil {
			return nil, err
		}
		s.synced = append(s.synced, inf.HasSynced)
	}
	nodeInformer := core.Nodes().Informer()
	if _, err := nodeInformer.AddEventHandler(s.nodes.handler(s.notify)); err != nil {
		return nil, err
	}
	s.synced = append(s.synced, nodeInformer.HasSynced)
	s.namespaces, s.pods, s.services = core.Namespaces().Lister(), core.Pods().Lister(), core.Services().Lister()
	s.slices = disc.EndpointSlices().Lister()
	s.gateways, s.httpRoutes, s.grpcRoutes, s.grants = gwi.Gateways().Lister(), gwi.HTTPRoutes().Lister(), gwi.GRPCRoutes().Lister(), gwi.ReferenceGrants().Lister()
	s.tlsPolicies, s.configMaps = gwi.BackendTLSPolicies().Lister(), core.ConfigMaps().Lister()
	s.secrets = s.secFactory.Core().V1().Secrets().Lister()
	s.ingresses, s.ingClasses = netv1.Ingresses().Lister(), netv1.IngressClasses().Lister()
	var err error
	if s.policies, err = NewConnectionPolicies(dyn, kube.Discovery(), opts.Logger, opts.KindRecheck, s.notify); err != nil {
		return nil, err
	}
	return s, nil
}

// notify records that something changed; the first change of a burst is
// the one whose time counts.
func (s *Source) notify() {
	select {
	case s.changed <- time.Now():
	default: // a change is already pending
	}
}

// Run starts the informers, waits for their first list, emits the first
// snapshot, then emits one after every burst of changes that yields a good
// one, until ctx ends (then it returns nil). emit is called from Run's
// goroutine; a snapshot's ChangedAt is the time of the first change it
// includes (for the first snapshot, when Run started).
func (s *Source) Run(ctx context.Context, emit func(*config.Snapshot)) error {
	start := time.Now()
	if err := s.checkGatewayAPI(); err != nil {
		return err
	}
	// On return the informers are stopped, then waited for (an error
	// returns with the caller's ctx still live).
	ctx, stop := context.WithCancel(ctx)
	defer s.factory.Shutdown()
	defer s.secFactory.Shutdown()
	defer s.gwFactory.Shutdown()
	defer s.policies.Shutdown()
	defer stop()
	s.factory.Start(ctx.Done())
	s.secFactory.Start(ctx.Done())
	s.gwFactory.Start(ctx.Done())
	policiesSynced, err := s.policies.Start(ctx)
	if err != nil {
		return err
	}
	synced := s.synced
	if policiesSynced != nil {
		synced = append(slices.Clip(synced), policiesSynced)
	}
	syncCtx, cancel := context.WithTimeout(ctx, s.opts.SyncTimeout)
	ok := cache.WaitForCacheSync(syncCtx.Done(), synced...)
	cancel()
	if !ok {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("kubernetes informers did not sync within %s", s.opts.SyncTimeout)
	}
	s.log.Info("kubernetes informers synced", zap.Duration("took", time.Since(start)))
	// Everything up to here is in the first snapshot.
	select {
	case <-s.changed:
	default:
	}
	s.reload(emit, start)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var since time.Time
	for {
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case at := <-s.changed:
			if since.IsZero() {
				since = at
				timer.Reset(s.opts.Debounce)
			}
		case <-timer.C:
			// Changes arriving during the translation start the next burst.
			s.reload(emit, since)
			since = time.Time{}
		}
	}
}

// checkGatewayAPI fails early and clearly when the Gateway API CRDs are
// missing: the informers would otherwise wait for them forever.
func (s *Source) checkGatewayAPI() error {
	res, err := s.kube.Discovery().ServerResourcesForGroupVersion(gwv1.GroupVersion.String())
	if err != nil {
		return fmt.Errorf("Gateway API %s: %w (are its CRDs installed?)", gwv1.GroupVersion, err)
	}
	have := map[string]bool{}
	for _, r := range res.APIResources {
		have[r.Name] = true
	}
	var missing []string
	for _, r := range []string{"gateways", "httproutes", "grpcroutes", "referencegrants", "backendtlspolicies"} {
		if !have[r] {
			missing = append(missing, r)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("Gateway API %s does not serve %s: install the standard-channel CRDs (v1.4 or later)", gwv1.GroupVersion, strings.Join(missing, ", "))
	}
	return nil
}

// Load translates what the informers hold now (after Run has synced them).
func (s *Source) Load() (*config.Snapshot, error) {
	objs, err := s.objects()
	if err != nil {
		return nil, err
	}
	return s.translator.Translate(objs)
}

func (s *Source) reload(emit func(*config.Snapshot), since time.Time) {
	snap, err := s.Load()
	if err != nil {
		s.report(err)
		return
	}
	s.lastErr = ""
	s.rejections.Update(snap.Rejected)
	s.log.Info("configuration loaded",
		zap.Int("refusals", len(snap.Rejected)),
		zap.Int("workloads", len(snap.Workloads)),
		zap.Int("services", len(snap.Services)),
		zap.Int("waypoints", len(snap.Waypoints)),
		zap.Int("http_routes", len(snap.HTTPRoutes)),
		zap.Int("grpc_routes", len(snap.GRPCRoutes)),
		zap.Duration("since_change", time.Since(since)))
	snap.ChangedAt = since
	s.last.Store(snap)
	s.waitMu.Lock()
	if s.waiters != nil {
		close(s.waiters)
		s.waiters = nil
	}
	s.waitMu.Unlock()
	emit(snap)
}

// report logs a configuration rejected as a whole (objects that are not a
// configuration, or the informers' caches failing), once per distinct set
// of problems (every event re-translates, and the same problem would flood
// the log).
func (s *Source) report(err error) {
	if s.opts.OnRejected != nil {
		s.opts.OnRejected(err)
	}
	if err.Error() == s.lastErr {
		return
	}
	s.lastErr = err.Error()
	var inv *config.InvalidError
	if errors.As(err, &inv) {
		for _, p := range inv.Problems {
			s.log.Error("configuration rejected; the last good configuration stays in force",
				zap.String("object", p.Object), zap.String("reason", p.Reason))
		}
		if inv.Truncated > 0 {
			s.log.Error("more configuration problems not shown", zap.Int("count", inv.Truncated))
		}
		return
	}
	s.log.Error("configuration rejected; the last good configuration stays in force", zap.Error(err))
}

// objects lists everything the informers hold, in a fixed order (kind,
// namespace, name), so problems are reported the same way every time.
func (s *Source) objects() ([]config.Object, error) {
	var out []config.Object
	add := func(list []runtime.Object) {
		keyed := make([]keyedObject, len(list))
		for i, o := range list {
			keyed[i] = keyedObject{key(o), o}
		}
		sort.Slice(keyed, func(i, j int) bool { return keyed[i].key < keyed[j].key })
		for _, k := range keyed {
			out = append(out, config.Object{Origin: Origin, Obj: k.obj})
		}
	}
	all := labels.Everything()
	var err error
	// list adds a lister's objects, unless a list before it failed.
	list := func(objs []runtime.Object, lerr error) {
		if err == nil {
			err = lerr
		}
		if err == nil {
			add(objs)
		}
	}
	list(listed(s.namespaces.List(all)))
	list(s.nodes.list(), nil)
	list(listed(s.pods.List(all)))
	list(listed(s.services.List(all)))
	list(listed(servicesSlices(s.slices.List(all))))
	list(listed(s.gateways.List(all)))
	list(listed(s.httpRoutes.List(all)))
	list(listed(s.grpcRoutes.List(all)))
	list(listed(s.grants.List(all)))
	list(listed(s.tlsPolicies.List(all)))
	list(listed(s.configMaps.List(all)))
	list(listed(s.secrets.List(all)))
	list(listed(s.ingClasses.List(all)))
	list(listed(s.ingresses.List(all)))
	list(listed(s.policies.List(), nil))
	if err != nil {
		return nil, err
	}
	return out, nil
}

// servicesSlices keeps the slices that name their Service: one without the
// service-name label belongs to none (a custom controller's), and the
// translation would refuse it.
func servicesSlices(sls []*discoveryv1.EndpointSlice, err error) ([]*discoveryv1.EndpointSlice, error) {
	return slices.DeleteFunc(sls, func(sl *discoveryv1.EndpointSlice) bool { return sl.Labels[config.LabelServiceName] == "" }), err
}

// listed is what a lister listed, as runtime objects.
func listed[T runtime.Object](list []T, err error) ([]runtime.Object, error) {
	if err != nil {
		return nil, err
	}
	out := make([]runtime.Object, len(list))
	for i, o := range list {
		out[i] = o
	}
	return out, nil
}

type keyedObject struct {
	key string
	obj runtime.Object
}

func key(o runtime.Object) string {
	m, err := meta.Accessor(o)
	if err != nil {
		return ""
	}
	return m.GetNamespace() + "/" + m.GetName()
}
