package e2ek8s

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
)

// Istio's standard metrics as the tools read them: a real Prometheus
// (hack/prometheus/prometheus.sh, CAUSEWAY_E2E_PROMETHEUS) on the host
// discovers the cluster's pods with a ServiceAccount of its own, scrapes
// those annotated prometheus.io/scrape (the node proxies and the
// waypoints), and answers the PromQL of Kiali's graph and of Istio's
// Grafana dashboards, each test named after the panel its query comes
// from; then every panel of the repository's dashboard
// (docs/dashboards/causeway-mesh.json) gets data.

// promServer is a running Prometheus's HTTP API.
type promServer struct{ url string }

// promSample is one series of an instant vector.
type promSample struct {
	Metric map[string]string
	Value  float64
}

// promScrapeConfig discovers pods through the API server as the
// ServiceAccount whose token is in tokenFile, and scrapes those that ask
// for it by annotation, the usual way (prometheus.io/scrape, port, path).
const promScrapeConfig = `global:
  scrape_interval: 2s
  evaluation_interval: 2s
scrape_configs:
- job_name: kubernetes-pods
  kubernetes_sd_configs:
  - role: pod
    api_server: %q
    tls_config: {ca_file: %q}
    authorization: {credentials_file: %q}
  relabel_configs:
  - source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_scrape]
    action: keep
    regex: "true"
  - source_labels: [__meta_kubernetes_pod_phase]
    action: keep
    regex: Running
  - source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_path]
    target_label: __metrics_path__
    regex: (.+)
  - source_labels: [__meta_kubernetes_pod_ip, __meta_kubernetes_pod_annotation_prometheus_io_port]
    target_label: __address__
    regex: (.+);(\d+)
    replacement: $1:$2
  - source_labels: [__meta_kubernetes_namespace]
    target_label: namespace
  - source_labels: [__meta_kubernetes_pod_name]
    target_label: pod
`

// startPrometheus runs Prometheus on the host until the test ends, with
// RBAC of its own that lets it only read pods.
func startPrometheus(t *testing.T) *promServer {
	t.Helper()
	bin := os.Getenv("CAUSEWAY_E2E_PROMETHEUS")
	if bin == "" {
		t.Fatal("CAUSEWAY_E2E_PROMETHEUS (the Prometheus binary) is not set: make e2e-k8s sets it (hack/prometheus/prometheus.sh)")
	}
	ctx := context.Background()
	// What it scrapes is on the cluster's bridges, never elsewhere.
	for _, sel := range []struct{ ns, label string }{{systemNS, "app.kubernetes.io/name=" + nodeProxy}, {"shop", "gateway.networking.k8s.io/gateway-name=waypoint"}} {
		ps, err := client.CoreV1().Pods(sel.ns).List(ctx, metav1.ListOptions{LabelSelector: sel.label})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps.Items {
			if err := onClusterBridge(p.Status.PodIP); err != nil {
				t.Fatalf("pod %s/%s: %v", p.Namespace, p.Name, err)
			}
		}
	}

	ns := newNamespace(t, "e2e-prometheus")
	role := ns + "-pod-reader"
	if _, err := client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "prometheus"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: role},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.RbacV1().ClusterRoles().Delete(context.Background(), role, metav1.DeleteOptions{}) })
	if _, err := client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: "prometheus"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.RbacV1().ClusterRoleBindings().Delete(context.Background(), role, metav1.DeleteOptions{})
	})
	tok, err := client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "prometheus", &authv1.TokenRequest{
		Spec: authv1.TokenRequestSpec{ExpirationSeconds: new(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kcfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	caFile := kcfg.TLSClientConfig.CAFile
	if len(kcfg.TLSClientConfig.CAData) > 0 {
		caFile = filepath.Join(dir, "ca.crt")
		writeFile(t, caFile, kcfg.TLSClientConfig.CAData)
	}
	tokenFile, configFile := filepath.Join(dir, "token"), filepath.Join(dir, "prometheus.yml")
	writeFile(t, tokenFile, []byte(tok.Status.Token))
	writeFile(t, configFile, fmt.Appendf(nil, promScrapeConfig, kcfg.Host, caFile, tokenFile))

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var out lockedBuffer
	cmd := exec.Command(bin, "--config.file="+configFile, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("prometheus logged:\n%s", out.String())
		}
	})
	p := &promServer{url: "http://" + addr}
	eventually(t, 30*time.Second, "prometheus ready", func() error {
		select {
		case <-done:
			t.Fatalf("prometheus exited: %s", out.String())
		default:
		}
		resp, err := promClient.Get(p.url + "/-/ready")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %s", resp.Status)
		}
		return nil
	})
	return p
}

