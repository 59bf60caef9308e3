// Package kubecontrollers runs the control plane's Kubernetes controllers
// (docs/design.md §10): every replica serves the validating admission webhook; the
// replica holding the Lease also runs the deployer (waypoints and ingress
// Gateways), the status writer, the upkeep of the webhook configuration's
// CA bundle and of the mesh's GatewayClasses. xDS and the CA are served by every replica,
// outside this package.
package kubecontrollers

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	admissionac "k8s.io/client-go/applyconfigurations/admissionregistration/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	gwinformers "sigs.k8s.io/gateway-api/pkg/client/informers/externalversions"

	"github.com/causeway-mesh/causeway/pkg/admission"
	"github.com/causeway-mesh/causeway/pkg/config"
	"github.com/causeway-mesh/causeway/pkg/deployer"
	"github.com/causeway-mesh/causeway/pkg/gwstatus"
	"github.com/causeway-mesh/causeway/pkg/leader"
	"github.com/causeway-mesh/causeway/pkg/trust"
)

// Options configure the controllers.
type Options struct {
	Config *rest.Config
	// Authority issues the webhook's certificate; its roots go to the
	// waypoints and to the webhook configuration's CA bundle.
	Authority   *trust.Authority
	Identity    trust.Identity // the control plane's
	Translation config.Options
	// Election: the Lease Namespace/LeaseName, this replica's identity in it.
	Election leader.Options
	// Deployment names the control plane's own Deployment, in the Lease's
	// namespace. Seen being deleted (uninstall), the replica leads no more
	// and leaves the Lease to expire (leader.Elector.Abandon): helm
	// uninstall deletes the RBAC right after the workloads, before their
	// pods stop, and every Lease request would then be refused. Empty: not
	// watched.
	Deployment string
	// Waypoint values the deployer renders (Image, XDSAddress,
	// TokenAudience; the rest is filled in), for waypoints and ingress
	// Gateways alike, and the template files (empty: the built-in ones).
	Waypoint         deployer.Values
	WaypointTemplate string
	IngressTemplate  string
	// GatewayAddresses are the static addresses ingress Gateways may claim
	// in spec.addresses (config.AddressPool); empty: none.
	GatewayAddresses config.AddressPool
	// WebhookListen is the webhook's address; empty: no webhook.
	WebhookListen   string
	WebhookDNSNames []string // host names (or IPs) in its certificate
	// WebhookConfiguration names the ValidatingWebhookConfiguration whose
	// CA bundle the leader keeps equal to the roots; empty: left alone.
	WebhookConfiguration string
	// PolicySet says whether a connection policy set can be enforced, for
	// the ConnectionPolicies' status (gwstatus.Options.PolicySet); call
	// PolicySetsChanged when its answers change. The admission webhook refuses
	// a ConnectionPolicy naming a set it says cannot be enforced.
	PolicySet  func(name string) (revision, problem string)
	Logger     *zap.Logger
	Registerer prometheus.Registerer
}

// Controllers runs the webhook on every replica and the leader's work on
// the replica holding the Lease. Build it with New; Run owns everything and
// returns when its context ends.
type Controllers struct {
	opts      Options
	log       *zap.Logger
	cs        kubernetes.Interface
	gw        gwclient.Interface
	authority *trust.Authority
	identity  trust.Identity
	elector   *leader.Elector
	deployer  *deployer.Deployer
	status    *gwstatus.Writer
	webhook   *admission.Webhook
	hookCert  atomic.Pointer[tls.Certificate]
	informers []interface{ Start(<-chan struct{}) }
	synced    []func(<-chan struct{}) bool
	shutdown  []func()
	webhookLn net.Listener
}

