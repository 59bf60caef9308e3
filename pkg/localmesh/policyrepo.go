package localmesh

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"

	"github.com/causeway-mesh/causeway/pkg/policy"
	"github.com/causeway-mesh/causeway/pkg/readlimit"
)

// PolicyBranch is the branch of the policy repository the waypoints follow.
const PolicyBranch = "main"

// maxImportedFile bounds each file copied into the policy repository.
const maxImportedFile = 4 << 20

// PolicyRepo is local mode's Git repository of the waypoints' policies,
// created at start from a policy directory: the waypoints fetch its branch
// as they would a remote repository's, so each commit is a revision.
// Anyone may commit to it (git, or Commit).
type PolicyRepo struct {
	Path string
	repo *git.Repository
}

// CreatePolicyRepo makes a fresh repository at path (any earlier one is
// removed) whose first commit holds the policy files of dir: those the
// engine reads from a policy directory (policy.DirFiles).
func CreatePolicyRepo(path, dir string) (*PolicyRepo, error) {
	if err := os.RemoveAll(path); err != nil {
		return nil, fmt.Errorf("policy repository: %w", err)
	}
	repo, err := git.PlainInitWithOptions(path, &git.PlainInitOptions{InitOptions: git.InitOptions{DefaultBranch: plumbing.NewBranchReferenceName(PolicyBranch)}})
	if err != nil {
		return nil, fmt.Errorf("policy repository: %w", err)
	}
	// Exactly what a waypoint would read from dir, so the repository's
	// first revision is the directory's policy.
	files, err := policy.DirFiles(dir, policy.Limits{MaxFileBytes: maxImportedFile})
	if err != nil {
		return nil, fmt.Errorf("policy directory: %w", err)
	}
	r := &PolicyRepo{Path: path, repo: repo}
	if _, err := r.Commit("policy: import "+dir, files); err != nil {
		return nil, err
	}
	return r, nil
}

// Commit writes files (slash paths; nil content removes one) in the work
// tree, commits them on the branch and returns the commit's SHA.
func (r *PolicyRepo) Commit(msg string, files map[string][]byte) (string, error) {
	wt, err := r.repo.Worktree()
	if err != nil {
		return "", err
	}
	for name, content := range files {
		if content == nil {
			if _, err := wt.Remove(name); err != nil {
				return "", fmt.Errorf("remove %s: %w", name, err)
			}
			continue
		}
		p := filepath.Join(r.Path, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(p, content, 0o644); err != nil {
			return "", err
		}
		if _, err := wt.Add(name); err != nil {
			return "", fmt.Errorf("add %s: %w", name, err)
		}
	}
	h, err := wt.Commit(msg, &git.CommitOptions{Author: &object.Signature{Name: "meshctl", Email: "meshctl@localhost", When: time.Now()}, AllowEmptyCommits: true})
	if err != nil {
		return "", fmt.Errorf("commit: %w", err)
	}
	return h.String(), nil
}

// URL is what a waypoint fetches: the repository's .git directory (the
// in-process file transport serves a repository from its storage).
func (r *PolicyRepo) URL() string { return filepath.Join(r.Path, ".git") }

// File reads a file of the work tree.
func (r *PolicyRepo) File(name string) ([]byte, error) {
	return readlimit.File(filepath.Join(r.Path, filepath.FromSlash(name)), maxImportedFile)
}