func writeFile(t *testing.T, name string, data []byte) {
	t.Helper()
	if err := os.WriteFile(name, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

var promClient = &http.Client{Timeout: 30 * time.Second}

// query runs an instant query; an expression that does not parse or
// evaluate is an error (Prometheus answers 400 or 422).
func (p *promServer) query(expr string) ([]promSample, error) {
	resp, err := promClient.PostForm(p.url+"/api/v1/query", url.Values{"query": {expr}})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return nil, err
	}
	var r struct {
		Status, Error string
		Data          struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Metric map[string]string
				Value  [2]any
			}
		}
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("%s: %v in %q", resp.Status, err, body)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("query %s: %s: %s", expr, resp.Status, r.Error)
	}
	if r.Data.ResultType != "vector" {
		return nil, fmt.Errorf("query %s: a %s, want a vector", expr, r.Data.ResultType)
	}
	out := make([]promSample, 0, len(r.Data.Result))
	for _, s := range r.Data.Result {
		v, _ := s.Value[1].(string)
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return nil, fmt.Errorf("query %s: value %v: %v", expr, s.Value, err)
		}
		out = append(out, promSample{s.Metric, f})
	}
	return out, nil
}

// edge is a series a panel must show: labels it must have (a value
// starting with "~" is a regular expression the value must match in full)
// and a value above zero.
type edge map[string]string

func (e edge) matches(s promSample) bool {
	for k, want := range e {
		got := s.Metric[k]
		if re, ok := strings.CutPrefix(want, "~"); ok {
			if m, _ := regexp.MatchString("^(?:"+re+")$", got); !m {
				return false
			}
		} else if got != want {
			return false
		}
	}
	return s.Value > 0
}

// expectEdges waits until expr shows every one of edges.
func (p *promServer) expectEdges(t *testing.T, expr string, edges ...edge) {
	t.Helper()
	eventually(t, 90*time.Second, expr, func() error {
		samples, err := p.query(expr)
		if err != nil {
			return err
		}
		var found []promSample
		for _, e := range edges {
			i := slices.IndexFunc(samples, e.matches)
			if i < 0 {
				return fmt.Errorf("no series %v above zero among %v", e, samples)
			}
			found = append(found, samples[i])
		}
		for _, s := range found {
			t.Logf("%v %.3g", s.Metric, s.Value)
		}
		return nil
	})
}

const frontendPrincipal = "spiffe://cluster.local/ns/web/sa/frontend"