// New builds the controllers and binds the webhook's port.
func New(o Options) (*Controllers, error) {
	if o.Config == nil || o.Authority == nil || o.Logger == nil {
		return nil, errors.New("kubecontrollers: Config, Authority and Logger are required")
	}
	cs, err := kubernetes.NewForConfig(o.Config)
	if err != nil {
		return nil, err
	}
	gw, err := gwclient.NewForConfig(o.Config)
	if err != nil {
		return nil, err
	}
	md, err := metadata.NewForConfig(o.Config)
	if err != nil {
		return nil, err
	}
	log := o.Logger
	kc := &Controllers{opts: o, log: log, cs: cs, gw: gw, authority: o.Authority, identity: o.Identity}
	el := o.Election
	el.Client, el.Logger = cs, log.Named("leader")
	if kc.elector, err = leader.New(el); err != nil {
		return nil, err
	}
	values := o.Waypoint
	values.ControlPlaneIdentity = o.Identity.String()
	values.TrustDomain = o.Identity.TrustDomain().Name()
	values.RootCert = string(o.Authority.RootsPEM())
	if kc.deployer, err = deployer.New(deployer.Options{Client: cs, Metadata: md, Gateways: gw, TemplateFile: o.WaypointTemplate,
		IngressTemplateFile: o.IngressTemplate, Values: func() deployer.Values { return values }, Addresses: o.GatewayAddresses, Logger: log.Named("deployer")}); err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(o.Config)
	if err != nil {
		return nil, err
	}
	if kc.status, err = gwstatus.New(gwstatus.Options{Client: cs, Gateways: gw, Dynamic: dyn, PolicySet: o.PolicySet,
		Translation: o.Translation, Addresses: o.GatewayAddresses, Logger: log.Named("status")}); err != nil {
		return nil, err
	}
	if o.WebhookListen != "" {
		kf := informers.NewSharedInformerFactory(cs, 0)
		gf := gwinformers.NewSharedInformerFactory(gw, 0)
		if kc.webhook, err = admission.New(admission.Options{Gateways: gf.Gateway().V1().Gateways().Lister(),
			Namespaces: kf.Core().V1().Namespaces().Lister(), IngressClasses: kf.Networking().V1().IngressClasses().Lister(), PolicySet: o.PolicySet, Logger: log.Named("admission"), Registerer: o.Registerer}); err != nil {
			return nil, err
		}
		kc.informers = append(kc.informers, kf, gf)
		kc.synced = append(kc.synced, func(stop <-chan struct{}) bool { return allSynced(kf.WaitForCacheSync(stop)) },
			func(stop <-chan struct{}) bool { return allSynced(gf.WaitForCacheSync(stop)) })
		kc.shutdown = append(kc.shutdown, kf.Shutdown, gf.Shutdown)
		if err := kc.renewWebhookCert(); err != nil {
			return nil, err
		}
		if kc.webhookLn, err = net.Listen("tcp", o.WebhookListen); err != nil {
			return nil, fmt.Errorf("webhook: %w", err)
		}
	}
	return kc, nil
}

// WebhookAddr is the webhook's bound address (nil without a webhook).
func (kc *Controllers) WebhookAddr() net.Addr {
	if kc.webhookLn == nil {
		return nil
	}
	return kc.webhookLn.Addr()
}

func allSynced[K comparable](m map[K]bool) bool {
	for _, ok := range m {
		if !ok {
			return false
		}
	}
	return true
}

// renewWebhookCert issues the webhook's serving certificate: the apiserver
// checks the Service's host name, so it carries DNS names as well as the
// control plane's identity.
func (kc *Controllers) renewWebhookCert() error {
	var names trust.ServerNames
	for _, n := range kc.opts.WebhookDNSNames {
		if ip := net.ParseIP(n); ip != nil {
			names.IPs = append(names.IPs, ip)
		} else {
			names.DNS = append(names.DNS, n)
		}
	}
	cert, err := kc.authority.IssueServer(kc.identity, names)
	if err != nil {
		return fmt.Errorf("webhook certificate: %w", err)
	}
	kc.hookCert.Store(cert)
	return nil
}

// PolicySetsChanged has the status writer look at the connection policy
// sets again (a new revision, or a set's first).
func (kc *Controllers) PolicySetsChanged() { kc.status.Resync() }

// Healthy fails when this replica may be leading without holding the Lease.
func (kc *Controllers) Healthy() error { return kc.elector.Healthy() }

