package benchmesh

import (
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// ReadMemory of this process, whose metrics page serves the Go collector
// as the mesh's processes do.
func TestReadMemory(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector())
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()

	m, err := ReadMemory(os.Getpid(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	// The kernel sums each kind apart: allow a few pages of skew.
	if m.RSSAnon <= 0 || m.RSSFile <= 0 || m.RSSAnon+m.RSSFile > m.RSS+1<<20 {
		t.Fatalf("RSS %d bytes: %d anonymous, %d file-backed", m.RSS, m.RSSAnon, m.RSSFile)
	}
	if m.FDs < 3 {
		t.Fatalf("%d open files", m.FDs)
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	// What the runtime holds is its own figure, a heap at least as large
	// as the live one, and no more than it has mapped.
	if held := m.RuntimeHeld(); held <= float64(ms.HeapAlloc)/2 || held > float64(ms.Sys) {
		t.Fatalf("runtime holds %.0f bytes; heap %d, mapped %d", held, ms.HeapAlloc, ms.Sys)
	}
	if free := m.HeapFree(); free < 0 || free > float64(ms.HeapSys) {
		t.Fatalf("free heap %.0f bytes of %d", free, ms.HeapSys)
	}
	for _, name := range RuntimeMetrics {
		if _, ok := m.Runtime[name]; !ok {
			t.Errorf("no %s", name)
		}
	}
	empty := httptest.NewServer(http.NotFoundHandler())
	defer empty.Close()
	if _, err := ReadMemory(os.Getpid(), empty.URL); err == nil {
		t.Fatal("ReadMemory of a page without the runtime's figures succeeded")
	}
	if _, err := ReadMemory(1<<23, srv.URL); err == nil {
		t.Fatal("ReadMemory of a missing process succeeded")
	}
}
