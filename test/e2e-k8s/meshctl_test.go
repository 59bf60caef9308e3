package e2ek8s

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// meshctl is cmd/meshctl built for the test, and the kubeconfig it runs
// with.
type meshctl struct {
	bin        string
	kubeconfig string
}

// buildMeshctl builds cmd/meshctl into dir; it runs with the cluster's
// admin kubeconfig until asOperator.
func buildMeshctl(t *testing.T, dir string) *meshctl {
	t.Helper()
	bin := filepath.Join(dir, "meshctl")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "../../cmd/meshctl").CombinedOutput(); err != nil {
		t.Fatalf("build meshctl: %v\n%s", err, out)
	}
	return &meshctl{bin: bin, kubeconfig: kubeconfig}
}

// run runs meshctl and returns its stdout, stderr and exit code.
func (m *meshctl) run(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, m.bin, append(args, "--kubeconfig", m.kubeconfig)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("meshctl %s: %v", strings.Join(args, " "), err)
	}
	// Whatever it is asked, meshctl answers in words: never a Go panic.
	if s := stderr.String(); strings.Contains(s, "goroutine ") || strings.Contains(s, "panic:") {
		t.Fatalf("meshctl %s crashed:\n%s", strings.Join(args, " "), s)
	}
	return stdout.String(), stderr.String(), code
}

