// Package logging builds the zap loggers every Causeway binary uses: JSON for
// production, console for development, with a level that the admin endpoint
// can change while the process runs.
package logging

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Logger is a zap logger plus the handle that changes its level at runtime.
type Logger struct {
	*zap.Logger
	Level zap.AtomicLevel

	enc           zapcore.Encoder
	out           zapcore.WriteSyncer // Options.Output, locked: every core writes through it
	flushInterval time.Duration

	mu       sync.Mutex
	buffered []*zapcore.BufferedWriteSyncer
}

// Options selects the encoding and the initial level.
type Options struct {
	// Format is "json" (production, default) or "console" (development).
	Format string
	// Level is a zap level name: debug, info, warn, error.
	Level string
	// FlushInterval is how long lines of Buffered loggers may wait before
	// they are written (0: they are written at once).
	FlushInterval time.Duration
	// Output receives every line (default: stderr).
	Output zapcore.WriteSyncer
}

// bufferSize bounds what a Buffered logger holds before it writes.
const bufferSize = 256 << 10

// New builds a logger writing to stderr.
func New(opts Options) (*Logger, error) {
	level := zap.NewAtomicLevel()
	if opts.Level != "" {
		if err := level.UnmarshalText([]byte(opts.Level)); err != nil {
			return nil, fmt.Errorf("log level %q: %w", opts.Level, err)
		}
	}
	var (
		enc  zapcore.Encoder
		zopt []zap.Option
	)
	switch opts.Format {
	case "", "json":
		ec := zap.NewProductionEncoderConfig()
		ec.EncodeTime = zapcore.RFC3339NanoTimeEncoder
		ec.NewReflectedEncoder = newReflectedEncoder
		enc = newFastJSON(ec)
		zopt = []zap.Option{zap.AddStacktrace(zap.ErrorLevel)}
	case "console":
		ec := zap.NewDevelopmentEncoderConfig()
		ec.NewReflectedEncoder = newReflectedEncoder
		enc = zapcore.NewConsoleEncoder(ec)
		zopt = []zap.Option{zap.AddStacktrace(zap.WarnLevel), zap.Development()}
	default:
		return nil, fmt.Errorf("log format %q: want json or console", opts.Format)
	}
	if opts.FlushInterval < 0 {
		return nil, fmt.Errorf("log flush interval %v: want >= 0", opts.FlushInterval)
	}
	// No sampling: access logs must not be sampled away.
	out := opts.Output
	if out == nil {
		out = os.Stderr
	}
	out = zapcore.Lock(out)
	l := zap.New(zapcore.NewCore(enc, out, level), append(zopt, zap.AddCaller(), zap.ErrorOutput(out))...)
	return &Logger{Logger: l, Level: level, enc: enc, out: out, flushInterval: opts.FlushInterval}, nil
}

// Buffered returns a logger named name with l's encoding and level, for
// the lines whose number follows traffic (access and decision logs): they
// are written in batches, at the latest after the flush interval, instead
// of a write syscall each, as Envoy buffers its access log files. Lines have
// no caller annotation (it would be the same on every line, and costs a
// stack walk each). fields go on every line. Sync writes out what is
// buffered.
func (l *Logger) Buffered(name string, fields ...zap.Field) *zap.Logger {
	named := l.Logger.Named(name).WithOptions(zap.WithCaller(false))
	if l.flushInterval == 0 {
		return named.With(fields...)
	}
	ws := &zapcore.BufferedWriteSyncer{WS: l.out, Size: bufferSize, FlushInterval: l.flushInterval}
	l.mu.Lock()
	l.buffered = append(l.buffered, ws)
	l.mu.Unlock()
	return named.WithOptions(zap.WrapCore(func(zapcore.Core) zapcore.Core {
		return zapcore.NewCore(l.enc.Clone(), ws, l.Level)
	})).With(fields...)
}

// Sync writes out every buffered line.
func (l *Logger) Sync() error {
	l.mu.Lock()
	buffered := l.buffered
	l.mu.Unlock()
	var errs []error
	for _, ws := range buffered {
		errs = append(errs, ws.Sync())
	}
	// Syncing stderr fails on terminals and pipes; that is not an error here.
	_ = l.Logger.Sync()
	return errors.Join(errs...)
}

// Handler serves GET (current level) and PUT {"level":"debug"} for the
// admin endpoint's /logging.
func (l *Logger) Handler() http.Handler { return l.Level }

// RawJSON is a value its producer has already encoded as JSON (the decision
// log's inputs, written straight from OPA values). Log it with zap.Reflect:
// loggers from New copy it verbatim; any other zap encoder goes through
// encoding/json, which checks and compacts it.
type RawJSON []byte

// MarshalJSON returns r itself.
func (r RawJSON) MarshalJSON() ([]byte, error) { return r, nil }

// reflectedEncoder is zap's default for reflected values (encoding/json
// without HTML escaping), except that RawJSON is copied as it is. zap makes
// one per line that has a reflected field, so the JSON encoder is only made
// when a value needs it.
type reflectedEncoder struct {
	w    io.Writer
	json *json.Encoder
}

func newReflectedEncoder(w io.Writer) zapcore.ReflectedEncoder {
	return &reflectedEncoder{w: w}
}

func (e *reflectedEncoder) Encode(v any) error {
	if raw, ok := v.(RawJSON); ok {
		_, err := e.w.Write(raw)
		return err
	}
	if e.json == nil {
		e.json = json.NewEncoder(e.w)
		e.json.SetEscapeHTML(false)
	}
	return e.json.Encode(v)
}
