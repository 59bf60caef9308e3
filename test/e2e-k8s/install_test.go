package e2ek8s

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/causeway-mesh/causeway/internal/testcluster"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/caclient"
)

// The install as README "Install" tells a user to run it (helm install of
// charts/causeway, with the test cluster's images), its sample and the
// mesh's behaviour on the real cluster, helm upgrade, rollback and
// uninstall, in one install reused by every step (the steps depend on each
// other; a failed step ends the test, and the install is removed either
// way).
const (
	systemNS   = "causeway-system"
	trustDom   = "cluster.local"
	nodeProxy  = "causeway-nodeproxy"
	nodeName   = "causeway-node"
	principalH = "X-Causeway-Source-Principal"
	// Where the node's container runtime reads CNI configurations and
	// plugins (hack/cluster/containerd.toml).
	cniConfDir = "/etc/cni/net.d"
	cniBinDir  = "/opt/cni/bin"
	// The agent's socket for the plugin (manifests/core/nodeproxy.yaml).
	cniSocket = "/etc/cni/net.d/causeway/cni.sock"
)

var (
	repoRoot = filepath.Join("..", "..")
	chart    = filepath.Join(repoRoot, "charts", "causeway")
	// The chart's values naming the images: those images.sh pushed to the
	// cluster's registry, by digest (make e2e-k8s sets it).
	installValues = os.Getenv("CAUSEWAY_E2E_VALUES")
)

