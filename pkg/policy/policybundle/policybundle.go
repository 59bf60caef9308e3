// Package policybundle loads policy from an OPA bundle service with OPA's
// own downloader (ETags, long polling, signature verification), for
// policy.Options.Feed. It is a package of its own so that binaries that
// never read bundles (the node proxy) do not link the downloader and what
// it brings (oras-go, the OpenTelemetry SDK).
package policybundle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/download"
	"github.com/open-policy-agent/opa/v1/keys"
	opalog "github.com/open-policy-agent/opa/v1/logging"
	"github.com/open-policy-agent/opa/v1/plugins/rest"
	"go.uber.org/zap"
)

// Options configure a Feed.
type Options struct {
	// Name names the bundle (default "policy"); it shows as source "bundle:<name>".
	Name string
	// Service is an OPA service configuration (JSON: url, headers,
	// credentials, tls), as in OPA's "services" section.
	Service json.RawMessage
	// Resource is the bundle's path on the service, e.g. "bundles/authz.tar.gz".
	Resource string
	// MinDelay and MaxDelay bound the polling interval (defaults 60s, 120s).
	MinDelay, MaxDelay time.Duration
	// MaxBytes bounds the bundle's size (default 64 MiB, as
	// policy.Limits' MaxTotalBytes).
	MaxBytes int64
	// Verification, if set, requires signed bundles (OPA's bundle signing).
	Verification *bundle.VerificationConfig
	// Keys are the keys the service credentials refer to, if any.
	Keys map[string]*keys.Config
}

// Feed is one bundle of one service.
type Feed struct {
	o   Options
	cfg download.Config
}

// New checks the options and returns a Feed that downloads nothing until
// started.
func New(o Options) (*Feed, error) {
	if o.Name == "" {
		o.Name = "policy"
	}
	if o.Resource == "" || len(o.Service) == 0 {
		return nil, errors.New("policy bundle: service and resource are required")
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = 64 << 20
	}
	cfg := download.Config{}
	if o.MinDelay > 0 || o.MaxDelay > 0 {
		minS, maxS := int64(o.MinDelay/time.Second), int64(o.MaxDelay/time.Second)
		if minS < 1 {
			minS = 1
		}
		if maxS < minS {
			maxS = minS
		}
		cfg.Polling.MinDelaySeconds = &minS
		cfg.Polling.MaxDelaySeconds = &maxS
	}
	if err := cfg.ValidateAndInjectDefaults(); err != nil {
		return nil, fmt.Errorf("policy bundle polling: %w", err)
	}
	return &Feed{o: o, cfg: cfg}, nil
}

// Options are the feed's options, defaults filled in.
func (f *Feed) Options() Options { return f.o }

// Name is the source's name in the engine's statuses: "bundle:<name>".
func (f *Feed) Name() string { return "bundle:" + f.o.Name }

// Start polls the service until ctx ends or stop is called, handing every
// downloaded bundle (nil when not modified) or download error to deliver.
func (f *Feed) Start(ctx context.Context, log *zap.Logger, deliver func(context.Context, *bundle.Bundle, error)) (stop func(), err error) {
	client, err := rest.New(f.o.Service, f.o.Keys, rest.Name(f.o.Name), rest.Logger(zapOPALogger{l: log.Sugar()}))
	if err != nil {
		return nil, fmt.Errorf("policy bundle service: %w", err)
	}
	d := download.New(f.cfg, client, f.o.Resource).
		WithBundleName(f.o.Name).
		WithSizeLimitBytes(f.o.MaxBytes).
		WithBundleParserOpts(ast.ParserOptions{RegoVersion: ast.RegoV1}).
		WithCallback(func(ctx context.Context, u download.Update) error {
			deliver(ctx, u.Bundle, u.Error)
			return nil
		})
	if f.o.Verification != nil {
		d = d.WithBundleVerificationConfig(f.o.Verification)
	}
	d.Start(ctx)
	return func() { d.Stop(context.Background()) }, nil
}

// zapOPALogger adapts zap to OPA's logging interface for the downloader.
type zapOPALogger struct {
	l *zap.SugaredLogger
}

func (z zapOPALogger) Debug(f string, a ...any) { z.l.Debugf(f, a...) }
func (z zapOPALogger) Info(f string, a ...any)  { z.l.Infof(f, a...) }
func (z zapOPALogger) Error(f string, a ...any) { z.l.Errorf(f, a...) }
func (z zapOPALogger) Warn(f string, a ...any)  { z.l.Warnf(f, a...) }

func (z zapOPALogger) WithFields(fields map[string]any) opalog.Logger {
	args := make([]any, 0, 2*len(fields))
	for k, v := range fields {
		args = append(args, k, v)
	}
	return zapOPALogger{l: z.l.With(args...)}
}

func (z zapOPALogger) GetLevel() opalog.Level {
	switch {
	case z.l.Desugar().Core().Enabled(zap.DebugLevel):
		return opalog.Debug
	case z.l.Desugar().Core().Enabled(zap.InfoLevel):
		return opalog.Info
	case z.l.Desugar().Core().Enabled(zap.WarnLevel):
		return opalog.Warn
	default:
		return opalog.Error
	}
}

// SetLevel is ignored: the level belongs to the process's zap logger
// (changed at runtime through the admin endpoint).
func (z zapOPALogger) SetLevel(opalog.Level) {}
