package config

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/causeway-mesh/causeway/pkg/dirwatch"
	"github.com/causeway-mesh/causeway/pkg/readlimit"
)

// Limits on what a configuration directory may hold; beyond them the
// configuration is rejected, never read unbounded.
const (
	MaxFileBytes  = 16 << 20
	MaxTotalBytes = 128 << 20
	MaxFiles      = 10000
)

// DirOptions configure a DirSource.
type DirOptions struct {
	Translate Options
	Logger    *zap.Logger
	// Debounce is how long the directory must be quiet after a change event
	// before it is read (editors and git-sync write in several steps); a
	// steady stream is read at most 10× it after its first event.
	// Default 100ms.
	Debounce time.Duration
	// Rescan is the period of a full re-read that catches what file events
	// missed (network file systems, inotify limits). Default 10s.
	Rescan time.Duration
	// OnRejected, when set, is called with each rejected configuration's
	// error (an *InvalidError), e.g. to count config errors.
	OnRejected func(error)
}

// DirSource is the local-mode configuration source: a directory of
// multi-document Kubernetes YAML (*.yaml, *.yml, *.json; hidden files and
// directories skipped), read as one configuration. A directory that is not
// a configuration (a file that cannot be read or does not parse, a limit
// exceeded, an unsupported kind, an object without a name or defined twice)
// rejects the whole change and the last good snapshot stays in force: what
// the files hold is not known, so nothing in them can be refused alone.
// Objects that parse are translated as in Kubernetes: one the mesh cannot
// serve is refused alone and fails closed (Translate), the rest applies.
type DirSource struct {
	dir        string
	opts       DirOptions
	log        *zap.Logger
	rejections *RejectionLog

	lastHash [sha256.Size]byte
	haveLast bool
	lastErr  string // last unreadable-directory report, not repeated on every rescan
}

// NewDirSource returns a source for dir.
func NewDirSource(dir string, opts DirOptions) *DirSource {
	if opts.Debounce <= 0 {
		opts.Debounce = 100 * time.Millisecond
	}
	if opts.Rescan <= 0 {
		opts.Rescan = 10 * time.Second
	}
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	log = log.With(zap.String("config_dir", dir))
	return &DirSource{dir: dir, opts: opts, log: log, rejections: NewRejectionLog(log)}
}

// Load reads and translates the directory once.
func (s *DirSource) Load() (*Snapshot, error) {
	files, _, err := s.read()
	if err != nil {
		return nil, err
	}
	return translateFiles(files, s.opts.Translate)
}

// Run reads the directory, then watches it until ctx ends, calling emit
// (from Run's goroutine) with the first good snapshot and after every change
// that yields a new good one. Rejected changes are logged, one entry per
// problem with its file and reason, and leave the last good snapshot in
// force; refused objects are logged as they come and go. Run returns nil
// when ctx ends.
func (s *DirSource) Run(ctx context.Context, emit func(*Snapshot)) error {
	dirwatch.Run(ctx, dirwatch.Options{
		Dirs:     s.dirs,
		Debounce: s.opts.Debounce,
		Rescan:   s.opts.Rescan,
		Logger:   s.log,
		Reload:   func(changedAt time.Time) { s.reload(emit, changedAt) },
	})
	return nil
}

// reload reads the directory and, if its content changed since the last
// attempt, translates it and emits or reports the result; changedAt is
// when the first change it may include was noticed.
func (s *DirSource) reload(emit func(*Snapshot), changedAt time.Time) {
	files, hash, err := s.read()
	if err == nil && s.haveLast && hash == s.lastHash {
		return // nothing changed (a rescan, or an event that changed no content)
	}
	var snap *Snapshot
	if err != nil {
		// Unreadable: try again on the next event or rescan, reporting only news.
		s.haveLast = false
		if err.Error() != s.lastErr {
			s.lastErr = err.Error()
			s.report(err)
		}
		return
	}
	s.lastErr = ""
	s.lastHash, s.haveLast = hash, true
	if snap, err = translateFiles(files, s.opts.Translate); err != nil {
		s.report(err)
		return
	}
	s.rejections.Update(snap.Rejected)
	s.log.Info("configuration loaded",
		zap.Int("files", len(files)),
		zap.Int("refusals", len(snap.Rejected)),
		zap.Int("workloads", len(snap.Workloads)),
		zap.Int("services", len(snap.Services)),
		zap.Int("waypoints", len(snap.Waypoints)),
		zap.Int("http_routes", len(snap.HTTPRoutes)),
		zap.Int("grpc_routes", len(snap.GRPCRoutes)))
	snap.ChangedAt = changedAt
	emit(snap)
}