// Leading reports whether this replica runs the leader's work.
func (kc *Controllers) Leading() bool { return kc.elector.Leading() }

// Run serves the webhook and campaigns for the Lease until ctx ends.
func (kc *Controllers) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, f := range kc.shutdown {
		defer f()
	}
	errc := make(chan error, 2)
	if kc.webhook != nil {
		for _, inf := range kc.informers {
			inf.Start(ctx.Done())
		}
		for _, s := range kc.synced {
			if !s(ctx.Done()) {
				if ctx.Err() != nil {
					return nil // stopped while starting
				}
				return errors.New("webhook: informer caches did not sync")
			}
		}
		mux := http.NewServeMux()
		mux.Handle(admission.Path, kc.webhook)
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second,
			TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12,
				GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return kc.hookCert.Load(), nil }}}
		wg.Add(2)
		go func() {
			defer wg.Done()
			if err := srv.ServeTLS(kc.webhookLn, "", ""); !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("webhook: %w", err)
			}
		}()
		go func() {
			defer wg.Done()
			<-ctx.Done()
			sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer scancel()
			_ = srv.Shutdown(sctx)
		}()
		wg.Add(1)
		go func() {
			defer wg.Done()
			kc.rotateWebhookCert(ctx)
		}()
		kc.log.Info("admission webhook serving", zap.String("listen", kc.webhookLn.Addr().String()), zap.Strings("dns_names", kc.opts.WebhookDNSNames))
	}
	if kc.opts.Deployment != "" {
		stop := kc.watchUninstall(ctx)
		defer stop()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		// It returns nil early when abandoned: the rest serves on.
		if err := kc.elector.Run(ctx, kc.lead); err != nil {
			errc <- err
		}
	}()
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		return err
	}
}

// watchUninstall abandons the election once the control plane's
// Deployment is seen being deleted or deleted; the returned function stops
// the watch.
func (kc *Controllers) watchUninstall(ctx context.Context) (stop func()) {
	ns, name := kc.opts.Election.Namespace, kc.opts.Deployment
	f := informers.NewSharedInformerFactoryWithOptions(kc.cs, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		}))
	var once sync.Once
	uninstalling := func(why string) {
		once.Do(func() {
			kc.log.Info("uninstalling: "+why+"; leading no more and leaving the Lease to expire (the permissions go next)",
				zap.String("deployment", ns+"/"+name))
			kc.elector.Abandon()
		})
	}
	deleting := func(obj any) {
		if d, ok := obj.(*appsv1.Deployment); ok && d.DeletionTimestamp != nil {
			uninstalling("the control plane's Deployment is being deleted")
		}
	}
	if _, err := f.Apps().V1().Deployments().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    deleting,
		UpdateFunc: func(_, obj any) { deleting(obj) },
		DeleteFunc: func(any) { uninstalling("the control plane's Deployment is deleted") },
	}); err != nil {
		kc.log.Error("cannot watch the control plane's Deployment: uninstall will be refused Lease requests", zap.Error(err))
	}
	f.Start(ctx.Done())
	return f.Shutdown
}

// lead is the leader's work, until leadership ends.
func (kc *Controllers) lead(ctx context.Context) {
	var wg sync.WaitGroup
	run := func(name string, f func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A controller that fails is restarted while this replica leads.
			for {
				err := f(ctx)
				if ctx.Err() != nil {
					return
				}
				if err == nil {
					err = errors.New("stopped")
				}
				kc.log.Error(name+" failed; restarting", zap.Error(err))
				select {
				case <-ctx.Done():
					return
				case <-time.After(5 * time.Second):
				}
			}
		}()
	}
	run("waypoint deployer", kc.deployer.Run)
	run("status writer", kc.status.Run)
	if kc.opts.WebhookConfiguration != "" {
		run("webhook configuration upkeep", kc.keepCABundle)
	}
	run("gatewayclass upkeep", kc.keepGatewayClass)
	wg.Wait()
}

