package main

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

// ownerWatch follows the agent's DaemonSet and its namespace, so the
// uninstall decision at shutdown has the last state seen even when the API
// server no longer answers the agent.
type ownerWatch struct {
	client          kubernetes.Interface
	namespace, name string
	informer        cache.SharedIndexInformer // the DaemonSet
	nsInformer      cache.SharedIndexInformer // its namespace
}

func watchOwner(ctx context.Context, client kubernetes.Interface, namespace, name string, log *zap.Logger) *ownerWatch {
	byName := func(name string) informers.SharedInformerOption {
		return informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		})
	}
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(namespace), byName(name))
	nf := informers.NewSharedInformerFactoryWithOptions(client, 0, byName(namespace))
	w := &ownerWatch{client: client, namespace: namespace, name: name,
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

// gone says whether the DaemonSet, or its namespace, is deleted or being
// deleted (uninstall), and why. `kubectl delete -k` deletes the namespace
// first: the namespace controller may then stop the agent's pod before it
// deletes the DaemonSet. The API server's answer wins; when there is none,
// the watches' last state, and when they never listed, no: keeping the
// plugin fails new pods closed, removing it would start them uncaptured.
func (w *ownerWatch) gone(ctx context.Context) (bool, string) {
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
	obj, exists, _ := w.informer.GetStore().GetByKey(w.namespace + "/" + w.name)
	if !exists {
		return true, fmt.Sprintf("the DaemonSet was last seen deleted (the API server: %v)", err)
	}
	gone, why := deleting(obj.(*appsv1.DaemonSet))
	return gone, why + fmt.Sprintf(", as last seen (the API server: %v)", err)
}

// namespaceGone: the DaemonSet's namespace is deleted or terminating, from
// the API server or, when it does not answer, as last seen.
func (w *ownerWatch) namespaceGone(ctx context.Context) (bool, string) {
	ns, err := w.client.CoreV1().Namespaces().Get(ctx, w.namespace, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return true, "the DaemonSet's namespace is deleted"
	case err == nil:
		return ns.DeletionTimestamp != nil, "the DaemonSet's namespace is being deleted"
	}
	obj, exists, _ := w.nsInformer.GetStore().GetByKey(w.namespace)
	if w.nsInformer.HasSynced() && (!exists || obj.(*corev1.Namespace).DeletionTimestamp != nil) {
		return true, fmt.Sprintf("the DaemonSet's namespace was last seen deleted or being deleted (the API server: %v)", err)
	}
	return false, ""
}

func deleting(ds *appsv1.DaemonSet) (bool, string) {
	if ds.DeletionTimestamp != nil {
		return true, "the DaemonSet is being deleted"
	}
	return false, "the DaemonSet remains (a restart or an upgrade)"
}
