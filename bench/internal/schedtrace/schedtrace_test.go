package schedtrace

import (
	"os"
	"path/filepath"
	"runtime"
	"runtime/trace"
	"slices"
	"strings"
	"testing"
	"time"
)

// A trace of goroutines handing a value back and forth through channels,
// 200 times each way, with two forced collections.
func TestReadFindsHandOffsAndCollections(t *testing.T) {
	file := filepath.Join(t.TempDir(), "trace")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := trace.Start(f); err != nil {
		t.Fatal(err)
	}
	ping, pong := make(chan int), make(chan int)
	go func() {
		for v := range ping {
			pong <- v
		}
	}()
	for i := range 200 {
		ping <- i
		<-pong
	}
	close(ping)
	runtime.GC()
	runtime.GC()
	trace.Stop()
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := Read(file)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Waits) < 400 {
		t.Errorf("%d waits, want at least 400 (200 wake-ups each way)", len(s.Waits))
	}
	if !slices.IsSorted(s.Waits) || s.Waits[0] < 0 {
		t.Errorf("waits not sorted or negative: first %v, last %v", s.Waits[0], s.Waits[len(s.Waits)-1])
	}
	// runtime.GC runs a whole cycle: its mark phase and two pauses (sweep
	// termination, mark termination).
	if s.GCs < 2 || len(s.Pauses) < 4 {
		t.Errorf("%d collections, %d pauses: want at least 2 and 4", s.GCs, len(s.Pauses))
	}
	if s.Span <= 0 || s.Span > time.Minute {
		t.Errorf("span %v", s.Span)
	}
	var out strings.Builder
	Report(&out, "x", s)
	for _, want := range []string{"bench: x_sched_wait_p99 ", "bench: x_gc_cycles_per_second ", "bench: x_gc_pause_max "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

func TestReadRefusesWhatIsNoTrace(t *testing.T) {
	if _, err := Read(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("a missing trace gave no error")
	}
	file := filepath.Join(t.TempDir(), "junk")
	if err := os.WriteFile(file, []byte("not a trace"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(file); err == nil {
		t.Error("a file that is no trace gave no error")
	}
}
