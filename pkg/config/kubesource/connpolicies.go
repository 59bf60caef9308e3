package kubesource

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	"github.com/causeway-mesh/causeway/pkg/config"
)

// ConnectionPolicies watches the ConnectionPolicy kind while the cluster
// serves it. Its CRD ships with the mesh but may be missing (an install
// that predates it, or one that left it out): then no ConnectionPolicy can
// exist, so there are none. That is said once, and the kind is looked for
// again every recheck; when it appears its informer starts. (An informer
// on a kind that is not served never syncs, and logs each retry.)
//
// The informer's cache holds *config.ConnectionPolicy, converted once per
// change, so that objects keep their identity while they do not change
// (config.Incremental relies on it). An object that does not convert (a CRD
// other than the mesh's) is held marked Unreadable: the translation refuses
// it, failing closed.
type ConnectionPolicies struct {
	discovery discovery.DiscoveryInterface
	log       *zap.Logger
	recheck   time.Duration
	informer  cache.SharedIndexInformer
	wg        sync.WaitGroup
}

// NewConnectionPolicies returns a watcher calling onChange after every
// change; Start starts it.
func NewConnectionPolicies(client dynamic.Interface, disc discovery.DiscoveryInterface, log *zap.Logger, recheck time.Duration, onChange func()) (*ConnectionPolicies, error) {
	// Resync off, as for the other informers.
	inf := dynamicinformer.NewFilteredDynamicInformer(client, config.ConnectionPolicyResource, "", 0, cache.Indexers{}, nil).Informer()
	if err := inf.SetTransform(toConnectionPolicy); err != nil {
		return nil, err
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { onChange() },
		UpdateFunc: func(any, any) { onChange() },
		DeleteFunc: func(any) { onChange() },
	}); err != nil {
		return nil, err
	}
	return &ConnectionPolicies{discovery: disc, log: log, recheck: recheck, informer: inf}, nil
}

// Start starts the informer if the kind is served, or else keeps looking
// for it until ctx ends. It returns what to wait for before the first
// snapshot: the informer's first list, or nothing when the kind is not
// served. Discovery failing for another reason than the kind's absence is
// an error: treating it as absence would drop every policy (fail open).
func (c *ConnectionPolicies) Start(ctx context.Context) (cache.InformerSynced, error) {
	served, err := c.served()
	if err != nil {
		return nil, err
	}
	if served {
		c.run(ctx)
		return c.informer.HasSynced, nil
	}
	c.log.Warn("the ConnectionPolicy kind is not served (is its CRD, manifests/core/connectionpolicy-crd.yaml, applied?): no connection policies until it is",
		zap.String("resource", config.ConnectionPolicyResource.String()), zap.Duration("recheck", c.recheck))
	c.wg.Go(func() {
		t := time.NewTicker(c.recheck)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if ok, err := c.served(); err == nil && ok {
				c.log.Info("the ConnectionPolicy kind is served now: reading connection policies")
				c.run(ctx)
				return
			}
		}
	})
	return nil, nil
}

func (c *ConnectionPolicies) run(ctx context.Context) {
	c.wg.Go(func() { c.informer.Run(ctx.Done()) })
}

// Shutdown waits for what Start started to end (after its context ended).
func (c *ConnectionPolicies) Shutdown() { c.wg.Wait() }

func (c *ConnectionPolicies) served() (bool, error) {
	gv := config.ConnectionPolicyResource.GroupVersion().String()
	res, err := c.discovery.ServerResourcesForGroupVersion(gv)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("discover %s: %w", gv, err)
	}
	for _, r := range res.APIResources {
		if r.Name == config.ConnectionPolicyResource.Resource {
			return true, nil
		}
	}
	return false, nil
}

// List returns the policies held, by namespace and name. They are the
// cache's: callers must not modify them.
func (c *ConnectionPolicies) List() []*config.ConnectionPolicy {
	var out []*config.ConnectionPolicy
	for _, o := range c.informer.GetStore().List() {
		if p, ok := o.(*config.ConnectionPolicy); ok {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Namespace != out[j].Namespace {
			return out[i].Namespace < out[j].Namespace
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// toConnectionPolicy is the informer's transform.
func toConnectionPolicy(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil // a tombstone, or already converted
	}
	u.SetManagedFields(nil)
	return ConnectionPolicy(u), nil
}

// ConnectionPolicy is what the API server sent, as the translation's type
// (also the admission webhook's reading of it). Unknown fields make it
// unreadable, as they make a file of the directory source fail to decode.
func ConnectionPolicy(u *unstructured.Unstructured) *config.ConnectionPolicy {
	p := &config.ConnectionPolicy{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, p, true); err != nil {
		p = &config.ConnectionPolicy{Unreadable: err.Error()}
		p.APIVersion, p.Kind = u.GetAPIVersion(), u.GetKind()
		p.Namespace, p.Name, p.UID = u.GetNamespace(), u.GetName(), u.GetUID()
		p.ResourceVersion, p.Generation = u.GetResourceVersion(), u.GetGeneration()
	}
	return p
}