// ok runs meshctl, fails the test unless it exits 0, and returns stdout.
func (m *meshctl) ok(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, code := m.run(t, args...)
	if code != 0 {
		t.Fatalf("meshctl %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// operatorName is the ServiceAccount (in default) and ClusterRoleBinding
// the test makes a mesh operator of.
const operatorName = "e2e-mesh-operator"

// asOperator makes meshctl run as a mesh operator: a ServiceAccount bound
// to the chart's ClusterRole causeway-mesh-operator and nothing else, its
// token in a kubeconfig of its own (the cluster's address and CA from the
// admin's).
func (m *meshctl) asOperator(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	sa, err := client.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: operatorName}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.RbacV1().ClusterRoleBindings().Delete(context.Background(), operatorName, metav1.DeleteOptions{})
		_ = client.CoreV1().ServiceAccounts("default").Delete(context.Background(), operatorName, metav1.DeleteOptions{})
	})
	if _, err := client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: operatorName},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "causeway-mesh-operator"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa.Name, Namespace: sa.Namespace}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tok, err := client.CoreV1().ServiceAccounts("default").CreateToken(ctx, sa.Name, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{ExpirationSeconds: new(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	admin, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cur := admin.Contexts[admin.CurrentContext]
	if cur == nil || admin.Clusters[cur.Cluster] == nil {
		t.Fatalf("admin kubeconfig %s: no current context with a cluster", kubeconfig)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = admin.Clusters[cur.Cluster]
	cfg.AuthInfos[operatorName] = &clientcmdapi.AuthInfo{Token: tok.Status.Token}
	cfg.Contexts[operatorName] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: operatorName}
	cfg.CurrentContext = operatorName
	path := filepath.Join(t.TempDir(), "operator.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	m.kubeconfig = path
	// The operator is no administrator: it may not, say, read Secrets.
	if out, err := runClient(ctx, kubectl, "--kubeconfig", path, "auth", "can-i", "list", "secrets", "-n", systemNS); err == nil {
		t.Fatalf("the operator may list secrets: %s", out)
	}
}

// checkResult is one line of `meshctl check -o json`.
type checkResult struct {
	Check, Status, Message string
}

// testCheckBeforeInstall: before the install `meshctl check` fails,
// saying the mesh is not there, and `check --pre-install` passes for the
// administrator who installs it.
func testCheckBeforeInstall(t *testing.T, m *meshctl) {
	out, errOut, code := m.run(t, "check", "-o", "json")
	if code != 1 {
		t.Fatalf("meshctl check before the install: exit %d, want 1\n%s%s", code, out, errOut)
	}
	var results []checkResult
	if err := json.Unmarshal([]byte(out), &results); err != nil {
		t.Fatalf("meshctl check -o json: %v\n%s", err, out)
	}
	failed := map[string]string{}
	for _, r := range results {
		if r.Status == "FAIL" {
			failed[r.Check] = r.Message
		}
	}
	if msg := failed["control plane"]; !strings.Contains(msg, "not installed") {
		t.Errorf("check before the install: control plane %q, want it said not installed; all: %v", msg, failed)
	}
	for _, c := range []string{"kubernetes"} {
		if msg, bad := failed[c]; bad {
			t.Errorf("check %s failed on the test cluster: %s", c, msg)
		}
	}
	out = m.ok(t, "check", "--pre-install")
	for _, want := range []string{"permissions", "PASS", "Gateway API CRDs"} {
		if !strings.Contains(out, want) {
			t.Errorf("check --pre-install: no %q in\n%s", want, out)
		}
	}
	t.Logf("meshctl check --pre-install:\n%s", out)
}

// testMeshctl runs meshctl as a mesh operator against the installed mesh
// and the sample: check, proxy-config, proxy-status, analyze, log-level,
// and its answers to pods that are not proxies.
func testMeshctl(t *testing.T, m *meshctl, frontend corev1.Pod) {
	ctx := context.Background()
	m.asOperator(t)

	t.Run("check passes", func(t *testing.T) {
		out := m.ok(t, "check")
		if strings.Contains(out, "FAIL") || !strings.Contains(out, "node proxy "+systemNS) || !strings.Contains(out, "waypoint shop/waypoint") {
			t.Errorf("meshctl check after the install:\n%s", out)
		}
		t.Logf("meshctl check:\n%s", out)
	})

	t.Run("proxy-config all of a node proxy", func(t *testing.T) {
		np := readyNodeProxyOn(t, frontend.Spec.NodeName)
		reviews, err := client.CoreV1().Services("shop").Get(ctx, "reviews", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var dump struct {
			ByAddr map[string]struct {
				Name      string `json:"name"`
				Namespace string `json:"namespace"`
			} `json:"by_addr"`
			ByVIP map[string]struct {
				Name string `json:"name"`
			} `json:"by_vip"`
			Certificates []struct {
				Identity string `json:"identity"`
				State    string `json:"state"`
			} `json:"certificates"`
		}
		out := m.ok(t, "proxy-config", "all", np.Name, "-n", systemNS, "-o", "json")
		if err := json.Unmarshal([]byte(out), &dump); err != nil {
			t.Fatalf("proxy-config all -o json: %v\n%s", err, out)
		}
		if w := dump.ByAddr[frontend.Status.PodIP]; w.Name != frontend.Name || w.Namespace != "web" {
			t.Errorf("by_addr[%s] = %+v, want web/%s", frontend.Status.PodIP, w, frontend.Name)
		}
		if s := dump.ByVIP[reviews.Spec.ClusterIP]; s.Name != "reviews" {
			t.Errorf("by_vip[%s] = %+v, want reviews", reviews.Spec.ClusterIP, s)
		}
		found := false
		for _, c := range dump.Certificates {
			if c.Identity == "spiffe://cluster.local/ns/web/sa/frontend" {
				found = c.State == "Available"
			}
		}
		if !found {
			t.Errorf("no Available certificate for web/frontend in %+v", dump.Certificates)
		}
		table := m.ok(t, "proxy-config", "all", np.Name, "-n", systemNS)
		for _, want := range []string{"WORKLOADS (by_addr)", frontend.Name, "SERVICES (by_vip)", reviews.Spec.ClusterIP, "CERTIFICATES", "spiffe://cluster.local/ns/web/sa/frontend"} {
			if !strings.Contains(table, want) {
				t.Errorf("proxy-config all: no %q in\n%s", want, table)
			}
		}
		t.Logf("meshctl proxy-config all %s:\n%s", np.Name, table)
		// A waypoint: its policy, through the same admin port.
		wp := readyPods(t, "shop", "gateway.networking.k8s.io/gateway-name=waypoint", 2)[0]
		if out := m.ok(t, "proxy-config", "policy", "shop/"+wp.Name); !strings.Contains(out, "REVISION") {
			t.Errorf("proxy-config policy of waypoint %s:\n%s", wp.Name, out)
		}
	})

	t.Run("proxy-status", func(t *testing.T) {
		nps := readyPods(t, systemNS, "app.kubernetes.io/name="+nodeProxy, len(nodes))
		wps := readyPods(t, "shop", "gateway.networking.k8s.io/gateway-name=waypoint", 2)
		var out string
		eventually(t, 30*time.Second, "every proxy synced", func() error {
			out = m.ok(t, "proxy-status", "-o", "json")
			var st []struct {
				Pod       string `json:"pod"`
				Connected bool   `json:"connected"`
				Types     []struct {
					Type         string `json:"type"`
					Status       string `json:"status"`
					AckedVersion string `json:"acked_version"`
				} `json:"types"`
			}
			if err := json.Unmarshal([]byte(out), &st); err != nil {
				return fmt.Errorf("%v in %s", err, out)
			}
			byPod := map[string]int{}
			for i, s := range st {
				byPod[s.Pod] = i
			}
			for _, p := range append(nps, wps...) {
				i, ok := byPod[p.Namespace+"/"+p.Name]
				if !ok {
					return fmt.Errorf("%s/%s not listed", p.Namespace, p.Name)
				}
				s := st[i]
				if !s.Connected || len(s.Types) == 0 {
					return fmt.Errorf("%s: connected %v, %d types", s.Pod, s.Connected, len(s.Types))
				}
				for _, ty := range s.Types {
					if ty.Status != "SYNCED" && ty.Status != "NOT SENT" || ty.Status == "SYNCED" && ty.AckedVersion == "" {
						return fmt.Errorf("%s %s: %s, acked version %q", s.Pod, ty.Type, ty.Status, ty.AckedVersion)
					}
				}
			}
			return nil
		})
		t.Logf("meshctl proxy-status:\n%s", m.ok(t, "proxy-status"))
	})

	t.Run("analyze names a broken route and why", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "broken.yaml")
		if err := os.WriteFile(file, []byte(brokenRoute), 0o600); err != nil {
			t.Fatal(err)
		}
		kc(t, time.Minute, "apply", "-f", file)
		deleted := false
		defer func() {
			if !deleted {
				kc(t, time.Minute, "delete", "-f", file, "--ignore-not-found")
			}
		}()
		eventually(t, time.Minute, "analyze reports the route", func() error {
			out, errOut, code := m.run(t, "analyze", "-n", "shop", "-o", "json")
			var fs []struct{ Level, Kind, Object, Reason, Message string }
			if err := json.Unmarshal([]byte(out), &fs); err != nil {
				return fmt.Errorf("%v: %s%s", err, out, errOut)
			}
			for _, f := range fs {
				if f.Kind == "HTTPRoute" && f.Object == "shop/e2e-broken" && f.Reason == "BackendNotFound" && strings.Contains(f.Message, "e2e-missing") {
					if code != 1 {
						return fmt.Errorf("exit %d with an error found, want 1", code)
					}
					return nil
				}
			}
			return fmt.Errorf("exit %d, findings %+v", code, fs)
		})
		out, _, _ := m.run(t, "analyze", "-n", "shop")
		t.Logf("meshctl analyze -n shop:\n%s", out)
		// Without it the sample has nothing that will not work.
		kc(t, time.Minute, "delete", "-f", file, "--wait=true")
		deleted = true
		eventually(t, time.Minute, "analyze finds nothing in the sample", func() error {
			out, errOut, code := m.run(t, "analyze", "-A")
			if code != 0 || strings.Contains(out, "Error") {
				return fmt.Errorf("exit %d:\n%s%s", code, out, errOut)
			}
			return nil
		})
	})

	t.Run("log-level", func(t *testing.T) {
		np := readyNodeProxyOn(t, frontend.Spec.NodeName)
		if out := m.ok(t, "log-level", np.Name, "-n", systemNS); !strings.Contains(out, "info") {
			t.Fatalf("log-level of %s:\n%s", np.Name, out)
		}
		if out := m.ok(t, "log-level", np.Name, "error", "-n", systemNS); !strings.Contains(out, "error") {
			t.Errorf("log-level %s error:\n%s", np.Name, out)
		}
		if out := m.ok(t, "log-level", np.Name, "info", "-n", systemNS); !strings.Contains(out, "info") {
			t.Errorf("log-level %s info:\n%s", np.Name, out)
		}
		out := m.ok(t, "log-level", "-o", "json")
		for _, want := range []string{"control plane", "node proxy", "waypoint"} {
			if !strings.Contains(out, want) {
				t.Errorf("log-level of every pod: no %s in\n%s", want, out)
			}
		}
	})

	t.Run("bad input", func(t *testing.T) {
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"proxy-config", "all", frontend.Name, "-n", "web"}, "is not a Causeway proxy"},
			{[]string{"proxy-config", "all", "no-such-pod", "-n", "web"}, "pod web/no-such-pod not found"},
			{[]string{"proxy-config", "all", "x", "-n", "no-such-namespace"}, `namespace "no-such-namespace" not found`},
			{[]string{"proxy-config", "routes-and-more", frontend.Name, "-n", "web"}, `unknown view "routes-and-more"`},
			{[]string{"log-level", frontend.Name, "-n", "web"}, "is not a Causeway proxy"},
			{[]string{"no-such-command"}, `unknown command "no-such-command"`},
		} {
			out, errOut, code := m.run(t, c.args...)
			if code == 0 || !strings.Contains(errOut, c.want) {
				t.Errorf("meshctl %s: exit %d, stderr %q, want an error saying %q (stdout %q)", strings.Join(c.args, " "), code, errOut, c.want, out)
			}
		}
	})
}

// brokenRoute is an HTTPRoute on a Service of the shop (bound to its
// waypoint) whose backend does not exist.
const brokenRoute = `apiVersion: v1
kind: Service
metadata: {name: e2e-broken, namespace: shop}
spec:
  selector: {app: ratings}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: e2e-broken, namespace: shop}
spec:
  parentRefs: [{group: "", kind: Service, name: e2e-broken, port: 80}]
  rules:
  - backendRefs: [{name: e2e-missing, port: 80}]
`

// readyNodeProxyOn is the ready node proxy pod of node.
func readyNodeProxyOn(t *testing.T, node string) corev1.Pod {
	t.Helper()
	p, err := nodeProxyOn(readyPods(t, systemNS, "app.kubernetes.io/name="+nodeProxy, len(nodes)), node)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
