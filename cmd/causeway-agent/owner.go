package main

import (
	"context"
	"fmt"

	"go.uber.org/zap"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// ownerWatch follows the agent's DaemonSet, so the uninstall decision at
// shutdown has the last state seen even when the API server no longer
// answers the agent.
type ownerWatch struct {
	client          kubernetes.Interface
	namespace, name string
	informer        cache.SharedIndexInformer
}

func watchOwner(ctx context.Context, client kubernetes.Interface, namespace, name string, log *zap.Logger) *ownerWatch {
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		}))
	w := &ownerWatch{client: client, namespace: namespace, name: name, informer: f.Apps().V1().DaemonSets().Informer()}
	w.informer.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
		log.Warn("watch of the agent's DaemonSet", zap.String("daemonset", namespace+"/"+name), zap.Error(err))
	})
	f.Start(ctx.Done())
	return w
}

// gone says whether the DaemonSet is deleted or being deleted (uninstall),
// and why. The API server's answer wins; when there is none, the watch's
// last state, and when the watch never listed it, no: keeping the plugin
// fails new pods closed, removing it would start them uncaptured.
func (w *ownerWatch) gone(ctx context.Context) (bool, string) {
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

func deleting(ds *appsv1.DaemonSet) (bool, string) {
	if ds.DeletionTimestamp != nil {
		return true, "the DaemonSet is being deleted"
	}
	return false, "the DaemonSet remains (a restart or an upgrade)"
}
