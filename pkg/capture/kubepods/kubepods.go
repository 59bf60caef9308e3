// Package kubepods is the node agent's view of Kubernetes: the pods on its
// own node (an informer restricted by spec.nodeName, so a node's agent
// never holds the cluster's pods) and the namespaces' labels. It answers
// the agent's pod lookups at CNI ADD, finds the enrolled pods already
// running when the agent starts, and watches enrollment: a namespace or
// pod labelled causeway.dev/dataplane-mode=mesh after its pods started gets
// them captured without a restart; removing the label releases them.
//
// A running pod's network namespace is found by its IP among the
// namespaces the container runtime names under /var/run/netns (Index):
// a pod IP is unique on its node, the path is the one the CNI plugin is
// given at ADD, and it needs neither the runtime's socket (root on the
// node) nor entering the host's processes (hostPID and CAP_SYS_PTRACE).
// The IP comes from the pod's status, which can be stale (after a reboot
// another pod may hold it already), so the node's /proc, mounted
// read-only, first confirms the address is the pod's own (Owners).
package kubepods

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/causeway-mesh/causeway/pkg/capture/agent"
	"github.com/causeway-mesh/causeway/pkg/capture/cni"
	"github.com/causeway-mesh/causeway/pkg/capture/podns"
)

// DefaultNetnsDir is where containerd and CRI-O name pod sandboxes'
// network namespaces.
const DefaultNetnsDir = "/var/run/netns"

// DefaultProcDir is where the DaemonSet mounts the node's /proc.
const DefaultProcDir = "/host/proc"

// maxRetryDelay caps the backoff of a failed capture: the usual failure
// is a node proxy not connected yet, and the pod's rules are already in
// place (its traffic fails closed) until a retry hands it over.
const maxRetryDelay = 10 * time.Second

// Options configure a Cluster.
type Options struct {
	Client kubernetes.Interface
	// Node is this node's name.
	Node string
	// NetnsDir holds the pod sandboxes' namespaces (default DefaultNetnsDir).
	NetnsDir string
	// ProcDir is the node's /proc (default DefaultProcDir).
	ProcDir string
	// ExcludeNamespaces are never captured by the watch (default the CNI
	// plugin's: cni.DefaultExcludeNamespaces).
	ExcludeNamespaces []string
	// SyncTimeout bounds the wait for the first listing (default 1m).
	SyncTimeout time.Duration
	Logger      *zap.Logger
}

// Capturer is the agent (agent.Agent) as the watch drives it.
type Capturer interface {
	CapturePod(agent.RunningPod) error
	Release(uid string) error
	Captured(uid string) bool
}

// Cluster holds the informers. Pod and Running are safe for concurrent use.
type Cluster struct {
	o          Options
	log        *zap.Logger
	factories  []informers.SharedInformerFactory
	podInf     cache.SharedIndexInformer
	pods       corelisters.PodLister
	namespaces corelisters.NamespaceLister
	queue      workqueue.TypedRateLimitingInterface[podRef]
}

// podRef names a pod to reconcile; the uid tells a deleted pod from a new
// one of the same name.
type podRef struct{ Namespace, Name, UID string }

// New sets up the informers; Start runs them.
func New(o Options) (*Cluster, error) {
	if o.Client == nil || o.Node == "" {
		return nil, errors.New("kubepods: Client and Node are required")
	}
	if o.NetnsDir == "" {
		o.NetnsDir = DefaultNetnsDir
	}
	if o.ProcDir == "" {
		o.ProcDir = DefaultProcDir
	}
	if o.ExcludeNamespaces == nil {
		o.ExcludeNamespaces = cni.DefaultExcludeNamespaces
	}
	if o.SyncTimeout <= 0 {
		o.SyncTimeout = time.Minute
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	onNode := informers.NewSharedInformerFactoryWithOptions(o.Client, 0, informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
		lo.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", o.Node).String()
	}))
	all := informers.NewSharedInformerFactory(o.Client, 0)
	c := &Cluster{o: o, log: o.Logger, factories: []informers.SharedInformerFactory{onNode, all},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.NewTypedItemExponentialFailureRateLimiter[podRef](100*time.Millisecond, maxRetryDelay),
			workqueue.TypedRateLimitingQueueConfig[podRef]{Name: "kubepods"})}
	podInf := onNode.Core().V1().Pods()
	nsInf := all.Core().V1().Namespaces()
	c.podInf, c.pods, c.namespaces = podInf.Informer(), podInf.Lister(), nsInf.Lister()
	for _, inf := range []cache.SharedIndexInformer{c.podInf, nsInf.Informer()} {
		if err := inf.SetTransform(stripManagedFields); err != nil {
			return nil, err
		}
	}
	if _, err := c.podInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueuePod,
		UpdateFunc: func(_, obj any) { c.enqueuePod(obj) },
		DeleteFunc: c.enqueuePod,
	}); err != nil {
		return nil, err
	}
	if _, err := nsInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: c.enqueueNamespace,
		UpdateFunc: func(old, obj any) {
			o, n := old.(*corev1.Namespace), obj.(*corev1.Namespace)
			if o.Labels[agent.LabelDataplaneMode] != n.Labels[agent.LabelDataplaneMode] {
				c.enqueueNamespace(obj)
			}
		},
	}); err != nil {
		return nil, err
	}
	return c, nil
}

