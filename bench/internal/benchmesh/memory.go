package benchmesh

import "fmt"

// RuntimeMetrics are the Go runtime's figures a mesh process's /metrics
// page gives (client_golang's Go collector). Each is a sum of
// runtime/metrics' /memory/classes (go_collector.go there says which).
var RuntimeMetrics = []string{
	"go_goroutines", "go_threads",
	"go_memstats_sys_bytes",           // /memory/classes/total
	"go_memstats_heap_alloc_bytes",    // heap/objects
	"go_memstats_heap_inuse_bytes",    // heap/objects + heap/unused
	"go_memstats_heap_idle_bytes",     // heap/free + heap/released
	"go_memstats_heap_released_bytes", // heap/released
	"go_memstats_heap_objects",
	"go_memstats_stack_inuse_bytes", // heap/stacks
	"go_memstats_stack_sys_bytes",   // heap/stacks + os-stacks
	"go_memstats_mspan_sys_bytes",   // metadata/mspan/{inuse,free}
	"go_memstats_mspan_inuse_bytes", // metadata/mspan/inuse
	"go_memstats_mcache_sys_bytes",  // metadata/mcache/{inuse,free}
	"go_memstats_buck_hash_sys_bytes",
	"go_memstats_gc_sys_bytes",    // metadata/other
	"go_memstats_other_sys_bytes", // other
}

// Memory is what a Go process of the mesh holds at one moment: resident
// memory by kind from /proc/<pid>/status, and the Go runtime's memory
// classes from its /metrics page.
type Memory struct {
	RSS, RSSFile, RSSAnon int64
	FDs                   int
	Runtime               map[string]float64 // RuntimeMetrics by name
}

// ReadMemory reads process pid, whose metrics page is metricsURL.
func ReadMemory(pid int, metricsURL string) (Memory, error) {
	var m Memory
	var err error
	for _, f := range []struct {
		read func(int) (int64, error)
		to   *int64
	}{{RSS, &m.RSS}, {FileRSS, &m.RSSFile}, {AnonRSS, &m.RSSAnon}} {
		if *f.to, err = f.read(pid); err != nil {
			return m, err
		}
	}
	if m.FDs, err = OpenFiles(pid); err != nil {
		return m, err
	}
	// Scraped last: the page is made for the request, and a reading
	// before it would count its garbage.
	if m.Runtime, err = Scrape(metricsURL, RuntimeMetrics...); err != nil {
		return m, fmt.Errorf("pid %d: %w", pid, err)
	}
	return m, nil
}

// RuntimeHeld is all the Go runtime took from the system and holds (heap
// with its free pages not yet returned, stacks, its own structures: the
// runtime/metrics class /memory/classes/total less heap/released). It
// counts mapped memory, whether or not it was ever touched: RSSAnon is
// what of it is resident.
func (m Memory) RuntimeHeld() float64 {
	return m.Runtime["go_memstats_sys_bytes"] - m.Runtime["go_memstats_heap_released_bytes"]
}

// HeapFree is freed heap not yet returned to the system
// (/memory/classes/heap/free).
func (m Memory) HeapFree() float64 {
	return m.Runtime["go_memstats_heap_idle_bytes"] - m.Runtime["go_memstats_heap_released_bytes"]
}

// Report prints the figures as <prefix>_<figure>_<when>_<unit>: resident
// memory by kind, open files, and what the runtime holds by class.
func (m Memory) Report(prefix, when string) {
	mib := func(figure string, bytes float64) {
		Report(prefix+"_"+figure+"_"+when+"_mib", bytes/(1<<20), "MiB")
	}
	rt := func(name string) float64 { return m.Runtime[name] }
	mib("rss", float64(m.RSS))
	mib("rss_file", float64(m.RSSFile))
	mib("rss_anon", float64(m.RSSAnon))
	Report(prefix+"_fds_"+when, float64(m.FDs), "fds")
	Report(prefix+"_goroutines_"+when, rt("go_goroutines"), "goroutines")
	Report(prefix+"_threads_"+when, rt("go_threads"), "threads")
	mib("heap", rt("go_memstats_heap_inuse_bytes"))
	mib("heap_objects", rt("go_memstats_heap_alloc_bytes"))
	mib("heap_free", m.HeapFree())
	mib("stack", rt("go_memstats_stack_inuse_bytes"))
	mib("os_stacks", rt("go_memstats_stack_sys_bytes")-rt("go_memstats_stack_inuse_bytes"))
	mib("mspan", rt("go_memstats_mspan_sys_bytes"))
	mib("mspan_free", rt("go_memstats_mspan_sys_bytes")-rt("go_memstats_mspan_inuse_bytes"))
	mib("mcache", rt("go_memstats_mcache_sys_bytes"))
	mib("profiling_buckets", rt("go_memstats_buck_hash_sys_bytes"))
	mib("metadata_other", rt("go_memstats_gc_sys_bytes"))
	mib("other", rt("go_memstats_other_sys_bytes"))
	mib("runtime_held", m.RuntimeHeld())
}
