package kubepods

import (
	"context"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"

	"github.com/causeway-mesh/causeway/pkg/capture/agent"
)

func (c *Cluster) enqueuePod(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if p, ok := obj.(*corev1.Pod); ok {
		c.queue.Add(podRef{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID)})
	}
}

func (c *Cluster) enqueueNamespace(obj any) {
	ns, ok := obj.(*corev1.Namespace)
	if !ok {
		return
	}
	pods, err := c.pods.Pods(ns.Name).List(labels.Everything())
	if err != nil {
		return
	}
	for _, p := range pods {
		c.enqueuePod(p)
	}
}

// Watch keeps capture in line with enrollment until ctx ends (Start must
// have returned): enrolled running pods that are not captured are, pods
// no longer enrolled, or gone, are released. Retryable failures (no node
// proxy connected yet) are retried with backoff.
func (c *Cluster) Watch(ctx context.Context, to Capturer) {
	stop := context.AfterFunc(ctx, c.queue.ShutDown)
	defer stop()
	for {
		ref, quit := c.queue.Get()
		if quit {
			return
		}
		err := c.reconcile(ref, to)
		switch {
		case err == nil:
			c.queue.Forget(ref)
		case agent.Retryable(err):
			c.log.Info("capture of a running pod will be retried", zap.String("pod", ref.Namespace+"/"+ref.Name), zap.Error(err))
			c.queue.AddRateLimited(ref)
		default:
			c.log.Error("cannot capture running pod", zap.String("pod", ref.Namespace+"/"+ref.Name), zap.Error(err))
			c.queue.Forget(ref)
		}
		c.queue.Done(ref)
	}
}

func (c *Cluster) reconcile(ref podRef, to Capturer) error {
	p, err := c.pods.Pods(ref.Namespace).Get(ref.Name)
	if apierrors.IsNotFound(err) || (err == nil && string(p.UID) != ref.UID) {
		if to.Captured(ref.UID) {
			return to.Release(ref.UID) // the pod is gone
		}
		return nil
	}
	if err != nil {
		return err
	}
	ap, ok, known := c.candidate(p)
	if !known {
		return nil
	}
	enrolled, _ := agent.Enrolled(ap)
	captured := to.Captured(ref.UID)
	switch {
	case ok && enrolled && !captured && p.DeletionTimestamp == nil:
		if len(p.Status.PodIPs) == 0 {
			return nil // its status update with the IPs enqueues it again
		}
		v, err := c.scan()
		if err != nil {
			return err
		}
		r, err := v.running(ap, p)
		if err != nil {
			return err
		}
		return to.CapturePod(r)
	case captured && !(ok && enrolled) && p.DeletionTimestamp == nil:
		// Un-enrolled (a terminating pod keeps its capture until it is
		// gone). A pod the plugin captured before the kubelet posted its
		// IPs is not un-enrolled: judging it by its missing IPs released
		// it while its containers started.
		c.log.Info("pod no longer enrolled", zap.String("pod", p.Namespace+"/"+p.Name))
		return to.Release(ref.UID)
	}
	return nil
}
