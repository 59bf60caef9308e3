package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	streamhttp "k8s.io/streaming/pkg/httpstream"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/causeway-mesh/causeway/pkg/clustercheck"
	"github.com/causeway-mesh/causeway/pkg/readlimit"
	"github.com/causeway-mesh/causeway/pkg/trust"
)

// The mesh's components as meshctl finds them in a cluster (the chart's
// and the waypoint template's labels, docs/design.md §10).
const (
	systemNamespace      = trust.SystemNamespace
	nodeProxyLabel       = "app.kubernetes.io/name" // the chart's components' name label
	nodeProxyLabelValue  = clustercheck.NodeProxyName
	controlPlaneValue    = clustercheck.ControlPlaneName
	controlPlaneSelector = nodeProxyLabel + "=" + controlPlaneValue
	nodeProxySelector    = nodeProxyLabel + "=" + nodeProxyLabelValue
	waypointLabel        = "gateway.networking.k8s.io/gateway-name"
	// adminPort is where every component serves its admin endpoints, on
	// localhost in its pod (docs/design.md §2): reached only by
	// port-forward through the API server.
	adminPort = 15000
	// maxAdminBody bounds what is read from an admin endpoint.
	maxAdminBody = 64 << 20
	// kubeTimeout bounds each API request and each admin request.
	kubeTimeout = 30 * time.Second
)

// kubeFlags are the flags of the commands that talk to a cluster, as
// kubectl names them.
type kubeFlags struct {
	kubeconfig string
	context    string
	namespace  string
	output     string
}

func addKubeFlags(fs *flag.FlagSet, withNamespace bool) *kubeFlags {
	k := &kubeFlags{}
	fs.StringVar(&k.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then the in-cluster configuration)")
	fs.StringVar(&k.context, "context", "", "kubeconfig context (default: the current one)")
	if withNamespace {
		fs.StringVar(&k.namespace, "n", "", "namespace of the pod (default: the context's, else default)")
		fs.StringVar(&k.namespace, "namespace", "", "same as -n")
	}
	fs.StringVar(&k.output, "o", "table", "output format: table, json or yaml")
	fs.StringVar(&k.output, "output", "table", "same as -o")
	return k
}

// parseInterspersed parses fs's flags wherever they stand among the
// positional arguments (kubectl's habit: `proxy-config all POD -n NS`),
// and returns the positional ones.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, nil
		}
		if len(rest) < len(args) && args[len(args)-len(rest)-1] == "--" {
			return append(positional, rest...), nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// parseArgs parses a cluster command's flags, fs's own and those
// addKubeFlags adds, and returns the positional arguments, at most max.
func parseArgs(fs *flag.FlagSet, args []string, withNamespace bool, max int, usage string) (*kubeFlags, []string, error) {
	kf := addKubeFlags(fs, withNamespace)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return nil, nil, err
	}
	if len(pos) > max {
		return nil, nil, fmt.Errorf("usage: %s (unexpected %q)", usage, strings.Join(pos[max:], " "))
	}
	return kf, pos, nil
}

// cluster is a connection to the API server.
type cluster struct {
	cfg       *rest.Config
	client    kubernetes.Interface
	gateway   gwclient.Interface
	namespace string // from the flags or the kubeconfig context
}

// connect builds a client from the flags, as kubectl does
// (clientcmd's loading rules: --kubeconfig, $KUBECONFIG, ~/.kube/config,
// in-cluster).
func (k *kubeFlags) connect() (*cluster, error) {
	if err := checkFormat(k.output); err != nil {
		return nil, err
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = k.kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: k.context}
	if k.namespace != "" {
		overrides.Context.Namespace = k.namespace
	}
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides)
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	ns, _, err := cc.Namespace()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.Timeout = kubeTimeout
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	gw, err := gwclient.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return &cluster{cfg: cfg, client: cs, gateway: gw, namespace: ns}, nil
}

// proxyKind says which mesh component a pod is: "node proxy",
// "waypoint", "control plane", or "" for any other pod.
func proxyKind(p *corev1.Pod) string {
	switch {
	case p.Namespace == systemNamespace && p.Labels[nodeProxyLabel] == nodeProxyLabelValue:
		return "node proxy"
	case p.Namespace == systemNamespace && p.Labels[nodeProxyLabel] == controlPlaneValue:
		return "control plane"
	case p.Labels[waypointLabel] != "" && hasContainer(p, "waypoint"):
		return "waypoint"
	}
	return ""
}

func hasContainer(p *corev1.Pod, name string) bool {
	for _, c := range p.Spec.Containers {
		if c.Name == name {
			return true
		}
	}
	return false
}

// proxyPod reads the named pod and checks it is a node proxy or a
// waypoint (control plane too when allowControlPlane).
func (c *cluster) proxyPod(ctx context.Context, name string, allowControlPlane bool) (*corev1.Pod, string, error) {
	if ns, n, ok := strings.Cut(name, "/"); ok { // also NAMESPACE/POD
		c = &cluster{cfg: c.cfg, client: c.client, gateway: c.gateway, namespace: ns}
		name = n
	}
	if name == "" {
		return nil, "", errors.New("no pod named")
	}
	p, err := c.client.CoreV1().Pods(c.namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		if _, nsErr := c.client.CoreV1().Namespaces().Get(ctx, c.namespace, metav1.GetOptions{}); apierrors.IsNotFound(nsErr) {
			return nil, "", fmt.Errorf("namespace %q not found", c.namespace)
		}
		return nil, "", fmt.Errorf("pod %s/%s not found", c.namespace, name)
	}
	if err != nil {
		return nil, "", fmt.Errorf("pod %s/%s: %w", c.namespace, name, err)
	}
	kind := proxyKind(p)
	if kind == "" || kind == "control plane" && !allowControlPlane {
		what := "a node proxy or a waypoint"
		if allowControlPlane {
			what = "a node proxy, a waypoint or the control plane"
		}
		return nil, "", fmt.Errorf("pod %s/%s is not a Causeway proxy: it is not %s (node proxies are the pods of DaemonSet %s/causeway-nodeproxy; waypoints have the label %s)",
			p.Namespace, p.Name, what, systemNamespace, waypointLabel)
	}
	if p.Status.Phase != corev1.PodRunning {
		return nil, "", fmt.Errorf("%s pod %s/%s is %s, not running", kind, p.Namespace, p.Name, p.Status.Phase)
	}
	return p, kind, nil
}