func TestInstall(t *testing.T) {
	requireCluster(t)
	ctx := context.Background()
	step := func(name string, f func(t *testing.T)) {
		t.Helper()
		if !t.Run(name, f) {
			t.FailNow()
		}
	}
	// The sample with the cluster registry's echo image (images.sh), its
	// Deployments placed on nodes apart on a cluster of three.
	sample, err := placedSample(t.TempDir(), filepath.Join(repoRoot, "bin", "cluster-images", "sample"))
	if err != nil {
		t.Fatal(err)
	}
	// The chart with the cluster registry's images by digest, and one more connection
	// policy set for the admission test: "e2e-broken", the ConfigMap
	// connection-policy-e2e-broken (testdata/connection-policy-broken, Rego
	// that does not compile), so that it never has a good revision; static
	// ingress Gateway addresses allowed from the test cluster's range for
	// them.
	install := []string{"install", "causeway", chart, "--namespace", systemNS, "--wait", "--timeout", "3m",
		"--values", installValues, "--set-json", `controlPlane.connectionPolicySets=[{"name":"default"},{"name":"e2e-broken"}]`,
		"--set-json", `gatewayAddresses=["` + testcluster.StaticAddressRange + `"]`}

	uninstalled := false
	uninstall := func(t *testing.T) {
		// The sample first (its pods are released while the agent runs),
		// then the mesh's components (README: they stop while their CRDs
		// and RBAC still exist, so nothing they do meanwhile is refused),
		// then the rest; --wait: the objects are gone when it returns.
		kc(t, 3*time.Minute, "delete", "-k", sample, "--ignore-not-found", "--wait=true")
		hc(t, 3*time.Minute, "uninstall", "causeway", "--namespace", systemNS, "--wait", "--timeout", "3m")
		uninstalled = true
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
		defer cancel()
		if !uninstalled {
			runKubectl(ctx, "delete", "-k", sample, "--ignore-not-found", "--wait=true")
			runHelm(ctx, "uninstall", "causeway", "--namespace", systemNS, "--wait", "--timeout", "3m", "--ignore-not-found")
		}
		// What helm uninstall leaves by design: the namespace it did not
		// create, the ConnectionPolicy CRD it keeps.
		runKubectl(ctx, "delete", "namespace", systemNS, "--ignore-not-found", "--wait=true")
		runKubectl(ctx, "delete", "crd", "connectionpolicies.causeway.dev", "--ignore-not-found", "--wait=true")
	})

	// meshctl against the cluster: before the install its check fails,
	// saying the mesh is not there (as the administrator who installs it).
	mc := buildMeshctl(t, t.TempDir())
	step("meshctl check before the install", func(t *testing.T) { testCheckBeforeInstall(t, mc) })

	step("install", func(t *testing.T) {
		began := time.Now()
		defer expectQuietLogs(t, "install", began)
		// The control plane's connection policy sets, in place before it
		// starts: a ConfigMap created later reaches its pods when the
		// kubelet next syncs them (within about a minute). So the namespace
		// is made first (README: where Pod Security admission needs its label).
		kc(t, time.Minute, "create", "namespace", systemNS)
		kc(t, time.Minute, "-n", systemNS, "create", "configmap", "connection-policy-default",
			"--from-file="+filepath.Join("testdata", "connection-policy"))
		kc(t, time.Minute, "-n", systemNS, "create", "configmap", "connection-policy-e2e-broken",
			"--from-file="+filepath.Join("testdata", "connection-policy-broken"))
		hc(t, 4*time.Minute, install...)
		cps := readyPods(t, systemNS, "app.kubernetes.io/name=causeway-controlplane", 2)
		nps := readyPods(t, systemNS, "app.kubernetes.io/name="+nodeProxy, len(nodes))
		// Every container runs the image the registry serves, pulled by
		// digest (nothing is imported: the runtime reports the digest it
		// resolved from the registry).
		pulled := map[string]string{"controlplane": "controlplane", "nodeproxy": "nodeproxy", "agent": "causeway-agent", "install-cni": "causeway-cni"}
		for _, p := range append(cps, nps...) {
			for _, st := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
				want := digestOf(images[pulled[st.Name]])
				if want == "" || !strings.HasSuffix(st.ImageID, "@"+want) {
					t.Errorf("pod %s container %s: image ID %q, want the registry's %s", p.Name, st.Name, st.ImageID, images[pulled[st.Name]])
				}
			}
		}
		// The leader made the GatewayClasses (waypoints, ingress), and accepted them.
		for _, class := range []string{"gatewayclass/causeway-waypoint", "gatewayclass/causeway"} {
			kc(t, time.Minute, "wait", "--for=create", "--timeout=60s", class)
			kc(t, time.Minute, "wait", "--for=condition=Accepted", "--timeout=60s", class)
		}
		if err := cniInstalled(); err != nil {
			t.Error(err)
		}
	})

	var pods map[string]corev1.Pod // the sample's, by app label
	step("sample", func(t *testing.T) {
		began := time.Now()
		defer expectQuietLogs(t, "sample", began)
		kc(t, 2*time.Minute, "apply", "-k", sample)
		// README: the policy is the shop's Rego of examples/local.
		kc(t, time.Minute, "-n", "shop", "create", "configmap", "waypoint-policies",
			"--from-file="+filepath.Join(repoRoot, "examples", "local", "policies"))
		pods = map[string]corev1.Pod{}
		for ns, apps := range map[string][]string{"web": {"frontend", "admin"}, "shop": {"reviews", "ratings"}, "outside": {"outsider"}} {
			for _, app := range apps {
				n := 1
				if app == "reviews" {
					n = 2
				}
				ps := readyPods(t, ns, "app="+app, n)
				pods[app] = ps[0]
			}
		}
		readyPods(t, "shop", "gateway.networking.k8s.io/gateway-name=waypoint", 2)
		kc(t, 2*time.Minute, "-n", "shop", "wait", "--for=condition=Programmed", "--timeout=120s", "gateway/waypoint")
		if node := placed(waypointNode); node != "" {
			// The control plane applies the waypoint's Deployment (server-side,
			// as its own field manager); the placement is the operator's.
			kc(t, time.Minute, "-n", "shop", "patch", "deployment", "waypoint", "--type", "json", "-p", nodeSelectorPatch(node))
			kc(t, 3*time.Minute, "-n", "shop", "rollout", "status", "deployment/waypoint", "--timeout=180s")
			for _, p := range readyPods(t, "shop", "gateway.networking.k8s.io/gateway-name=waypoint", 2) {
				if p.Spec.NodeName != node {
					t.Fatalf("waypoint pod %s on %s, want %s", p.Name, p.Spec.NodeName, node)
				}
			}
			var where []string
			for _, app := range []string{"frontend", "admin", "reviews", "ratings", "outsider"} {
				where = append(where, app+"@"+pods[app].Spec.NodeName)
			}
			t.Logf("placed: waypoint@%s %s", node, strings.Join(where, " "))
		}
	})

	// The control plane's CA issued the node proxy the certificates of its
	// node's workloads, and the waypoints their own, each caller
	// authenticated by the token of its projected volume (the log names
	// the caller's identity and node from the TokenReview): every caller
	// as it should be, and one on a node the identity's pods run on.
	step("certificates from projected tokens", func(t *testing.T) {
		want := []struct{ ns, sa, caller string }{
			{"web", "frontend", "spiffe://cluster.local/ns/causeway-system/sa/nodeproxy"},
			{"shop", "reviews", "spiffe://cluster.local/ns/causeway-system/sa/nodeproxy"},
			{"shop", "waypoint", "spiffe://cluster.local/ns/shop/sa/waypoint"},
			{"outside", "default", ""}, // not enrolled: never asked for
		}
		eventually(t, time.Minute, "certificates issued", func() error {
			issued, err := issuedCertificates(ctx)
			if err != nil {
				return err
			}
			for _, w := range want {
				id := "spiffe://cluster.local/ns/" + w.ns + "/sa/" + w.sa
				got := issued[id]
				if w.caller == "" {
					if len(got) > 0 {
						return fmt.Errorf("%s was issued a certificate (%v) though it is outside the mesh", id, got)
					}
					continue
				}
				on, err := nodesOf(ctx, w.ns, w.sa)
				if err != nil {
					return err
				}
				onPodNode := false
				for _, g := range got {
					if g.Caller != w.caller {
						return fmt.Errorf("%s issued to caller %s on node %q, want %s", id, g.Caller, g.Node, w.caller)
					}
					onPodNode = onPodNode || on[g.Node]
				}
				if !onPodNode {
					return fmt.Errorf("%s issued %v, none on a node of its pods %v", id, got, on)
				}
			}
			return nil
		})
		// A pod's first request comes as the pod starts, before the
		// configuration holds it: the CA waits for it rather than refuse.
		refused, err := certificateLog(ctx, "certificate refused")
		if err != nil {
			t.Fatal(err)
		}
		for id, r := range refused {
			t.Errorf("%s refused before the CA checks began: %v", id, r)
		}
	})

	// meshctl as a mesh operator (the chart's ClusterRole) on the
	// installed mesh and the sample.
	t.Run("meshctl", func(t *testing.T) { testMeshctl(t, mc, pods["frontend"]) })

	t.Run("traffic through the waypoint", func(t *testing.T) {
		path := "/e2e-" + randomHex()
		a := fetchOK(t, "web", pods["frontend"].Name, "http://reviews.shop"+path)
		if !strings.HasPrefix(a.Pod, "reviews-") || a.Headers[principalH] == nil || a.Headers[principalH][0] != "spiffe://cluster.local/ns/web/sa/frontend" {
			t.Fatalf("answer from %s with %s %v, want a reviews pod told the frontend's identity", a.Pod, principalH, a.Headers[principalH])
		}
		expectSampleStatus(t)
		// The waypoint's access log names the caller's identity.
		eventually(t, 30*time.Second, "the waypoint's access log line", func() error {
			return waypointLogged(ctx, path, "spiffe://cluster.local/ns/web/sa/frontend", 200)
		})
		if placed(clientNode) == "" {
			return
		}
		// Each version by its own Service (bound to the waypoint too):
		// reviews-v1 three nodes apart from the frontend and the waypoint,
		// reviews-v2 on the frontend's node.
		for version, place := range map[string]int{"reviews-v1": destinationNode, "reviews-v2": clientNode} {
			path := "/e2e-" + randomHex()
			a := fetchOK(t, "web", pods["frontend"].Name, "http://"+version+".shop"+path)
			if p := a.Headers[principalH]; !strings.HasPrefix(a.Pod, version+"-") || p == nil || p[0] != "spiffe://cluster.local/ns/web/sa/frontend" {
				t.Fatalf("%s: answer from %s with %s %v, want a %s pod told the frontend's identity", version, a.Pod, principalH, p, version)
			}
			if on, err := client.CoreV1().Pods("shop").Get(ctx, a.Pod, metav1.GetOptions{}); err != nil || on.Spec.NodeName != placed(place) {
				t.Fatalf("%s: answered by %s, want a pod on %s (%v)", version, a.Pod, placed(place), err)
			}
			eventually(t, 30*time.Second, "the waypoint's access log line", func() error {
				return waypointLogged(ctx, path, "spiffe://cluster.local/ns/web/sa/frontend", 200)
			})
		}
	})

	t.Run("waypoint rollout under load", func(t *testing.T) { testWaypointRollout(t, pods["frontend"]) })

	t.Run("traces in Jaeger", func(t *testing.T) { testTraces(t, pods["frontend"]) })

	t.Run("backend TLS to a server outside the mesh", func(t *testing.T) {
		testBackendTLS(t, pods["frontend"], func(args ...string) { kc(t, time.Minute, args...) })
	})

	t.Run("outside the mesh: hairpinned, unauthenticated", func(t *testing.T) {
		// To the Service and straight to a pod: the destination's node
		// proxy sends both through the waypoint with no identity, which
		// the policy denies but for /public.
		target := "http://" + net.JoinHostPort(pods["reviews"].Status.PodIP, "8080")
		bases := []string{"http://reviews.shop", target}
		if placed(clientNode) != "" {
			// The outsider shares reviews-v1's node; reviews-v2 and the
			// waypoint are on the two others.
			bases = append(bases, "http://reviews-v1.shop", "http://reviews-v2.shop")
		}
		for _, base := range bases {
			denied := "/e2e-" + randomHex()
			expectDenied(t, "outside", pods["outsider"].Name, base+denied, "unauthenticated callers may only read /public")
			a := fetchOK(t, "outside", pods["outsider"].Name, base+"/public/"+randomHex())
			if p := a.Headers[principalH]; p != nil {
				t.Errorf("%s: an unauthenticated caller reached the app as %v", base, p)
			}
			eventually(t, 30*time.Second, "the waypoint's access log line", func() error {
				return waypointLogged(ctx, denied, "unauthenticated", 403)
			})
		}
	})

	t.Run("ingress gateway from the host", testIngress)

	t.Run("standard metrics in Prometheus", func(t *testing.T) { testStandardMetrics(t, pods) })

	// A namespace labelled after its pod started: the running pod is
	// captured without a restart and speaks with its own identity (which
	// the policy does not allow: an authenticated denial).
	t.Run("late enrollment", func(t *testing.T) {
		ns := newNamespace(t, "e2e-late")
		client, err := startEcho(ctx, ns, placed(waypointNode))
		if err != nil {
			t.Fatal(err)
		}
		expectDenied(t, ns, client.Name, "http://reviews.shop/e2e-"+randomHex(), "unauthenticated callers may only read /public")
		kc(t, time.Minute, "label", "namespace", ns, "causeway.dev/dataplane-mode=mesh")
		eventually(t, time.Minute, "the labelled namespace's pod captured", func() error {
			return denied(ns, client.Name, "http://reviews.shop/e2e-"+randomHex(), "no rule allows this request")
		})
		a := fetchOK(t, ns, client.Name, "http://reviews.shop/public/"+randomHex())
		if want := "spiffe://cluster.local/ns/" + ns + "/sa/default"; a.Headers[principalH] == nil || a.Headers[principalH][0] != want {
			t.Errorf("%s %v, want %s", principalH, a.Headers[principalH], want)
		}
		p, err := clientPod(ctx, ns, client.Name)
		if err != nil || p.UID != client.UID || p.Status.ContainerStatuses[0].RestartCount != 0 {
			t.Errorf("the pod was restarted or replaced: %v", err)
		}
	})

	// Service trafficDistribution, at the node proxy and at the waypoint,
	// and its fallback (locality_test.go).
	t.Run("locality", func(t *testing.T) {
		testLocality(t, pods["frontend"])
	})

	// A pod recreated on another node: its certificate follows it
	// (locality_test.go).
	t.Run("pod moved to another node", func(t *testing.T) {
		testPodMoves(t, pods["frontend"])
	})

	t.Run("connection policy at workloads without a waypoint", func(t *testing.T) {
		testConnectionPolicy(t, func(args ...string) { kc(t, time.Minute, args...) })
	})

	t.Run("connection policy admission", func(t *testing.T) {
		testConnectionPolicyAdmission(t, func(args ...string) { kc(t, time.Minute, args...) })
	})

	// The CA takes a node proxy's token (read from its projected volume on
	// the node) for identities with a pod on its node, and refuses it for
	// one whose only pod is bound to another node.
	t.Run("CA node authorization", func(t *testing.T) {
		kubeletDir := os.Getenv("CAUSEWAY_E2E_KUBELET_DIR")
		if kubeletDir == "" {
			t.Skip("CAUSEWAY_E2E_KUBELET_DIR is not set (make e2e-k8s sets it): the node proxy's projected token is read from the kubelet's pod directory")
		}
		// This machine's node proxy, whose kubelet directory is here.
		np, err := nodeProxyOn(readyPods(t, systemNS, "app.kubernetes.io/name="+nodeProxy, len(nodes)), nodeName)
		if err != nil {
			t.Fatal(err)
		}
		token := filepath.Join(kubeletDir, "pods", string(np.UID), "volumes", "kubernetes.io~projected", "token", "token")
		ca, err := caClient(ctx, caclient.TokenFromFile(token))
		if err != nil {
			t.Fatal(err)
		}
		defer ca.Close()

		ns := newNamespace(t, "e2e-offnode")
		if _, err := client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "away"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// Bound to a node that does not exist: never scheduled, never run;
		// its status says Running so only the node tells it apart.
		away, err := client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "away"},
			Spec: corev1.PodSpec{NodeName: "elsewhere", ServiceAccountName: "away",
				Containers: []corev1.Container{{Name: "app", Image: echoImage, ImagePullPolicy: corev1.PullIfNotPresent}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// No kubelet will confirm its deletion: without grace it goes at
		// once (else it keeps its namespace terminating).
		t.Cleanup(func() {
			_ = client.CoreV1().Pods(ns).Delete(context.Background(), "away", metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		})
		away.Status.Phase = corev1.PodRunning
		away.Status.PodIP, away.Status.PodIPs = "10.244.0.250", []corev1.PodIP{{IP: "10.244.0.250"}}
		if _, err := client.CoreV1().Pods(ns).UpdateStatus(ctx, away, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}

		fetch := func(ca *caclient.Client, ns, sa string) error {
			id, err := trust.NewIdentity(trustDom, ns, sa)
			if err != nil {
				return err
			}
			_, csr, err := trust.NewKeyAndCSR(id)
			if err != nil {
				return err
			}
			fctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			_, err = ca.Fetch(fctx, id, csr, time.Hour)
			return err
		}
		if err := fetch(ca, "web", "frontend"); err != nil {
			t.Fatalf("the node proxy's own token for a workload on its node: %v", err)
		}
		err = fetch(ca, ns, "away")
		want := fmt.Sprintf("no workload with identity spiffe://cluster.local/ns/%s/sa/away on node %s", ns, nodeName)
		if err == nil || !strings.Contains(err.Error(), "PermissionDenied") || !strings.Contains(err.Error(), want) {
			t.Fatalf("the node proxy's token for a workload on another node: %v, want PermissionDenied: %s", err, want)
		}
		if placed(waypointNode) == "" {
			return
		}
		// On three nodes, with real pods and the node proxies' own bound
		// tokens (as the kubelet makes them: audience causeway-ca, bound
		// to the node proxy pod, so naming its node): the ratings pods
		// run on the waypoint's node alone. That node's node proxy gets
		// their certificate; this machine's is refused, saying why, in
		// the error and in the control plane's log.
		ratings, err := nodesOf(ctx, "shop", "ratings")
		if err != nil || len(ratings) != 1 || !ratings[placed(waypointNode)] {
			t.Fatalf("ratings pods on %v (%v), want %s alone", ratings, err, placed(waypointNode))
		}
		proxies := readyPods(t, systemNS, "app.kubernetes.io/name="+nodeProxy, len(nodes))
		for _, c := range []struct {
			node    string
			refused bool
		}{{placed(waypointNode), false}, {nodeName, true}} {
			np, err := nodeProxyOn(proxies, c.node)
			if err != nil {
				t.Fatal(err)
			}
			tok, err := client.CoreV1().ServiceAccounts(systemNS).CreateToken(ctx, np.Spec.ServiceAccountName, &authv1.TokenRequest{
				Spec: authv1.TokenRequestSpec{Audiences: []string{"causeway-ca"}, ExpirationSeconds: new(int64(600)),
					BoundObjectRef: &authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: np.Name, UID: np.UID}},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			nodeCA, err := caClient(ctx, caclient.StaticToken(tok.Status.Token))
			if err != nil {
				t.Fatal(err)
			}
			err = fetch(nodeCA, "shop", "ratings")
			nodeCA.Close()
			want := "no workload with identity spiffe://cluster.local/ns/shop/sa/ratings on node " + c.node
			switch {
			case !c.refused && err != nil:
				t.Fatalf("node %s's node proxy, for its own workload: %v", c.node, err)
			case c.refused && (err == nil || !strings.Contains(err.Error(), "PermissionDenied") || !strings.Contains(err.Error(), want)):
				t.Fatalf("node %s's node proxy, for a workload on %s: %v, want PermissionDenied: %s", c.node, placed(waypointNode), err, want)
			}
		}
		eventually(t, 30*time.Second, "the control plane's log of the refusal", func() error {
			refused, err := certificateLog(ctx, "certificate refused")
			if err != nil {
				return err
			}
			for _, r := range refused["spiffe://cluster.local/ns/shop/sa/ratings"] {
				if r.Node == nodeName && strings.Contains(r.Reason, "on node "+nodeName) {
					return nil
				}
			}
			return fmt.Errorf("no refusal of shop/ratings to node %s logged: %v", nodeName, refused["spiffe://cluster.local/ns/shop/sa/ratings"])
		})
	})

	// Captured pods keep their rules while the node proxy pod is replaced;
	// the new one gets their namespaces replayed and serves them again.
	t.Run("node proxy pod deleted", func(t *testing.T) {
		// The frontend's.
		old, err := nodeProxyOn(readyPods(t, systemNS, "app.kubernetes.io/name="+nodeProxy, len(nodes)), pods["frontend"].Spec.NodeName)
		if err != nil {
			t.Fatal(err)
		}
		if err := client.CoreV1().Pods(systemNS).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, 2*time.Minute, "a new node proxy pod ready on "+old.Spec.NodeName, func() error {
			return newReadyNodeProxy(ctx, old)
		})
		expectCaptured(t, pods["frontend"])
	})

	// helm upgrade to another node proxy image, then helm rollback to the
	// first release: each rolls the DaemonSet, and captured pods keep
	// reaching their destinations through the mesh; steady requests to the
	// waypoint-bound Service across each roll all succeed (traffic_test.go).
	t.Run("upgrade and rollback", func(t *testing.T) {
		image := os.Getenv("CAUSEWAY_E2E_UPGRADE_IMAGE")
		if image == "" {
			t.Skip("CAUSEWAY_E2E_UPGRADE_IMAGE is not set (make e2e-k8s pushes a second node proxy image, another version)")
		}
		began := time.Now()
		defer expectQuietLogs(t, "upgrade", began)
		// The node proxy's image by digest (repository@sha256:...), or by
		// tag; its registry is the install's (the check below compares the
		// whole reference).
		set := ""
		if _, digest, ok := strings.Cut(image, "@"); ok {
			set = "images.nodeproxy.digest=" + digest
		} else if _, tag, ok := strings.Cut(image[strings.LastIndex(image, "/")+1:], ":"); ok {
			set = "images.nodeproxy.tag=" + tag
		} else {
			t.Fatalf("CAUSEWAY_E2E_UPGRADE_IMAGE %s names neither a tag nor a digest", image)
		}
		first := readyPods(t, systemNS, "app.kubernetes.io/name="+nodeProxy, len(nodes))
		firstImage := containerImage(first[0], "nodeproxy")
		if digestOf(firstImage) == digestOf(image) {
			t.Fatalf("the upgrade image %s has the installed image's digest: no upgrade", image)
		}
		// Every node's node proxy pod replaced by one with the image.
		rollTo := func(t *testing.T, old []corev1.Pod, image string, helmArgs ...string) []corev1.Pod {
			hc(t, 4*time.Minute, helmArgs...)
			kc(t, 3*time.Minute, "-n", systemNS, "rollout", "status", "daemonset/"+nodeProxy, "--timeout=180s")
			cur := readyPods(t, systemNS, "app.kubernetes.io/name="+nodeProxy, len(nodes))
			for _, p := range cur {
				if slices.ContainsFunc(old, func(o corev1.Pod) bool { return o.UID == p.UID }) || containerImage(p, "nodeproxy") != image {
					t.Fatalf("after helm %s: pod %s with %s, want a new pod with %s", helmArgs[0], p.Name, containerImage(p, "nodeproxy"), image)
				}
			}
			expectCaptured(t, pods["frontend"])
			return cur
		}
		// The roll's traffic leaves from the frontend: its node's node proxy
		// is the one whose replacement it crosses.
		serving := func(t *testing.T, proxies []corev1.Pod) corev1.Pod {
			np, err := nodeProxyOn(proxies, pods["frontend"].Spec.NodeName)
			if err != nil {
				t.Fatal(err)
			}
			return np
		}
		traffic := startRollTraffic(t, pods["frontend"], serving(t, first), "http://reviews.shop/e2e-"+randomHex())
		upgraded := rollTo(t, first, image, "upgrade", "causeway", chart, "--namespace", systemNS, "--reuse-values",
			"--set", set, "--wait", "--timeout", "3m")
		traffic.stop(t, "helm upgrade")
		expectMigrateReq(t, pods["frontend"])
		traffic = startRollTraffic(t, pods["frontend"], serving(t, upgraded), "http://reviews.shop/e2e-"+randomHex())
		rollTo(t, upgraded, firstImage, "rollback", "causeway", "1", "--namespace", systemNS, "--wait", "--timeout", "3m")
		traffic.stop(t, "helm rollback")
		if h := hc(t, time.Minute, "history", "causeway", "--namespace", systemNS, "--max", "10"); !strings.Contains(h, "Rollback to 1") {
			t.Errorf("helm history does not show the rollback:\n%s", h)
		}
	})

	// Last before the uninstall, as they stop nodes (each node is back and
	// Ready after): a node lost and back, then the other extra node
	// rebooted without a drain (nodeloss_test.go).
	t.Run("node loss and reboot", func(t *testing.T) {
		nc := nodeScriptsFor(t)
		senders := startSenders(t, newNamespace(t, "e2e-senders"), senderURL(t), nodes[1], nodes[2])
		var lost string
		if !t.Run("node lost and back", func(t *testing.T) { lost = testNodeLoss(t, nc, pods["frontend"], senders) }) {
			return
		}
		other := nodes[1]
		if lost == other {
			other = nodes[2]
		}
		t.Run("node rebooted without drain", func(t *testing.T) { testRebootWithoutDrain(t, nc, other, senders[other]) })
	})

	// helm uninstall leaves the node without the plugin's configuration
	// and binary (the container runtime would otherwise keep calling it).
	step("uninstall", func(t *testing.T) {
		quiet := followMeshLogs(t, ctx, systemNS)
		uninstall(t)
		expectNodeClean(t)
		quiet("uninstall")
	})
}

// The rendered install (what a release's install.yaml is, with the test
// cluster's images) applied with kubectl: the mesh comes up, and kubectl
// delete removes it and its CNI files from the node.
func TestInstallYAML(t *testing.T) {
	requireCluster(t)
	ctx := context.Background()
	// stdout alone: the YAML, whatever helm says on stderr.
	rendered, err := exec.Command(helmBin, "template", "causeway", chart, "--namespace", systemNS, "--include-crds",
		"--values", installValues, "--set", "namespace.create=true").Output()
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	file := filepath.Join(t.TempDir(), "install.yaml")
	if err := os.WriteFile(file, rendered, 0o644); err != nil {
		t.Fatal(err)
	}
	deleted := false
	t.Cleanup(func() {
		if !deleted {
			ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
			defer cancel()
			runKubectl(ctx, "delete", "-f", file, "--ignore-not-found", "--wait=true")
		}
	})
	kc(t, 3*time.Minute, "apply", "--server-side", "-f", file)
	kc(t, 3*time.Minute, "-n", systemNS, "rollout", "status", "deployment/causeway-controlplane", "--timeout=180s")
	kc(t, 3*time.Minute, "-n", systemNS, "rollout", "status", "daemonset/"+nodeProxy, "--timeout=180s")
	kc(t, time.Minute, "wait", "--for=create", "--timeout=60s", "gatewayclass/causeway-waypoint")
	kc(t, time.Minute, "wait", "--for=condition=Accepted", "--timeout=60s", "gatewayclass/causeway-waypoint")
	eventually(t, time.Minute, "the node proxy's installer's files on every node", cniInstalled)
	kc(t, 4*time.Minute, "delete", "-f", file, "--wait=true")
	deleted = true
	expectNodeClean(t)
}

// expectNodeClean: the node proxy pods are gone and left no CNI
// configuration, plugin binary or agent socket on any node.
func expectNodeClean(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	eventually(t, 2*time.Minute, "the node proxy pods gone", func() error {
		list, err := client.CoreV1().Pods(systemNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + nodeProxy})
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		if list != nil && len(list.Items) > 0 {
			return fmt.Errorf("%d left", len(list.Items))
		}
		return nil
	})
	for _, node := range nodes {
		for _, dir := range []string{cniConfDir, cniBinDir} {
			entries, err := os.ReadDir(nodePath(node, dir))
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				if strings.Contains(e.Name(), "causeway") && e.Name() != "10-causeway-bridge.conflist" { // the cluster's own primary
					t.Errorf("uninstall left %s on %s", filepath.Join(dir, e.Name()), node)
				}
			}
		}
		if _, err := os.Stat(nodePath(node, cniSocket)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("uninstall left the agent's socket %s on %s (%v)", cniSocket, node, err)
		}
	}
}

