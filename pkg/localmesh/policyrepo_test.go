package localmesh

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/causeway-mesh/causeway/pkg/policy"
)

// The repository's first commit holds what the engine would read from the
// directory: policy files only, symlinked files followed, hidden entries
// skipped, and a directory reached through a symlink (git-sync) resolved.
func TestCreatePolicyRepoHoldsWhatTheEngineReads(t *testing.T) {
	base := t.TempDir()
	real := filepath.Join(base, "checkout")
	mk := func(rel, content string) {
		p := filepath.Join(real, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mk("authz.rego", "package authz\n")
	mk("authz_test.rego", "package authz\n")
	mk("team/data.json", `{"x": 1}`)
	mk("README.md", "not policy")
	mk(".hidden.rego", "package hidden\n")
	mk(".git/config", "[core]")
	shared := filepath.Join(base, "shared.rego")
	if err := os.WriteFile(shared, []byte("package shared\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(shared, filepath.Join(real, "shared.rego")); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "current") // as git-sync publishes
	if err := os.Symlink(real, dir); err != nil {
		t.Fatal(err)
	}

	repo, err := CreatePolicyRepo(filepath.Join(base, "repo"), dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	err = filepath.WalkDir(repo.Path, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == ".git" {
				return filepath.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(repo.Path, p)
		got = append(got, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want, err := policy.DirFiles(dir, policy.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	wantNames := slices.Sorted(maps.Keys(want))
	slices.Sort(got)
	if !slices.Equal(got, wantNames) || !slices.Equal(got, []string{"authz.rego", "authz_test.rego", "shared.rego", "team/data.json"}) {
		t.Fatalf("repository holds %v; the engine reads %v", got, wantNames)
	}
	b, err := repo.File("shared.rego")
	if err != nil || string(b) != "package shared\n" {
		t.Fatalf("shared.rego = %q, %v", b, err)
	}
}
