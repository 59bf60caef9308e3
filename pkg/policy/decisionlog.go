package policy

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/causeway-mesh/causeway/pkg/logging"
)

// DefaultMaskedHeaders are replaced by Masked in decision logs, in the input
// (request headers) and in the result (headers the policy adds).
var DefaultMaskedHeaders = []string{"authorization", "proxy-authorization", "cookie", "set-cookie"}

// Masked replaces masked values in decision logs.
const Masked = "<masked>"

// DecisionLogMode says which decisions are logged.
type DecisionLogMode string

const (
	// LogAllDecisions logs every decision (DecisionLogOptions' default; the
	// waypoint command defaults to LogDenials).
	LogAllDecisions DecisionLogMode = "all"
	// LogDenials logs decisions that deny (policy denials, requests whose
	// input cannot be built, evaluation errors); allowed requests are left
	// to the access log, which names their decision id.
	LogDenials DecisionLogMode = "denied"
	// LogNoDecisions logs none.
	LogNoDecisions DecisionLogMode = "none"
)

// ParseDecisionLogMode reads "all", "denied" or "none".
func ParseDecisionLogMode(s string) (DecisionLogMode, error) {
	switch m := DecisionLogMode(s); m {
	case LogAllDecisions, LogDenials, LogNoDecisions:
		return m, nil
	}
	return "", fmt.Errorf("decision log mode %q: want all, denied or none", s)
}

// DecisionLogOptions configures a DecisionLogger.
type DecisionLogOptions struct {
	// Mode says which decisions are logged ("": all) when the policy's
	// settings do not say (SettingsFile).
	Mode DecisionLogMode
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
	Input    ast.Value // nil when the input could not be built (or doc holds it)
	Result   any       // the policy's result (an ast.Value from Engine), nil when undefined
	Time     time.Time
	Duration time.Duration

	doc *inputDoc // a request's input, written without building its value
}

// DecisionLogger writes decisions as zap JSON lines from its own goroutine
// (Run), so logging never slows a request: when the queue is full the
// decision is dropped and counted.
type DecisionLogger struct {
	log       *zap.Logger
	mode      DecisionLogMode
	ch        chan DecisionEvent
	mask      map[string]bool
	logBodies bool

	inputRedaction, resultRedaction *redaction
	// Only touched by write (Run's goroutine):
	termJSON termJSON
	fields   []zap.Field
	lineSize int

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
	if opts.Mode == "" {
		opts.Mode = LogAllDecisions
	}
	if _, err := ParseDecisionLogMode(string(opts.Mode)); err != nil {
		return nil, err
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
	if err := register(opts.Registerer, dropped, written); err != nil {
		return nil, err
	}
	l := &DecisionLogger{
		log:          log,
		mode:         opts.Mode,
		ch:           make(chan DecisionEvent, opts.Buffer),
		mask:         mask,
		logBodies:    opts.LogBodies,
		termJSON:     termJSON{},
		droppedTotal: dropped,
		written:      written,
	}
	l.newRedactions()
	return l, nil
}

// wants reports whether decision d is logged in mode m.
func (m DecisionLogMode) wants(d Decision) bool {
	switch m {
	case LogNoDecisions:
		return false
	case LogDenials:
		return !d.Allowed
	}
	return true
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
	fields := append(l.fields[:0],
		zap.String("decision_id", d.ID),
		zap.String("revision", d.Revision),
		zap.String("path", ev.Path),
		zap.Bool("allowed", d.Allowed),
		zap.Int("status", d.Status),
		zap.String("reason", d.Reason),
		zap.Time("timestamp", ev.Time),
		zap.Duration("duration", ev.Duration),
	)
	// One buffer for both values, sized after the last line. It is not
	// reused: a core may keep the values (zaptest's observer does), while
	// it copies the fields slice, which is.
	buf := make([]byte, 0, l.lineSize)
	switch {
	case ev.doc != nil:
		buf = ev.doc.appendJSON(buf, l.inputRedaction, l.termJSON)
		fields = append(fields, zap.Reflect("input", logging.RawJSON(buf)))
	case ev.Input != nil:
		buf = appendJSON(buf, ev.Input, l.inputRedaction)
		fields = append(fields, zap.Reflect("input", logging.RawJSON(buf)))
	}
	switch res := ev.Result.(type) {
	case nil:
	case ast.Value:
		n := len(buf)
		buf = appendJSON(buf, res, l.resultRedaction)
		fields = append(fields, zap.Reflect("result", logging.RawJSON(buf[n:])))
	default:
		fields = append(fields, zap.Any("result", res))
	}
	l.log.Info("decision", fields...)
	l.lineSize = min(max(len(buf)+len(buf)/8, 1024), 64<<10)
	clear(fields)
	l.fields = fields[:0]
	l.written.Inc()
}

// MaskHeader reports whether a header's value is masked in decision logs.
func (l *DecisionLogger) MaskHeader(name string) bool {
	return l.mask[strings.ToLower(name)]
}

// redaction says which parts of a logged value are replaced by Masked: the
// members of an object named in fields follow their own rule; a value with
// mask set is replaced (unless null); headers masks the values of an
// object's members whose lower-cased names it reports. A rule applies to
// each element when it meets an array (OPA-Envoy accepts arrays of header
// objects).
type redaction struct {
	fields  map[string]*redaction
	mask    bool
	headers func(name string) bool
}

// newRedactions builds the rules for inputs (attributes.request.http.headers,
// and body and parsed_body unless bodies are logged) and results (the
// headers a policy adds, and its body unless bodies are logged).
func (l *DecisionLogger) newRedactions() {
	headers := &redaction{headers: l.MaskHeader}
	body := &redaction{mask: !l.logBodies}
	l.inputRedaction = &redaction{fields: map[string]*redaction{
		"attributes": {fields: map[string]*redaction{
			"request": {fields: map[string]*redaction{
				"http": {fields: map[string]*redaction{"headers": headers, "body": body}},
			}},
		}},
		"parsed_body": body,
	}}
	l.resultRedaction = &redaction{fields: map[string]*redaction{
		"headers":                 headers,
		"response_headers_to_add": headers,
		"body":                    body,
	}}
}

// member is the rule for the member name of an object r applies to.
func (r *redaction) member(name string) *redaction {
	if r == nil {
		return nil
	}
	if r.headers != nil && r.headers(name) {
		return maskValue
	}
	return r.fields[name]
}

// maskValue replaces a whole value (a masked header's).
var maskValue = &redaction{mask: true}
