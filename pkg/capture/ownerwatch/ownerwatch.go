// Package ownerwatch follows the node agent's DaemonSet and its namespace,
// so that the agent, stopping, can tell an uninstall (remove the CNI
// plugin) from a restart or an upgrade (keep it).
package ownerwatch

import (
	"context"
	"fmt"

	"go.uber.org/zap"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Watch follows the agent's DaemonSet and its namespace, so the uninstall
// decision at shutdown has the last state seen even when the API server no
// longer answers the agent.
type Watch struct {
	client          kubernetes.Interface
	namespace, name string
	informer        cache.SharedIndexInformer // the DaemonSet
	nsInformer      cache.SharedIndexInformer // its namespace
}

// New starts the watches; they end with ctx.
func New(ctx context.Context, client kubernetes.Interface, namespace, name string, log *zap.Logger) *Watch {
	byName := func(name string) informers.SharedInformerOption {
		return informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		})
	}
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(namespace), byName(name))
	nf := informers.NewSharedInformerFactoryWithOptions(client, 0, byName(namespace))
	w := &Watch{client: client, namespace: namespace, name: name,
		informer: f.Apps().V1().DaemonSets().Informer(), nsInformer: nf.Core().V1().Namespaces().Informer()}
	for what, inf := range map[string]cache.SharedIndexInformer{"DaemonSet": w.informer, "namespace": w.nsInformer} {
		inf.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
			log.Warn("watch of the agent's "+what, zap.String("daemonset", namespace+"/"+name), zap.Error(err))
		})
	}
	f.Start(ctx.Done())
	nf.Start(ctx.Done())
	return w
}

// Gone says whether the DaemonSet, or its namespace, is deleted or being
// deleted (uninstall), and why. `kubectl delete -k` deletes the namespace
// first: the namespace controller may then stop the agent's pod before it
// deletes the DaemonSet. A deletion the watches saw is final (what is being
// deleted is never undeleted), so it is not asked again: `helm uninstall`
// deletes the agent's permissions right after the DaemonSet, before its
// pods stop, and the API server would refuse the agent. Otherwise the API
// server's answer wins, as the watches may lag; when there is none, the
// watches' last state, and when they never listed, no: keeping the plugin
// fails new pods closed, removing it would start them uncaptured.
func (w *Watch) Gone(ctx context.Context) (bool, string) {
	if gone, why := w.seenGone(); gone {
		return true, why
	}
	if gone, why := w.namespaceGone(ctx); gone {
		return true, why
	}
	ds, err := w.client.AppsV1().DaemonSets(w.namespace).Get(ctx, w.name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return true, "the DaemonSet is deleted"
	case err == nil:
		return deleting(ds)
	}
	if !w.informer.HasSynced() {
		return false, fmt.Sprintf("the API server cannot say whether the DaemonSet is deleted (%v) and it was never listed", err)
	}
	return false, fmt.Sprintf("the DaemonSet remains, as last seen (the API server: %v)", err)
}

// seenGone: the watches saw the namespace or the DaemonSet deleted or
// being deleted.
func (w *Watch) seenGone() (bool, string) {
	if w.nsInformer.HasSynced() {
		obj, exists, _ := w.nsInformer.GetStore().GetByKey(w.namespace)
		if !exists || obj.(*corev1.Namespace).DeletionTimestamp != nil {
			return true, "the DaemonSet's namespace was seen deleted or being deleted"
		}
	}
	if w.informer.HasSynced() {
		obj, exists, _ := w.informer.GetStore().GetByKey(w.namespace + "/" + w.name)
		if !exists {
			return true, "the DaemonSet was seen deleted"
		}
		if gone, why := deleting(obj.(*appsv1.DaemonSet)); gone {
			return true, why
		}
	}
	return false, ""
}

// namespaceGone: the DaemonSet's namespace is deleted or terminating, as
// the API server says.
func (w *Watch) namespaceGone(ctx context.Context) (bool, string) {
	ns, err := w.client.CoreV1().Namespaces().Get(ctx, w.namespace, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return true, "the DaemonSet's namespace is deleted"
	case err == nil:
		return ns.DeletionTimestamp != nil, "the DaemonSet's namespace is being deleted"
	}
	return false, ""
}

func deleting(ds *appsv1.DaemonSet) (bool, string) {
	if ds.DeletionTimestamp != nil {
		return true, "the DaemonSet is being deleted"
	}
	return false, "the DaemonSet remains (a restart or an upgrade)"
}