// cniInstalled: the node proxy's installer put the plugin's configuration
// and binary on every node.
func cniInstalled() error {
	for _, node := range nodes {
		for _, f := range []string{filepath.Join(cniConfDir, "05-causeway.conflist"), filepath.Join(cniBinDir, "causeway-cni")} {
			if _, err := os.Stat(nodePath(node, f)); err != nil {
				return fmt.Errorf("the node proxy's installer left no %s on %s: %w", f, node, err)
			}
		}
	}
	return nil
}

func randomHex() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// fetchOK fetches url from the pod's echo container, retrying briefly (a
// route or endpoint still converging), and returns the answer.
func fetchOK(t *testing.T, ns, pod, url string) echoAnswer {
	t.Helper()
	var a echoAnswer
	eventually(t, 30*time.Second, "GET "+url+" from "+ns+"/"+pod, func() error {
		answers, err := fetchFrom(ns, pod, url)
		if err != nil {
			return err
		}
		a = answers[0]
		return nil
	})
	return a
}

// expectDenied: the request gets the policy's 403 with reason in the body.
func expectDenied(t *testing.T, ns, pod, url, reason string) {
	t.Helper()
	eventually(t, 30*time.Second, "GET "+url+" from "+ns+"/"+pod+" denied", func() error {
		return denied(ns, pod, url, reason)
	})
}

