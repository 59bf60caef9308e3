package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/download"
	"github.com/open-policy-agent/opa/v1/keys"
	opalog "github.com/open-policy-agent/opa/v1/logging"
	"github.com/open-policy-agent/opa/v1/plugins/rest"
	"go.uber.org/zap"
)

// BundleOptions configures loading policy from an OPA bundle service with
// OPA's own downloader (ETags, long polling, signature verification).
type BundleOptions struct {
	// Name names the bundle (default "policy"); it shows as source "bundle:<name>".
	Name string
	// Service is an OPA service configuration (JSON: url, headers,
	// credentials, tls), as in OPA's "services" section.
	Service json.RawMessage
	// Resource is the bundle's path on the service, e.g. "bundles/authz.tar.gz".
	Resource string
	// MinDelay and MaxDelay bound the polling interval (defaults 60s, 120s).
	MinDelay, MaxDelay time.Duration
	// MaxBytes bounds the bundle's size (default: Limits.MaxTotalBytes).
	MaxBytes int64
	// Verification, if set, requires signed bundles (OPA's bundle signing).
	Verification *bundle.VerificationConfig
	// Keys are the keys the service credentials refer to, if any.
	Keys map[string]*keys.Config
}

func (e *Engine) startBundle(ctx context.Context) (*download.Downloader, error) {
	b := e.opts.Bundle
	name := b.Name
	if name == "" {
		name = "policy"
	}
	if b.Resource == "" || len(b.Service) == 0 {
		return nil, errors.New("policy bundle: service and resource are required")
	}
	client, err := rest.New(b.Service, b.Keys, rest.Name(name), rest.Logger(zapOPALogger{l: e.log.Named("bundle").Sugar()}))
	if err != nil {
		return nil, fmt.Errorf("policy bundle service: %w", err)
	}
	cfg := download.Config{}
	if b.MinDelay > 0 || b.MaxDelay > 0 {
		minS, maxS := int64(b.MinDelay/time.Second), int64(b.MaxDelay/time.Second)
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
	maxBytes := b.MaxBytes
	if maxBytes <= 0 {
		maxBytes = e.opts.Limits.MaxTotalBytes
	}
	source := "bundle:" + name
	d := download.New(cfg, client, b.Resource).
		WithBundleName(name).
		WithSizeLimitBytes(maxBytes).
		WithBundleParserOpts(ast.ParserOptions{RegoVersion: ast.RegoV1}).
		WithCallback(func(ctx context.Context, u download.Update) error {
			e.bundleUpdate(ctx, source, u)
			return nil
		})
	if b.Verification != nil {
		d = d.WithBundleVerificationConfig(b.Verification)
	}
	d.Start(ctx)
	return d, nil
}

// bundleUpdate offers a downloaded bundle; download errors keep the active set.
func (e *Engine) bundleUpdate(ctx context.Context, source string, u download.Update) {
	if u.Error != nil {
		e.log.Warn("policy bundle download failed, keeping the active policy", zap.String("source", source), zap.Error(u.Error))
		return
	}
	if u.Bundle == nil { // not modified
		return
	}
	snap, err := snapshotFromBundle(source, u.Bundle)
	if err != nil {
		e.mu.Lock()
		e.recordRejection(&Rejection{Source: source, Stage: "load", Reason: err.Error(), At: time.Now()}, true)
		e.mu.Unlock()
		return
	}
	_ = e.offer(ctx, snap, false) // a rejection is logged by offer
}

// snapshotFromBundle takes the Rego modules and data of a snapshot bundle.
// Its revision is the manifest's, else a hash of the content; the content
// hash also tells apart bundles published under one revision, and makes an
// unchanged bundle a no-op.
func snapshotFromBundle(source string, b *bundle.Bundle) (*snapshot, error) {
	if b.Type() == bundle.DeltaBundleType {
		return nil, errors.New("delta bundles are not supported")
	}
	snap := &snapshot{Name: source}
	for _, m := range b.Modules {
		p := m.Path
		if p == "" {
			p = m.URL
		}
		snap.Modules = append(snap.Modules, sourceFile{Path: p, Content: m.Raw})
	}
	sort.Slice(snap.Modules, func(i, j int) bool { return snap.Modules[i].Path < snap.Modules[j].Path })
	snap.Data = b.Data
	if snap.Data == nil {
		snap.Data = map[string]any{}
	}
	dataJSON, err := json.Marshal(snap.Data) // map keys sorted: a stable hash
	if err != nil {
		return nil, fmt.Errorf("bundle data: %w", err)
	}
	snap.DataDocs = []sourceFile{{Path: "data.json", Content: dataJSON}}
	snap.Revision = revisionOf(snap.Modules, snap.DataDocs)
	if r := b.Manifest.Revision; r != "" {
		snap.Revision, snap.Digest = r, snap.Revision
	}
	return snap, nil
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