// adminClient reaches one pod's admin port through the API server
// (pods/portforward, as kubectl port-forward: WebSocket, or SPDY when the
// server does not offer it), on a local port of 127.0.0.1 that lives as
// long as the client.
type adminClient struct {
	pod   string // namespace/name, for errors
	base  string // http://127.0.0.1:PORT
	http  *http.Client
	stop  chan struct{}
	done  chan struct{}
	errMu sync.Mutex
	errs  bytes.Buffer // what the forwarder reports (e.g. nothing listening in the pod)
}

func (c *cluster) forwardAdmin(ctx context.Context, p *corev1.Pod, port int) (*adminClient, error) {
	url := c.client.CoreV1().RESTClient().Post().Resource("pods").Namespace(p.Namespace).Name(p.Name).SubResource("portforward").URL()
	transport, upgrader, err := spdy.RoundTripperFor(c.cfg)
	if err != nil {
		return nil, err
	}
	ws, err := portforward.NewSPDYOverWebsocketDialerForStreaming(url, c.cfg)
	if err != nil {
		return nil, err
	}
	dialer := portforward.NewFallbackDialerForStreaming(ws, spdy.NewDialerForStreaming(upgrader, &http.Client{Transport: transport}, http.MethodPost, url),
		func(err error) bool { return streamhttp.IsUpgradeFailure(err) || streamhttp.IsHTTPSProxyError(err) })
	a := &adminClient{pod: p.Namespace + "/" + p.Name, stop: make(chan struct{}), done: make(chan struct{})}
	ready := make(chan struct{})
	fw, err := portforward.NewOnAddressesForStreaming(dialer, []string{"127.0.0.1"}, []string{"0:" + strconv.Itoa(port)}, a.stop, ready, io.Discard, lockedWriter{a})
	if err != nil {
		return nil, err
	}
	errc := make(chan error, 1)
	go func() {
		defer close(a.done)
		errc <- fw.ForwardPorts()
	}()
	select {
	case <-ready:
	case err := <-errc:
		return nil, forwardError(a.pod, err)
	case <-ctx.Done():
		close(a.stop)
		return nil, fmt.Errorf("port-forward to %s: %w", a.pod, ctx.Err())
	}
	ports, err := fw.GetPorts()
	if err != nil || len(ports) != 1 {
		a.Close()
		return nil, fmt.Errorf("port-forward to %s: no local port (%v)", a.pod, err)
	}
	a.base = fmt.Sprintf("http://127.0.0.1:%d", ports[0].Local)
	a.http = &http.Client{Timeout: kubeTimeout}
	return a, nil
}

// forwardError says why the API server refused a port-forward.
func forwardError(pod string, err error) error {
	if apierrors.IsForbidden(err) || strings.Contains(err.Error(), "forbidden") {
		return fmt.Errorf("port-forward to %s refused: you may not create pods/portforward there (the ClusterRole causeway-mesh-operator grants it): %w", pod, err)
	}
	return fmt.Errorf("port-forward to %s: %w", pod, err)
}

type lockedWriter struct{ a *adminClient }

func (w lockedWriter) Write(b []byte) (int, error) {
	w.a.errMu.Lock()
	defer w.a.errMu.Unlock()
	if w.a.errs.Len() < 4096 {
		w.a.errs.Write(b[:min(len(b), 4096-w.a.errs.Len())])
	}
	return len(b), nil
}

// Close ends the port-forward.
func (a *adminClient) Close() {
	close(a.stop)
	<-a.done
}

// do sends one request to the pod's admin port and returns the body of a
// 200 answer.
func (a *adminClient) do(ctx context.Context, method, path string, body []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, kubeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	resp, err := a.http.Do(req)
	if err != nil {
		a.errMu.Lock()
		detail := strings.TrimSpace(a.errs.String())
		a.errMu.Unlock()
		if detail != "" {
			return nil, fmt.Errorf("admin port %d of %s: %s", adminPort, a.pod, lastLine(detail))
		}
		return nil, fmt.Errorf("admin port %d of %s: %w", adminPort, a.pod, err)
	}
	defer resp.Body.Close()
	data, err := readlimit.All(resp.Body, maxAdminBody)
	if err != nil {
		return nil, fmt.Errorf("admin %s of %s: %w", path, a.pod, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("admin %s of %s: %s: %s", path, a.pod, resp.Status, strings.TrimSpace(string(data[:min(len(data), 1024)])))
	}
	return data, nil
}

func lastLine(s string) string {
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// adminGet fetches path from the admin port of p.
func (c *cluster) adminGet(ctx context.Context, p *corev1.Pod, path string) ([]byte, error) {
	a, err := c.forwardAdmin(ctx, p, adminPort)
	if err != nil {
		return nil, err
	}
	defer a.Close()
	return a.do(ctx, http.MethodGet, path, nil)
}
