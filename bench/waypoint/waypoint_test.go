package main

import (
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/bench/internal/benchmesh"
)

func TestPercentile(t *testing.T) {
	r := loadResult{}
	if r.percentile(0.99) != 0 {
		t.Fatal("percentile of nothing")
	}
	for i := 1; i <= 100; i++ {
		r.latencies = append(r.latencies, time.Duration(i)*time.Millisecond)
	}
	if got := r.percentile(0.99); got != 99*time.Millisecond {
		t.Fatalf("p99 of 1..100 ms = %v", got)
	}
	if got := r.percentile(0.50); got != 50*time.Millisecond {
		t.Fatalf("p50 of 1..100 ms = %v", got)
	}
	if got := r.percentile(1); got != 100*time.Millisecond {
		t.Fatalf("p100 of 1..100 ms = %v", got)
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{
		{[]float64{3}, 3},
		{[]float64{0.9, 0.5, 0.7}, 0.7},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		in := slices.Clone(c.in)
		if got := median(in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
		if !slices.Equal(in, c.in) {
			t.Errorf("median reordered its input: %v", in)
		}
	}
}

// The backend answers keep-alive requests on a tunnel handed over by the
// tunnel listener, and the tunnel's handler returns once the server closes.
func TestBackendOverTunnelListener(t *testing.T) {
	tl := newTunnelListener("127.0.0.1:15008")
	srv := newHTTPServer()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(tl) }()

	client, tunnel := net.Pipe()
	defer client.Close()
	handed := make(chan struct{})
	go func() {
		tl.serve(context.Background(), tunnel)
		close(handed)
	}()
	br := newReader(client)
	for i := range 3 {
		if err := roundTrip(client, br); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	srv.Close() // closes the tunnel and the listener
	select {
	case <-handed:
	case <-time.After(30 * time.Second):
		t.Fatal("tunnel handler still running after the server closed")
	}
	if err := <-served; err == nil {
		t.Fatal("Serve returned no error after Close")
	}
	if _, err := tl.Accept(); err == nil {
		t.Fatal("Accept after Close succeeded")
	}
}

// The nginx configuration the benchmark writes is one nginx accepts.
func TestNginxConfigValid(t *testing.T) {
	bin, err := benchmesh.LookTool("nginx", "/usr/sbin/nginx")
	if err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	pk, err := benchmesh.NewPKI(dir)
	if err != nil {
		t.Fatal(err)
	}
	for i, name := range []string{"nginx.bench", "nginx-client.bench"} {
		if _, err := pk.Issue(name, int64(i+2)); err != nil {
			t.Fatal(err)
		}
	}
	conf, err := nginxProxy(dir, "127.0.91.10:8443", "127.0.191.3:8443", 2).WriteConf()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "-t", "-p", dir, "-c", conf).CombinedOutput()
	if err != nil {
		t.Fatalf("nginx -t: %v\n%s", err, out)
	}
	if filepath.Dir(conf) != dir {
		t.Fatalf("configuration written to %s, not into %s", conf, dir)
	}
}
