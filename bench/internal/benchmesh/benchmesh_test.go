package benchmesh

import (
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"
)

func TestCPUTimeGrowsWithWork(t *testing.T) {
	pid := os.Getpid()
	before, err := CPUTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	// Spin until the kernel has accounted at least one more tick (10 ms);
	// the deadline only stops a broken reader from hanging the test.
	deadline := time.Now().Add(time.Minute)
	x := 0
	for {
		for i := range 1 << 20 {
			x += i
		}
		after, err := CPUTime(pid)
		if err != nil {
			t.Fatal(err)
		}
		if after > before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CPU time stayed at %v while spinning (%d)", before, x)
		}
	}
	// The reading agrees with getrusage, which counts the same threads.
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	got, err := CPUTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	want := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	if got > want+time.Second || got < want-time.Second {
		t.Fatalf("CPUTime %v, getrusage %v", got, want)
	}
}

func TestRSS(t *testing.T) {
	rss, err := RSS(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	// Resident memory is at least the code of a test binary and at most
	// what the runtime has mapped plus that code.
	if rss < 1<<20 || rss > int64(ms.Sys)+(1<<30) {
		t.Fatalf("RSS %d bytes; runtime has %d mapped", rss, ms.Sys)
	}
	peak, err := PeakRSS(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if peak < rss {
		t.Fatalf("peak RSS %d bytes below the RSS %d read before it", peak, rss)
	}
	file, err := FileRSS(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if file <= 0 || file > peak {
		t.Fatalf("file-backed RSS %d bytes, peak RSS %d", file, peak)
	}
	before, err := OpenFiles(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if after, err := OpenFiles(os.Getpid()); err != nil || after != before+1 {
		t.Fatalf("%d open files, then %d (%v) after opening one", before, after, err)
	}
}

func TestProcErrors(t *testing.T) {
	// PIDs are below the kernel's pid_max (at most 2^22).
	const noSuchPID = 1 << 23
	if _, err := CPUTime(noSuchPID); err == nil {
		t.Fatal("CPUTime of a missing process succeeded")
	}
	if _, err := RSS(noSuchPID); err == nil {
		t.Fatal("RSS of a missing process succeeded")
	}
	if _, err := OpenFiles(noSuchPID); err == nil {
		t.Fatal("OpenFiles of a missing process succeeded")
	}
	if _, err := PeakRSS(noSuchPID); err == nil {
		t.Fatal("PeakRSS of a missing process succeeded")
	}
}

func TestRaiseNoFile(t *testing.T) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	got, err := RaiseNoFile(lim.Cur)
	if err != nil || got != lim.Cur {
		t.Fatalf("RaiseNoFile(current %d) = %d, %v", lim.Cur, got, err)
	}
	got, err = RaiseNoFile(lim.Max + 1)
	if err != nil {
		t.Fatal(err)
	}
	if got < lim.Max {
		t.Fatalf("RaiseNoFile past the hard limit %d left the soft limit at %d", lim.Max, got)
	}
}