// denied: GET url from the pod is answered 403 with reason in the body
// (echo fetch prints the body, and exits 1 naming the status).
func denied(ns, pod, url, reason string) error {
	body, err := kubectlExec(ns, pod, "echo", "/usr/local/bin/echo", "fetch", "-timeout", "3s", url)
	var ee *execError
	if errors.As(err, &ee) && strings.Contains(ee.stderr, "status 403") && strings.Contains(body, reason) {
		return nil
	}
	return fmt.Errorf("want 403 %q, got %q (%v)", reason, body, err)
}

// expectCaptured: the frontend (not restarted) still reaches reviews
// through the waypoint with its identity.
func expectCaptured(t *testing.T, frontend corev1.Pod) {
	t.Helper()
	eventually(t, time.Minute, "the frontend through the mesh", func() error {
		answers, err := fetchFrom(frontend.Namespace, frontend.Name, "http://reviews.shop/e2e-"+randomHex())
		if err != nil {
			return err
		}
		if p := answers[0].Headers[principalH]; p == nil || p[0] != "spiffe://cluster.local/ns/web/sa/frontend" {
			return fmt.Errorf("reached %s as %v", answers[0].Pod, p)
		}
		return nil
	})
	p, err := clientPod(context.Background(), frontend.Namespace, frontend.Name)
	if err != nil || p.UID != frontend.UID || p.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("the frontend was restarted or replaced: %v", err)
	}
}

