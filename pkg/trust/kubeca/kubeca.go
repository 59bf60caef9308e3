// Package kubeca keeps the mesh CA's signing material in a Kubernetes
// Secret and publishes its roots in ConfigMaps for the proxies.
//
// Every control plane replica calls LoadOrCreate at start. The first one to
// find no Secret generates a self-signed CA and creates the Secret; creation
// is atomic in the API server, so a replica that loses the race reads the
// winner's Secret and all replicas sign with the same key. An operator who
// brings their own CA creates the Secret beforehand with the four files of
// Istio's plug-in layout (ca-cert.pem, ca-key.pem, root-cert.pem,
// cert-chain.pem); it is never replaced.
package kubeca

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/causeway-mesh/causeway/pkg/trust"
)

// RootsKey is the key of the roots in a published ConfigMap.
const RootsKey = trust.RootCertFile

// LoadOrCreate returns the authority kept in the Secret namespace/name,
// creating the Secret with a new self-signed CA for trustDomain when there
// is none.
func LoadOrCreate(ctx context.Context, client kubernetes.Interface, namespace, name, trustDomain string, maxTTL time.Duration) (*trust.Authority, error) {
	source := fmt.Sprintf("CA secret %s/%s", namespace, name)
	secrets := client.CoreV1().Secrets(namespace)
	s, err := secrets.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		files, genErr := trust.SelfSignedCAFiles(trustDomain)
		if genErr != nil {
			return nil, fmt.Errorf("%s: %w", source, genErr)
		}
		s, err = secrets.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace,
				Labels: map[string]string{"app.kubernetes.io/managed-by": "causeway"}},
			Type: corev1.SecretTypeOpaque,
			Data: files,
		}, metav1.CreateOptions{FieldManager: "causeway"})
		if apierrors.IsAlreadyExists(err) {
			s, err = secrets.Get(ctx, name, metav1.GetOptions{})
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	return trust.ParseCA(s.Data, source, maxTTL)
}

// PublishRoots makes the ConfigMap namespace/name hold rootsPEM under
// RootsKey, creating or updating it; an up-to-date ConfigMap is left alone.
func PublishRoots(ctx context.Context, client kubernetes.Interface, namespace, name string, rootsPEM []byte) error {
	maps := client.CoreV1().ConfigMaps(namespace)
	want := string(rootsPEM)
	cm, err := maps.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = maps.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace,
				Labels: map[string]string{"app.kubernetes.io/managed-by": "causeway"}},
			Data: map[string]string{RootsKey: want},
		}, metav1.CreateOptions{FieldManager: "causeway"})
		if apierrors.IsAlreadyExists(err) {
			return PublishRoots(ctx, client, namespace, name, rootsPEM)
		}
	case err == nil && cm.Data[RootsKey] != want:
		cm = cm.DeepCopy()
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[RootsKey] = want
		_, err = maps.Update(ctx, cm, metav1.UpdateOptions{FieldManager: "causeway"})
	}
	if err != nil {
		return fmt.Errorf("publish roots in ConfigMap %s/%s: %w", namespace, name, err)
	}
	return nil
}
