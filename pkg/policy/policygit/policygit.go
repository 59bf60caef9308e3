// Package policygit reads policy from a Git repository, fetched in process
// (no git binary), for policy.Options.Remote. It is a package of its own so
// that binaries that never read Git (the node proxy) do not link go-git
// and what it brings (ProtonMail/go-crypto, circl, SSH).
package policygit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-git/go-billy/v5"
	"github.com/go-git/go-billy/v5/memfs"
	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/cache"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/plumbing/transport/client"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
	"github.com/go-git/go-git/v5/plumbing/transport/server"
	gitssh "github.com/go-git/go-git/v5/plumbing/transport/ssh"
	"github.com/go-git/go-git/v5/storage/filesystem"

	"github.com/causeway-mesh/causeway/pkg/policy"
	"github.com/causeway-mesh/causeway/pkg/readlimit"
)

// Options configure loading policy from a Git repository, fetched in
// process (no git binary): each poll lists the remote's references and,
// when the ref moved, fetches that one commit (shallow) into memory and
// reads the policy from its tree. Every revision is a commit.
type Options struct {
	// URL is https://…, ssh://…, user@host:path, file://… or a local path.
	URL string
	// Ref is a branch, a tag, a full reference name or a commit SHA
	// (default HEAD, the remote's default branch).
	Ref string
	// Dir is the sub-directory of the repository holding the policy.
	Dir string
	// Poll is how often the ref is checked (default 60s).
	Poll time.Duration
	// TokenFile holds a token (or password) for https, sent as basic auth
	// with Username (default "git"). Read at every fetch, so a rotated
	// Secret takes effect; never logged.
	TokenFile string
	Username  string
	// SSHKeyFile holds a private key for ssh; KnownHostsFile the server's
	// host keys, required for ssh (host keys are always checked).
	SSHKeyFile     string
	KnownHostsFile string
	// CAFile adds PEM certificates to the system roots for https.
	CAFile string
	// MaxBytes bounds what one fetch stores (pack and index; default
	// policy.Limits.MaxTotalBytes), MaxFiles the files in the commit's tree
	// (default policy.Limits.MaxFiles).
	MaxBytes int64
	MaxFiles int
	// Timeout bounds one fetch (default 60s).
	Timeout time.Duration
}

// The file transport of go-git runs git-upload-pack; serve local
// repositories in process instead, so no git binary is needed. The
// in-process server serves no shallow fetches: local repositories are
// fetched whole (still bounded by MaxBytes).
func init() {
	client.InstallProtocol("file", server.NewClient(server.DefaultLoader))
}

var commitSHA = regexp.MustCompile(`^[0-9a-f]{40}$`)

// Source reads the policy of one repository, ref and sub-directory: a
// policy.Remote. Read is called from one goroutine at a time.
type Source struct {
	opts   Options
	limits policy.Limits
	local  bool // file transport: no shallow fetch

	// The last read, reused while the ref has not moved.
	lastRef  plumbing.Hash
	lastSnap *policy.Snapshot
	lastErr  error
}

// New checks the options and returns the source; limits bound the policy
// files it reads.
func New(o Options, limits policy.Limits) (*Source, error) {
	if o.URL == "" {
		return nil, errors.New("policy git: URL is required")
	}
	ep, err := transport.NewEndpoint(o.URL)
	if err != nil {
		return nil, fmt.Errorf("policy git URL: %w", err)
	}
	if ep.Password != "" {
		return nil, errors.New("policy git URL: carries a password; give credentials in a token file")
	}
	switch ep.Protocol {
	case "file", "https", "http", "ssh":
	default:
		return nil, fmt.Errorf("policy git URL: protocol %q not supported (https, ssh, file)", ep.Protocol)
	}
	if ep.Protocol == "ssh" && (o.SSHKeyFile == "" || o.KnownHostsFile == "") {
		return nil, errors.New("policy git: an ssh URL needs an SSH key file and a known hosts file (host keys are always checked)")
	}
	if ep.Protocol == "http" && o.TokenFile != "" {
		return nil, errors.New("policy git: a token is not sent over plain http; use https")
	}
	if o.TokenFile != "" && o.SSHKeyFile != "" {
		return nil, errors.New("policy git: give a token file or an SSH key file, not both")
	}
	if o.Ref == "" {
		o.Ref = "HEAD"
	}
	o.Dir = strings.Trim(path.Clean("/"+o.Dir), "/")
	if o.Poll <= 0 {
		o.Poll = time.Minute
	}
	if o.Username == "" {
		o.Username = "git"
	}
	limits = limits.WithDefaults()
	if o.MaxBytes <= 0 {
		o.MaxBytes = limits.MaxTotalBytes
	}
	if o.MaxFiles <= 0 {
		o.MaxFiles = limits.MaxFiles
	}
	if o.Timeout <= 0 {
		o.Timeout = time.Minute
	}
	return &Source{opts: o, limits: limits, local: ep.Protocol == "file"}, nil
}

