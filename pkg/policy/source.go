package policy

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/util"
	"sigs.k8s.io/yaml"

	"github.com/causeway-mesh/causeway/pkg/readlimit"
)

// Limits bound what a policy source may hold, so a bad checkout or bundle
// cannot exhaust memory.
type Limits struct {
	MaxFileBytes  int64 // per file; 0 means 4 MiB
	MaxTotalBytes int64 // all files together; 0 means 64 MiB
	MaxFiles      int   // 0 means 10000
}

// WithDefaults is l with its zero fields at their defaults.
func (l Limits) WithDefaults() Limits {
	if l.MaxFileBytes <= 0 {
		l.MaxFileBytes = 4 << 20
	}
	if l.MaxTotalBytes <= 0 {
		l.MaxTotalBytes = 64 << 20
	}
	if l.MaxFiles <= 0 {
		l.MaxFiles = 10000
	}
	return l
}

// Snapshot is the content of one policy source at one moment.
type Snapshot struct {
	Name     string         // "dir", GitSource or "bundle:<name>"
	Modules  []File         // .rego files, sorted by path
	Data     map[string]any // data documents merged at their paths
	DataDocs []File         // the data files (for the revision)
	Settings []byte         // the SettingsFile, nil when there is none
	// Revision is a content hash (directories), the commit SHA (Git) or
	// the bundle's manifest revision, else its content hash (bundles).
	Revision string
	// Digest tells apart content under one revision where the source does
	// not guarantee it (a bundle's manifest revision); "" otherwise.
	Digest string
	Commit *CommitInfo // Git only
}

// same reports whether a and b hold the same content.
func (s *Snapshot) same(o *Snapshot) bool {
	return s != nil && o != nil && s.Revision == o.Revision && s.Digest == o.Digest
}

// empty reports whether the source held no file the engine reads.
func (s *Snapshot) empty() bool {
	return len(s.Modules) == 0 && len(s.DataDocs) == 0 && s.Settings == nil
}

// isTestFile reports whether a module is a test module (OPA's convention).
func isTestFile(p string) bool { return strings.HasSuffix(p, "_test.rego") }

// isDataFile reports whether a file is a data document: data.json or
// data.yaml/.yml, placed at the path of its directory (as `opa run` does).
func isDataFile(name string) bool {
	switch name {
	case "data.json", "data.yaml", "data.yml":
		return true
	}
	return false
}

// readDir reads a policy directory.
func readDir(dir string, limits Limits) (*Snapshot, error) {
	c, err := collectDir(dir, limits)
	if err != nil {
		return nil, err
	}
	return c.Finish("")
}

// DirFiles returns the files of a policy directory that the engine reads
// (Rego modules, data documents, the SettingsFile), by slash path relative
// to the directory, read by the same rules and within the same limits, but
// not parsed: e.g. to publish the directory's policy elsewhere.
func DirFiles(dir string, limits Limits) (map[string][]byte, error) {
	c, err := collectDir(dir, limits)
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{}
	for _, group := range [][]File{c.snap.Modules, c.snap.DataDocs} {
		for _, f := range group {
			files[f.Path] = f.Content
		}
	}
	if c.snap.Settings != nil {
		files[SettingsFile] = c.snap.Settings
	}
	return files, nil
}

// collectDir reads the files of a policy directory. The directory may be,
// or sit under, a symbolic link (git-sync swaps one): it is resolved once,
// so one read sees one checkout. Hidden entries (".git", ".worktrees") are
// skipped; symbolic links to files are followed, links to directories are
// not (no cycles).
func collectDir(dir string, limits Limits) (*Collector, error) {
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, fmt.Errorf("policy directory %s: %w", dir, err)
	}
	st, err := os.Stat(root)
	if err != nil {
		return nil, fmt.Errorf("policy directory %s: %w", dir, err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("policy directory %s: not a directory", dir)
	}
	c := NewCollector("dir", limits)
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != root && strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if !c.Wants(rel) {
			return nil
		}
		info, err := os.Stat(p) // follows a link to a file
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		return c.Add(rel, func(max int64) ([]byte, error) { return readFileBounded(p, max) })
	})
	if err != nil {
		return nil, fmt.Errorf("read policy directory %s: %w", dir, err)
	}
	return c, nil
}

// Collector builds a Snapshot from a source's files, whatever holds them (a
// directory, a Git tree), with one set of rules and limits.
type Collector struct {
	snap   *Snapshot
	limits Limits
	count  int
	total  int64
}

// NewCollector collects the files of the source called name.
func NewCollector(name string, limits Limits) *Collector {
	return &Collector{snap: &Snapshot{Name: name}, limits: limits.WithDefaults()}
}

// Wants reports whether the file at slash path rel (relative to the
// source's root, no hidden segment) is part of a policy.
func (c *Collector) Wants(rel string) bool {
	name := path.Base(rel)
	return strings.HasSuffix(name, ".rego") || isDataFile(name) || rel == SettingsFile
}