func clientPod(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	return client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
}

// digestOf is the digest of an image reference pinned by digest, or "".
func digestOf(ref string) string {
	_, d, _ := strings.Cut(ref, "@")
	return d
}

func containerImage(p corev1.Pod, name string) string {
	for _, c := range p.Spec.Containers {
		if c.Name == name {
			return c.Image
		}
	}
	return ""
}

// newReadyNodeProxy: a node proxy pod other than old is ready on its node.
func newReadyNodeProxy(ctx context.Context, old corev1.Pod) error {
	list, err := client.CoreV1().Pods(systemNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + nodeProxy})
	if err != nil {
		return err
	}
	for _, p := range list.Items {
		if p.UID != old.UID && p.Spec.NodeName == old.Spec.NodeName && p.DeletionTimestamp == nil && podReady(p) {
			return nil
		}
	}
	return fmt.Errorf("%d node proxy pods, none new and ready on %s", len(list.Items), old.Spec.NodeName)
}

// startEcho runs one echo pod (not enrolled: its namespace has no label)
// on node (or where the scheduler puts it, for "") and waits for it to be
// ready.
func startEcho(ctx context.Context, ns, node string) (*corev1.Pod, error) {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "client", Labels: map[string]string{"app": "client"}}, Spec: echoPodSpec()}
	placeOn(&p.Spec, node)
	ready, err := startPods(ctx, ns, p)
	if err != nil {
		return nil, err
	}
	return ready[0], nil
}