// String names the source for messages: the URL without user, the ref and
// the sub-directory.
func (g *Source) String() string {
	s := redactURL(g.opts.URL) + "@" + g.opts.Ref
	if g.opts.Dir != "" {
		s += " (" + g.opts.Dir + ")"
	}
	return s
}

// redactURL drops the user part of a URL (it may be a token).
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil || u.Scheme == "" {
		return raw
	}
	u.User = nil
	return u.String()
}

// Options are the source's options, defaults filled in.
func (g *Source) Options() Options { return g.opts }

// Name is policy.GitSource.
func (g *Source) Name() string { return policy.GitSource }

// Poll is how often the ref is checked.
func (g *Source) Poll() time.Duration { return g.opts.Poll }

// Read returns the policy at the ref's current commit.
func (g *Source) Read(ctx context.Context) (*policy.Snapshot, error) {
	ctx, cancel := context.WithTimeout(ctx, g.opts.Timeout)
	defer cancel()
	auth, ca, err := g.credentials()
	if err != nil {
		return nil, err
	}
	ref, at, err := g.resolve(ctx, auth, ca)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", g, err)
	}
	if at == g.lastRef && (g.lastSnap != nil || g.lastErr != nil) {
		return g.lastSnap, g.lastErr
	}
	snap, err := g.fetch(ctx, ref, at, auth, ca)
	if err != nil {
		err = fmt.Errorf("%s: %w", g, err)
		if errors.Is(err, errTransfer) || ctx.Err() != nil {
			return nil, err // worth retrying at the next poll
		}
	}
	// What the commit holds does not change: its verdict is kept until
	// the ref moves.
	g.lastRef, g.lastSnap, g.lastErr = at, snap, err
	return snap, err
}

// credentials reads the mounted credentials afresh.
func (g *Source) credentials() (transport.AuthMethod, []byte, error) {
	var ca []byte
	if g.opts.CAFile != "" {
		b, err := readlimit.File(g.opts.CAFile, 1<<20)
		if err != nil {
			return nil, nil, fmt.Errorf("policy git CA file: %w", err)
		}
		ca = b
	}
	switch {
	case g.opts.TokenFile != "":
		b, err := readlimit.File(g.opts.TokenFile, 64<<10)
		if err != nil {
			return nil, nil, fmt.Errorf("policy git token file: %w", err)
		}
		token := strings.TrimSpace(string(b))
		if token == "" {
			return nil, nil, fmt.Errorf("policy git token file %s is empty", g.opts.TokenFile)
		}
		return &githttp.BasicAuth{Username: g.opts.Username, Password: token}, ca, nil
	case g.opts.SSHKeyFile != "":
		key, err := readlimit.File(g.opts.SSHKeyFile, 64<<10)
		if err != nil {
			return nil, nil, fmt.Errorf("policy git SSH key file: %w", err)
		}
		user := "git"
		if ep, err := transport.NewEndpoint(g.opts.URL); err == nil && ep.User != "" {
			user = ep.User
		}
		keys, err := gitssh.NewPublicKeys(user, key, "")
		if err != nil {
			// The error may quote the key: say only which file.
			return nil, nil, fmt.Errorf("policy git SSH key file %s: not a usable unencrypted private key", g.opts.SSHKeyFile)
		}
		hosts, err := gitssh.NewKnownHostsCallback(g.opts.KnownHostsFile)
		if err != nil {
			return nil, nil, fmt.Errorf("policy git known hosts: %w", err)
		}
		keys.HostKeyCallback = hosts
		return keys, ca, nil
	}
	return nil, ca, nil
}

