// Package kubetest runs a real etcd and kube-apiserver on 127.0.0.1 for
// integration tests: no scheduler, no controllers, no kubelet, so a test
// creates exactly the objects it reasons about (pods bound to nodes by
// spec.nodeName, status set through the status subresource). The
// service-account signing key and issuer are configured, so TokenRequest and
// TokenReview work as in a cluster.
//
// The binaries come from ${CAUSEWAY_K8S_BIN:-$HOME/.cache/causeway/k8s-v1.37.2/bin}
// (hack/cluster/build.sh builds them there). Without them a test is skipped
// with one line saying so, never silently passed.
//
// One apiserver per test package keeps tests fast:
//
//	func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }
//	func TestX(t *testing.T) { env := kubetest.Shared(t); ... }
//
// Start gives a test an apiserver of its own, stopped in t.Cleanup.
package kubetest

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// K8sVersion is the Kubernetes release the binaries are built from.
const K8sVersion = "v1.37.2"

// ServiceClusterIPRange is the apiserver's service range. It is loopback,
// like everything in local mode, and wide enough for the samples' VIPs
// (127.0.20.x); the apiserver gives 127.0.16.1 to the kubernetes Service.
const ServiceClusterIPRange = "127.0.16.0/20"

// Issuer is the service-account token issuer.
const Issuer = "https://kubetest.causeway.invalid"

// BinDir is where the Kubernetes binaries are looked for.
func BinDir() string {
	if d := os.Getenv("CAUSEWAY_K8S_BIN"); d != "" {
		return d
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "causeway", "k8s-"+K8sVersion, "bin")
}

// Env is a running etcd and kube-apiserver.
type Env struct {
	// Config authenticates as a cluster administrator (system:masters).
	Config *rest.Config
	// Kubeconfig is a kubeconfig file with the same credentials.
	Kubeconfig string
	// Dir holds the certificates, data and logs.
	Dir string

	saKey *rsa.PrivateKey
	procs []*exec.Cmd
	logs  []string
	once  sync.Once
}

// missingBinaries returns why the apiserver cannot run here, or "".
func missingBinaries() string {
	dir := BinDir()
	for _, name := range []string{"kube-apiserver", "etcd"} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Mode()&0o111 == 0 {
			return fmt.Sprintf("%s not found in %s; build it with hack/cluster/build.sh or set CAUSEWAY_K8S_BIN", name, dir)
		}
	}
	return ""
}

// Start starts an apiserver for one test and stops it when the test ends.
// It skips the test when the binaries are missing.
func Start(t testing.TB) *Env {
	t.Helper()
	if why := missingBinaries(); why != "" {
		t.Skip(why)
	}
	dir, err := os.MkdirTemp("", "kubetest-")
	if err != nil {
		t.Fatal(err)
	}
	e, err := start(dir)
	if err != nil {
		os.RemoveAll(dir)
		t.Fatalf("kubetest: %v", err)
	}
	t.Cleanup(e.Stop)
	return e
}

var shared struct {
	mu  sync.Mutex
	env *Env
	err error
}

// Main runs the package's tests and then stops the shared apiserver, if one
// was started. Use it as TestMain's body: os.Exit(kubetest.Main(m)).
func Main(m *testing.M) int {
	code := m.Run()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.env != nil {
		shared.env.Stop()
	}
	return code
}