// testStandardMetrics runs steady sample traffic (the frontend to
// reviews through the waypoint and to admin directly, the outsider to
// reviews hairpinned) and reads it back through Prometheus.
func testStandardMetrics(t *testing.T, pods map[string]corev1.Pod) {
	prom := startPrometheus(t)
	eventually(t, 2*time.Minute, "every node proxy and waypoint pod scraped", func() error {
		up, err := prom.query(`sum(up{job="kubernetes-pods"}) by (namespace)`)
		if err != nil {
			return err
		}
		got := map[string]float64{}
		for _, s := range up {
			got[s.Metric["namespace"]] = s.Value
		}
		if got[systemNS] != float64(len(nodes)) || got["shop"] != 2 {
			return fmt.Errorf("targets up by namespace %v, want %d in %s and 2 in shop", got, len(nodes), systemNS)
		}
		return nil
	})
	load := []string{"-c", "2", "-interval", "200ms", "-timeout", "5s"}
	startLoad(t, pods["frontend"], "http://reviews.shop/e2e-metrics", load...).answered(t)
	startLoad(t, pods["frontend"], "http://"+net.JoinHostPort(pods["admin"].Status.PodIP, "8080")+"/e2e-metrics", load...).answered(t)
	startLoad(t, pods["outsider"], "http://reviews.shop/public/e2e-metrics", load...).answered(t)

	// The frontend is of another namespace than the waypoint, which may
	// not read its workload: it is named by its node proxy's CONNECT
	// baggage (the Deployment frontend, label app=frontend, no version).
	frontendToReviews := edge{"source_workload_namespace": "web", "source_principal": frontendPrincipal,
		"source_workload": "frontend", "source_canonical_service": "frontend", "source_canonical_revision": "latest", "source_cluster": "Kubernetes",
		"destination_service_namespace": "shop", "destination_service_name": "reviews",
		"destination_workload_namespace": "shop", "destination_workload": "~reviews-v[12]",
		"request_protocol": "http", "response_code": "200", "connection_security_policy": "mutual_tls"}
	// Hairpinned: a TLS-only tunnel names nobody, whatever it claims.
	outsiderToReviews := edge{"source_workload": "unknown", "source_workload_namespace": "unknown", "source_principal": "unknown",
		"destination_workload_namespace": "shop", "destination_workload": "~reviews-v[12]",
		"response_code": "200", "connection_security_policy": "none"}

	t.Run("Kiali graph: requests reported by waypoints", func(t *testing.T) {
		prom.expectEdges(t, `sum(rate(istio_requests_total{reporter="waypoint"}[1m])) by (source_cluster,source_workload_namespace,source_workload,source_canonical_service,source_canonical_revision,source_principal,destination_cluster,destination_service_namespace,destination_service,destination_service_name,destination_workload_namespace,destination_workload,destination_canonical_service,destination_canonical_revision,request_protocol,response_code,grpc_response_status,response_flags,connection_security_policy) > 0`,
			frontendToReviews, outsiderToReviews)
	})
	t.Run("a caller of another namespace named at the waypoint", func(t *testing.T) {
		prom.expectEdges(t, `sum(rate(istio_requests_total{reporter="waypoint", source_workload_namespace="web"}[1m])) by (source_workload, source_app, source_version, source_canonical_service, source_canonical_revision, source_cluster, source_principal) > 0`,
			edge{"source_workload": "frontend", "source_app": "frontend", "source_version": "latest", "source_canonical_service": "frontend",
				"source_canonical_revision": "latest", "source_cluster": "Kubernetes", "source_principal": frontendPrincipal})
		// None of the frontend's requests is of an unknown workload.
		expr := `sum(increase(istio_requests_total{reporter="waypoint", source_principal="` + frontendPrincipal + `", source_workload="unknown"}[10m])) > 0`
		if s, err := prom.query(expr); err != nil || len(s) > 0 {
			t.Errorf("%s: %v %v, want no series", expr, s, err)
		}
	})
	t.Run("Kiali graph: TCP reported by node proxies", func(t *testing.T) {
		prom.expectEdges(t, `sum(rate(istio_tcp_sent_bytes_total{reporter="source"}[1m])) by (source_cluster,source_workload_namespace,source_workload,source_canonical_service,source_canonical_revision,source_principal,destination_cluster,destination_service_namespace,destination_service,destination_service_name,destination_workload_namespace,destination_workload,destination_canonical_service,destination_canonical_revision,destination_principal,response_flags,connection_security_policy) > 0`,
			edge{"source_workload_namespace": "web", "source_workload": "frontend", "source_canonical_service": "frontend", "source_principal": frontendPrincipal,
				"destination_service_namespace": "shop", "destination_service_name": "reviews", "connection_security_policy": "mutual_tls"},
			edge{"source_workload": "frontend", "destination_workload_namespace": "web", "destination_workload": "admin",
				"destination_principal": "spiffe://cluster.local/ns/web/sa/admin", "connection_security_policy": "mutual_tls"})
	})
	t.Run("Istio Mesh Dashboard: Global Request Volume", func(t *testing.T) {
		prom.expectEdges(t, `round(sum(irate(istio_requests_total{reporter=~"source|waypoint"}[1m])), 0.001)`, edge{})
	})
	t.Run("Istio Mesh Dashboard: Global Success Rate (non-5xx responses)", func(t *testing.T) {
		expr := `sum(rate(istio_requests_total{reporter=~"source|waypoint", response_code!~"5.*"}[1m])) / sum(rate(istio_requests_total{reporter=~"source|waypoint"}[1m]))`
		// Two minutes: answers of earlier steps (5xx among them) leave the
		// 1m window.
		eventually(t, 2*time.Minute, expr, func() error {
			s, err := prom.query(expr)
			if err != nil {
				return err
			}
			if len(s) != 1 || s[0].Value != 1 {
				return fmt.Errorf("%v, want 1: no request failed", s)
			}
			return nil
		})
	})
	// Istio's workload dashboard, inbound, for the reviews workloads
	// ($namespace shop, $workload reviews-v.*, $qrep waypoint, $srcns and
	// $srcwl all): mTLS and not, each a query of the panel.
	t.Run("Istio Workload Dashboard: Incoming Requests By Source And Response Code", func(t *testing.T) {
		for _, security := range []struct {
			matcher string
			want    edge
		}{
			{`connection_security_policy="mutual_tls"`, edge{"source_workload": "frontend", "source_workload_namespace": "web", "response_code": "200"}},
			{`connection_security_policy!="mutual_tls"`, edge{"source_workload": "unknown", "source_workload_namespace": "unknown", "response_code": "200"}},
		} {
			prom.expectEdges(t, `round(sum(irate(istio_requests_total{reporter=~"waypoint", `+security.matcher+`, destination_workload_namespace=~"shop", destination_workload=~"reviews-v.*", source_workload=~".*", source_workload_namespace=~".*"}[1m])) by (source_workload, source_workload_namespace, response_code), 0.001)`,
				security.want)
		}
	})
	// Istio's workload dashboard, inbound TCP, reported by the
	// destination's node proxy: admin from the frontend (mTLS), reviews
	// from the hairpin (not).
	for _, panel := range []struct{ name, metric string }{
		{"Bytes Received from Incoming TCP Connection", "istio_tcp_received_bytes_total"},
		{"Bytes Sent to Incoming TCP Connection", "istio_tcp_sent_bytes_total"},
	} {
		t.Run("Istio Workload Dashboard: "+panel.name, func(t *testing.T) {
			q := func(security, ns, workload string) string {
				return `round(sum(irate(` + panel.metric + `{reporter=~"destination", ` + security + `, destination_workload_namespace=~"` + ns + `", destination_workload=~"` + workload + `", source_workload=~".*", source_workload_namespace=~".*"}[1m])) by (source_workload, source_workload_namespace), 0.001)`
			}
			prom.expectEdges(t, q(`connection_security_policy="mutual_tls"`, "web", "admin"),
				edge{"source_workload": "frontend", "source_workload_namespace": "web"})
			prom.expectEdges(t, q(`connection_security_policy!="mutual_tls"`, "shop", "reviews-v.*"),
				edge{"source_workload": "unknown", "source_workload_namespace": "unknown"})
		})
	}
	t.Run("Grafana dashboard: every panel has data", func(t *testing.T) { testDashboard(t, prom) })
}