// stripManagedFields keeps the cache small: nothing here reads them.
func stripManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// Start runs the informers until ctx ends and waits, bounded, for their
// first listing. Without the node's /proc it refuses to start: the agent
// fails closed rather than capture by an address alone.
func (c *Cluster) Start(ctx context.Context) error {
	if err := podns.CheckProc(c.o.ProcDir); err != nil {
		return fmt.Errorf("kubepods: running pods cannot be told apart by their addresses: %w", err)
	}
	sctx, cancel := context.WithTimeout(ctx, c.o.SyncTimeout)
	defer cancel()
	for _, f := range c.factories {
		f.Start(ctx.Done())
		for typ, ok := range f.WaitForCacheSync(sctx.Done()) {
			if !ok {
				return fmt.Errorf("kubepods: no listing of %v within %s", typ, c.o.SyncTimeout)
			}
		}
	}
	return nil
}

// Pod looks a pod up for the agent: from the informers, or from the API
// server when they have not seen it yet (a pod just bound to the node).
func (c *Cluster) Pod(ctx context.Context, namespace, name string) (agent.Pod, error) {
	p, err := c.pods.Pods(namespace).Get(name)
	if apierrors.IsNotFound(err) {
		p, err = c.o.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		return agent.Pod{}, err
	}
	ns, err := c.namespaces.Get(namespace)
	if apierrors.IsNotFound(err) {
		ns, err = c.o.Client.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{})
	}
	if err != nil {
		return agent.Pod{}, err
	}
	return agentPod(p, ns), nil
}

func agentPod(p *corev1.Pod, ns *corev1.Namespace) agent.Pod {
	return agent.Pod{UID: string(p.UID), Name: p.Name, Namespace: p.Namespace, ServiceAccount: p.Spec.ServiceAccountName,
		Labels: p.Labels, NamespaceLabels: ns.Labels}
}

// Running lists the enrolled pods running on the node, with their
// namespaces (Start must have returned). A pod whose namespace is not
// found is logged and left out: its CNI ADD, or the watch, comes later.
func (c *Cluster) Running(context.Context) ([]agent.RunningPod, error) {
	pods, err := c.pods.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	var nodeView *view
	var out []agent.RunningPod
	for _, p := range pods {
		ap, ok, _ := c.candidate(p)
		if enrolled, _ := agent.Enrolled(ap); !ok || !enrolled || len(p.Status.PodIPs) == 0 {
			continue
		}
		if nodeView == nil {
			if nodeView, err = c.scan(); err != nil {
				return nil, err
			}
		}
		r, err := nodeView.running(ap, p)
		if err != nil {
			c.log.Warn("running pod left for later", zap.String("pod", p.Namespace+"/"+p.Name), zap.Error(err))
			continue
		}
		out = append(out, r)
	}
	return out, nil
}

// candidate is the agent's view of a pod that can be captured: sandboxed
// with its own network (not the host's), not finished, not in an excluded
// namespace. (A terminating pod is one: an agent restarting while it
// drains keeps it captured.) known is false while the informers have not
// seen the pod's namespace: the pod is then neither captured nor released
// (the namespace's arrival enqueues it again). The pod may have no IP yet.
func (c *Cluster) candidate(p *corev1.Pod) (ap agent.Pod, ok, known bool) {
	if p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed ||
		slices.Contains(c.o.ExcludeNamespaces, p.Namespace) {
		return agent.Pod{}, false, true
	}
	ns, err := c.namespaces.Get(p.Namespace)
	if err != nil {
		return agent.Pod{}, false, false
	}
	return agentPod(p, ns), true, true
}

// view is one scan of the node: its named network namespaces and which
// processes are whose pods'.
type view struct {
	idx    podns.Index
	owners *podns.Owners
}

func (c *Cluster) scan() (*view, error) {
	idx, err := podns.Scan(c.o.NetnsDir)
	if err != nil {
		return nil, fmt.Errorf("kubepods: %w", err)
	}
	owners, err := podns.ScanOwners(c.o.ProcDir)
	if err != nil {
		return nil, fmt.Errorf("kubepods: running pods cannot be told apart by their addresses: %w", err)
	}
	return &view{idx, owners}, nil
}

// running finds the pod's network namespace by the IPs of its status,
// once its own processes confirm them.
func (v *view) running(ap agent.Pod, p *corev1.Pod) (agent.RunningPod, error) {
	var ips []netip.Addr
	for _, s := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(s.IP); err == nil {
			ips = append(ips, a)
		}
	}
	if len(ips) == 0 {
		return agent.RunningPod{}, fmt.Errorf("no valid address in the status (%v)", p.Status.PodIPs)
	}
	if err := v.owners.Confirm(string(p.UID), ips); err != nil {
		return agent.RunningPod{}, err
	}
	path, err := v.idx.Lookup(ips...)
	if err != nil {
		return agent.RunningPod{}, err
	}
	gws, err := gateways(path)
	if err != nil {
		return agent.RunningPod{}, err
	}
	return agent.RunningPod{Pod: ap, Netns: path, Gateways: gws}, nil
}

// gateways are the default gateways inside the namespace at path: where
// the node reaches the pod from, kubelet's probes included.
func gateways(path string) ([]netip.Addr, error) {
	netns, err := ns.GetNS(path)
	if err != nil {
		return nil, err
	}
	defer netns.Close()
	return podns.Gateways(netns)
}
