package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/open-policy-agent/opa/v1/bundle"
	"go.uber.org/zap"
)

// Feed is a policy source that delivers content as it arrives rather than
// being read: an OPA bundle service (policybundle.Feed).
type Feed interface {
	// Name names the source in statuses, rejections and logs
	// ("bundle:<name>").
	Name() string
	// Start delivers every downloaded bundle (nil when not modified) or
	// download error until ctx ends or stop is called.
	Start(ctx context.Context, log *zap.Logger, deliver func(context.Context, *bundle.Bundle, error)) (stop func(), err error)
}

// bundleUpdate offers a downloaded bundle; download errors keep the active set.
func (e *Engine) bundleUpdate(ctx context.Context, source string, b *bundle.Bundle, err error) {
	if err != nil {
		e.log.Warn("policy bundle download failed, keeping the active policy", zap.String("source", source), zap.Error(err))
		return
	}
	if b == nil { // not modified
		return
	}
	snap, err := snapshotFromBundle(source, b)
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
func snapshotFromBundle(source string, b *bundle.Bundle) (*Snapshot, error) {
	if b.Type() == bundle.DeltaBundleType {
		return nil, errors.New("delta bundles are not supported")
	}
	snap := &Snapshot{Name: source}
	for _, m := range b.Modules {
		p := m.Path
		if p == "" {
			p = m.URL
		}
		snap.Modules = append(snap.Modules, File{Path: p, Content: m.Raw})
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
	snap.DataDocs = []File{{Path: "data.json", Content: dataJSON}}
	snap.Revision = revisionOf(snap.Modules, snap.DataDocs)
	if r := b.Manifest.Revision; r != "" {
		snap.Revision, snap.Digest = r, snap.Revision
	}
	return snap, nil
}
