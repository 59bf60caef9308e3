package e2ek8s

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/causeway-mesh/causeway/pkg/deployer"
)

// Traces as a real receiver sees them: Jaeger (hack/tracing/jaeger.sh,
// CAUSEWAY_E2E_JAEGER) runs on this machine, its OTLP gRPC receiver on the
// first node's address, which every node's pods reach over the node
// bridge, and its query API on loopback. The shop's waypoint is given
// Jaeger by its Gateway's annotations, sampling 0 so that only a caller's
// sampled trace context starts a trace; the frontend calls reviews with
// one, and Jaeger must hold one trace: the waypoint's server span under
// the caller's span, its client span under that, the reviews pod told the
// client span's context, attributes naming the authenticated caller and
// the upstream, resource attributes naming the waypoint's pod and node.

// jaeger is a running Jaeger: where pods send OTLP, where its API answers.
type jaeger struct {
	otlp  string // host:port, OTLP over gRPC
	query string // http://127.0.0.1:port
}

// jaegerConfig is an all-in-one Jaeger v2 (OpenTelemetry Collector based)
// with memory storage: the OTLP receiver (gRPC), the query API, nothing
// else listening.
const jaegerConfig = `service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
extensions:
  jaeger_storage:
    backends:
      memory:
        memory:
          max_traces: 10000
  jaeger_query:
    storage:
      traces: memory
    enable_tracing: false
    http:
      endpoint: %q
    grpc:
      endpoint: %q
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: %q
exporters:
  jaeger_storage_exporter:
    trace_storage: memory
`

// startJaeger runs Jaeger until the test ends.
func startJaeger(t *testing.T) *jaeger {
	t.Helper()
	bin := os.Getenv("CAUSEWAY_E2E_JAEGER")
	if bin == "" {
		t.Fatal("CAUSEWAY_E2E_JAEGER (the Jaeger binary) is not set: make e2e-k8s sets it (hack/tracing/jaeger.sh)")
	}
	host, err := client.CoreV1().Nodes().Get(context.Background(), nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var hostIP string
	for _, a := range host.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			hostIP = a.Address
		}
	}
	if hostIP == "" {
		t.Fatalf("node %s has no internal IP", nodeName)
	}
	j := &jaeger{otlp: freePort(t, hostIP)}
	queryAddr := freePort(t, "127.0.0.1")
	j.query = "http://" + queryAddr
	dir := t.TempDir()
	cfg := filepath.Join(dir, "jaeger.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, jaegerConfig, queryAddr, freePort(t, "127.0.0.1"), j.otlp), 0o644); err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(dir, "jaeger.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config", cfg)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		logFile.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logFile.Name()); err == nil {
				t.Logf("jaeger's log:\n%s", b)
			}
		}
	})
	eventually(t, time.Minute, "Jaeger's query API", func() error {
		select {
		case <-exited:
			t.Fatalf("jaeger exited: %v", cmd.ProcessState)
		default:
		}
		var services struct{ Data []string }
		return j.get("/api/services", &services)
	})
	return j
}

