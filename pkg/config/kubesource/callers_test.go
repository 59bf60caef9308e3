package kubesource_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/causeway-mesh/causeway/pkg/config"
	"github.com/causeway-mesh/causeway/pkg/config/kubesource"
	"github.com/causeway-mesh/causeway/pkg/internal/kubetest"
	"github.com/causeway-mesh/causeway/pkg/internal/metricstest"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/authn"
	"github.com/causeway-mesh/causeway/pkg/trust/authn/tokenreview"
	"github.com/causeway-mesh/causeway/pkg/trust/caclient"
	"github.com/causeway-mesh/causeway/pkg/trust/caserver"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
	"github.com/causeway-mesh/causeway/pkg/xds"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
	"github.com/causeway-mesh/causeway/pkg/xds/xdsserver"
)

// callers is the CA and the xDS server in front of the test apiserver, as
// the control plane runs them with --source kubernetes: callers
// authenticated by TokenReview, node authorization by the source's pod
// index, xDS fed from the source's snapshots.
type callers struct {
	t       *testing.T
	env     *kubetest.Env
	ca      *trusttest.CA
	caAddr  string
	xdsAddr string
	cpID    trust.Identity
	logs    *observer.ObservedLogs
	metrics *prometheus.Registry
	src     *kubesource.Source
	run     *running               // the source's snapshots
	pods    map[string]*corev1.Pod // by name
}

func pod(ns, name, node, sa, ip string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       corev1.PodSpec{NodeName: node, ServiceAccountName: sa, Containers: []corev1.Container{{Name: "c", Image: "i"}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip},
	}
}

func waypointPod() *corev1.Pod {
	p := pod("kshop", "wp-0", "node-b", "wp", "127.0.30.4")
	p.Labels = map[string]string{"gateway.networking.k8s.io/gateway-name": "wp"}
	return p
}

func startCallers(t *testing.T) *callers {
	t.Helper()
	env := kubetest.Shared(t)
	k := &callers{t: t, env: env, pods: map[string]*corev1.Pod{}, metrics: prometheus.NewRegistry()}
	created := env.Create(t,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "causeway-system"}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kshop", Labels: map[string]string{"causeway.dev/dataplane-mode": "mesh"}}},
		pod("causeway-system", "nodeproxy-a", "node-a", "nodeproxy", "127.0.31.1"),
		pod("causeway-system", "nodeproxy-b", "node-b", "nodeproxy", "127.0.31.2"),
		pod("kshop", "web", "node-a", "web", "127.0.30.1"),
		pod("kshop", "db", "node-b", "db", "127.0.30.2"),
		waypointPod(),
		&gwv1.Gateway{ObjectMeta: metav1.ObjectMeta{Name: "wp", Namespace: "kshop"}, Spec: gwv1.GatewaySpec{
			GatewayClassName: "causeway-waypoint", Listeners: []gwv1.Listener{{Name: "mesh", Port: 15008, Protocol: "HBONE"}}}},
	)
	for _, o := range created[2:] {
		if p, ok := o.(*corev1.Pod); ok {
			k.pods[p.Name] = p
		}
	}
	core, logs := observer.New(zapcore.InfoLevel)
	k.logs = logs
	log := zap.New(core)

	// The xDS server first: the source feeds it.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var auth authn.Chain // filled below; no stream arrives before the server listens
	trusted := []trust.Identity{trusttest.Identity(t, nodeProxyID)}
	xdsServer, err := xdsserver.NewServer(ctx, xdsserver.ServerOptions{Logger: log, TrustedNodeAccounts: trusted, Authenticator: &auth})
	if err != nil {
		t.Fatal(err)
	}
	r := startSource(t, env, 50*time.Millisecond, func(s *config.Snapshot) {
		if err := xdsServer.Update(s.Resources()); err != nil {
			t.Errorf("xDS update: %v", err)
		}
	})
	r.next(t, "the waypoint", func(s *config.Snapshot) bool { return len(s.Waypoints) > 0 })
	tr, err := tokenreview.New(tokenreview.Options{
		Reviews: kubernetes.NewForConfigOrDie(env.ControlPlane(t)).AuthenticationV1().TokenReviews(), TrustDomain: "cluster.local", Pods: r.src,
	})
	if err != nil {
		t.Fatal(err)
	}
	auth = authn.Chain{tr}
	k.src, k.run = r.src, r

	k.ca = trusttest.NewCA(t, "cluster.local")
	srv := k.ca.StartCAServer(t, caserver.Options{
		Authenticator: &auth, TrustedNodeAccounts: trusted, Workloads: r.src, WorkloadWait: workloadWait, Logger: log, Registerer: k.metrics,
	})
	k.caAddr, k.cpID = srv.Addr, srv.Identity
	cert := k.ca.Certificate(t, srv.Identity, 0)
	g := grpc.NewServer(append(xdsserver.GRPCServerOptions(), grpc.Creds(credentials.NewTLS(
		trust.ServerConfig(k.ca.Bundle, func(net.Addr) (*tls.Certificate, error) { return cert, nil }, trust.VerifyIfGiven))))...)
	xdsServer.Register(g)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	k.xdsAddr = ln.Addr().String()
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(func() {
		cancel() // ends the streams first, so that Stop does not wait on them
		g.Stop()
	})
	return k
}