// resolve lists the remote's references and finds the ref: the name to
// fetch and the object it points at. A commit SHA resolves to itself.
func (g *Source) resolve(ctx context.Context, auth transport.AuthMethod, ca []byte) (string, plumbing.Hash, error) {
	if commitSHA.MatchString(g.opts.Ref) {
		return g.opts.Ref, plumbing.NewHash(g.opts.Ref), nil
	}
	remote := git.NewRemote(nil, &config.RemoteConfig{Name: "origin", URLs: []string{g.opts.URL}})
	refs, err := remote.ListContext(ctx, &git.ListOptions{Auth: auth, CABundle: ca})
	if errors.Is(err, transport.ErrEmptyRemoteRepository) {
		return "", plumbing.ZeroHash, fmt.Errorf("ref %q not found: the repository has no references", g.opts.Ref)
	}
	if err != nil {
		return "", plumbing.ZeroHash, fmt.Errorf("list references: %w", err)
	}
	byName := make(map[plumbing.ReferenceName]*plumbing.Reference, len(refs))
	for _, r := range refs {
		byName[r.Name()] = r
	}
	candidates := []plumbing.ReferenceName{plumbing.ReferenceName(g.opts.Ref),
		plumbing.NewBranchReferenceName(g.opts.Ref), plumbing.NewTagReferenceName(g.opts.Ref)}
	for _, name := range candidates {
		r, ok := byName[name]
		for hops := 0; ok && r.Type() == plumbing.SymbolicReference && hops < 5; hops++ {
			r, ok = byName[r.Target()]
		}
		if ok && r.Type() == plumbing.HashReference {
			return r.Name().String(), r.Hash(), nil
		}
	}
	return "", plumbing.ZeroHash, fmt.Errorf("ref %q not found", g.opts.Ref)
}

// fetch fetches the one commit (of a tag: the tag and its commit) into a
// bounded in-memory repository and reads the policy from its tree.
func (g *Source) fetch(ctx context.Context, ref string, at plumbing.Hash, auth transport.AuthMethod, ca []byte) (*policy.Snapshot, error) {
	fsys := &boundedFS{Filesystem: memfs.New(), left: &atomic.Int64{}}
	fsys.left.Store(g.opts.MaxBytes)
	repo, err := git.Init(filesystem.NewStorage(fsys, cache.NewObjectLRUDefault()), nil)
	if err != nil {
		return nil, err
	}
	remote, err := repo.CreateRemote(&config.RemoteConfig{Name: "origin", URLs: []string{g.opts.URL}})
	if err != nil {
		return nil, err
	}
	depth := 1
	if g.local {
		depth = 0
	}
	specs := []config.RefSpec{config.RefSpec("+" + ref + ":refs/causeway/policy")}
	if g.local && commitSHA.MatchString(ref) {
		// The in-process server takes no commit in a want: fetch the
		// branches and tags, then pick the commit.
		specs = []config.RefSpec{"+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"}
	}
	err = remote.FetchContext(ctx, &git.FetchOptions{RefSpecs: specs, Depth: depth,
		Auth: auth, CABundle: ca, Tags: git.NoTags})
	if errors.Is(err, errRepoTooLarge) || fsys.left.Load() < 0 {
		return nil, fmt.Errorf("repository larger than %d bytes", g.opts.MaxBytes)
	}
	if err != nil && !errors.Is(err, git.NoErrAlreadyUpToDate) {
		return nil, fmt.Errorf("fetch %s: %w: %w", ref, errTransfer, err)
	}
	obj, err := repo.Object(plumbing.AnyObject, at)
	if err != nil {
		return nil, fmt.Errorf("fetch %s: %s: %w", ref, at, err)
	}
	commit, ok := obj.(*object.Commit)
	if tag, isTag := obj.(*object.Tag); isTag {
		commit, err = tag.Commit()
		ok = err == nil
	}
	if !ok {
		return nil, fmt.Errorf("%s does not name a commit", ref)
	}
	return g.readCommit(repo, commit, ref)
}

