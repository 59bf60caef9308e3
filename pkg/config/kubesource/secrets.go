package kubesource

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"

	"github.com/causeway-mesh/causeway/pkg/config"
)

// TLSSecretInformers returns an informer factory for the certificates
// ingress Gateways' HTTPS listeners name: its Secrets informer lists and
// watches only Secrets of type kubernetes.io/tls (a field selector, so the
// API server never sends the control plane any other Secret: tokens,
// passwords, registry credentials), trimmed by TrimSecret. The control
// plane's status writer and its configuration source each run one.
func TLSSecretInformers(kube kubernetes.Interface) informers.SharedInformerFactory {
	return informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithTransform(TrimSecret),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("type", string(corev1.SecretTypeTLS)).String()
		}))
}

// TrimSecret is the TLS Secret informer's transform: a Secret keeps its
// name, namespace, uid, resourceVersion and type, and of its data only the
// certificate and key (tls.crt, tls.key), and not its annotations (kubectl
// apply's last-applied-configuration holds a copy of the data) nor its
// managed fields. Secret contents are never logged.
func TrimSecret(obj any) (any, error) {
	s, ok := obj.(*corev1.Secret)
	if !ok {
		return obj, nil
	}
	out := &corev1.Secret{TypeMeta: s.TypeMeta, Type: s.Type, ObjectMeta: metav1.ObjectMeta{
		Name: s.Name, Namespace: s.Namespace, UID: s.UID, ResourceVersion: s.ResourceVersion, Generation: s.Generation, Labels: s.Labels,
		CreationTimestamp: s.CreationTimestamp, DeletionTimestamp: s.DeletionTimestamp}}
	for _, k := range []string{corev1.TLSCertKey, corev1.TLSPrivateKeyKey} {
		if v, ok := s.Data[k]; ok {
			if out.Data == nil {
				out.Data = map[string][]byte{}
			}
			out.Data[k] = v
		}
	}
	return out, nil
}

// SecretLookup finds Secrets in a TLS Secret informer's cache, for
// config.Listeners.
func SecretLookup(l corelisters.SecretLister) config.SecretLookup {
	return func(ns, name string) *corev1.Secret {
		s, err := l.Secrets(ns).Get(name)
		if err != nil {
			return nil
		}
		return s
	}
}
