package admission

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	networkinglisters "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/cache"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	gwinformers "sigs.k8s.io/gateway-api/pkg/client/informers/externalversions"
	gwlisters "sigs.k8s.io/gateway-api/pkg/client/listers/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/causeway-mesh/causeway/pkg/config"
	"github.com/causeway-mesh/causeway/pkg/internal/kubetest"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
)

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }

type cluster struct {
	t   *testing.T
	ctx context.Context
	cs  kubernetes.Interface
	gw  gwclient.Interface
}

// startWebhook serves the webhook on 127.0.0.1 with a serving certificate
// from a mesh CA, and registers it with the apiserver by URL.
func startWebhook(t *testing.T) *cluster {
	env := kubetest.Shared(t)
	ctx, cancel := context.WithCancel(context.Background())
	c := &cluster{t: t, ctx: ctx, cs: env.Clientset(t)}
	var err error
	if c.gw, err = gwclient.NewForConfig(env.Config); err != nil {
		t.Fatal(err)
	}
	kf := informers.NewSharedInformerFactory(c.cs, 0)
	gf := gwinformers.NewSharedInformerFactory(c.gw, 0)
	w, err := New(Options{Gateways: gf.Gateway().V1().Gateways().Lister(), Namespaces: kf.Core().V1().Namespaces().Lister(),
		IngressClasses: kf.Networking().V1().IngressClasses().Lister(), PolicySet: policySets(t), Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	kf.Start(ctx.Done())
	gf.Start(ctx.Done())
	kf.WaitForCacheSync(ctx.Done())
	gf.WaitForCacheSync(ctx.Done())
	t.Cleanup(func() { cancel(); kf.Shutdown(); gf.Shutdown() })

	ca := trusttest.NewCA(t, "cluster.local")
	id, err := trust.ControlPlaneIdentity("cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	key, csrPEM, err := trust.NewKeyAndCSR(id)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := trust.ParseCSR(csrPEM)
	if err != nil {
		t.Fatal(err)
	}
	chain, err := ca.Authority.SignServer(csr, id, time.Hour, trust.ServerNames{DNS: []string{"causeway-controlplane.causeway-system.svc"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := trust.TLSCertificate(chain, key)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(Path, w)
	srv := httptest.NewUnstartedServer(mux)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{*cert}, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(srv.Close)

	url := srv.URL + Path
	vwc := Configuration("causeway-validation-test", "causeway-system", admissionregistrationv1.WebhookClientConfig{
		URL: &url, CABundle: []byte(strings.Join(chain[len(chain)-1:], "")),
	})
	if _, err := c.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, vwc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(context.Background(), vwc.Name, metav1.DeleteOptions{})
	})

	c.namespace("infra", nil)
	c.waypoint("infra", "shared", &gwv1.AllowedRoutes{Namespaces: &gwv1.RouteNamespaces{From: ptr(gwv1.NamespacesFromAll)}})
	c.waypoint("infra", "private", nil)
	c.namespace("captured", map[string]string{config.LabelDataplaneMode: config.DataplaneModeMesh})
	c.waypoint("captured", "wp", nil)
	// The webhook answers once the apiserver has the configuration and the
	// informers have the Gateways: wait for a refusal.
	if err := kubetest.WaitFor(ctx, 20*time.Second, func() (bool, error) {
		if _, err := w.opts.Gateways.Gateways("captured").Get("wp"); err != nil {
			return false, nil
		}
		err := c.createPod("captured", "probe", "wp", nil, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil {
			err = errors.New("the probe pod was admitted")
		}
		return strings.Contains(err.Error(), "causeway:"), err
	}); err != nil {
		t.Fatalf("the webhook never refused: %v", err)
	}
	return c
}

func ptr[T any](v T) *T { return &v }

// namespace creates a namespace with the service accounts its pods use
// (no controller-manager makes "default" here).
func (c *cluster) namespace(name string, labels map[string]string) {
	c.t.Helper()
	if _, err := c.cs.CoreV1().Namespaces().Create(c.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		c.t.Fatal(err)
	}
	for _, sa := range []string{"default", "app", "wp"} {
		if _, err := c.cs.CoreV1().ServiceAccounts(name).Create(c.ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			c.t.Fatal(err)
		}
	}
}

func (c *cluster) waypoint(ns, name string, allowed *gwv1.AllowedRoutes) {
	c.t.Helper()
	if _, err := c.gw.GatewayV1().Gateways(ns).Create(c.ctx, &gwv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: gwv1.GatewaySpec{GatewayClassName: config.WaypointClass,
			Listeners: []gwv1.Listener{{Name: "mesh", Port: 15008, Protocol: config.WaypointProtocol, AllowedRoutes: allowed}}},
	}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		c.t.Fatal(err)
	}
}

func (c *cluster) createPod(ns, name, sa string, labels map[string]string, opts metav1.CreateOptions) error {
	_, err := c.cs.CoreV1().Pods(ns).Create(c.ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec:       corev1.PodSpec{ServiceAccountName: sa, Containers: []corev1.Container{{Name: "c", Image: "i"}}},
	}, opts)
	return err
}

// refused asserts that err is the webhook's refusal mentioning want.
func refused(t *testing.T, what string, err error, want string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: admitted, want refused with %q", what, want)
		return
	}
	if !strings.Contains(err.Error(), `admission webhook "`) || !strings.Contains(err.Error(), want) {
		t.Errorf("%s: %v\nwant the webhook's refusal mentioning %q", what, err, want)
	}
}

func admitted(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Errorf("%s: %v", what, err)
	}
}

func TestWebhookRoutes(t *testing.T) {
	c := startWebhook(t)
	c.namespace("routes", nil)
	apply := func(doc string) error {
		var r gwv1.HTTPRoute
		if err := yaml.UnmarshalStrict([]byte(doc), &r); err != nil {
			t.Fatal(err)
		}
		_, err := c.gw.GatewayV1().HTTPRoutes("routes").Create(c.ctx, &r, metav1.CreateOptions{})
		return err
	}
	admitted(t, "a valid route", apply(`
metadata: {name: good}
spec:
  parentRefs: [{group: "", kind: Service, name: reviews, port: 80}]
  rules: [{matches: [{path: {type: RegularExpression, value: "/v[0-9]+/.*"}}], backendRefs: [{name: reviews-v2, port: 80}]}]
`))
	refused(t, "a regular expression RE2 cannot compile", apply(`
metadata: {name: lookahead}
spec:
  parentRefs: [{group: "", kind: Service, name: reviews}]
  rules: [{matches: [{path: {type: RegularExpression, value: "/(?=admin)"}}]}]
`), `HTTPRoute routes/lookahead: rule 0 path: regular expression "/(?=admin)"`)
	refused(t, "a filter the mesh cannot carry out", apply(`
metadata: {name: extension}
spec:
  parentRefs: [{group: "", kind: Service, name: reviews}]
  rules: [{filters: [{type: ExtensionRef, extensionRef: {group: example.com, kind: Magic, name: m}}]}]
`), "rule 0: unsupported filter ExtensionRef example.com/Magic m")
	admitted(t, "the same route for an ingress Gateway (not ours)", apply(`
metadata: {name: ingress}
spec:
  parentRefs: [{name: public-gateway}]
  rules: [{filters: [{type: ExtensionRef, extensionRef: {group: example.com, kind: Magic, name: m}}]}]
`))
	// An update is checked too.
	r, err := c.gw.GatewayV1().HTTPRoutes("routes").Get(c.ctx, "good", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r.Spec.Rules[0].Matches[0].Path.Value = ptr("/[")
	_, err = c.gw.GatewayV1().HTTPRoutes("routes").Update(c.ctx, r, metav1.UpdateOptions{})
	refused(t, "an update breaking the route", err, "regular expression")

	var g gwv1.GRPCRoute
	if err := yaml.UnmarshalStrict([]byte(`
metadata: {name: grpc}
spec:
  parentRefs: [{group: "", kind: Service, name: reviews}]
  rules: [{matches: [{method: {type: RegularExpression, service: "a(?!b)"}}]}]
`), &g); err != nil {
		t.Fatal(err)
	}
	_, err = c.gw.GatewayV1().GRPCRoutes("routes").Create(c.ctx, &g, metav1.CreateOptions{})
	refused(t, "a GRPCRoute with a bad regular expression", err, "rule 0 service: regular expression")
}

// An Ingress of an IngressClass of ours that the mesh would refuse never
// lands; another controller's is not judged.
func TestWebhookIngresses(t *testing.T) {
	c := startWebhook(t)
	c.namespace("ingresses", nil)
	for name, controller := range map[string]string{"causeway-wh": config.IngressClassController, "other-wh": "example.com/ingress"} {
		if _, err := c.cs.NetworkingV1().IngressClasses().Create(c.ctx, &networkingv1.IngressClass{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: networkingv1.IngressClassSpec{Controller: controller}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	apply := func(name, class, backend string) error {
		var ing networkingv1.Ingress
		if err := yaml.UnmarshalStrict([]byte("metadata: {name: "+name+"}\nspec:\n  ingressClassName: "+class+"\n  defaultBackend: "+backend+"\n"), &ing); err != nil {
			t.Fatal(err)
		}
		_, err := c.cs.NetworkingV1().Ingresses("ingresses").Create(c.ctx, &ing, metav1.CreateOptions{})
		return err
	}
	bucket := "{resource: {apiGroup: x.example.com, kind: Bucket, name: b}}"
	// The informer sees the new class soon after: wait for the refusal.
	var err error
	if werr := kubetest.WaitFor(c.ctx, 20*time.Second, func() (bool, error) {
		if err = apply("bucket", "causeway-wh", bucket); err == nil { // admitted before the informer had the class
			return false, c.cs.NetworkingV1().Ingresses("ingresses").Delete(c.ctx, "bucket", metav1.DeleteOptions{})
		}
		return true, nil
	}); werr != nil {
		t.Fatalf("an Ingress of ours with a resource backend was admitted")
	}
	refused(t, "a resource backend", err, "defaultBackend: resource backends are not supported")
	admitted(t, "a Service backend", apply("web", "causeway-wh", "{service: {name: web, port: {name: http}}}"))
	admitted(t, "another controller's Ingress", apply("foreign", "other-wh", bucket))
}

func TestWebhookWaypointBindings(t *testing.T) {
	c := startWebhook(t)
	useLabels := func(name string) map[string]string {
		return map[string]string{config.LabelUseWaypoint: name, config.LabelUseWaypointNamespace: "infra"}
	}
	_, err := c.cs.CoreV1().Namespaces().Create(c.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a", Labels: useLabels("private")}}, metav1.CreateOptions{})
	refused(t, "a namespace bound to a waypoint that admits only its own", err,
		"causeway.dev/use-waypoint=private: waypoint infra/private does not admit namespace team-a")
	_, err = c.cs.CoreV1().Namespaces().Create(c.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-b", Labels: useLabels("shared")}}, metav1.CreateOptions{})
	admitted(t, "a namespace bound to a waypoint admitting all", err)
	c.namespace("team-b", nil) // its service accounts

	svc := func(name string, labels map[string]string) error {
		_, err := c.cs.CoreV1().Services("team-b").Create(c.ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
		}, metav1.CreateOptions{})
		return err
	}
	refused(t, "a Service bound across namespaces without admission", svc("s1", useLabels("private")), "does not admit namespace team-b")
	admitted(t, "a Service bound to an admitting waypoint", svc("s2", useLabels("shared")))
	admitted(t, "a Service bound to a waypoint not created yet", svc("s3", useLabels("later")))
	refused(t, "a Pod bound across namespaces without admission", c.createPod("team-b", "p1", "", useLabels("private"), metav1.CreateOptions{}),
		"does not admit namespace team-b")
}

func TestWebhookWaypointIdentity(t *testing.T) {
	c := startWebhook(t)
	refused(t, "a captured pod running as the waypoint", c.createPod("captured", "thief", "wp", nil, metav1.CreateOptions{}),
		"service account wp is the identity of waypoint captured/wp")
	admitted(t, "a captured pod with its own identity", c.createPod("captured", "app", "app", nil, metav1.CreateOptions{}))
	refused(t, "an uncaptured pod running as the waypoint", c.createPod("captured", "outside", "wp",
		map[string]string{config.LabelDataplaneMode: config.DataplaneModeNone}, metav1.CreateOptions{}), "is the identity of waypoint captured/wp")
	refused(t, "a pod claiming another waypoint's label", c.createPod("captured", "claimer", "wp",
		map[string]string{config.LabelGatewayName: "other"}, metav1.CreateOptions{}), "is the identity of waypoint captured/wp")
	admitted(t, "the waypoint's own pod", c.createPod("captured", "wp-1", "wp",
		map[string]string{config.LabelGatewayName: "wp"}, metav1.CreateOptions{}))
}

// Requests that are not AdmissionReviews get an HTTP error, never a panic.
func TestServeHTTPRefusesBadRequests(t *testing.T) {
	w, err := New(Options{Gateways: emptyGateways(t), Namespaces: emptyNamespaces(t), IngressClasses: emptyIngressClasses(t), Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, method, ct string
		body             []byte
		code             int
	}{
		{"GET", http.MethodGet, "application/json", nil, http.StatusMethodNotAllowed},
		{"not JSON", http.MethodPost, "text/plain", []byte("x"), http.StatusUnsupportedMediaType},
		{"garbage", http.MethodPost, "application/json", []byte("{"), http.StatusBadRequest},
		{"no request", http.MethodPost, "application/json", []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`), http.StatusBadRequest},
		{"v1beta1", http.MethodPost, "application/json", []byte(`{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"1"}}`), http.StatusBadRequest},
		{"too large", http.MethodPost, "application/json", bytes.Repeat([]byte(" "), maxReviewBytes+1), http.StatusRequestEntityTooLarge},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			req := httptest.NewRequest(c.method, Path, bytes.NewReader(c.body))
			req.Header.Set("Content-Type", c.ct)
			w.ServeHTTP(rec, req)
			if rec.Code != c.code {
				t.Fatalf("status %d, want %d (%s)", rec.Code, c.code, rec.Body)
			}
		})
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, Path, strings.NewReader(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u1","kind":{"group":"","version":"v1","kind":"Pod"},"operation":"CREATE","namespace":"a","name":"p","object":"not a pod"}}`))
	req.Header.Set("Content-Type", "application/json")
	w.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"allowed":false`) || !strings.Contains(rec.Body.String(), `"uid":"u1"`) {
		t.Fatalf("an undecodable object: %d %s", rec.Code, rec.Body)
	}
}

func emptyIndexer() cache.Indexer {
	return cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
}

func emptyGateways(*testing.T) gwlisters.GatewayLister {
	return gwlisters.NewGatewayLister(emptyIndexer())
}

func emptyNamespaces(*testing.T) corelisters.NamespaceLister {
	return corelisters.NewNamespaceLister(emptyIndexer())
}

func emptyIngressClasses(*testing.T) networkinglisters.IngressClassLister {
	return networkinglisters.NewIngressClassLister(emptyIndexer())
}