// dashboardFile is the repository's Grafana dashboard (docs/observability.md).
var dashboardFile = filepath.Join(repoRoot, "docs", "dashboards", "causeway-mesh.json")

// grafanaPanel is what the test reads of a dashboard's panel.
type grafanaPanel struct {
	Title   string
	Type    string
	Targets []struct {
		Expr  string
		RefID string `json:"refId"`
	}
	Panels []grafanaPanel // a row's
}

// testDashboard runs every panel's queries, the dashboard's variables set
// to "All" and Grafana's rate interval to 1m, and expects each to parse
// and to have data on the sample's traffic.
func testDashboard(t *testing.T, prom *promServer) {
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels     []grafanaPanel
		Templating struct {
			List []struct {
				Name       string
				IncludeAll bool   `json:"includeAll"`
				AllValue   string `json:"allValue"`
			}
		}
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	vars := map[string]string{"__rate_interval": "1m", "__interval": "2s"}
	for _, v := range d.Templating.List {
		if v.IncludeAll {
			vars[v.Name] = v.AllValue
		}
	}
	variable := regexp.MustCompile(`\$\{(\w+)\}|\$(\w+)|\[\[(\w+)\]\]`)
	var queries int
	var walk func(ps []grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			walk(p.Panels)
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, target := range p.Targets {
				var unknown []string
				expr := variable.ReplaceAllStringFunc(target.Expr, func(m string) string {
					sub := variable.FindStringSubmatch(m)
					name := sub[1] + sub[2] + sub[3]
					v, ok := vars[name]
					if !ok {
						unknown = append(unknown, m)
					}
					return v
				})
				if len(unknown) > 0 {
					t.Errorf("panel %q query %s: variables %v the dashboard does not define", p.Title, target.RefID, unknown)
					continue
				}
				queries++
				t.Run(p.Title+" "+target.RefID, func(t *testing.T) {
					eventually(t, 90*time.Second, expr, func() error {
						s, err := prom.query(expr)
						if err == nil && len(s) == 0 {
							err = fmt.Errorf("no data")
						}
						return err
					})
				})
			}
		}
	}
	walk(d.Panels)
	if queries == 0 {
		t.Fatalf("%s: no panel queries", dashboardFile)
	}
}
