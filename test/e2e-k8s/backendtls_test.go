package e2ek8s

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/causeway-mesh/causeway/pkg/backendtls/backendtlstest"
)

// testBackendTLS: a TLS server outside the mesh (a pod of shop opted out
// with dataplane-mode none; its certificate from a CA of the test's own)
// behind a Service of shop, which the shop waypoint serves. A
// BackendTLSPolicy has the waypoint originate TLS to it, with the policy's
// hostname as SNI, verified against the CA of a ConfigMap and the exact
// SAN: the frontend's plain HTTP request arrives over TLS. With a SAN the
// certificate does not carry, the waypoint refuses the traffic (503),
// saying why in its log, and sends nothing unverified.
func testBackendTLS(t *testing.T, frontend corev1.Pod, kubectl func(args ...string)) {
	ctx := context.Background()
	name := "tlsbackend-" + randomHex()
	host := name + ".backend.e2e.example"
	caPEM, certPEM, keyPEM := serverCertificate(t, host)

	const ns = "shop"
	if _, err := client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name},
		Type: corev1.SecretTypeTLS, Data: map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name + "-ca"},
		Data: map[string]string{"ca.crt": string(caPEM)}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	spec := echoPodSpec()
	spec.Containers[0].Args = append(spec.Containers[0].Args, "--tls-listen", ":8443", "--tls-cert", "/tls/tls.crt", "--tls-key", "/tls/tls.key")
	spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "tls", MountPath: "/tls", ReadOnly: true}}
	spec.Volumes = []corev1.Volume{{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: name}}}}
	// Away from the frontend and the waypoint, on three nodes.
	placeOn(&spec, placed(destinationNode))
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name, "causeway.dev/dataplane-mode": "none"}}, Spec: spec}
	if _, err := client.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": name}, Ports: []corev1.ServicePort{{
			Name: "http", Port: 80, TargetPort: intstr.FromInt32(8443), AppProtocol: new("http")}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = runKubectl(ctx, "-n", ns, "delete", "backendtlspolicy", name, "--ignore-not-found")
		_ = client.CoreV1().Services(ns).Delete(ctx, name, metav1.DeleteOptions{})
		_ = client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{})
		_ = client.CoreV1().Secrets(ns).Delete(ctx, name, metav1.DeleteOptions{})
		_ = client.CoreV1().ConfigMaps(ns).Delete(ctx, name+"-ca", metav1.DeleteOptions{})
	})
	if _, err := startPods(ctx, ns, pod); err != nil {
		t.Fatal(err)
	}

	file := filepath.Join(t.TempDir(), "backendtlspolicy.yaml")
	apply := func(san string) {
		t.Helper()
		doc := fmt.Sprintf(`apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  targetRefs: [{group: "", kind: Service, name: %[1]s}]
  validation:
    hostname: %[3]s
    caCertificateRefs: [{group: "", kind: ConfigMap, name: %[1]s-ca}]
    subjectAltNames: [{type: Hostname, hostname: %[4]s}]
`, name, ns, host, san)
		if err := os.WriteFile(file, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		kubectl("apply", "-f", file)
	}
	url := "http://" + name + "." + ns + "/e2e-" + randomHex()

	apply(host)
	a := fetchOK(t, frontend.Namespace, frontend.Name, url)
	if a.Pod != name || a.TLSServerName != host {
		t.Fatalf("answer from %q over TLS with server name %q, want %s over TLS with server name %s", a.Pod, a.TLSServerName, name, host)
	}

	apply("other." + host)
	eventually(t, 30*time.Second, "the waypoint refusing a certificate without the SAN", func() error {
		body, err := kubectlExec(frontend.Namespace, frontend.Name, "echo", "/usr/local/bin/echo", "fetch", "-timeout", "3s", url)
		var ee *execError
		if errors.As(err, &ee) && strings.Contains(ee.stderr, "status 503") {
			return nil
		}
		return fmt.Errorf("want 503, got %q (%v)", body, err)
	})
	eventually(t, 30*time.Second, "the waypoint's log line of the refusal", func() error {
		found := false
		err := eachLogLine(ctx, ns, "gateway.networking.k8s.io/gateway-name=waypoint", "waypoint", func(line map[string]any) {
			e, _ := line["error"].(string)
			if line["msg"] == "backend TLS refused" && line["policy"] == ns+"/"+name && strings.Contains(e, "certificate presents none of the subjectAltNames [Hostname other."+host+"]") {
				found = true
			}
		})
		if err == nil && !found {
			err = errors.New("no \"backend TLS refused\" line names the policy and the SAN")
		}
		return err
	})
}

// serverCertificate makes a CA and a server certificate for host signed by
// it, PEM encoded.
func serverCertificate(t *testing.T, host string) (caPEM, certPEM, keyPEM []byte) {
	t.Helper()
	ca, err := backendtlstest.NewCA("e2e backend CA")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Leaf([]string{host}, nil, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(leaf.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	return ca.PEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Certificate[0]}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}
