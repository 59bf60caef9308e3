package kubeca

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/causeway-mesh/causeway/pkg/internal/kubetest"
	"github.com/causeway-mesh/causeway/pkg/trust"
)

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }

func namespace(t *testing.T, c kubernetes.Interface, name string) {
	t.Helper()
	_, err := c.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

// Replicas starting together all end up signing with one CA: the Secret's.
func TestLoadOrCreateAgreesAcrossReplicas(t *testing.T) {
	c := kubetest.Shared(t).Clientset(t)
	namespace(t, c, "ca-race")
	const n = 4
	var (
		wg    sync.WaitGroup
		roots [n][]byte
		errs  [n]error
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, err := LoadOrCreate(context.Background(), c, "ca-race", "causeway-ca", "cluster.local", time.Hour)
			if err == nil {
				roots[i] = a.RootsPEM()
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("replica %d: %v", i, errs[i])
		}
		if !bytes.Equal(roots[i], roots[0]) {
			t.Fatalf("replica %d has other roots than replica 0", i)
		}
	}
	s, err := c.CoreV1().Secrets("ca-race").Get(context.Background(), "causeway-ca", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(s.Data[trust.RootCertFile], roots[0]) {
		t.Fatal("the Secret holds other roots than the replicas use")
	}
	// A later start loads the same CA.
	a, err := LoadOrCreate(context.Background(), c, "ca-race", "causeway-ca", "cluster.local", time.Hour)
	if err != nil || !bytes.Equal(a.RootsPEM(), roots[0]) {
		t.Fatalf("restart: %v (same roots: %v)", err, err == nil && bytes.Equal(a.RootsPEM(), roots[0]))
	}
}

// An operator's Secret is used as it is, and a broken one is an error that
// names it, never replaced.
func TestLoadOrCreateKeepsOperatorSecret(t *testing.T) {
	c := kubetest.Shared(t).Clientset(t)
	namespace(t, c, "ca-own")
	files, err := trust.SelfSignedCAFiles("cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	mk := func(name string, data map[string][]byte) {
		_, err := c.CoreV1().Secrets("ca-own").Create(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: data}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	mk("mine", files)
	a, err := LoadOrCreate(context.Background(), c, "ca-own", "mine", "cluster.local", time.Hour)
	if err != nil || !bytes.Equal(a.RootsPEM(), files[trust.RootCertFile]) {
		t.Fatalf("operator's CA not used: %v", err)
	}

	partial := map[string][]byte{trust.CACertFile: files[trust.CACertFile], trust.CAKeyFile: files[trust.CAKeyFile]}
	mk("partial", partial)
	_, err = LoadOrCreate(context.Background(), c, "ca-own", "partial", "cluster.local", time.Hour)
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte("CA secret ca-own/partial is incomplete: missing")) {
		t.Fatalf("partial secret: %v", err)
	}
	s, _ := c.CoreV1().Secrets("ca-own").Get(context.Background(), "partial", metav1.GetOptions{})
	if len(s.Data) != 2 {
		t.Fatalf("partial secret was changed: %d keys", len(s.Data))
	}
}

// writeCounter counts the requests that would change an object.
type writeCounter struct {
	next   http.RoundTripper
	writes atomic.Int32
}

func (w *writeCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodGet {
		w.writes.Add(1)
	}
	return w.next.RoundTrip(r)
}

// Roots are published once, updated when they change, and an up-to-date
// ConfigMap is not written again.
func TestPublishRoots(t *testing.T) {
	cfg := rest.CopyConfig(kubetest.Shared(t).Config)
	counter := &writeCounter{}
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { counter.next = rt; return counter }
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	namespace(t, c, "roots")
	ctx := context.Background()
	if err := PublishRoots(ctx, c, "roots", "causeway-root-cert", []byte("one")); err != nil {
		t.Fatal(err)
	}
	get := func() *corev1.ConfigMap {
		cm, err := c.CoreV1().ConfigMaps("roots").Get(ctx, "causeway-root-cert", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return cm
	}
	first := get()
	if first.Data[RootsKey] != "one" {
		t.Fatalf("published %q", first.Data[RootsKey])
	}
	if err := PublishRoots(ctx, c, "roots", "causeway-root-cert", []byte("one")); err != nil {
		t.Fatal(err)
	}
	if n := counter.writes.Load(); n != 2 { // the namespace and the first publication
		t.Fatalf("%d writes, want 2: unchanged roots were written again", n)
	}
	if err := PublishRoots(ctx, c, "roots", "causeway-root-cert", []byte("two")); err != nil {
		t.Fatal(err)
	}
	if got := get().Data[RootsKey]; got != "two" {
		t.Fatalf("after a change: %q", got)
	}
}
