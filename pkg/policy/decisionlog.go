package policy

import (
	"context"
	"strings"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// DefaultMaskedHeaders are replaced by Masked in decision logs, in the input
// (request headers) and in the result (headers the policy adds).
var DefaultMaskedHeaders = []string{"authorization", "proxy-authorization", "cookie", "set-cookie"}

// Masked replaces masked values in decision logs.
const Masked = "<masked>"

// DecisionLogOptions configures a DecisionLogger.
type DecisionLogOptions struct {
	// Buffer is how many decisions may wait to be written (default 1024);
	// past that, decisions are dropped and counted, never waited for.
	Buffer int
	// MaskHeaders are masked in addition to DefaultMaskedHeaders (any case).
	MaskHeaders []string
	// LogBodies keeps body and parsed_body in logged inputs (default masked:
	// bodies carry passwords and tokens as often as headers do).
	LogBodies bool
	// Registerer, if set, registers the logger's counters.
	Registerer prometheus.Registerer
}

// DecisionEvent is one decision to log.
type DecisionEvent struct {
	Decision Decision
	Path     string
	Input    ast.Value // nil when the input could not be built
	Result   any       // the policy's result (an ast.Value from Engine), nil when undefined
	Time     time.Time
	Duration time.Duration
}

// DecisionLogger writes decisions as zap JSON lines from its own goroutine
// (Run), so logging never slows a request: when the queue is full the
// decision is dropped and counted.
type DecisionLogger struct {
	log       *zap.Logger
	ch        chan DecisionEvent
	mask      map[string]bool
	logBodies bool

	dropped      atomic.Uint64
	droppedTotal prometheus.Counter
	written      prometheus.Counter
}

// NewDecisionLogger builds a decision logger writing to log; call Run.
func NewDecisionLogger(log *zap.Logger, opts DecisionLogOptions) (*DecisionLogger, error) {
	if log == nil {
		log = zap.NewNop()
	}
	if opts.Buffer <= 0 {
		opts.Buffer = 1024
	}
	mask := map[string]bool{}
	for _, h := range DefaultMaskedHeaders {
		mask[h] = true
	}
	for _, h := range opts.MaskHeaders {
		mask[strings.ToLower(h)] = true
	}
	dropped := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "policy_decision_logs_dropped_total",
		Help: "Decision log entries dropped because the log queue was full.",
	})
	written := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "policy_decision_logs_written_total",
		Help: "Decision log entries written.",
	})
	if opts.Registerer != nil {
		for _, c := range []prometheus.Collector{dropped, written} {
			if err := register(opts.Registerer, c); err != nil {
				return nil, err
			}
		}
	}
	return &DecisionLogger{
		log:          log,
		ch:           make(chan DecisionEvent, opts.Buffer),
		mask:         mask,
		logBodies:    opts.LogBodies,
		droppedTotal: dropped,
		written:      written,
	}, nil
}

// Log queues ev without blocking; it reports false when ev was dropped.
func (l *DecisionLogger) Log(ev DecisionEvent) bool {
	select {
	case l.ch <- ev:
		return true
	default:
		l.dropped.Add(1)
		l.droppedTotal.Inc()
		return false
	}
}

// Dropped is the number of decisions dropped so far.
func (l *DecisionLogger) Dropped() uint64 { return l.dropped.Load() }

// Run writes queued decisions until ctx ends, then writes what is already
// queued and returns.
func (l *DecisionLogger) Run(ctx context.Context) {
	for {
		select {
		case ev := <-l.ch:
			l.write(ev)
		case <-ctx.Done():
			for {
				select {
				case ev := <-l.ch:
					l.write(ev)
				default:
					_ = l.log.Sync()
					return
				}
			}
		}
	}
}

func (l *DecisionLogger) write(ev DecisionEvent) {
	d := ev.Decision
	fields := []zap.Field{
		zap.String("decision_id", d.ID),
		zap.String("revision", d.Revision),
		zap.String("path", ev.Path),
		zap.Bool("allowed", d.Allowed),
		zap.Int("status", d.Status),
		zap.String("reason", d.Reason),
		zap.Time("timestamp", ev.Time),
		zap.Duration("duration", ev.Duration),
	}
	if ev.Input != nil {
		if in, err := ast.JSON(ev.Input); err == nil {
			fields = append(fields, zap.Any("input", l.maskInput(in)))
		} else {
			fields = append(fields, zap.String("input_error", err.Error()))
		}
	}
	if ev.Result != nil {
		res := ev.Result
		if v, ok := res.(ast.Value); ok {
			if j, err := ast.JSON(v); err == nil {
				res = j
			}
		}
		fields = append(fields, zap.Any("result", l.maskResult(res)))
	}
	l.log.Info("decision", fields...)
	l.written.Inc()
}

// maskInput masks headers (attributes.request.http.headers) and, unless
// bodies are logged, body and parsed_body. in is a fresh copy from ast.JSON,
// so it is changed in place.
func (l *DecisionLogger) maskInput(in any) any {
	root, ok := in.(map[string]any)
	if !ok {
		return in
	}
	httpReq := dig(root, "attributes", "request", "http")
	if httpReq != nil {
		if h, ok := httpReq["headers"].(map[string]any); ok {
			for k := range h {
				if l.mask[strings.ToLower(k)] {
					h[k] = Masked
				}
			}
		}
		if !l.logBodies {
			if _, ok := httpReq["body"]; ok {
				httpReq["body"] = Masked
			}
		}
	}
	if !l.logBodies {
		if v, ok := root["parsed_body"]; ok && v != nil {
			root["parsed_body"] = Masked
		}
	}
	return root
}

// maskResult masks header values the policy returns. The result is shared
// with nobody once the decision is made, but it is copied anyway so the
// logger never writes to memory it did not create.
func (l *DecisionLogger) maskResult(res any) any {
	obj, ok := res.(map[string]any)
	if !ok {
		return res
	}
	out := make(map[string]any, len(obj))
	for k, v := range obj {
		switch k {
		case "headers", "response_headers_to_add":
			out[k] = l.maskHeaderValue(v)
		case "body":
			if l.logBodies {
				out[k] = v
			} else {
				out[k] = Masked
			}
		default:
			out[k] = v
		}
	}
	return out
}

func (l *DecisionLogger) maskHeaderValue(v any) any {
	switch v := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(v))
		for k, hv := range v {
			if l.mask[strings.ToLower(k)] {
				m[k] = Masked
			} else {
				m[k] = hv
			}
		}
		return m
	case []any:
		arr := make([]any, len(v))
		for i, e := range v {
			arr[i] = l.maskHeaderValue(e)
		}
		return arr
	default:
		return v
	}
}

// MaskHeader reports whether a header's value is masked in decision logs.
func (l *DecisionLogger) MaskHeader(name string) bool {
	return l.mask[strings.ToLower(name)]
}

func dig(m map[string]any, keys ...string) map[string]any {
	for _, k := range keys {
		next, ok := m[k].(map[string]any)
		if !ok {
			return nil
		}
		m = next
	}
	return m
}