// Add reads a wanted file within the limits.
func (c *Collector) Add(rel string, read func(max int64) ([]byte, error)) error {
	c.count++
	if c.count > c.limits.MaxFiles {
		return fmt.Errorf("more than %d policy files", c.limits.MaxFiles)
	}
	content, err := read(c.limits.MaxFileBytes)
	if err != nil {
		return err
	}
	c.total += int64(len(content))
	if c.total > c.limits.MaxTotalBytes {
		return fmt.Errorf("policy files exceed %d bytes", c.limits.MaxTotalBytes)
	}
	f := File{Path: rel, Content: content}
	switch {
	case rel == SettingsFile:
		c.snap.Settings = content
	case strings.HasSuffix(rel, ".rego"):
		c.snap.Modules = append(c.snap.Modules, f)
	default:
		c.snap.DataDocs = append(c.snap.DataDocs, f)
	}
	return nil
}

// Finish merges the data documents and sets the revision: the given one
// (a commit), else a hash of the content.
func (c *Collector) Finish(revision string) (*Snapshot, error) {
	snap := c.snap
	sort.Slice(snap.Modules, func(i, j int) bool { return snap.Modules[i].Path < snap.Modules[j].Path })
	sort.Slice(snap.DataDocs, func(i, j int) bool { return snap.DataDocs[i].Path < snap.DataDocs[j].Path })
	snap.Data = map[string]any{}
	for _, f := range snap.DataDocs {
		doc, err := parseDataDoc(f)
		if err != nil {
			return nil, err
		}
		dirPath := path.Dir(f.Path)
		var at []string
		if dirPath != "." {
			at = strings.Split(dirPath, "/")
		}
		if err := mergeData(snap.Data, at, doc); err != nil {
			return nil, fmt.Errorf("data file %s: %w", f.Path, err)
		}
	}
	if revision == "" {
		groups := [][]File{snap.Modules, snap.DataDocs}
		if snap.Settings != nil {
			groups = append(groups, []File{{Path: SettingsFile, Content: snap.Settings}})
		}
		revision = revisionOf(groups...)
	}
	snap.Revision = revision
	return snap, nil
}

func readFileBounded(p string, max int64) ([]byte, error) {
	b, err := readlimit.File(p, max)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	return b, nil
}

func parseDataDoc(f File) (map[string]any, error) {
	content := f.Content
	if !strings.HasSuffix(f.Path, ".json") {
		j, err := yaml.YAMLToJSON(content)
		if err != nil {
			return nil, fmt.Errorf("data file %s: %w", f.Path, err)
		}
		content = j
	}
	var doc any
	if err := util.UnmarshalJSON(content, &doc); err != nil {
		return nil, fmt.Errorf("data file %s: %w", f.Path, err)
	}
	if doc == nil {
		return map[string]any{}, nil
	}
	m, ok := doc.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("data file %s: top level must be an object", f.Path)
	}
	return m, nil
}

// mergeData places doc at path under dst, refusing to overwrite a value.
func mergeData(dst map[string]any, at []string, doc map[string]any) error {
	for _, seg := range at {
		next, ok := dst[seg]
		if !ok {
			m := map[string]any{}
			dst[seg] = m
			dst = m
			continue
		}
		m, ok := next.(map[string]any)
		if !ok {
			return fmt.Errorf("data path %s conflicts with a value", strings.Join(at, "."))
		}
		dst = m
	}
	for k, v := range doc {
		old, exists := dst[k]
		if !exists {
			dst[k] = v
			continue
		}
		om, ok1 := old.(map[string]any)
		nm, ok2 := v.(map[string]any)
		if !ok1 || !ok2 {
			return fmt.Errorf("data key %q defined twice", k)
		}
		if err := mergeData(om, nil, nm); err != nil {
			return err
		}
	}
	return nil
}

// revisionOf hashes paths and contents (length-prefixed, so no two file sets
// collide by concatenation) into a short content revision.
func revisionOf(groups ...[]File) string {
	h := sha256.New()
	var n [8]byte
	for gi, files := range groups {
		binary.BigEndian.PutUint64(n[:], uint64(gi))
		h.Write(n[:])
		for _, f := range files {
			binary.BigEndian.PutUint64(n[:], uint64(len(f.Path)))
			h.Write(n[:])
			h.Write([]byte(f.Path))
			binary.BigEndian.PutUint64(n[:], uint64(len(f.Content)))
			h.Write(n[:])
			h.Write(f.Content)
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

var errNoModules = errors.New("no policy modules (.rego files other than *_test.rego)")

// GitSource names the Git source (policygit) in statuses, rejections and
// logs.
const GitSource = "git"

// CommitInfo describes the commit a Git revision is.
type CommitInfo struct {
	Ref     string    `json:"ref"`
	Time    time.Time `json:"committed_at"`
	Subject string    `json:"subject,omitempty"`
}
