package bootstrap

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/causeway-mesh/causeway/pkg/admin"
	"github.com/causeway-mesh/causeway/pkg/logging"
)

// freeAddr returns a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func serveOps(t *testing.T, f *Flags, ready func() error) {
	t.Helper()
	log, err := logging.New(logging.Options{Format: "json", Level: "error"})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "ops_test_total"}))
	ctx, cancel := context.WithCancel(context.Background())
	wait, err := f.ServeOps(ctx, &Env{Log: log, Metrics: reg}, Ops{
		Dump:  func() (*admin.ConfigDump, error) { return &admin.ConfigDump{}, nil },
		Ready: func() (string, error) { return "test", ready() },
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); wait() })
}

// docs/design.md §2: readiness on 15021 and metrics on 15020 are separate ports.
func TestReadinessAndMetricsOnTheirOwnPorts(t *testing.T) {
	f := &Flags{Admin: freeAddr(t), Readiness: freeAddr(t), Metrics: freeAddr(t)}
	var synced atomic.Bool
	serveOps(t, f, func() error {
		if !synced.Load() {
			return errors.New("xDS not synced")
		}
		return nil
	})
	if code, body := get(t, "http://"+f.Readiness+"/healthz/ready"); code != http.StatusServiceUnavailable || !strings.Contains(body, "xDS not synced") {
		t.Fatalf("readiness before ready: %d %q", code, body)
	}
	synced.Store(true)
	if code, body := get(t, "http://"+f.Readiness+"/healthz/ready"); code != http.StatusOK || body != "ready: test\n" {
		t.Fatalf("readiness when ready: %d %q", code, body)
	}
	if code, body := get(t, "http://"+f.Metrics+"/metrics"); code != http.StatusOK || !strings.Contains(body, "ops_test_total 0") {
		t.Fatalf("metrics: %d %q", code, body)
	}
	if code, _ := get(t, "http://"+f.Readiness+"/metrics"); code != http.StatusNotFound {
		t.Fatalf("metrics on the readiness port: %d, want 404", code)
	}
	if code, _ := get(t, "http://"+f.Metrics+"/healthz/ready"); code != http.StatusNotFound {
		t.Fatalf("readiness on the metrics port: %d, want 404", code)
	}
	if code, _ := get(t, "http://"+f.Admin+"/config_dump"); code != http.StatusOK {
		t.Fatalf("admin config dump: %d", code)
	}
}

func TestReadinessAndMetricsMayShareAPort(t *testing.T) {
	addr := freeAddr(t)
	f := &Flags{Admin: freeAddr(t), Readiness: addr, Metrics: addr}
	serveOps(t, f, func() error { return nil })
	for _, path := range []string{"/healthz/ready", "/metrics"} {
		if code, _ := get(t, "http://"+addr+path); code != http.StatusOK {
			t.Fatalf("%s: %d", path, code)
		}
	}
}

func TestAdminMustNotShareTheStatusPorts(t *testing.T) {
	addr := freeAddr(t)
	f := &Flags{Admin: addr, Readiness: addr, Metrics: freeAddr(t)}
	log, _ := logging.New(logging.Options{Format: "json", Level: "error"})
	_, err := f.ServeOps(context.Background(), &Env{Log: log, Metrics: prometheus.NewRegistry()}, Ops{})
	if err == nil || !strings.Contains(err.Error(), "must differ") {
		t.Fatalf("admin on the readiness address: %v", err)
	}
}

