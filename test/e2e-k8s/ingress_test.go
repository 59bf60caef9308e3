package e2ek8s

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/causeway-mesh/causeway/internal/testcluster"
	"github.com/causeway-mesh/causeway/pkg/backendtls/backendtlstest"
)

// testIngress: an ingress Gateway (class causeway) deployed by the control
// plane in a namespace of its own, with an HTTP listener, an HTTPS listener
// whose certificate is a Secret of another namespace (a ReferenceGrant
// there lets the Gateway use it) and an HTTPS listener naming a Secret
// that does not exist; an HTTPRoute to shop/reviews (bound to the shop
// waypoint; a ReferenceGrant in shop lets the route name it). The status
// reports the broken listener (ResolvedRefs false) while the two others
// serve: from the host, to the Gateway's status address, over HTTP and
// over HTTPS, requests reach reviews through the shop waypoint, whose
// policy decides with the gateway's identity: /public is allowed, other
// paths are denied.
func testIngress(t *testing.T) {
	ctx := context.Background()
	ns, certs := newNamespace(t, "edge"), newNamespace(t, "edge-certs")
	const host = "shop.e2e.example"
	ca, pair := backendtlstest.TLSSecretData(t, host)
	if _, err := client.CoreV1().Secrets(certs).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "shop-cert"},
		Type: corev1.SecretTypeTLS, Data: pair}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	grantInShop := "edge-routes-" + randomHex()
	t.Cleanup(func() {
		_, _ = runKubectl(context.Background(), "-n", "shop", "delete", "referencegrant", grantInShop, "--ignore-not-found")
	})
	file := filepath.Join(t.TempDir(), "ingress.yaml")
	if err := os.WriteFile(file, []byte(fmt.Sprintf(`apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: edge-gateways, namespace: %[2]s}
spec:
  from: [{group: gateway.networking.k8s.io, kind: Gateway, namespace: %[1]s}]
  to: [{group: "", kind: Secret, name: shop-cert}]
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: %[3]s, namespace: shop}
spec:
  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: %[1]s}]
  to: [{group: "", kind: Service, name: reviews}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: %[1]s}
spec:
  gatewayClassName: causeway
  listeners:
  - {name: http, port: 80, protocol: HTTP, allowedRoutes: {namespaces: {from: All}}}
  - name: https
    port: 443
    protocol: HTTPS
    hostname: %[4]s
    tls: {certificateRefs: [{name: shop-cert, namespace: %[2]s}]}
  - name: broken
    port: 8443
    protocol: HTTPS
    tls: {certificateRefs: [{name: missing-cert}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: shop, namespace: %[1]s}
spec:
  parentRefs: [{name: edge}]
  rules: [{backendRefs: [{name: reviews, namespace: shop, port: 80}]}]
`, ns, certs, grantInShop, host)), 0o644); err != nil {
		t.Fatal(err)
	}
	kc(t, time.Minute, "apply", "-f", file)

	kc(t, 4*time.Minute, "-n", ns, "wait", "--for=condition=Programmed", "--timeout=240s", "gateway/edge")
	var addr string
	eventually(t, time.Minute, "the Gateway's status: an address, the broken listener alone not resolved", func() error {
		gw, err := getGateway(ctx, ns, "edge")
		if err != nil {
			return err
		}
		if len(gw.Status.Addresses) == 0 {
			return fmt.Errorf("no address")
		}
		addr = gw.Status.Addresses[0].Value
		for _, l := range gw.Status.Listeners {
			refs, prog := meta.FindStatusCondition(l.Conditions, "ResolvedRefs"), meta.FindStatusCondition(l.Conditions, "Programmed")
			if refs == nil || prog == nil {
				return fmt.Errorf("listener %s: no conditions yet", l.Name)
			}
			switch l.Name {
			case "broken":
				if refs.Status != metav1.ConditionFalse || refs.Reason != "InvalidCertificateRef" || !strings.Contains(refs.Message, "missing-cert") ||
					prog.Status != metav1.ConditionFalse || l.AttachedRoutes != 1 {
					// The route attaches (and counts) though the listener
					// serves nothing until its certificate resolves, as the
					// Gateway API defines attachment (GatewayWithAttachedRoutes).
					return fmt.Errorf("broken listener: ResolvedRefs %s/%s %q, Programmed %s, %d routes", refs.Status, refs.Reason, refs.Message, prog.Status, l.AttachedRoutes)
				}
			default:
				if refs.Status != metav1.ConditionTrue || prog.Status != metav1.ConditionTrue || l.AttachedRoutes != 1 {
					return fmt.Errorf("listener %s: ResolvedRefs %s %q, Programmed %s %q, %d routes", l.Name, refs.Status, refs.Message, prog.Status, prog.Message, l.AttachedRoutes)
				}
			}
		}
		if len(gw.Status.Listeners) != 3 {
			return fmt.Errorf("%d listener statuses", len(gw.Status.Listeners))
		}
		return nil
	})
	// No load balancer runs on the test cluster: the address is the
	// Service's cluster IP, which the host routes to the cluster (never
	// anywhere else: checked first).
	if err := onClusterBridge(addr); err != nil {
		t.Fatal(err)
	}
	svc, err := client.CoreV1().Services(ns).Get(ctx, "edge", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer || addr != svc.Spec.ClusterIP {
		t.Fatalf("Service %s with cluster IP %s, Gateway address %s: want a LoadBalancer Service whose cluster IP stands in while no load balancer serves", svc.Spec.Type, svc.Spec.ClusterIP, addr)
	}

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.PEM)
	httpsClient := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: host, MinVersion: tls.VersionTLS12},
		// The host name is the listener's; the address the Gateway's.
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, net.JoinHostPort(addr, "443"))
		},
	}}
	httpClient := &http.Client{Timeout: 5 * time.Second}
	identity := "spiffe://" + trustDom + "/ns/" + ns + "/sa/edge"
	for _, c := range []struct {
		name   string
		client *http.Client
		base   string
	}{
		{"http", httpClient, "http://" + addr},
		{"https", httpsClient, "https://" + host},
	} {
		public := "/public/e2e-" + randomHex()
		eventually(t, time.Minute, c.name+" GET "+public+" through the gateway and the waypoint", func() error {
			status, body, err := get(c.client, c.base+public)
			if err != nil {
				return err
			}
			return reviewsAnswered(status, body, identity)
		})
		eventually(t, 30*time.Second, "the waypoint's access log line", func() error {
			return waypointLogged(ctx, public, identity, 200)
		})
		private := "/e2e-" + randomHex()
		eventually(t, 30*time.Second, c.name+" GET "+private+" denied by the waypoint's policy", func() error {
			status, body, err := get(c.client, c.base+private)
			if err != nil {
				return err
			}
			if status != http.StatusForbidden || !strings.Contains(body, "no rule allows this request") {
				return fmt.Errorf("status %d: %s", status, body)
			}
			return nil
		})
		eventually(t, 30*time.Second, "the waypoint's access log line", func() error {
			return waypointLogged(ctx, private, identity, 403)
		})
	}
	t.Run("Kubernetes Ingress", func(t *testing.T) { testKubeIngress(t, ns, addr, identity) })
	t.Run("static address", func(t *testing.T) { testStaticAddress(t, ns, identity) })
}