// startPods creates the pods in ns (those that name no namespace of their
// own) and waits until all are ready; it returns them as they are then.
func startPods(ctx context.Context, ns string, pods ...*corev1.Pod) ([]*corev1.Pod, error) {
	ready := make([]*corev1.Pod, len(pods))
	created := make([]bool, len(pods))
	var err error
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		waiting := 0
		for i, p := range pods {
			pns := cmp.Or(p.Namespace, ns)
			switch {
			case !created[i]:
				// Refused until the pod's ServiceAccount exists.
				_, err = client.CoreV1().Pods(pns).Create(ctx, p, metav1.CreateOptions{})
				created[i] = err == nil
				waiting++
			case ready[i] == nil:
				if cur, err := clientPod(ctx, pns, p.Name); err == nil && podReady(*cur) {
					ready[i] = cur
				} else {
					waiting++
				}
			}
		}
		if waiting == 0 {
			return ready, nil
		}
	}
	return nil, fmt.Errorf("pods of %s not ready within 2m (%v)", ns, err)
}

// issuance is what the CA logged for one identity (Reason: a refusal's).
type issuance struct{ Caller, Node, Reason string }

// issuedCertificates reads the "certificate issued" lines of every control
// plane replica's log, by identity.
func issuedCertificates(ctx context.Context) (map[string][]issuance, error) {
	return certificateLog(ctx, "certificate issued")
}