// rotateWebhookCert renews the webhook's certificate at half its lifetime.
func (kc *Controllers) rotateWebhookCert(ctx context.Context) {
	for {
		leaf := kc.hookCert.Load().Leaf
		wait := max(time.Until(leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore)/2)), time.Second)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		if err := kc.renewWebhookCert(); err != nil {
			kc.log.Error("webhook certificate renewal failed; retrying in a minute", zap.Error(err))
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Minute):
			}
		}
	}
}

// classCheck is how often the leader makes sure the mesh's GatewayClasses
// exist.
const classCheck = 30 * time.Second

// classes are the GatewayClasses the leader keeps: waypoints and ingress
// Gateways.
var classes = []gwv1.GatewayClass{
	{ObjectMeta: metav1.ObjectMeta{Name: config.WaypointClass}, Spec: gwv1.GatewayClassSpec{ControllerName: gwstatus.ControllerName,
		Description: ptr.To("Causeway waypoints: per-namespace L7 proxies for the mesh")}},
	{ObjectMeta: metav1.ObjectMeta{Name: config.IngressClass}, Spec: gwv1.GatewayClassSpec{ControllerName: gwstatus.IngressControllerName,
		Description: ptr.To("Causeway ingress: HTTP and HTTPS from outside into the mesh")}},
}

// keepGatewayClass creates the GatewayClasses causeway-waypoint and
// causeway when they are missing, as istiod does for its classes: the
// manifests cannot carry them, since one `kubectl apply -k` of a CRD and an
// object of its kind fails on a fresh cluster (the kind is not served yet
// when the object is sent). A class that exists is left as it is, even
// with another controller: it is the operator's (and a class of another
// controller has its Gateways left alone).
func (kc *Controllers) keepGatewayClass(ctx context.Context) error {
	api := kc.gw.GatewayV1().GatewayClasses()
	for {
		for _, c := range classes {
			_, err := api.Get(ctx, c.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				c := c.DeepCopy()
				c.Labels = map[string]string{"app.kubernetes.io/managed-by": "causeway"}
				_, err = api.Create(ctx, c, metav1.CreateOptions{FieldManager: deployer.FieldManager})
				if err == nil {
					kc.log.Info("GatewayClass created", zap.String("gatewayclass", c.Name))
				}
			}
			if err != nil && !apierrors.IsAlreadyExists(err) {
				kc.log.Warn("GatewayClass not ensured", zap.String("gatewayclass", c.Name), zap.Error(err))
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(classCheck):
		}
	}
}

// keepCABundle sets the CA bundle of the webhooks of the configuration (made
// by the manifests) to the mesh roots, which only the control plane knows
// when it generated its CA; it checks again every minute.
func (kc *Controllers) keepCABundle(ctx context.Context) error {
	roots := kc.authority.RootsPEM()
	for {
		if err := kc.applyCABundle(ctx, roots); err != nil {
			kc.log.Warn("webhook configuration's CA bundle not updated", zap.String("configuration", kc.opts.WebhookConfiguration), zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Minute):
		}
	}
}

func (kc *Controllers) applyCABundle(ctx context.Context, roots []byte) error {
	vwcs := kc.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	cur, err := vwcs.Get(ctx, kc.opts.WebhookConfiguration, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil // not installed: nothing to keep
	}
	if err != nil {
		return err
	}
	ac := admissionac.ValidatingWebhookConfiguration(kc.opts.WebhookConfiguration)
	stale := false
	for _, w := range cur.Webhooks {
		if !slices.Contains(admission.Webhooks, w.Name) {
			continue
		}
		if !bytes.Equal(w.ClientConfig.CABundle, roots) {
			stale = true
		}
		ac.WithWebhooks(admissionac.ValidatingWebhook().WithName(w.Name).
			WithClientConfig(admissionac.WebhookClientConfig().WithCABundle(roots...)))
	}
	if !stale {
		return nil
	}
	_, err = vwcs.Apply(ctx, ac, metav1.ApplyOptions{FieldManager: deployer.FieldManager, Force: true})
	if err == nil {
		kc.log.Info("webhook configuration's CA bundle set to the mesh roots", zap.String("configuration", kc.opts.WebhookConfiguration))
	}
	return err
}