// token asks the TokenRequest API for a token of the pod's service
// account, bound to the pod, for the audience.
func (k *callers) token(podName, audience string) string {
	k.t.Helper()
	p := k.pods[podName]
	tr, err := k.env.Clientset(k.t).CoreV1().ServiceAccounts(p.Namespace).CreateToken(context.Background(), p.Spec.ServiceAccountName,
		&authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
			Audiences:      []string{audience},
			BoundObjectRef: &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID},
		}}, metav1.CreateOptions{})
	if err != nil {
		k.t.Fatal(err)
	}
	return tr.Status.Token
}

// tokenFile writes a token where a projected volume would put it.
func tokenFile(t *testing.T, token string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "token")
	writeToken(t, path, token)
	return path
}

func writeToken(t *testing.T, path, token string) {
	t.Helper()
	// As the kubelet does: a new file swapped in, never a partial write.
	if err := os.WriteFile(path+".new", []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
}

// fetch asks the CA for identity id with the token in path.
func (k *callers) deletePod(t *testing.T, name string) {
	t.Helper()
	if err := k.env.Clientset(t).CoreV1().Pods("kshop").Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
}

func (k *callers) fetch(cc *caclient.Client, id string) error {
	k.t.Helper()
	ident, err := trust.ParseIdentity(id)
	if err != nil {
		k.t.Fatal(err)
	}
	_, csr, err := trust.NewKeyAndCSR(ident)
	if err != nil {
		k.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	_, err = cc.Fetch(ctx, ident, csr, 0)
	return err
}

func (k *callers) caClient(tokenPath string) *caclient.Client {
	k.t.Helper()
	cc, err := caclient.New(caclient.Options{Address: k.caAddr, Bundle: k.ca.Bundle, ServerIdentity: k.cpID, Token: caclient.TokenFromFile(tokenPath)})
	if err != nil {
		k.t.Fatal(err)
	}
	k.t.Cleanup(func() { cc.Close() })
	return cc
}

func wantRefused(t *testing.T, err error, code codes.Code, msg string) {
	t.Helper()
	if err == nil {
		t.Fatalf("accepted; want %v containing %q", code, msg)
	}
	st, _ := status.FromError(err) // sees through wrapping
	if st.Code() != code || !strings.Contains(st.Message(), msg) {
		t.Fatalf("got %v, want %v containing %q", err, code, msg)
	}
}

// workloadWait is the CA's wait for a pod the configuration does not hold
// yet (the control plane's --ca-workload-wait).
const workloadWait = time.Second

const (
	webID       = "spiffe://cluster.local/ns/kshop/sa/web"
	dbID        = "spiffe://cluster.local/ns/kshop/sa/db"
	nodeProxyID = "spiffe://cluster.local/ns/causeway-system/sa/nodeproxy"
	wpID        = "spiffe://cluster.local/ns/kshop/sa/wp"
)

// In Kubernetes, the CA and the xDS server authenticate callers by
// TokenReview against the cluster's apiserver.
func TestKubernetesCallers(t *testing.T) {
	k := startCallers(t)
	t.Run("CA", func(t *testing.T) { testCAAuthentication(t, k) })
	t.Run("xDS", func(t *testing.T) { testXDSAuthentication(t, k) })
}

// The CA authorizes node proxies by the pods on their node; every refusal
// says why.
func testCAAuthentication(t *testing.T, k *callers) {

	// Accepted: a node proxy's bound token, read from its file, gets its
	// node's workload identity and its own.
	nodeA := k.caClient(tokenFile(t, k.token("nodeproxy-a", "causeway-ca")))
	if err := k.fetch(nodeA, webID); err != nil {
		t.Fatalf("node-a proxy for web (on node-a): %v", err)
	}
	if err := k.fetch(nodeA, nodeProxyID); err != nil {
		t.Fatalf("node-a proxy for itself: %v", err)
	}

	// Off-node impersonation, refused once the wait for the configuration
	// is over.
	wantRefused(t, k.fetch(nodeA, dbID), codes.PermissionDenied, "no workload with identity "+dbID+" on node node-a")

	// A pod's first request can come before the configuration holds the
	// pod (in-pod capture hands a pod to its node proxy as it starts): the
	// CA waits for the snapshot that serves it instead of refusing.
	lateID := "spiffe://cluster.local/ns/kshop/sa/late"
	k.env.Create(t, pod("kshop", "late", "node-a", "late", "127.0.30.6"))
	if err := k.fetch(nodeA, lateID); err != nil {
		t.Fatalf("node-a proxy for a pod just created: %v", err)
	}
	k.deletePod(t, "late")
	// A waypoint's identity, though a captured pod on node-a runs as it
	// (the translation refuses that configuration; the last good one, which
	// knows the waypoint, stays in force while the pod index sees the pod).
	k.env.Create(t, pod("kshop", "impostor", "node-a", "wp", "127.0.30.3"))
	eventually(t, "the pod informer sees the impostor", func() bool { _, ok, _ := k.src.Pod("kshop", "impostor"); return ok })
	wantRefused(t, k.fetch(nodeA, wpID), codes.PermissionDenied, "identity "+wpID+" belongs to a waypoint")
	k.deletePod(t, "impostor")

	// A pod the translation refuses for another reason is no workload: its
	// node proxy gets no certificate for it while the refusal stands, and
	// gets one once the pod is fixed.
	brokenID := "spiffe://cluster.local/ns/kshop/sa/broken"
	broken := pod("kshop", "broken", "node-a", "broken", "127.0.30.5")
	broken.Annotations = map[string]string{config.AnnotationAppAddress: "not-an-address"}
	k.env.Create(t, broken)
	k.run.next(t, "the broken pod refused", func(s *config.Snapshot) bool {
		for _, p := range s.Rejected {
			if p.Object == "Pod kshop/broken" {
				return true
			}
		}
		return false
	})
	eventually(t, "the pod informer sees the broken pod", func() bool { _, ok, _ := k.src.Pod("kshop", "broken"); return ok })
	wantRefused(t, k.fetch(nodeA, brokenID), codes.PermissionDenied, "no workload with identity "+brokenID+" on node node-a")
	fixed, err := k.env.Clientset(t).CoreV1().Pods("kshop").Get(context.Background(), "broken", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fixed.Annotations = nil
	if _, err := k.env.Clientset(t).CoreV1().Pods("kshop").Update(context.Background(), fixed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	k.run.next(t, "the fixed pod a workload", func(s *config.Snapshot) bool { return s.HasWorkload("node-a", trusttest.Identity(t, brokenID)) })
	if err := k.fetch(nodeA, brokenID); err != nil {
		t.Fatalf("node-a proxy for the fixed pod: %v", err)
	}
	k.deletePod(t, "broken")

	// A workload's own token: its identity only.
	web := k.caClient(tokenFile(t, k.token("web", "causeway-ca")))
	if err := k.fetch(web, webID); err != nil {
		t.Fatalf("web for itself: %v", err)
	}
	wantRefused(t, k.fetch(web, dbID), codes.PermissionDenied, "account "+webID+" is not a trusted node account")

	// Wrong audience; the client re-reads its token file, so a rotated
	// token takes effect without a new client.
	path := tokenFile(t, k.token("nodeproxy-a", "kubernetes"))
	rotating := k.caClient(path)
	wantRefused(t, k.fetch(rotating, webID), codes.Unauthenticated, "token review")
	writeToken(t, path, k.token("nodeproxy-a", "causeway-ca"))
	if err := k.fetch(rotating, webID); err != nil {
		t.Fatalf("after the token file was rotated: %v", err)
	}

	// Expired: signed with the apiserver's key, bound to a live pod, past its expiry.
	p := k.pods["nodeproxy-a"]
	sa, err := k.env.Clientset(t).CoreV1().ServiceAccounts(p.Namespace).Get(context.Background(), "nodeproxy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	exp := time.Now().Add(-10 * time.Minute)
	expired, err := k.env.SignToken(map[string]any{
		"iss": kubetest.Issuer, "sub": "system:serviceaccount:causeway-system:nodeproxy", "aud": []string{"causeway-ca"},
		"iat": exp.Add(-time.Hour).Unix(), "nbf": exp.Add(-time.Hour).Unix(), "exp": exp.Unix(),
		"kubernetes.io": map[string]any{
			"namespace":      "causeway-system",
			"pod":            map[string]any{"name": p.Name, "uid": string(p.UID)},
			"serviceaccount": map[string]any{"name": "nodeproxy", "uid": string(sa.UID)},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	wantRefused(t, k.fetch(k.caClient(tokenFile(t, expired)), webID), codes.Unauthenticated, "expired")

	// Deleted pod: node-b's proxy is accepted, its pod is replaced by one
	// of the same name, and its token (reviewed and cached) stops working.
	nodeB := k.caClient(tokenFile(t, k.token("nodeproxy-b", "causeway-ca")))
	if err := k.fetch(nodeB, dbID); err != nil {
		t.Fatalf("node-b proxy for db (on node-b): %v", err)
	}
	pods := k.env.Clientset(t).CoreV1().Pods("causeway-system")
	if err := pods.Delete(context.Background(), "nodeproxy-b", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	k.env.Create(t, pod("causeway-system", "nodeproxy-b", "node-b", "nodeproxy", "127.0.31.2"))
	const replaced = "which no longer exists (the pod of that name has uid"
	var last error
	eventually(t, "the replaced pod's token is refused", func() bool {
		last = k.fetch(nodeB, dbID)
		return last != nil && strings.Contains(last.Error(), replaced)
	})
	wantRefused(t, last, codes.Unauthenticated, replaced)

	// Every refusal is logged with its reason and counted by code.
	for _, want := range []string{"no workload with identity", "not a trusted node account", "token review", "no longer exists"} {
		found := false
		for _, e := range k.logs.FilterMessage("certificate refused").All() {
			f := e.ContextMap()
			if strings.Contains(fmt.Sprint(f["reason"], f["error"]), want) {
				found = true
			}
		}
		if !found {
			t.Errorf("no refusal logged mentioning %q", want)
		}
	}
	if n := refusals(t, k.metrics, "PermissionDenied"); n != 4 {
		t.Errorf("%v PermissionDenied refusals counted, want 4", n)
	}
	if n := refusals(t, k.metrics, "Unauthenticated"); n < 3 {
		t.Errorf("%v Unauthenticated refusals counted, want at least 3", n)
	}
}

// The xDS server authenticates node proxies by the same TokenReview and
// keeps its per-caller rules: a node proxy's node id must name its node.
func testXDSAuthentication(t *testing.T, k *callers) {
	tok := caclient.TokenFromFile(tokenFile(t, k.token("nodeproxy-a", "causeway-ca")))
	c := k.xdsClient(t, tok, "node-a")
	wctx, wcancel := context.WithTimeout(context.Background(), patience)
	defer wcancel()
	if err := c.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, w := range c.State().Workloads {
		if w.Namespace == "kshop" && w.Name == "web" && w.Node == "node-a" && w.Identity == webID {
			found = true
		}
	}
	if !found {
		t.Fatalf("node-a proxy's workloads lack kshop/web: %d workloads", len(c.State().Workloads))
	}

	for _, tc := range []struct {
		what    string
		token   caclient.TokenSource
		node    string
		log, is string
	}{
		{"node-a's token for node id nodeproxy~node-b", tok, "node-b", "xDS request refused", "names node node-b, but the credential is for node node-a"},
		{"a token for another audience", caclient.StaticToken(k.token("nodeproxy-a", "kubernetes")), "node-a", "xDS stream refused", "token review"},
	} {
		refused := k.xdsClient(t, tc.token, tc.node)
		eventually(t, "the server refuses "+tc.what, func() bool {
			for _, e := range k.logs.FilterMessage(tc.log).All() {
				if strings.Contains(fmt.Sprint(e.ContextMap()["error"]), tc.is) {
					return true
				}
			}
			return false
		})
		if refused.Ready() {
			t.Fatalf("the client with %s got data", tc.what)
		}
	}
}

// xdsClient runs a node proxy's workload subscription until the test ends.
func (k *callers) xdsClient(t *testing.T, token caclient.TokenSource, node string) *xds.Client {
	t.Helper()
	c, err := xds.NewClient(xds.ClientOptions{Address: k.xdsAddr, Bundle: k.ca.Bundle, Token: token, NodeID: xds.NodeProxyID(node),
		Subscriptions:  []xds.Subscription{{TypeURL: meshv1.WorkloadTypeURL}},
		InitialBackoff: 50 * time.Millisecond, MaxBackoff: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

// refusals reads causeway_ca_refusals_total{code}.
func refusals(t *testing.T, reg *prometheus.Registry, code string) float64 {
	t.Helper()
	v, _ := metricstest.Value(t, reg, "causeway_ca_refusals_total", map[string]string{"code": code})
	return v
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for: %s", patience, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