// certificateLog reads the CA's lines with message msg from every control
// plane replica's log, by identity.
func certificateLog(ctx context.Context, msg string) (map[string][]issuance, error) {
	out := map[string][]issuance{}
	err := eachLogLine(ctx, systemNS, "app.kubernetes.io/name=causeway-controlplane", "controlplane", func(line map[string]any) {
		if line["msg"] != msg {
			return
		}
		id, _ := line["identity"].(string)
		caller, _ := line["caller"].(string)
		node, _ := line["node"].(string)
		reason, _ := line["reason"].(string)
		out[id] = append(out[id], issuance{caller, node, reason})
	})
	return out, err
}

// waypointLogged finds the waypoint's access log line of a request to path
// with the identity and status.
func waypointLogged(ctx context.Context, path, identity string, status int) error {
	found := false
	err := eachLogLine(ctx, "shop", "gateway.networking.k8s.io/gateway-name=waypoint", "waypoint", func(line map[string]any) {
		if line["msg"] == "request" && line["path"] == path && line["identity"] == identity && line["status"] == float64(status) {
			found = true
		}
	})
	if err == nil && !found {
		err = fmt.Errorf("no access log line for %s with identity %s and status %d", path, identity, status)
	}
	return err
}

// eachLogLine calls f with every JSON line of the container's logs in the
// pods matching selector.
func eachLogLine(ctx context.Context, ns, selector, container string, f func(map[string]any)) error {
	list, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return err
	}
	for _, p := range list.Items {
		if err := podLogLines(ctx, p, &corev1.PodLogOptions{Container: container}, f); err != nil {
			return err
		}
	}
	return nil
}

