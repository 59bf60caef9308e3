package bootstrap

import (
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"strconv"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"go.uber.org/zap"
)

// DefaultGCPercent is the proxies' heap growth between collections. A
// proxy's live heap is small and its CPU goes to every request, so it
// trades memory for CPU: against Go's 100, 400 took ~14 % off the
// waypoint's CPU per request for ~27 MB more resident memory under the
// waypoint benchmark (bench/README.md).
const DefaultGCPercent = 400

// tuneMemory sets the garbage collector's target to gcPercent unless GOGC
// is set, and, unless GOMEMLIMIT is set, a soft memory limit at 90 % of
// the container's (cgroup) memory limit, so that the larger heap target
// makes the collector work harder near the limit instead of running the
// pod out of memory.
func tuneMemory(gcPercent int, log *zap.Logger) error {
	if gcPercent <= 0 {
		return fmt.Errorf("--gc-percent %d: want > 0", gcPercent)
	}
	gc := "GOGC " + os.Getenv("GOGC")
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(gcPercent)
		gc = "--gc-percent " + strconv.Itoa(gcPercent)
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
	return nil
}
