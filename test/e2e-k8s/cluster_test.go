// Package e2ek8s tests Causeway on the real Kubernetes cluster that `make
// cluster` brings up (hack/cluster), of one node or several (NODES=3). `make e2e-k8s` runs it with
// CAUSEWAY_E2E_KUBECONFIG naming the cluster's admin kubeconfig, after
// pushing the images to the cluster's registry (hack/cluster/images.sh,
// which lists them in CAUSEWAY_E2E_IMAGES and writes the overlays the
// install uses under bin/cluster-images); without that variable every test
// skips, so a plain `go test ./...` needs no cluster.
package e2ek8s

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// The cluster under test, set up once by TestMain.
var (
	kubeconfig string
	kubectl    string
	helmBin    string
	client     kubernetes.Interface
	skipReason string
	// images are the images the cluster's registry serves, by name:
	// REF@DIGEST (hack/cluster/images.sh).
	images map[string]string
)

func TestMain(m *testing.M) {
	kubeconfig = os.Getenv("CAUSEWAY_E2E_KUBECONFIG")
	if kubeconfig == "" {
		skipReason = "no cluster: CAUSEWAY_E2E_KUBECONFIG is not set (make e2e-k8s sets it and brings a cluster up)"
		os.Exit(m.Run())
	}
	var err error
	images, err = readImages(os.Getenv("CAUSEWAY_E2E_IMAGES"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e-k8s: CAUSEWAY_E2E_IMAGES: %v\n", err)
		os.Exit(1)
	}
	if echoImage = images["echo"]; echoImage == "" {
		fmt.Fprintln(os.Stderr, "e2e-k8s: CAUSEWAY_E2E_IMAGES lists no echo image")
		os.Exit(1)
	}
	if installValues == "" {
		fmt.Fprintln(os.Stderr, "e2e-k8s: CAUSEWAY_E2E_VALUES (the chart's values naming the pushed images) is not set (make e2e-k8s sets it)")
		os.Exit(1)
	}
	kubectl = os.Getenv("CAUSEWAY_E2E_KUBECTL")
	if kubectl == "" {
		kubectl = "kubectl"
	}
	helmBin = os.Getenv("CAUSEWAY_E2E_HELM")
	if helmBin == "" {
		helmBin = "helm"
	}
	if err := connect(); err != nil {
		// A cluster was named but does not answer: that is a failure, not a skip.
		fmt.Fprintf(os.Stderr, "e2e-k8s: cluster at %s unreachable: %v\n", kubeconfig, err)
		os.Exit(1)
	}
	if err := listNodes(context.Background()); err != nil {
		fmt.Fprintf(os.Stderr, "e2e-k8s: %v\n", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// readImages reads images.sh's list: "NAME REF@DIGEST" per line.
func readImages(file string) (map[string]string, error) {
	if file == "" {
		return nil, errors.New("not set (make e2e-k8s sets it)")
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	images := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		name, ref, ok := strings.Cut(line, " ")
		if !ok || !strings.Contains(ref, "@sha256:") {
			return nil, fmt.Errorf("%s: %q is not \"NAME REF@DIGEST\"", file, line)
		}
		images[name] = ref
	}
	return images, nil
}

func connect() error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	cfg.Timeout = 30 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	if _, err := cs.Discovery().ServerVersion(); err != nil {
		return err
	}
	client = cs
	return nil
}

func requireCluster(t *testing.T) {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
}

// newNamespace creates a namespace of its own for the test and deletes it
// (without waiting) when the test ends.
func newNamespace(t *testing.T, prefix string) string {
	t.Helper()
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: prefix + "-" + hex.EncodeToString(suffix)}}
	if _, err := client.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	t.Cleanup(func() {
		_ = client.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	return ns.Name
}

// eventually retries check every half second until it succeeds or bound
// passes, then fails the test with what it said last. The cluster converges
// (endpoints, kube-proxy rules, DNS records) rather than switching at once.
func eventually(t *testing.T, bound time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, bound, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// execError is a command in a pod that ran and exited non-zero.
type execError struct {
	code   int
	stderr string
}

func (e *execError) Error() string { return fmt.Sprintf("exit code %d: %s", e.code, e.stderr) }

// kubectlExec runs argv in the pod's container through `kubectl exec` and
// returns its stdout.
func kubectlExec(ns, pod, container string, argv ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	args := append([]string{"--kubeconfig", kubeconfig, "-n", ns, "exec", pod, "-c", container, "--"}, argv...)
	cmd := exec.CommandContext(ctx, kubectl, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return stdout.String(), &execError{code: exit.ExitCode(), stderr: strings.TrimSpace(stderr.String())}
	}
	return stdout.String(), err
}

// echoAnswer is the part of cmd/echo's JSON answer the tests look at.
type echoAnswer struct {
	Path      string              `json:"path"`
	Host      string              `json:"host"`
	Headers   map[string][]string `json:"headers"`
	Pod       string              `json:"pod"`
	Namespace string              `json:"namespace"`
	Remote    string              `json:"remote"`
	// TLSServerName: the SNI of a request that came over TLS.
	TLSServerName string `json:"tls_server_name"`
}

// runKubectl runs kubectl against the cluster under test (bounded by ctx)
// and returns its combined output.
func runKubectl(ctx context.Context, args ...string) (string, error) {
	return runClient(ctx, kubectl, args...)
}

// runHelm runs helm against the cluster under test, as runKubectl.
func runHelm(ctx context.Context, args ...string) (string, error) {
	return runClient(ctx, helmBin, args...)
}

func runClient(ctx context.Context, bin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %v\n%s", filepath.Base(bin), strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// kc runs kubectl within bound and fails the test if it fails.
func kc(t *testing.T, bound time.Duration, args ...string) string {
	t.Helper()
	return mustRun(t, bound, runKubectl, args...)
}

// hc runs helm within bound and fails the test if it fails.
func hc(t *testing.T, bound time.Duration, args ...string) string {
	t.Helper()
	return mustRun(t, bound, runHelm, args...)
}

func mustRun(t *testing.T, bound time.Duration, run func(context.Context, ...string) (string, error), args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	out, err := run(ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// fetchFrom GETs each URL from inside the pod with `echo fetch` and returns
// the echo answers in order.
func fetchFrom(ns, pod string, urls ...string) ([]echoAnswer, error) {
	out, err := kubectlExec(ns, pod, "echo", append([]string{"/usr/local/bin/echo", "fetch", "-timeout", "3s"}, urls...)...)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(strings.NewReader(out))
	answers := make([]echoAnswer, 0, len(urls))
	for range urls {
		var a echoAnswer
		if err := dec.Decode(&a); err != nil {
			return nil, fmt.Errorf("decode answer %d of %d: %v in %q", len(answers)+1, len(urls), err, out)
		}
		answers = append(answers, a)
	}
	return answers, nil
}