// tuneUnset tunes memory as a proxy without GOGC in its environment does,
// and restores the GC target when t ends.
func tuneUnset(t *testing.T) *idleMemory {
	t.Helper()
	prev := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(prev) })
	t.Setenv("GOGC", "")
	os.Unsetenv("GOGC")
	m, err := tuneMemory(DefaultGCPercent, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// The proxies' GC target applies unless GOGC says otherwise; a bad value
// is refused.
func TestTuneMemory(t *testing.T) {
	m := tuneUnset(t)
	if got := debug.SetGCPercent(100); got != DefaultGCPercent || !m.adapt {
		t.Fatalf("GC percent %d, want %d (adapting: %v)", got, DefaultGCPercent, m.adapt)
	}
	t.Setenv("GOGC", "150")
	m, err := tuneMemory(DefaultGCPercent, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if got := debug.SetGCPercent(100); got != 100 || m.adapt {
		t.Fatalf("GOGC set: GC percent changed to %d (adapting: %v)", got, m.adapt)
	}
	if _, err := tuneMemory(0, zap.NewNop()); err == nil {
		t.Fatal("--gc-percent 0 accepted")
	}
}

// inUse keeps the test's load reachable (and allocated) until it ends.
var inUse [][]byte

// While busy the GC target is --gc-percent of the live heap up to
// busyHeadroom of garbage, in steps of 25, never below idleGCPercent nor
// above --gc-percent.
func TestBusyGCPercentBoundsTheHeadroom(t *testing.T) {
	for _, tc := range []struct {
		gcPercent int
		live      uint64
		want      int
	}{
		{400, 0, 400},
		{400, 2 << 20, 400},
		{400, 4 << 20, 400},
		{400, 5 << 20, 300}, // 320 % is 16 MiB
		{400, 10 << 20, 150},
		{400, 16 << 20, 100},
		{400, 1 << 30, 100},
		{200, 4 << 20, 200},
		{50, 1 << 30, 50},
	} {
		if got := busyGCPercent(tc.gcPercent, tc.live); got != tc.want {
			t.Errorf("busyGCPercent(%d, %d MiB) = %d, want %d", tc.gcPercent, tc.live>>20, got, tc.want)
		}
	}
}

// A quiet spell after a busy one lowers the GC target and returns the
// freed heap to the system, and what is freed later while idle goes back
// within idleRelease; the next busy check restores the target. With GOGC
// set only the memory is returned.
func TestIdleMemoryReturnsTheHeapAfterLoad(t *testing.T) {
	m := tuneUnset(t)
	// The heap the process holds: objects (live or not yet collected) and
	// free pages not returned to the system.
	heldHeap := func() uint64 {
		s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/memory/classes/heap/free:bytes"}}
		metrics.Read(s)
		return s[0].Value.Uint64() + s[1].Value.Uint64()
	}
	percent := func() int {
		p := debug.SetGCPercent(-1)
		debug.SetGCPercent(p)
		return p
	}
	// step checks the heap as it is, but for the bytes allocated and a
	// live heap of 2 MiB.
	var allocated uint64
	step := func(m *idleMemory) {
		h := m.read()
		h.allocated, h.live = allocated, 2<<20
		m.step(h)
	}
	quiet := func(checks int) {
		for range checks {
			allocated++
			step(m)
		}
	}
	load := func(mib int) {
		inUse = make([][]byte, mib)
		for i := range inUse {
			inUse[i] = make([]byte, 1<<20)
		}
	}

	// Load: 64 MiB in use while busy, garbage once it ends.
	load(64)
	allocated += idleAlloc
	step(m)
	quiet(idleAfter - 1)
	if m.idle || percent() != DefaultGCPercent {
		t.Fatalf("%d quiet checks after a busy one: idle %v, GC percent %d", idleAfter-1, m.idle, percent())
	}
	if held := heldHeap(); held < 64<<20 {
		t.Fatalf("%d bytes of heap held with 64 MiB in use", held)
	}
	inUse = nil
	quiet(1)
	if !m.idle || percent() != idleGCPercent {
		t.Fatalf("%d quiet checks: idle %v, GC percent %d", idleAfter, m.idle, percent())
	}
	if held := heldHeap(); held > 32<<20 {
		t.Fatalf("%d bytes of heap held once idle", held)
	}

	// Memory freed while idle (pooled connections closing) goes back
	// within idleRelease. (No collection may run meanwhile: that is the
	// next case.)
	debug.SetGCPercent(-1)
	load(64)
	debug.SetGCPercent(idleGCPercent)
	inUse = nil
	quiet(int(idleRelease/idleCheck) - 1)
	if held := heldHeap(); held < 64<<20 {
		t.Fatalf("%d bytes of heap held before idleRelease passed: released early", held)
	}
	quiet(1)
	if held := heldHeap(); !m.idle || held > 32<<20 {
		t.Fatalf("idle %v, %d bytes of heap held idleRelease after the last release", m.idle, held)
	}

	// A collection while idle leaves freed pages that the scavenger
	// would keep up to the heap goal: they go back at the next check.
	load(64)
	inUse = nil
	runtime.GC()
	if h := m.read(); h.free < idleFree {
		t.Fatalf("a collection of 64 MiB left %d bytes free", h.free)
	}
	quiet(1)
	if held := heldHeap(); !m.idle || m.sinceFree != 0 || held > 32<<20 {
		t.Fatalf("a check after a collection while idle: idle %v, %v since the last release, %d bytes of heap held", m.idle, m.sinceFree, held)
	}
	quiet(1) // and not again without another collection
	if m.sinceFree != idleCheck {
		t.Fatalf("released again without a collection (%v since the last release)", m.sinceFree)
	}

	allocated += idleAlloc
	step(m)
	if m.idle || percent() != DefaultGCPercent {
		t.Fatalf("load again: idle %v, GC percent %d", m.idle, percent())
	}

	t.Setenv("GOGC", "150")
	debug.SetGCPercent(150)
	m, err := tuneMemory(DefaultGCPercent, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	step(m) // busy: all allocated so far is new to it
	quiet(idleAfter)
	if !m.idle || percent() != 150 {
		t.Fatalf("GOGC set, quiet spell: idle %v, GC percent %d", m.idle, percent())
	}
}
