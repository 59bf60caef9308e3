// Package logging builds the zap loggers every Causeway binary uses: JSON for
// production, console for development, with a level that the admin endpoint
// can change while the process runs.
package logging

import (
	"fmt"
	"net/http"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Logger is a zap logger plus the handle that changes its level at runtime.
type Logger struct {
	*zap.Logger
	Level zap.AtomicLevel
}

// Options selects the encoding and the initial level.
type Options struct {
	// Format is "json" (production, default) or "console" (development).
	Format string
	// Level is a zap level name: debug, info, warn, error.
	Level string
}

// New builds a logger writing to stderr.
func New(opts Options) (*Logger, error) {
	level := zap.NewAtomicLevel()
	if opts.Level != "" {
		if err := level.UnmarshalText([]byte(opts.Level)); err != nil {
			return nil, fmt.Errorf("log level %q: %w", opts.Level, err)
		}
	}
	var cfg zap.Config
	switch opts.Format {
	case "", "json":
		cfg = zap.NewProductionConfig()
		cfg.EncoderConfig.EncodeTime = zapcore.RFC3339NanoTimeEncoder
		cfg.Sampling = nil // access logs must not be sampled away
	case "console":
		cfg = zap.NewDevelopmentConfig()
	default:
		return nil, fmt.Errorf("log format %q: want json or console", opts.Format)
	}
	cfg.Level = level
	l, err := cfg.Build()
	if err != nil {
		return nil, fmt.Errorf("build logger: %w", err)
	}
	return &Logger{Logger: l, Level: level}, nil
}

// Handler serves GET (current level) and PUT {"level":"debug"} for the
// admin endpoint's /logging.
func (l *Logger) Handler() http.Handler { return l.Level }
