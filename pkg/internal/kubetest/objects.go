package kubetest

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/causeway-mesh/causeway/pkg/config"
)

// Gateway returns a Gateway API client for the Config.
func (e *Env) Gateway(t testing.TB) gwclient.Interface {
	t.Helper()
	c, err := gwclient.NewForConfig(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Dynamic returns a dynamic client for the Config.
func (e *Env) Dynamic(t testing.TB) dynamic.Interface {
	t.Helper()
	c, err := dynamic.NewForConfig(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// createConnectionPolicy creates p through the dynamic client and returns
// it as stored.
func createConnectionPolicy(ctx context.Context, dyn dynamic.Interface, p *config.ConnectionPolicy) (runtime.Object, error) {
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p)
	if err != nil {
		return nil, err
	}
	obj := &unstructured.Unstructured{Object: u}
	obj.SetAPIVersion(config.CausewayGroupVersion.String())
	obj.SetKind("ConnectionPolicy")
	got, err := dyn.Resource(config.ConnectionPolicyResource).Namespace(p.Namespace).Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	out := &config.ConnectionPolicy{}
	return out, runtime.DefaultUnstructuredConverter.FromUnstructured(got.Object, out)
}

// Create creates objects in order and returns them as the apiserver
// stored them. It stands in for the controllers this apiserver runs
// without: a created Namespace gets its "default" ServiceAccount, a Pod's
// service account is created if missing, and a Pod's status (which the
// apiserver ignores on create) is written through the status subresource.
// Kinds: Namespace, Node, ServiceAccount, Pod, Service, ConfigMap, EndpointSlice,
// Gateway, HTTPRoute, GRPCRoute, ReferenceGrant, BackendTLSPolicy,
// ConnectionPolicy.
func (e *Env) Create(t testing.TB, objs ...runtime.Object) []runtime.Object {
	t.Helper()
	kube, gw, dyn := e.Clientset(t), e.Gateway(t), e.Dynamic(t)
	ctx := context.Background()
	out := make([]runtime.Object, 0, len(objs))
	for _, o := range objs {
		got, err := create(ctx, kube, gw, dyn, o.DeepCopyObject())
		if err != nil {
			t.Fatalf("kubetest: create %T: %v", o, err)
		}
		out = append(out, got)
	}
	return out
}

func create(ctx context.Context, kube kubernetes.Interface, gw gwclient.Interface, dyn dynamic.Interface, o runtime.Object) (runtime.Object, error) {
	c := metav1.CreateOptions{}
	switch v := o.(type) {
	case *corev1.Namespace:
		ns, err := kube.CoreV1().Namespaces().Create(ctx, v, c)
		if err != nil {
			return nil, err
		}
		return ns, ensureServiceAccount(ctx, kube, ns.Name, "default")
	case *corev1.Node:
		return kube.CoreV1().Nodes().Create(ctx, v, c)
	case *corev1.ServiceAccount:
		return kube.CoreV1().ServiceAccounts(v.Namespace).Create(ctx, v, c)
	case *corev1.Pod:
		sa := v.Spec.ServiceAccountName
		if sa == "" {
			sa = "default"
		}
		if err := ensureServiceAccount(ctx, kube, v.Namespace, sa); err != nil {
			return nil, err
		}
		status := v.Status
		p, err := kube.CoreV1().Pods(v.Namespace).Create(ctx, v, c)
		if err != nil {
			return nil, err
		}
		p.Status = status
		if status.Phase == "" {
			p.Status.Phase = corev1.PodPending // the apiserver requires a phase
		}
		return kube.CoreV1().Pods(v.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
	case *corev1.Service:
		return kube.CoreV1().Services(v.Namespace).Create(ctx, v, c)
	case *corev1.ConfigMap:
		return kube.CoreV1().ConfigMaps(v.Namespace).Create(ctx, v, c)
	case *discoveryv1.EndpointSlice:
		return kube.DiscoveryV1().EndpointSlices(v.Namespace).Create(ctx, v, c)
	case *gwv1.Gateway:
		return gw.GatewayV1().Gateways(v.Namespace).Create(ctx, v, c)
	case *gwv1.HTTPRoute:
		return gw.GatewayV1().HTTPRoutes(v.Namespace).Create(ctx, v, c)
	case *gwv1.GRPCRoute:
		return gw.GatewayV1().GRPCRoutes(v.Namespace).Create(ctx, v, c)
	case *gwv1.ReferenceGrant:
		return gw.GatewayV1().ReferenceGrants(v.Namespace).Create(ctx, v, c)
	case *gwv1.BackendTLSPolicy:
		return gw.GatewayV1().BackendTLSPolicies(v.Namespace).Create(ctx, v, c)
	case *config.ConnectionPolicy:
		return createConnectionPolicy(ctx, dyn, v)
	}
	return nil, fmt.Errorf("kind %T not supported", o)
}

func ensureServiceAccount(ctx context.Context, kube kubernetes.Interface, ns, name string) error {
	_, err := kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}
