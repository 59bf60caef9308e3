package policy

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
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

	inputRedaction, resultRedaction *redaction

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
	l := &DecisionLogger{
		log:          log,
		ch:           make(chan DecisionEvent, opts.Buffer),
		mask:         mask,
		logBodies:    opts.LogBodies,
		droppedTotal: dropped,
		written:      written,
	}
	l.newRedactions()
	return l, nil
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
	fields := make([]zap.Field, 0, 10)
	fields = append(fields,
		zap.String("decision_id", d.ID),
		zap.String("revision", d.Revision),
		zap.String("path", ev.Path),
		zap.Bool("allowed", d.Allowed),
		zap.Int("status", d.Status),
		zap.String("reason", d.Reason),
		zap.Time("timestamp", ev.Time),
		zap.Duration("duration", ev.Duration),
	)
	if ev.Input != nil {
		fields = append(fields, astField("input", ev.Input, l.inputRedaction))
	}
	switch res := ev.Result.(type) {
	case nil:
	case ast.Value:
		fields = append(fields, astField("result", res, l.resultRedaction))
	default:
		fields = append(fields, zap.Any("result", res))
	}
	l.log.Info("decision", fields...)
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

func (r *redaction) field(name string) *redaction {
	if r == nil || r.fields == nil {
		return nil
	}
	return r.fields[name]
}

// astField renders v as ast.JSON would (sets as arrays, non-string keys as
// their JSON text), straight from the ast value into zap's encoder: no
// intermediate Go maps and no reflection. Values that are not ground (never
// produced by evaluation or BuildInput) are written as their Rego text.
func astField(key string, v ast.Value, r *redaction) zap.Field {
	switch v := v.(type) {
	case ast.Object:
		return zap.Object(key, astObject{v, r})
	case *ast.Array, ast.Set:
		return zap.Array(key, astArray{v, r})
	}
	return zap.Inline(astMember{key, v, r})
}

// astMember is one member of a JSON object.
type astMember struct {
	key string
	v   ast.Value
	r   *redaction
}

func (m astMember) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	if m.r != nil && m.r.mask {
		if _, null := m.v.(ast.Null); !null {
			enc.AddString(m.key, Masked)
			return nil
		}
	}
	switch v := m.v.(type) {
	case ast.String:
		enc.AddString(m.key, string(v))
	case ast.Boolean:
		enc.AddBool(m.key, bool(v))
	case ast.Number:
		if i, ok := v.Int64(); ok {
			enc.AddInt64(m.key, i)
		} else {
			return enc.AddReflected(m.key, json.Number(v))
		}
	case ast.Null:
		return enc.AddReflected(m.key, nil)
	case ast.Object:
		return enc.AddObject(m.key, astObject{v, m.r})
	case *ast.Array, ast.Set:
		return enc.AddArray(m.key, astArray{v, m.r})
	default:
		enc.AddString(m.key, v.String())
	}
	return nil
}

type astObject struct {
	obj ast.Object
	r   *redaction
}

func (o astObject) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	return o.obj.Iter(func(k, v *ast.Term) error {
		name, ok := k.Value.(ast.String)
		if !ok {
			name = ast.String(jsonKey(k.Value))
		}
		m := astMember{key: string(name), v: v.Value, r: o.r.field(string(name))}
		if o.r != nil && o.r.headers != nil && o.r.headers(string(name)) {
			m.r = &redaction{mask: true}
		}
		return m.MarshalLogObject(enc)
	})
}

// jsonKey is the member name ast.JSON gives a non-string key: its JSON text.
func jsonKey(k ast.Value) string {
	if x, err := ast.JSON(k); err == nil {
		if b, err := json.Marshal(x); err == nil {
			return string(b)
		}
	}
	return k.String()
}

type astArray struct {
	v ast.Value // *ast.Array or ast.Set
	r *redaction
}

func (a astArray) MarshalLogArray(enc zapcore.ArrayEncoder) error {
	appendElem := func(t *ast.Term) error {
		switch v := t.Value.(type) {
		case ast.String:
			enc.AppendString(string(v))
		case ast.Boolean:
			enc.AppendBool(bool(v))
		case ast.Number:
			if i, ok := v.Int64(); ok {
				enc.AppendInt64(i)
			} else {
				return enc.AppendReflected(json.Number(v))
			}
		case ast.Null:
			return enc.AppendReflected(nil)
		case ast.Object:
			return enc.AppendObject(astObject{v, a.r})
		case *ast.Array, ast.Set:
			return enc.AppendArray(astArray{v, a.r})
		default:
			enc.AppendString(v.String())
		}
		return nil
	}
	switch v := a.v.(type) {
	case *ast.Array:
		for i := range v.Len() {
			if err := appendElem(v.Elem(i)); err != nil {
				return err
			}
		}
	case ast.Set:
		return v.Iter(appendElem)
	}
	return nil
}
