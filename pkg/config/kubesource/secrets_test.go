package kubesource

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A TLS Secret keeps only what a listener reads: no other data, and not
// kubectl's last-applied annotation (which holds a copy of the data).
func TestTrimSecret(t *testing.T) {
	in := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "cert", Namespace: "shop", ResourceVersion: "7",
			Annotations:   map[string]string{"kubectl.kubernetes.io/last-applied-configuration": `{"data":{"tls.key":"secret"}}`},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}},
		Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: []byte("crt"), corev1.TLSPrivateKeyKey: []byte("key"), "ca.key": []byte("another key")},
	}
	out, err := TrimSecret(in)
	if err != nil {
		t.Fatal(err)
	}
	s := out.(*corev1.Secret)
	if s.Name != "cert" || s.Namespace != "shop" || s.ResourceVersion != "7" || s.Type != corev1.SecretTypeTLS {
		t.Errorf("identity lost: %+v", s.ObjectMeta)
	}
	if len(s.Annotations) != 0 || len(s.ManagedFields) != 0 {
		t.Errorf("annotations %v, managed fields %v kept", s.Annotations, s.ManagedFields)
	}
	if len(s.Data) != 2 || string(s.Data[corev1.TLSCertKey]) != "crt" || string(s.Data[corev1.TLSPrivateKeyKey]) != "key" {
		t.Errorf("data keys kept: %d, want tls.crt and tls.key only", len(s.Data))
	}
	cm := &corev1.ConfigMap{}
	if got, err := TrimSecret(cm); err != nil || got != cm {
		t.Errorf("a non-Secret: got %v, %v; want it passed through", got, err)
	}
}