// podLogLines calls f with every JSON line of a pod's log as opts select it.
func podLogLines(ctx context.Context, p corev1.Pod, opts *corev1.PodLogOptions, f func(map[string]any)) error {
	rc, err := client.CoreV1().Pods(p.Namespace).GetLogs(p.Name, opts).Stream(ctx)
	if err != nil {
		return fmt.Errorf("logs of %s: %w", p.Name, err)
	}
	defer rc.Close()
	sc := bufio.NewScanner(rc)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) == nil {
			f(line)
		}
	}
	return sc.Err()
}

// caClient dials a control plane replica's CA at its pod IP (inside the
// cluster's pod network), trusting the roots it publishes.
func caClient(ctx context.Context, token caclient.TokenSource) (*caclient.Client, error) {
	cm, err := client.CoreV1().ConfigMaps(systemNS).Get(ctx, "causeway-root-cert", metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	roots, err := trust.ParseCertificatesPEM([]byte(cm.Data["root-cert.pem"]))
	if err != nil {
		return nil, err
	}
	bundle, err := trust.NewBundle(trustDom, roots)
	if err != nil {
		return nil, err
	}
	id, err := trust.ControlPlaneIdentity(trustDom)
	if err != nil {
		return nil, err
	}
	list, err := client.CoreV1().Pods(systemNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=causeway-controlplane"})
	if err != nil || len(list.Items) == 0 {
		return nil, fmt.Errorf("no control plane pod: %v", err)
	}
	ip := list.Items[0].Status.PodIP
	if err := onClusterBridge(ip); err != nil {
		return nil, err
	}
	return caclient.New(caclient.Options{Address: net.JoinHostPort(ip, "15012"), Bundle: bundle, ServerIdentity: id, Token: token})
}

// onClusterBridge refuses an address the host would not route to the
// cluster's pod bridge or, for a pod on another node, to its node bridge
// (hack/cluster/lib.sh; nothing may leave the machine).
func onClusterBridge(ip string) error {
	out, err := exec.Command("ip", "route", "get", ip).Output()
	if err != nil {
		return fmt.Errorf("ip route get %s: %v", ip, err)
	}
	if f := strings.Fields(string(out)); !slices.Contains(f, "cni0") && !slices.Contains(f, "cw-node") {
		return fmt.Errorf("%s is not routed to the cluster's bridges cni0 or cw-node: %s", ip, out)
	}
	return nil
}
