package policy

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"
)

// Content is an active policy set's files, as a control plane hands them
// to proxies that do not read the sources themselves (connection policies
// at node proxies): per source, its revision and its Rego modules, data
// documents and SettingsFile, by slash path. A proxy installs it with
// NewInstalledEngine and gets the same set, under the same revision.
type Content struct {
	Revision string
	Sources  []ContentSource
}

// ContentSource is one source's part of a Content.
type ContentSource struct {
	Name, Revision, Digest string
	Files                  []File
}

// File is one policy file: a Rego module or data document, by slash path
// relative to its source's root.
type File struct {
	Path    string
	Content []byte
}

// Content returns the active set's files, nil while none is active.
func (e *Engine) Content() *Content {
	c := e.active.Load()
	if c == nil {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	out := &Content{Revision: c.revision}
	names := make([]string, 0, len(e.accepted))
	for n := range e.accepted {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		s := e.accepted[n]
		cs := ContentSource{Name: s.Name, Revision: s.Revision, Digest: s.Digest}
		for _, group := range [][]File{s.Modules, s.DataDocs} {
			for _, f := range group {
				cs.Files = append(cs.Files, File{Path: f.Path, Content: f.Content})
			}
		}
		if s.Settings != nil {
			cs.Files = append(cs.Files, File{Path: SettingsFile, Content: s.Settings})
		}
		out.Sources = append(out.Sources, cs)
	}
	return out
}

// NewInstalledEngine builds an engine whose one policy set is content
// (sources in opts are ignored) and activates it at once: compiled, its
// decision prepared and, unless opts.SkipTests, its tests run. The set's
// revision is the one the content was exported under; an error says why
// the content cannot be used, and no engine is returned then.
func NewInstalledEngine(ctx context.Context, content *Content, opts Options) (*Engine, error) {
	if content == nil || len(content.Sources) == 0 {
		return nil, errors.New("policy: empty content")
	}
	opts.Dir, opts.Remote, opts.Feed = "", nil, nil
	opts.Limits = opts.Limits.WithDefaults()
	set := make([]*Snapshot, 0, len(content.Sources))
	for _, cs := range content.Sources {
		c := NewCollector(cs.Name, opts.Limits)
		for _, f := range cs.Files {
			if !validContentPath(f.Path) || !c.Wants(f.Path) {
				return nil, fmt.Errorf("policy content %s: unexpected file %q", cs.Name, f.Path)
			}
			data := f.Content
			if err := c.Add(f.Path, func(max int64) ([]byte, error) {
				if int64(len(data)) > max {
					return nil, fmt.Errorf("%s: larger than %d bytes", f.Path, max)
				}
				return data, nil
			}); err != nil {
				return nil, fmt.Errorf("policy content %s: %w", cs.Name, err)
			}
		}
		snap, err := c.Finish(cs.Revision)
		if err != nil {
			return nil, fmt.Errorf("policy content %s: %w", cs.Name, err)
		}
		snap.Digest = cs.Digest
		set = append(set, snap)
	}
	e, err := newEngine(opts, nil)
	if err != nil {
		return nil, err
	}
	sort.Slice(set, func(i, j int) bool { return set[i].Name < set[j].Name })
	start := time.Now()
	c, err := e.build(ctx, set)
	if err != nil {
		return nil, err
	}
	if content.Revision != "" && c.revision != content.Revision {
		return nil, fmt.Errorf("policy content: files give revision %s, not %s", c.revision, content.Revision)
	}
	e.mu.Lock()
	e.activate(c, set, set[len(set)-1].Name, start)
	e.mu.Unlock()
	return e, nil
}

// validContentPath accepts the slash paths a source reader produces:
// relative, no empty, "." or ".." segment, nothing hidden.
func validContentPath(p string) bool {
	if p == "" || p[0] == '/' {
		return false
	}
	start := 0
	for i := 0; i <= len(p); i++ {
		if i == len(p) || p[i] == '/' {
			seg := p[start:i]
			if seg == "" || seg[0] == '.' {
				return false
			}
			start = i + 1
		}
	}
	return true
}
