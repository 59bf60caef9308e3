package kubesource_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/causeway-mesh/causeway/pkg/backendtls/backendtlstest"
	"github.com/causeway-mesh/causeway/pkg/config"
	"github.com/causeway-mesh/causeway/pkg/config/kubesource"
	"github.com/causeway-mesh/causeway/pkg/internal/kubetest"
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
	out, err := kubesource.TrimSecret(in)
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
	if got, err := kubesource.TrimSecret(cm); err != nil || got != cm {
		t.Errorf("a non-Secret: got %v, %v; want it passed through", got, err)
	}
}

// An ingress listener's certificate reaches the snapshot from a
// kubernetes.io/tls Secret, and leaves it with the Secret; a Secret of
// another type is never read (the listener naming it does not serve).
func TestTLSSecretsReachTheTranslation(t *testing.T) {
	env := kubetest.Shared(t)
	cs := env.Clientset(t)
	ctx := context.Background()
	const ns = "src-ingress"
	_, pair := backendtlstest.TLSSecretData(t, "shop.example.com")
	gw := &gwv1.Gateway{ObjectMeta: metav1.ObjectMeta{Name: "edge", Namespace: ns}, Spec: gwv1.GatewaySpec{GatewayClassName: config.IngressClass,
		Listeners: []gwv1.Listener{
			{Name: "https", Port: 443, Protocol: gwv1.HTTPSProtocolType, TLS: &gwv1.ListenerTLSConfig{CertificateRefs: []gwv1.SecretObjectReference{{Name: "cert"}}}},
			{Name: "opaque", Port: 8443, Protocol: gwv1.HTTPSProtocolType, TLS: &gwv1.ListenerTLSConfig{CertificateRefs: []gwv1.SecretObjectReference{{Name: "opaque"}}}},
		}}}
	env.Create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, gw)
	for name, typ := range map[string]corev1.SecretType{"cert": corev1.SecretTypeTLS, "opaque": corev1.SecretTypeOpaque} {
		if _, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, Type: typ, Data: pair}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	listeners := func(s *config.Snapshot) map[string]int {
		out := map[string]int{}
		for _, l := range s.IngressGateways[ns+"/edge"].GetListeners() {
			out[l.GetName()] = len(l.GetCertificates())
		}
		return out
	}
	r := startSource(t, env, 50*time.Millisecond)
	r.next(t, "the https listener with its certificate, not the one naming an Opaque Secret", func(s *config.Snapshot) bool {
		l := listeners(s)
		return len(l) == 1 && l["https"] == 1
	})
	if err := cs.CoreV1().Secrets(ns).Delete(ctx, "cert", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	r.next(t, "no listener once its Secret is gone", func(s *config.Snapshot) bool {
		_, ok := s.IngressGateways[ns+"/edge"]
		return ok && len(listeners(s)) == 0
	})
}

// A Kubernetes Ingress of an IngressClass of ours reaches the snapshot as
// routes of the Gateway the class names, and leaves it with the Ingress.
func TestKubeIngressReachesTheTranslation(t *testing.T) {
	env := kubetest.Shared(t)
	cs := env.Clientset(t)
	ctx := context.Background()
	const ns = "src-kube-ingress"
	gw := &gwv1.Gateway{ObjectMeta: metav1.ObjectMeta{Name: "edge", Namespace: ns}, Spec: gwv1.GatewaySpec{GatewayClassName: config.IngressClass,
		Listeners: []gwv1.Listener{{Name: "http", Port: 80, Protocol: gwv1.HTTPProtocolType}}}}
	env.Create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, gw)
	group, scope, gwNS := gwv1.GroupName, networkingv1.IngressClassParametersReferenceScopeNamespace, ns
	if _, err := cs.NetworkingV1().IngressClasses().Create(ctx, &networkingv1.IngressClass{ObjectMeta: metav1.ObjectMeta{Name: ns},
		Spec: networkingv1.IngressClassSpec{Controller: config.IngressClassController, Parameters: &networkingv1.IngressClassParametersReference{
			APIGroup: &group, Kind: "Gateway", Name: "edge", Scope: &scope, Namespace: &gwNS}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	class := ns
	if _, err := cs.NetworkingV1().Ingresses(ns).Create(ctx, &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: networkingv1.IngressSpec{IngressClassName: &class, DefaultBackend: &networkingv1.IngressBackend{
			Service: &networkingv1.IngressServiceBackend{Name: "web", Port: networkingv1.ServiceBackendPort{Number: 80}}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	routes := func(s *config.Snapshot) []string {
		var out []string
		for _, l := range s.IngressGateways[ns+"/edge"].GetListeners() {
			for _, r := range l.GetHttpRoutes() {
				out = append(out, l.GetName()+":"+r.GetNamespace()+"/"+r.GetName())
			}
		}
		return out
	}
	r := startSource(t, env, 50*time.Millisecond)
	r.next(t, "the Ingress as a route of the Gateway's listener", func(s *config.Snapshot) bool {
		rs := routes(s)
		return len(rs) == 1 && rs[0] == "http:"+ns+"/web"
	})
	if err := cs.NetworkingV1().Ingresses(ns).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	r.next(t, "no route once the Ingress is gone", func(s *config.Snapshot) bool {
		_, ok := s.IngressGateways[ns+"/edge"]
		return ok && len(routes(s)) == 0
	})
}