// testStaticAddress: the Gateway edge asks for a static address of the
// range the install allows (chart value gatewayAddresses): its Service
// holds it as an externalIP, the Gateway's status lists it alone, and from
// the host (which routes the range to the node bridge, as a network would
// to the nodes) requests to it reach reviews through the gateway, served
// by kube-proxy with no load balancer. An address off the range leaves the
// Gateway not programmed (AddressNotUsable) and keeps the one it holds.
func testStaticAddress(t *testing.T, ns, identity string) {
	ctx := context.Background()
	prefix, err := netip.ParsePrefix(testcluster.StaticAddressRange)
	if err != nil {
		t.Fatal(err)
	}
	static := prefix.Addr().Next().String()
	const offRange = "10.250.0.200" // the node range's: blackholed by the host
	setAddresses := func(t *testing.T, addrs string) {
		t.Helper()
		kc(t, time.Minute, "-n", ns, "patch", "gateway", "edge", "--type=merge", "-p", `{"spec":{"addresses":`+addrs+`}}`)
	}
	t.Cleanup(func() {
		_, _ = runKubectl(context.Background(), "-n", ns, "patch", "gateway", "edge", "--type=merge", "-p", `{"spec":{"addresses":null}}`)
	})
	status := func(wantProgrammed, reason string) func() error {
		return func() error {
			gw, err := getGateway(ctx, ns, "edge")
			if err != nil {
				return err
			}
			prog := meta.FindStatusCondition(gw.Status.Conditions, "Programmed")
			if prog == nil || prog.ObservedGeneration != gw.Generation || string(prog.Status) != wantProgrammed || prog.Reason != reason {
				return fmt.Errorf("Programmed %+v, want %s %s for generation %d", prog, wantProgrammed, reason, gw.Generation)
			}
			if a := gw.Status.Addresses; len(a) != 1 || a[0].Value != static || a[0].Type == nil || *a[0].Type != gwv1.IPAddressType {
				return fmt.Errorf("status addresses %+v, want the IPAddress %s alone", a, static)
			}
			return nil
		}
	}
	setAddresses(t, `[{"type":"IPAddress","value":"`+static+`"}]`)
	eventually(t, time.Minute, "the Gateway programmed with its static address", status("True", "Programmed"))
	svc, err := client.CoreV1().Services(ns).Get(ctx, "edge", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(svc.Spec.ExternalIPs) != 1 || svc.Spec.ExternalIPs[0] != static {
		t.Fatalf("Service externalIPs %v, want %s", svc.Spec.ExternalIPs, static)
	}
	if err := onClusterBridge(static); err != nil {
		t.Fatal(err)
	}
	public := "/public/e2e-" + randomHex()
	httpClient := &http.Client{Timeout: 5 * time.Second}
	eventually(t, time.Minute, "GET "+public+" to the static address", func() error {
		status, body, err := get(httpClient, "http://"+static+public)
		if err != nil {
			return err
		}
		return reviewsAnswered(status, body, identity)
	})
	setAddresses(t, `[{"type":"IPAddress","value":"`+static+`"},{"type":"IPAddress","value":"`+offRange+`"}]`)
	eventually(t, time.Minute, "the Gateway not programmed for the address off the range", status("False", "AddressNotUsable"))
}

// testKubeIngress: an IngressClass of ours naming the Gateway edge, whose
// HTTP listener admits every namespace, and an Ingress of shop: its host's
// /public paths reach reviews through the shop waypoint (the gateway's
// identity the caller), a path to a Service that does not exist gets 503,
// and the Ingress's status is the Gateway's address.
func testKubeIngress(t *testing.T, ns, addr, identity string) {
	ctx := context.Background()
	name := "e2e-" + randomHex()
	const host = "ingress.e2e.example"
	t.Cleanup(func() {
		_, _ = runKubectl(context.Background(), "-n", "shop", "delete", "ingress", name, "--ignore-not-found")
		_, _ = runKubectl(context.Background(), "delete", "ingressclass", name, "--ignore-not-found")
	})
	file := filepath.Join(t.TempDir(), "kube-ingress.yaml")
	if err := os.WriteFile(file, []byte(fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: %[1]s}
spec:
  controller: causeway.dev/ingress-controller
  parameters: {apiGroup: gateway.networking.k8s.io, kind: Gateway, scope: Namespace, namespace: %[2]s, name: edge}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: %[1]s, namespace: shop}
spec:
  ingressClassName: %[1]s
  rules:
  - host: %[3]s
    http:
      paths:
      - {path: /public, pathType: Prefix, backend: {service: {name: reviews, port: {number: 80}}}}
      - {path: /public/gone, pathType: Exact, backend: {service: {name: gone-%[1]s, port: {number: 80}}}}
`, name, ns, host)), 0o644); err != nil {
		t.Fatal(err)
	}
	kc(t, time.Minute, "apply", "-f", file)
	fetch := func(path string) (int, string, error) {
		req, err := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
		if err != nil {
			return 0, "", err
		}
		req.Host = host
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return resp.StatusCode, string(body), err
	}
	public := "/public/e2e-" + randomHex()
	eventually(t, time.Minute, "GET "+public+" through the Ingress and the waypoint", func() error {
		status, body, err := fetch(public)
		if err != nil {
			return err
		}
		return reviewsAnswered(status, body, identity)
	})
	eventually(t, 30*time.Second, "the waypoint's access log line", func() error {
		return waypointLogged(ctx, public, identity, 200)
	})
	if status, body, err := fetch("/public/gone"); err != nil || status != http.StatusServiceUnavailable {
		t.Errorf("a Service that does not exist: %d %q %v, want 503", status, body, err)
	}
	eventually(t, time.Minute, "the Ingress's status: the Gateway's address", func() error {
		out, err := runKubectl(ctx, "-n", "shop", "get", "ingress", name, "-o", "jsonpath={.status.loadBalancer.ingress[*].ip}")
		if err != nil {
			return err
		}
		if strings.TrimSpace(out) != addr {
			return fmt.Errorf("status addresses %q, want %s", out, addr)
		}
		return nil
	})
}

// get fetches url from the host, reading at most 64 KiB of the answer.
// getGateway reads a Gateway with kubectl.
func getGateway(ctx context.Context, ns, name string) (*gwv1.Gateway, error) {
	out, err := runKubectl(ctx, "-n", ns, "get", "gateway", name, "-o", "json")
	if err != nil {
		return nil, err
	}
	var gw gwv1.Gateway
	if err := json.Unmarshal([]byte(out), &gw); err != nil {
		return nil, err
	}
	return &gw, nil
}

// reviewsAnswered checks an answer through an ingress gateway: 200 from a
// reviews pod, told the gateway's identity.
func reviewsAnswered(status int, body, identity string) error {
	if status != http.StatusOK {
		return fmt.Errorf("status %d: %s", status, body)
	}
	var a echoAnswer
	if err := json.Unmarshal([]byte(body), &a); err != nil {
		return fmt.Errorf("not an echo answer: %v: %s", err, body)
	}
	if p := a.Headers[principalH]; !strings.HasPrefix(a.Pod, "reviews-") || p == nil || p[0] != identity {
		return fmt.Errorf("answer from %s with %s %v, want a reviews pod told the gateway's identity %s", a.Pod, principalH, p, identity)
	}
	return nil
}

func get(c *http.Client, url string) (int, string, error) {
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, string(body), err
}
