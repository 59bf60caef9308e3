package bootstrap

import (
	"context"
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"go.uber.org/zap"
)

// DefaultGCPercent is the proxies' heap growth between collections. A
// proxy's live heap is small and its CPU goes to every request, so it
// trades memory for CPU: against Go's 100, 400 took ~14 % off the
// waypoint's CPU per request for ~27 MB more resident memory under the
// waypoint benchmark (bench/README.md).
const DefaultGCPercent = 400

// Idle memory. Under load the heap grows to gcPercent above the live heap
// (at most busyHeadroom above it), and Go returns freed pages lazily (its scavenger keeps about the heap
// goal), so a proxy would hold its peak long after the load ended. After
// idleAfter checks in a row each finding less than idleAlloc allocated
// since the one before, the process is idle: the collector's target drops
// to idleGCPercent and the freed heap goes back to the system at once, and
// again every idleRelease while anything was allocated (what ends after
// the load, such as pooled connections closing once idle, frees more). The
// first busy check restores gcPercent (busyGCPercent), within idleCheck
// of the load's return. A collection that runs while idle (what the load
// left, such as pooled connections closing, reaching the idle target)
// frees pages the scavenger would keep up to the heap goal: once it left
// idleFree of them, they go back at the next check.
const (
	idleCheck     = time.Second
	idleAfter     = 5
	idleAlloc     = 512 << 10
	idleRelease   = 30 * time.Second
	idleFree      = 1 << 20
	idleGCPercent = 100
)

// busyHeadroom bounds the garbage the collector lets build up while the
// process is busy: gcPercent of the live heap, but no more than this
// (nor less than idleGCPercent). A small heap keeps the CPU 400 saves; a
// large one does not hold four times itself in garbage: a node proxy
// holding 10,000 connections (a ~20 MB live heap) let ~80 MB build up,
// and the connections of a burst, opened among that garbage, kept about
// 1 KiB of heap pages each in use after it was collected (issue 36:
// memory per idle connection).
const busyHeadroom = 16 << 20

// busyGCPercent is the GC target while busy with a live heap of live
// bytes, in steps of 25 so that it seldom changes.
func busyGCPercent(gcPercent int, live uint64) int {
	if live == 0 {
		return gcPercent
	}
	p := int(min(busyHeadroom*100/live, uint64(gcPercent)))
	return max(p/25*25, min(idleGCPercent, gcPercent))
}

// tuneMemory sets the garbage collector's target to gcPercent unless GOGC
// is set, and, unless GOMEMLIMIT is set, a soft memory limit at 90 % of
// the container's (cgroup) memory limit, so that the larger heap target
// makes the collector work harder near the limit instead of running the
// pod out of memory. The idleMemory it returns releases memory after load
// once it runs.
func tuneMemory(gcPercent int, log *zap.Logger) (*idleMemory, error) {
	if gcPercent <= 0 {
		return nil, fmt.Errorf("--gc-percent %d: want > 0", gcPercent)
	}
	gc := "GOGC " + os.Getenv("GOGC")
	im := &idleMemory{busyPercent: gcPercent, percent: gcPercent, log: log}
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(gcPercent)
		gc = "--gc-percent " + strconv.Itoa(gcPercent)
		im.adapt = true
	}
	limit, err := memlimit.Set(memlimit.WithRatio(0.9), memlimit.WithProvider(memlimit.FromCgroup))
	if err != nil {
		// No readable cgroup: run without a soft limit, as Go does by default.
		log.Warn("no memory limit from the cgroup", zap.Error(err))
	}
	fields := []zap.Field{zap.String("gc", gc)}
	if limit > 0 && limit < math.MaxInt64 {
		fields = append(fields, zap.Int64("memory_limit_bytes", limit))
	}
	log.Info("memory", fields...)
	return im, nil
}

// idleMemory follows the process between busy and idle (see idleCheck).
type idleMemory struct {
	busyPercent int
	adapt       bool // the GC target is ours to change (GOGC is not set)
	percent     int  // the GC target set last
	log         *zap.Logger

	idle      bool
	quiet     int    // checks in a row that found the process quiet
	allocated uint64 // heap bytes allocated so far, at the last check
	released  uint64 // and at the last release
	cycles    uint64 // collections completed by the end of the last release
	sinceFree time.Duration
	sample    [len(heapMetrics)]metrics.Sample
}

// heapMetrics are what a check reads, in heapReading's order.
var heapMetrics = [...]string{"/gc/heap/allocs:bytes", "/gc/heap/live:bytes", "/memory/classes/heap/free:bytes", "/gc/cycles/total:gc-cycles"}

// heapReading is the heap at a check.
type heapReading struct {
	allocated uint64 // bytes allocated so far
	live      uint64 // live bytes, as of the last collection
	free      uint64 // freed pages not returned to the system
	cycles    uint64 // collections completed so far
}

// read reads the heap now.
func (m *idleMemory) read() heapReading {
	for i, name := range heapMetrics {
		m.sample[i].Name = name
	}
	metrics.Read(m.sample[:])
	return heapReading{m.sample[0].Value.Uint64(), m.sample[1].Value.Uint64(), m.sample[2].Value.Uint64(), m.sample[3].Value.Uint64()}
}

// run checks every idleCheck until ctx ends. The process starts busy
// (loading configuration and certificates), so its first quiet spell also
// returns what start-up left behind.
func (m *idleMemory) run(ctx context.Context) {
	t := time.NewTicker(idleCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.step(m.read())
		}
	}
}

// step moves to busy or idle given the heap now, one idleCheck after the
// last step.
func (m *idleMemory) step(h heapReading) {
	busy := h.allocated-m.allocated >= idleAlloc
	m.allocated = h.allocated
	m.sinceFree += idleCheck
	if busy {
		m.setPercent(busyGCPercent(m.busyPercent, h.live))
		m.idle, m.quiet = false, 0
		return
	}
	m.quiet++
	switch {
	case !m.idle && m.quiet >= idleAfter:
		m.idle = true
		m.setPercent(idleGCPercent)
		m.release()
	case m.idle && m.sinceFree >= idleRelease && h.allocated != m.released:
		m.release()
	case m.idle && h.cycles != m.cycles && h.free >= idleFree:
		m.release()
	}
}

// setPercent sets the GC target, if it is ours to set.
func (m *idleMemory) setPercent(p int) {
	if m.adapt && p != m.percent {
		debug.SetGCPercent(p)
		m.percent = p
	}
}

// release collects twice, the first moving sync.Pools' contents to their
// victim caches and the second (FreeOSMemory's) dropping them, and returns
// every free page to the system.
func (m *idleMemory) release() {
	runtime.GC()
	debug.FreeOSMemory()
	m.released, m.cycles, m.sinceFree = m.allocated, m.read().cycles, 0
	m.log.Debug("idle: freed heap returned to the system")
}
