// Command runtimeheld shows, in a bare Go process, the memory the Go
// runtime keeps after a peak and never returns: the classes that stay
// above their start in a node proxy after the load (bench/README.md,
// "What stays after the load, class by class"). It prints "bench: <name> <value> <unit>"
// lines:
//
//   - sockets: -sockets TCP sockets on loopback open at once, then closed,
//     then as many again: /memory/classes/other per socket at the peak,
//     and after closing them all and debug.FreeOSMemory (the network
//     poller's descriptors and the sockets' finalizer records, which the
//     runtime keeps in free lists for the next sockets);
//
//   - size classes: one live object of every small size class, with and
//     without pointers, through a
//     few collections, then none: /memory/classes/metadata/other before,
//     at the peak and after FreeOSMemory (each size class's span sets,
//     made on first use and kept);
//
//   - goroutines: -goroutines goroutines alive at once, then none: heap
//     in use after they ended and FreeOSMemory (goroutine descriptors,
//     which the runtime keeps for reuse: golang/go#34457).
//
//     go run ./bench/runtimeheld [-sockets 10000] [-goroutines 5000]
package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"

	"github.com/causeway-mesh/causeway/bench/internal/benchmesh"
)

// smallSizes are sizes in each of Go's small size classes
// (runtime/sizeclasses.go), 8 bytes to 32 KiB.
var smallSizes = []int{8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256,
	288, 320, 352, 384, 416, 448, 480, 512, 576, 640, 704, 768, 896, 1024, 1152, 1280, 1408, 1536, 1792,
	2048, 2304, 2688, 3072, 3200, 3456, 4096, 4864, 5376, 6144, 6528, 6784, 6912, 8192, 9472, 9728, 10240,
	10880, 12288, 13568, 14336, 16384, 18432, 19072, 20480, 21760, 24576, 27264, 28672, 32768}

func main() {
	sockets := flag.Int("sockets", 10000, "sockets open at once (half dialled, half accepted)")
	goroutines := flag.Int("goroutines", 5000, "goroutines alive at once")
	flag.Parse()
	if *sockets < 2 || *goroutines < 1 {
		fmt.Fprintln(os.Stderr, "runtimeheld: -sockets must be at least 2, -goroutines positive")
		os.Exit(2)
	}
	if _, err := benchmesh.RaiseNoFile(uint64(*sockets + 1024)); err != nil {
		fmt.Fprintln(os.Stderr, "runtimeheld:", err)
		os.Exit(1)
	}
	// Size classes first: the other two use many of them.
	sizeClasses()
	if err := socketPeak(*sockets); err != nil {
		fmt.Fprintln(os.Stderr, "runtimeheld:", err)
		os.Exit(1)
	}
	goroutinePeak(*goroutines)
}

// class reads runtime/metrics figures by name.
func class(names ...string) []float64 {
	s := make([]metrics.Sample, len(names))
	for i, n := range names {
		s[i].Name = n
	}
	metrics.Read(s)
	out := make([]float64, len(s))
	for i := range s {
		out[i] = float64(s[i].Value.Uint64())
	}
	return out
}

func anon() float64 {
	n, err := benchmesh.AnonRSS(os.Getpid())
	if err != nil {
		fmt.Fprintln(os.Stderr, "runtimeheld:", err)
		os.Exit(1)
	}
	return float64(n)
}

const (
	other    = "/memory/classes/other:bytes"
	metadata = "/memory/classes/metadata/other:bytes"
	heapUsed = "/memory/classes/heap/objects:bytes"
)

func socketPeak(n int) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	open := func() ([]net.Conn, error) {
		var conns []net.Conn
		for len(conns) < n {
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				return conns, err
			}
			s, err := ln.Accept()
			if err != nil {
				c.Close()
				return conns, err
			}
			conns = append(conns, c, s)
		}
		return conns, nil
	}
	closeAll := func(conns []net.Conn) {
		for _, c := range conns {
			c.Close()
		}
	}
	debug.FreeOSMemory()
	start, anon0 := class(other)[0], anon()
	conns, err := open()
	closeAll(conns)
	if err != nil {
		return fmt.Errorf("socket %d: %w", len(conns), err)
	}
	peak := class(other)[0]
	debug.FreeOSMemory()
	after, anon1 := class(other)[0], anon()
	conns, err = open()
	closeAll(conns)
	if err != nil {
		return errors.Join(fmt.Errorf("again, socket %d", len(conns)), err)
	}
	again := class(other)[0]
	sockets := float64(len(conns))
	benchmesh.Report("runtimeheld_sockets", sockets, "sockets")
	benchmesh.Report("runtimeheld_other_bytes_per_socket", (peak-start)/sockets, "B")
	benchmesh.Report("runtimeheld_other_after_close_mib", (after-start)/(1<<20), "MiB")
	benchmesh.Report("runtimeheld_anon_after_close_mib", (anon1-anon0)/(1<<20), "MiB")
	benchmesh.Report("runtimeheld_other_second_peak_mib", (again-after)/(1<<20), "MiB")
	return nil
}

var keep []any

func sizeClasses() {
	debug.FreeOSMemory()
	start, anon0 := class(metadata)[0], anon()
	for _, size := range smallSizes {
		keep = append(keep, make([]byte, size), make([]*byte, size/8)) // without pointers and with
	}
	for range 3 {
		runtime.GC()
	}
	peak := class(metadata)[0]
	keep = nil
	debug.FreeOSMemory()
	after, anon1 := class(metadata)[0], anon()
	benchmesh.Report("runtimeheld_span_classes", float64(2*len(smallSizes)), "classes")
	benchmesh.Report("runtimeheld_metadata_other_peak_mib", (peak-start)/(1<<20), "MiB")
	benchmesh.Report("runtimeheld_metadata_other_after_free_mib", (after-start)/(1<<20), "MiB")
	benchmesh.Report("runtimeheld_anon_after_free_mib", (anon1-anon0)/(1<<20), "MiB")
}

func goroutinePeak(n int) {
	debug.FreeOSMemory()
	start := class(heapUsed)[0]
	var started, wg sync.WaitGroup
	release := make(chan struct{})
	started.Add(n)
	for range n {
		wg.Go(func() {
			started.Done()
			<-release
		})
	}
	started.Wait()
	close(release)
	wg.Wait()
	debug.FreeOSMemory()
	after := class(heapUsed)[0]
	benchmesh.Report("runtimeheld_goroutines", float64(n), "goroutines")
	benchmesh.Report("runtimeheld_heap_bytes_per_ended_goroutine", (after-start)/float64(n), "B")
}