// Shared returns the package's apiserver, starting it on first use (the
// package's TestMain must call Main). Tests sharing it must use their own
// namespaces. It skips the test when the binaries are missing.
func Shared(t testing.TB) *Env {
	t.Helper()
	if why := missingBinaries(); why != "" {
		t.Skip(why)
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.env == nil && shared.err == nil {
		dir, err := os.MkdirTemp("", "kubetest-")
		if err == nil {
			shared.env, err = start(dir)
			if err != nil {
				os.RemoveAll(dir)
			}
		}
		shared.err = err
	}
	if shared.err != nil {
		t.Fatalf("kubetest: %v", shared.err)
	}
	return shared.env
}

// Clientset returns a client for the Config.
func (e *Env) Clientset(t testing.TB) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Stop ends the apiserver and etcd and removes their files.
func (e *Env) Stop() {
	e.once.Do(func() {
		for i := len(e.procs) - 1; i >= 0; i-- {
			stopProcess(e.procs[i])
		}
		os.RemoveAll(e.Dir)
	})
}

func stopProcess(c *exec.Cmd) {
	if c.Process == nil {
		return
	}
	_ = syscall.Kill(-c.Process.Pid, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = c.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

func start(dir string) (*Env, error) {
	e := &Env{Dir: dir}
	ok := false
	defer func() {
		if !ok {
			for i := len(e.procs) - 1; i >= 0; i-- {
				stopProcess(e.procs[i])
			}
		}
	}()
	pki := filepath.Join(dir, "pki")
	if err := os.MkdirAll(pki, 0o700); err != nil {
		return nil, err
	}
	caPEM, err := writeServingCerts(pki)
	if err != nil {
		return nil, err
	}
	if e.saKey, err = writeServiceAccountKey(pki); err != nil {
		return nil, err
	}
	token, err := randomHex(24)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(pki, "tokens.csv"), []byte(token+",kubetest-admin,kubetest-admin,\"system:masters\"\n"), 0o600); err != nil {
		return nil, err
	}

	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	if err := e.spawn("etcd",
		"--name=kubetest", "--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=kubetest="+peerURL,
		"--unsafe-no-fsync", "--quota-backend-bytes=4294967296",
		"--logger=zap", "--log-level=warn",
	); err != nil {
		return nil, err
	}
	if err := waitHTTP(etcdURL+"/health", nil, "", 30*time.Second, e); err != nil {
		return nil, fmt.Errorf("etcd did not become healthy: %w", err)
	}

	host := "https://127.0.0.1:" + strconv.Itoa(ports[2])
	if err := e.spawn("kube-apiserver",
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port="+strconv.Itoa(ports[2]),
		"--tls-cert-file="+filepath.Join(pki, "apiserver.crt"), "--tls-private-key-file="+filepath.Join(pki, "apiserver.key"),
		"--token-auth-file="+filepath.Join(pki, "tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-account-issuer="+Issuer,
		"--service-account-key-file="+filepath.Join(pki, "sa.pub"),
		"--service-account-signing-key-file="+filepath.Join(pki, "sa.key"),
		"--service-cluster-ip-range="+ServiceClusterIPRange,
		"--endpoint-reconciler-type=none",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		"--v=0",
	); err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	if err := waitHTTP(host+"/readyz", pool, token, 90*time.Second, e); err != nil {
		return nil, fmt.Errorf("kube-apiserver did not become ready: %w", err)
	}
	e.Config = &rest.Config{
		Host:            host,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: caPEM},
		QPS:             500,
		Burst:           1000,
		Timeout:         30 * time.Second,
	}
	e.Kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(e.Kubeconfig, kubeconfig(host, caPEM, token), 0o600); err != nil {
		return nil, err
	}
	if err := e.installCRDs(); err != nil {
		return nil, err
	}
	ok = true
	return e, nil
}

// spawn starts a daemon in its own process group, its output in a log file.
func (e *Env) spawn(name string, args ...string) error {
	logPath := filepath.Join(e.Dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer f.Close()
	c := exec.Command(filepath.Join(BinDir(), name), args...)
	c.Stdout, c.Stderr = f, f
	// Its own group, killed as one; killed too if the test binary dies.
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := c.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	e.procs = append(e.procs, c)
	e.logs = append(e.logs, logPath)
	return nil
}

// logTail returns the end of each daemon's log, for a failure message.
func (e *Env) logTail() string {
	var b strings.Builder
	for _, p := range e.logs {
		data, _ := os.ReadFile(p)
		if len(data) > 4000 {
			data = data[len(data)-4000:]
		}
		fmt.Fprintf(&b, "\n--- %s (end) ---\n%s", filepath.Base(p), data)
	}
	return b.String()
}

func waitHTTP(url string, pool *x509.CertPool, token string, timeout time.Duration, e *Env) error {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConfig(pool)}}
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		for _, c := range e.procs {
			if c.ProcessState != nil {
				return fmt.Errorf("%s exited: %s%s", c.Path, c.ProcessState, e.logTail())
			}
		}
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err == nil {
			body := make([]byte, 512)
			n, _ := resp.Body.Read(body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("%s: %s: %s", url, resp.Status, bytes.TrimSpace(body[:n]))
		}
		last = err
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("%v after %s%s", last, timeout, e.logTail())
}

// freePorts picks n distinct free loopback ports.
func freePorts(n int) ([]int, error) {
	var out []int
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

// writeServingCerts writes a CA and the apiserver's certificate for
// 127.0.0.1 and returns the CA's PEM.
func writeServingCerts(dir string) ([]byte, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubetest-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(7 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(7 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	for name, data := range map[string][]byte{
		"ca.crt":        caPEM,
		"apiserver.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		"apiserver.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return nil, err
		}
	}
	return caPEM, nil
}

// writeServiceAccountKey writes the token signing key pair (RSA, as
// kubeadm makes it).
func writeServiceAccountKey(dir string) (*rsa.PrivateKey, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "sa.key"), pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return nil, err
	}
	return key, os.WriteFile(filepath.Join(dir, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600)
}

// SignToken signs claims with the apiserver's service-account key, as the
// apiserver signs the tokens it issues. Tests use it for what TokenRequest
// cannot make, such as a token that has already expired; the key id is the
// one the apiserver computes, so the token is checked like its own.
func (e *Env) SignToken(claims map[string]any) (string, error) {
	pub, err := x509.MarshalPKIXPublicKey(&e.saKey.PublicKey)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(pub)
	header, err := json.Marshal(map[string]string{"alg": "RS256", "kid": base64.RawURLEncoding.EncodeToString(sum[:])})
	if err != nil {
		return "", err
	}
	payload, err := json.Marshal(claims)
	if err != nil {
		return "", err
	}
	signing := base64.RawURLEncoding.EncodeToString(header) + "." + base64.RawURLEncoding.EncodeToString(payload)
	digest := sha256.Sum256([]byte(signing))
	sig, err := rsa.SignPKCS1v15(rand.Reader, e.saKey, crypto.SHA256, digest[:])
	if err != nil {
		return "", err
	}
	return signing + "." + base64.RawURLEncoding.EncodeToString(sig), nil
}

func kubeconfig(host string, caPEM []byte, token string) []byte {
	return fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: kubetest
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: admin
  user:
    token: %s
contexts:
- name: kubetest
  context: {cluster: kubetest, user: admin}
current-context: kubetest
`, host, base64.StdEncoding.EncodeToString(caPEM), token)
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// WaitFor polls cond every 50ms until it holds or timeout passes.
func WaitFor(ctx context.Context, timeout time.Duration, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("%w (last error: %v)", ctx.Err(), last)
			}
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