func (s *DirSource) report(err error) {
	var inv *InvalidError
	if errors.As(err, &inv) {
		for _, p := range inv.Problems {
			s.log.Error("configuration rejected; the last good configuration stays in force",
				zap.String("file", p.Origin), zap.String("object", p.Object), zap.String("reason", p.Reason))
		}
		if inv.Truncated > 0 {
			s.log.Error("more configuration problems not shown", zap.Int("count", inv.Truncated))
		}
	} else {
		s.log.Error("configuration rejected; the last good configuration stays in force", zap.Error(err))
	}
	if s.opts.OnRejected != nil {
		s.opts.OnRejected(err)
	}
}

type file struct {
	path string
	data []byte
}

func translateFiles(files []file, opts Options) (*Snapshot, error) {
	var ps problems
	var objs []Object
	for _, f := range files {
		o, err := Decode(f.path, f.data)
		if err != nil {
			var inv *InvalidError
			if errors.As(err, &inv) {
				ps.addAll(inv.Problems)
			} else {
				ps.add(f.path, "", "%v", err)
			}
			continue
		}
		objs = append(objs, o...)
	}
	if err := ps.err(); err != nil {
		return nil, err
	}
	return Translate(objs, opts)
}

func isConfigFile(name string) bool {
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// dirs lists the directory and its (non-hidden) subdirectories to watch.
func (s *DirSource) dirs() map[string]bool {
	out := map[string]bool{s.dir: true}
	_ = filepath.WalkDir(s.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == s.dir {
			return nil
		}
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			out[p] = true
		}
		return nil
	})
	// Kubernetes ConfigMap volumes swap a hidden ..data directory behind
	// symlinks: watching the top level sees the swap.
	return out
}

// read returns the configuration files in path order and a hash of their
// names and contents. Symlinks to regular files are followed (ConfigMap
// volumes); symlinked directories are not.
func (s *DirSource) read() ([]file, [sha256.Size]byte, error) {
	var files []file
	var total int64
	var ps problems
	var zero [sha256.Size]byte
	walkErr := filepath.WalkDir(s.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			ps.add(p, "", "%v", err)
			if d != nil && d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if p == s.dir {
			return nil
		}
		if strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() || !isConfigFile(d.Name()) {
			return nil
		}
		info, err := os.Stat(p) // follows a symlink
		if err != nil {
			ps.add(p, "", "%v", err)
			return nil
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		if len(files) >= MaxFiles {
			return fmt.Errorf("more than %d configuration files", MaxFiles)
		}
		data, err := readlimit.File(p, MaxFileBytes)
		if err != nil {
			ps.add(p, "", "%v", err)
			return nil
		}
		total += int64(len(data))
		if total > MaxTotalBytes {
			return fmt.Errorf("configuration is larger than %d bytes", MaxTotalBytes)
		}
		files = append(files, file{path: p, data: data})
		return nil
	})
	if walkErr != nil {
		ps.add(s.dir, "", "%v", walkErr)
	}
	if err := ps.err(); err != nil {
		return nil, zero, err
	}
	sort.Slice(files, func(i, j int) bool { return files[i].path < files[j].path })
	h := sha256.New()
	for _, f := range files {
		fmt.Fprintf(h, "%d:%s%d:", len(f.path), f.path, len(f.data))
		h.Write(f.data)
	}
	var sum [sha256.Size]byte
	copy(sum[:], h.Sum(nil))
	return files, sum, nil
}
