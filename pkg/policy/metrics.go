package policy

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// engineMetrics counts decisions and policy (re)loads.
type engineMetrics struct {
	allow, deny, errorDeny, badRequest, cancelled prometheus.Counter
	activated, rejected                           prometheus.Counter
	cacheHit, cacheMiss                           prometheus.Counter
	readFailed                                    prometheus.Counter
	revision                                      *prometheus.GaugeVec // 1 for the active revision
}

func newEngineMetrics(reg prometheus.Registerer) (*engineMetrics, error) {
	decisions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "policy_decisions_total",
		Help: "Authorization decisions by result: allow, deny (policy said no or nothing), error (fail-closed deny), bad_request, cancelled (the caller gave up during evaluation; denied).",
	}, []string{"result"})
	loads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "policy_loads_total",
		Help: "Policy sets offered for activation, by result: activated or rejected.",
	}, []string{"result"})
	cache := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "policy_decision_cache_total",
		Help: "Decisions looked up in the decision cache, by result: hit (result reused) or miss (evaluated).",
	}, []string{"result"})
	readFailed := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "policy_source_read_failures_total",
		Help: "Reads of the policy directory or fetches of its Git repository that failed (the active policy stays).",
	})
	revision := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "policy_active_revision",
		Help: "1 for the active policy's revision (a Git commit SHA, a bundle revision or a content hash).",
	}, []string{"revision"})
	if err := register(reg, decisions, loads, cache, readFailed, revision); err != nil {
		return nil, err
	}
	return &engineMetrics{
		allow:      decisions.WithLabelValues("allow"),
		deny:       decisions.WithLabelValues("deny"),
		errorDeny:  decisions.WithLabelValues("error"),
		badRequest: decisions.WithLabelValues("bad_request"),
		cancelled:  decisions.WithLabelValues("cancelled"),
		activated:  loads.WithLabelValues("activated"),
		rejected:   loads.WithLabelValues("rejected"),
		cacheHit:   cache.WithLabelValues("hit"),
		cacheMiss:  cache.WithLabelValues("miss"),
		readFailed: readFailed,
		revision:   revision,
	}, nil
}

// register registers cs with reg (nil: the metrics are kept but not
// exported).
func register(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return fmt.Errorf("policy metrics: %w (one registry per engine)", err)
			}
			return fmt.Errorf("policy metrics: %w", err)
		}
	}
	return nil
}