// readCommit collects the policy files under the sub-directory of the
// commit's tree, counting every file of the tree against MaxFiles.
// Symbolic links and submodules are not followed.
func (g *Source) readCommit(repo *git.Repository, commit *object.Commit, ref string) (*policy.Snapshot, error) {
	tree, err := commit.Tree()
	if err != nil {
		return nil, fmt.Errorf("commit %s: %w", commit.Hash, err)
	}
	if g.opts.Dir != "" {
		if _, err := tree.FindEntry(g.opts.Dir); err != nil {
			return nil, fmt.Errorf("commit %s has no directory %s", commit.Hash, g.opts.Dir)
		}
	}
	prefix := ""
	if g.opts.Dir != "" {
		prefix = g.opts.Dir + "/"
	}
	c := policy.NewCollector(policy.GitSource, g.limits)
	walker := object.NewTreeWalker(tree, true, nil)
	defer walker.Close()
	files := 0
	for {
		name, entry, err := walker.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("commit %s: %w", commit.Hash, err)
		}
		if entry.Mode == filemode.Dir {
			continue
		}
		if files++; files > g.opts.MaxFiles {
			return nil, fmt.Errorf("commit %s: more than %d files in the repository", commit.Hash, g.opts.MaxFiles)
		}
		rel, under := strings.CutPrefix(name, prefix)
		if !under || hiddenPath(rel) || !entry.Mode.IsFile() || entry.Mode == filemode.Symlink || !c.Wants(rel) {
			continue
		}
		err = c.Add(rel, func(max int64) ([]byte, error) {
			blob, err := repo.BlobObject(entry.Hash)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			if blob.Size > max {
				return nil, fmt.Errorf("%s: larger than %d bytes", name, max)
			}
			r, err := blob.Reader()
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			defer r.Close()
			b, err := readlimit.All(r, max)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			return b, nil
		})

		if err != nil {
			return nil, fmt.Errorf("commit %s: %w", commit.Hash, err)
		}
	}
	snap, err := c.Finish(commit.Hash.String())
	if err != nil {
		return nil, fmt.Errorf("commit %s: %w", commit.Hash, err)
	}
	snap.Commit = &policy.CommitInfo{Ref: ref, Time: commit.Committer.When.UTC(), Subject: subject(commit.Message)}
	return snap, nil
}

// subject is a commit message's first line, bounded for dumps and logs.
func subject(msg string) string {
	line, _, _ := strings.Cut(msg, "\n")
	line = strings.TrimSpace(line)
	if len(line) > 200 {
		line = line[:200] + "…"
	}
	return line
}

// hiddenPath reports whether a slash path has a segment starting with "."
// (skipped, as in a directory).
func hiddenPath(p string) bool {
	for _, seg := range strings.Split(p, "/") {
		if strings.HasPrefix(seg, ".") {
			return true
		}
	}
	return false
}

var (
	errRepoTooLarge = errors.New("repository too large")
	// errTransfer marks a fetch that failed in transfer, not for what the
	// commit holds.
	errTransfer = errors.New("transfer failed")
)

// boundedFS fails writes once its files hold more than a budget, so a
// fetch cannot store an unbounded repository.
type boundedFS struct {
	billy.Filesystem
	left *atomic.Int64
}

func (b *boundedFS) Create(name string) (billy.File, error) {
	return b.wrap(b.Filesystem.Create(name))
}

func (b *boundedFS) OpenFile(name string, flag int, perm os.FileMode) (billy.File, error) {
	return b.wrap(b.Filesystem.OpenFile(name, flag, perm))
}

func (b *boundedFS) TempFile(dir, prefix string) (billy.File, error) {
	return b.wrap(b.Filesystem.TempFile(dir, prefix))
}

func (b *boundedFS) Chroot(p string) (billy.Filesystem, error) {
	fs, err := b.Filesystem.Chroot(p)
	if err != nil {
		return nil, err
	}
	return &boundedFS{Filesystem: fs, left: b.left}, nil
}

func (b *boundedFS) wrap(f billy.File, err error) (billy.File, error) {
	if err != nil {
		return nil, err
	}
	return &boundedFile{File: f, left: b.left}, nil
}

type boundedFile struct {
	billy.File
	left *atomic.Int64
}

func (f *boundedFile) Write(p []byte) (int, error) {
	if f.left.Add(-int64(len(p))) < 0 {
		return 0, errRepoTooLarge
	}
	return f.File.Write(p)
}