// w3cID is a random trace (16 bytes) or span (8 bytes) ID in hex.
func w3cID(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// freePort is a port on ip that nothing listens on now.
func freePort(t *testing.T, ip string) string {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// get reads a query API answer into v.
func (j *jaeger) get(path string, v any) error {
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(j.query + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", path, resp.Status, body)
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.UseNumber()
	return dec.Decode(v)
}

// jaegerTrace is a trace as the query API gives it (/api/traces/{id}).
type jaegerTrace struct {
	Spans []struct {
		SpanID        string `json:"spanID"`
		OperationName string `json:"operationName"`
		References    []struct {
			RefType string `json:"refType"`
			TraceID string `json:"traceID"`
			SpanID  string `json:"spanID"`
		} `json:"references"`
		Tags      []jaegerTag `json:"tags"`
		ProcessID string      `json:"processID"`
	} `json:"spans"`
	Processes map[string]struct {
		ServiceName string      `json:"serviceName"`
		Tags        []jaegerTag `json:"tags"`
	} `json:"processes"`
}

type jaegerTag struct {
	Key   string `json:"key"`
	Value any    `json:"value"`
}

func tagMap(tags []jaegerTag) map[string]string {
	m := make(map[string]string, len(tags))
	for _, tg := range tags {
		m[tg.Key] = fmt.Sprint(tg.Value)
	}
	return m
}

// jaegerSpan is a span of a trace with its tags and its process's.
type jaegerSpan struct {
	id, name, parent, service string
	tags, process             map[string]string
}

// spansOf flattens a trace; parent is the CHILD_OF reference's span.
func spansOf(tr jaegerTrace) []jaegerSpan {
	var out []jaegerSpan
	for _, s := range tr.Spans {
		js := jaegerSpan{id: s.SpanID, name: s.OperationName, tags: tagMap(s.Tags)}
		for _, r := range s.References {
			if r.RefType == "CHILD_OF" {
				js.parent = r.SpanID
			}
		}
		p := tr.Processes[s.ProcessID]
		js.service, js.process = p.ServiceName, tagMap(p.Tags)
		out = append(out, js)
	}
	return out
}

// setWaypointTracing sets (or, with no values, removes) the shop
// waypoint's tracing annotations.
func setWaypointTracing(t *testing.T, endpoint, protocol, sampling string) {
	t.Helper()
	args := []string{"-n", "shop", "annotate", "gateway/waypoint", "--overwrite"}
	if endpoint == "" {
		args = append(args, deployer.AnnotationTracingEndpoint+"-", deployer.AnnotationTracingProtocol+"-", deployer.AnnotationTracingSampling+"-")
	} else {
		args = append(args, deployer.AnnotationTracingEndpoint+"="+endpoint, deployer.AnnotationTracingProtocol+"="+protocol,
			deployer.AnnotationTracingSampling+"="+sampling)
	}
	kc(t, time.Minute, args...)
}

// waypointRolledTo waits until the shop waypoint's Deployment asks for
// the tracing flag want ("" for none) and its two pods run it.
func waypointRolledTo(t *testing.T, want string) []corev1.Pod {
	t.Helper()
	has := func(args []string) bool {
		i := slices.IndexFunc(args, func(a string) bool { return strings.HasPrefix(a, "--tracing-endpoint=") })
		return (want == "" && i < 0) || (i >= 0 && args[i] == want)
	}
	eventually(t, time.Minute, "the deployer's rendering of the annotations", func() error {
		d, err := client.AppsV1().Deployments("shop").Get(context.Background(), "waypoint", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if args := d.Spec.Template.Spec.Containers[0].Args; !has(args) {
			return fmt.Errorf("waypoint args %q, want tracing flag %q", args, want)
		}
		return nil
	})
	kc(t, 3*time.Minute, "-n", "shop", "rollout", "status", "deployment/waypoint", "--timeout=180s")
	pods := readyPods(t, "shop", "gateway.networking.k8s.io/gateway-name=waypoint", 2)
	for _, p := range pods {
		if !has(p.Spec.Containers[0].Args) {
			t.Fatalf("waypoint pod %s runs %q, want tracing flag %q", p.Name, p.Spec.Containers[0].Args, want)
		}
	}
	return pods
}

func testTraces(t *testing.T, frontend corev1.Pod) {
	j := startJaeger(t)
	ctx := context.Background()
	// Removed before Jaeger stops (cleanups run last first), so that no
	// waypoint is left exporting to nothing.
	t.Cleanup(func() {
		setWaypointTracing(t, "", "", "")
		waypointRolledTo(t, "")
	})
	setWaypointTracing(t, j.otlp, "grpc", "0")
	waypoints := waypointRolledTo(t, "--tracing-endpoint="+j.otlp)
	onNode := map[string]string{}
	for _, p := range waypoints {
		onNode[p.Name] = p.Spec.NodeName
	}

	// One call, right after the rollout: a waypoint's rollout loses no
	// request (testWaypointRollout), so none is retried here.
	traceID, callerSpan := w3cID(16), w3cID(8)
	out, err := kubectlExec("web", frontend.Name, "echo", "/usr/local/bin/echo", "fetch", "-timeout", "3s",
		"-H", "Traceparent: 00-"+traceID+"-"+callerSpan+"-01", "http://reviews.shop/e2e-"+randomHex())
	if err != nil {
		t.Fatalf("frontend -> reviews right after the waypoint's rollout: %v", err)
	}
	var answer echoAnswer
	if err := json.Unmarshal([]byte(out), &answer); err != nil {
		t.Fatalf("answer %q: %v", out, err)
	}
	answerPod, err := client.CoreV1().Pods("shop").Get(ctx, answer.Pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	var server, clientSpan jaegerSpan
	eventually(t, time.Minute, "the trace in Jaeger", func() error {
		var got struct{ Data []jaegerTrace }
		if err := j.get("/api/traces/"+traceID, &got); err != nil {
			return err
		}
		if len(got.Data) != 1 {
			return fmt.Errorf("%d traces with ID %s", len(got.Data), traceID)
		}
		var servers, clients []jaegerSpan
		for _, s := range spansOf(got.Data[0]) {
			switch s.tags["span.kind"] {
			case "server":
				servers = append(servers, s)
			case "client":
				clients = append(clients, s)
			}
		}
		if len(servers) != 1 || len(clients) != 1 {
			return fmt.Errorf("trace %s: %d server and %d client spans, want one of each", traceID, len(servers), len(clients))
		}
		server, clientSpan = servers[0], clients[0]
		return nil
	})
	if server.parent != callerSpan || clientSpan.parent != server.id {
		t.Errorf("server span %s under %q (want the caller's %s), client span under %q (want the server span)", server.id, server.parent, callerSpan, clientSpan.parent)
	}
	if got, want := answer.Headers["Traceparent"], "00-"+traceID+"-"+clientSpan.id+"-01"; len(got) != 1 || got[0] != want {
		t.Errorf("reviews was sent traceparent %q, want the client span's %q", got, want)
	}
	// The route splits reviews between the Services reviews-v1 and
	// reviews-v2 (examples/kubernetes/shop/mesh.yaml): the upstream
	// cluster is the backend Service of the pod that answered.
	const host = "reviews.shop.svc."
	domain, ok := strings.CutPrefix(strings.TrimSuffix(server.name, ":80/*"), host)
	if !ok || !strings.HasSuffix(server.name, ":80/*") {
		t.Errorf("server span %q, want %s...:80/*", server.name, host)
	}
	version := answerPod.Labels["version"]
	cluster := "outbound|80||reviews-" + version + ".shop.svc." + domain
	if want := "router " + cluster + " egress"; clientSpan.name != want {
		t.Errorf("client span %q, want %q", clientSpan.name, want)
	}
	for _, c := range []struct {
		span jaegerSpan
		want map[string]string
	}{
		{server, map[string]string{"http.method": "GET", "http.status_code": "200", "upstream_cluster": cluster,
			"source.principal": "spiffe://cluster.local/ns/web/sa/frontend"}},
		{clientSpan, map[string]string{"http.method": "GET", "http.status_code": "200", "upstream_cluster": cluster,
			"peer.address": net.JoinHostPort(answerPod.Status.PodIP, "8080"), "destination.principal": "spiffe://cluster.local/ns/shop/sa/reviews"}},
	} {
		for k, want := range c.want {
			if got := c.span.tags[k]; got != want {
				t.Errorf("span %s: %s = %q, want %q", c.span.name, k, c.span.tags[k], want)
			}
		}
		pod := c.span.process["k8s.pod.name"]
		if c.span.service != "waypoint.shop" || c.span.process["k8s.namespace.name"] != "shop" || onNode[pod] == "" || c.span.process["k8s.node.name"] != onNode[pod] {
			t.Errorf("span %s from %s %v, want service waypoint.shop, one of the waypoint pods %v and its node", c.span.name, c.span.service, c.span.process, onNode)
		}
	}

	// The tunnel's peer: the caller's node proxy, from the caller's
	// address in its pod.
	if _, err := netip.ParseAddrPort(server.tags["peer.address"]); err != nil {
		t.Errorf("server span peer.address %q: %v", server.tags["peer.address"], err)
	}
	t.Logf("trace %s: server span %s %v; client span %s %v", traceID, server.name, server.tags, clientSpan.name, clientSpan.tags)

	// A bad annotation is refused where the operator looks: an event on
	// the Gateway; the waypoint keeps what it runs.
	setWaypointTracing(t, j.otlp, "grpc", "often")
	eventually(t, time.Minute, "the InvalidWaypoint event", func() error {
		evs, err := client.CoreV1().Events("shop").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Gateway,involvedObject.name=waypoint,reason=InvalidWaypoint"})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if strings.Contains(e.Message, `tracing sampling "often"`) {
				return nil
			}
		}
		return fmt.Errorf("%d InvalidWaypoint events, none about the sampling", len(evs.Items))
	})
	waypointRolledTo(t, "--tracing-endpoint="+j.otlp)
}
