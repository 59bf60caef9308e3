package policy_test

import (
	"bytes"
	"context"
	"encoding/pem"
	"errors"
	"io"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/pkg/internal/metricstest"
	"github.com/causeway-mesh/causeway/pkg/policy"
	"github.com/causeway-mesh/causeway/pkg/policy/policygit"
	"github.com/go-git/go-billy/v5/memfs"
	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/storage/memory"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// testRepo is a bare repository served by path, and a work repository in
// memory that pushes commits to it, as a developer would.
type testRepo struct {
	t    testing.TB
	bare string
	work *git.Repository
	when time.Time
}

func newTestRepo(t testing.TB) *testRepo {
	t.Helper()
	bare := filepath.Join(t.TempDir(), "policy.git")
	if _, err := git.PlainInitWithOptions(bare, &git.PlainInitOptions{Bare: true, InitOptions: git.InitOptions{DefaultBranch: "refs/heads/main"}}); err != nil {
		t.Fatal(err)
	}
	work, err := git.Init(memory.NewStorage(), memfs.New())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := work.CreateRemote(&config.RemoteConfig{Name: "origin", URLs: []string{bare}}); err != nil {
		t.Fatal(err)
	}
	return &testRepo{t: t, bare: bare, work: work, when: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
}

// commit writes files ("" deletes one), commits them on main and pushes.
func (r *testRepo) commit(msg string, files map[string]string) plumbing.Hash {
	r.t.Helper()
	wt, err := r.work.Worktree()
	if err != nil {
		r.t.Fatal(err)
	}
	for name, content := range files {
		if content == "" {
			if _, err := wt.Remove(name); err != nil {
				r.t.Fatal(err)
			}
			continue
		}
		f, err := wt.Filesystem.Create(name)
		if err != nil {
			r.t.Fatal(err)
		}
		if _, err := f.Write([]byte(content)); err != nil {
			r.t.Fatal(err)
		}
		f.Close()
		if _, err := wt.Add(name); err != nil {
			r.t.Fatal(err)
		}
	}
	r.when = r.when.Add(time.Minute)
	h, err := wt.Commit(msg, &git.CommitOptions{Author: &object.Signature{Name: "dev", Email: "dev@example.com", When: r.when}, AllowEmptyCommits: true})
	if err != nil {
		r.t.Fatal(err)
	}
	r.push("+refs/heads/master:refs/heads/main")
	return h
}

func (r *testRepo) push(spec string) {
	r.t.Helper()
	err := r.work.Push(&git.PushOptions{RemoteName: "origin", RefSpecs: []config.RefSpec{config.RefSpec(spec)}, Force: true})
	if err != nil && err != git.NoErrAlreadyUpToDate {
		r.t.Fatalf("push %s: %v", spec, err)
	}
}

// forcePush points main at an older commit.
func (r *testRepo) forcePush(h plumbing.Hash) {
	r.t.Helper()
	if err := r.work.Storer.SetReference(plumbing.NewHashReference("refs/heads/old", h)); err != nil {
		r.t.Fatal(err)
	}
	r.push("+refs/heads/old:refs/heads/main")
}

func gitPolicy(methods string) string {
	return "package envoy.authz\n\nallow if input.attributes.request.http.method in {" + methods + "}\n"
}

const gitPolicyTest = `package envoy.authz_test

import data.envoy.authz

test_get if authz.allow with input as {"attributes": {"request": {"http": {"method": "GET"}}}}
`

func gitEngine(t testing.TB, opts policygit.Options) (*policy.Engine, *observer.ObservedLogs, *prometheus.Registry, *observer.ObservedLogs) {
	t.Helper()
	core, decisions := observer.New(zapcore.InfoLevel)
	dl, err := policy.NewDecisionLogger(zap.New(core), policy.DecisionLogOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { dl.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	reg := prometheus.NewRegistry()
	e, logs := policy.NewTestEngine(t, policy.Options{Remote: gitRemote(t, opts, policy.Limits{}), DecisionLog: dl, Registerer: reg})
	return e, logs, reg, decisions
}

func gitRemote(t testing.TB, o policygit.Options, limits policy.Limits) *policygit.Source {
	t.Helper()
	r, err := policygit.New(o, limits)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func decide(t testing.TB, e *policy.Engine, method string) policy.Decision {
	t.Helper()
	return e.Decide(context.Background(), &policy.Request{HTTP: policy.TestRequest(t, method+" / HTTP/1.1\nHost: x\n\n")})
}

// Commits that add, change and break a policy: each good commit becomes
// the revision (in the status, the decisions and their log), a broken one
// is refused and counted while the last good one stays; a force-push to an
// older commit activates it; a deleted ref keeps the last good policy.
func TestGitRevisions(t *testing.T) {
	repo := newTestRepo(t)
	repo.commit("unrelated start", map[string]string{"README.md": "policies below\n"})
	e, logs, reg, decisions := gitEngine(t, policygit.Options{URL: repo.bare, Ref: "main", Dir: "policies", Poll: 20 * time.Millisecond})

	// The sub-directory does not exist yet: not ready, and why.
	if err := e.Load(context.Background()); err == nil || !strings.Contains(err.Error(), "no directory policies") {
		t.Fatalf("Load without the directory: %v", err)
	}
	if err := e.Ready(); err == nil || !strings.Contains(err.Error(), "fetch") {
		t.Fatalf("Ready = %v, want the fetch failure", err)
	}
	policy.StartEngine(t, e)

	add := repo.commit("policy: allow GET", map[string]string{"policies/authz.rego": gitPolicy(`"GET"`), "policies/authz_test.rego": gitPolicyTest})
	policy.WaitFor(t, "the first commit", func() bool { return e.Revision() == add.String() })
	st := e.Status()
	src := st.Sources[policy.GitSource]
	if src.Revision != add.String() || src.Commit == nil || src.Commit.Ref != "refs/heads/main" ||
		!src.Commit.Time.Equal(repo.when) || src.Commit.Subject != "policy: allow GET" || src.ReadError != "" {
		t.Fatalf("git source status = %+v (commit %+v)", src, src.Commit)
	}
	// Readiness names the commit, its ref and time.
	if got, want := e.Describe(), "policy revision "+add.String()+" (refs/heads/main, committed "+repo.when.Format(time.RFC3339)+")"; got != want {
		t.Errorf("Describe = %q, want %q", got, want)
	}
	if !strings.Contains(src.Location, repo.bare+"@main (policies)") {
		t.Errorf("location = %q", src.Location)
	}
	if d := decide(t, e, "GET"); !d.Allowed || d.Revision != add.String() {
		t.Fatalf("GET: %+v", d)
	}
	if d := decide(t, e, "POST"); d.Allowed {
		t.Fatal("POST allowed by the first commit")
	}
	if v := gaugeWith(t, reg, "policy_active_revision", "revision", add.String()); v != 1 {
		t.Fatalf("policy_active_revision{revision=%s} = %v", add, v)
	}

	change := repo.commit("policy: allow POST", map[string]string{"policies/authz.rego": gitPolicy(`"GET", "POST"`)})
	policy.WaitFor(t, "the change", func() bool { return e.Revision() == change.String() })
	if d := decide(t, e, "POST"); !d.Allowed || d.Revision != change.String() {
		t.Fatalf("POST after the change: %+v", d)
	}
	if v := gaugeWith(t, reg, "policy_active_revision", "revision", add.String()); v != -1 {
		t.Errorf("the replaced revision is still a metric (%v)", v)
	}

	// A commit whose tests fail, then one that does not parse: refused.
	failing := repo.commit("policy: break GET", map[string]string{"policies/authz.rego": gitPolicy(`"POST"`)})
	policy.WaitFor(t, "the failing commit's rejection", func() bool {
		r := e.Status().LastRejection
		return r != nil && r.Revision == failing.String()
	})
	if r := e.Status().LastRejection; r.Source != policy.GitSource || r.Stage != "test" || len(r.FailedTests) != 1 {
		t.Fatalf("rejection = %+v", r)
	}
	broken := repo.commit("policy: typo", map[string]string{"policies/authz.rego": "package envoy.authz\n\nallow if {\n"})
	policy.WaitFor(t, "the broken commit's rejection", func() bool {
		r := e.Status().LastRejection
		return r != nil && r.Revision == broken.String() && r.Stage == "parse"
	})
	if e.Revision() != change.String() {
		t.Fatalf("revision %s after broken commits, want %s kept", e.Revision(), change)
	}
	if n := logs.FilterMessage("policy rejected, keeping the active policy").FilterField(zap.String("revision", broken.String())).Len(); n != 1 {
		t.Errorf("%d rejection logs for the broken commit, want 1 (polls must not repeat it)", n)
	}
	if v := gaugeWith(t, reg, "policy_loads_total", "result", "rejected"); v != 2 {
		t.Errorf("rejected loads = %v, want 2", v)
	}

	// Force-push main back to the first commit: it is the revision again.
	repo.forcePush(add)
	policy.WaitFor(t, "the force-pushed older commit", func() bool { return e.Revision() == add.String() })
	if d := decide(t, e, "POST"); d.Allowed {
		t.Fatal("POST allowed after the force-push to the first commit")
	}

	// Deleting the ref keeps the policy and says why.
	bare, err := git.PlainOpen(repo.bare)
	if err != nil {
		t.Fatal(err)
	}
	if err := bare.Storer.RemoveReference("refs/heads/main"); err != nil {
		t.Fatal(err)
	}
	policy.WaitFor(t, "the deleted ref's read error", func() bool {
		return strings.Contains(e.Status().Sources[policy.GitSource].ReadError, `ref "main" not found`)
	})
	if err := e.Ready(); err != nil || e.Revision() != add.String() {
		t.Fatalf("after the ref was deleted: ready %v, revision %s", err, e.Revision())
	}
	if d := decide(t, e, "GET"); !d.Allowed || d.Revision != add.String() {
		t.Fatalf("GET after the ref was deleted: %+v", d)
	}

	// Every decision log entry names the commit that decided.
	policy.WaitFor(t, "decision logs", func() bool { return decisions.FilterMessage("decision").Len() >= 5 })
	for _, entry := range decisions.FilterMessage("decision").All() {
		rev, _ := entry.ContextMap()["revision"].(string)
		if rev != add.String() && rev != change.String() {
			t.Errorf("decision log revision %q is not a commit", rev)
		}
	}
}

// gaugeWith returns the value of name's series whose label has that value,
// -1 if absent.
func gaugeWith(t testing.TB, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	if v, ok := metricstest.Value(t, reg, name, map[string]string{label: value}); ok {
		return v
	}
	return -1
}

// A repository unreachable at start: not ready, with the reason; once it
// exists it is fetched. Unreachable later: the last good policy stays.
func TestGitRepositoryUnreachable(t *testing.T) {
	repo := newTestRepo(t)
	moved := repo.bare + ".away"
	if err := os.Rename(repo.bare, moved); err != nil {
		t.Fatal(err)
	}
	e, _, reg, _ := gitEngine(t, policygit.Options{URL: repo.bare, Ref: "main", Poll: 20 * time.Millisecond})
	policy.StartEngine(t, e)
	policy.WaitFor(t, "the fetch failure", func() bool { return e.Ready() != nil && strings.Contains(e.Ready().Error(), "fetch") })
	if err := e.Ready(); !strings.Contains(err.Error(), "repository not found") {
		t.Fatalf("Ready = %v, want the reason", err)
	}

	if err := os.Rename(moved, repo.bare); err != nil {
		t.Fatal(err)
	}
	good := repo.commit("policy", map[string]string{"authz.rego": gitPolicy(`"GET"`)})
	policy.WaitFor(t, "the repository once reachable", func() bool { return e.Revision() == good.String() })

	if err := os.Rename(repo.bare, moved); err != nil {
		t.Fatal(err)
	}
	failures := policy.Gathered(t, reg, "policy_source_read_failures_total")
	policy.WaitFor(t, "the later fetch failure", func() bool { return policy.Gathered(t, reg, "policy_source_read_failures_total") > failures })
	if err := e.Ready(); err != nil || e.Revision() != good.String() {
		t.Fatalf("unreachable later: ready %v, revision %s", err, e.Revision())
	}
	if !strings.Contains(e.Status().Sources[policy.GitSource].ReadError, "repository not found") {
		t.Fatalf("status = %+v", e.Status().Sources[policy.GitSource])
	}
}

// A ref may be a tag (annotated: its commit is the revision) or a commit.
func TestGitRefs(t *testing.T) {
	repo := newTestRepo(t)
	first := repo.commit("one", map[string]string{"authz.rego": gitPolicy(`"GET"`)})
	if _, err := repo.work.CreateTag("v1", first, &git.CreateTagOptions{Message: "v1", Tagger: &object.Signature{Name: "dev", When: repo.when}}); err != nil {
		t.Fatal(err)
	}
	repo.push("refs/tags/v1:refs/tags/v1")
	second := repo.commit("two", map[string]string{"authz.rego": gitPolicy(`"GET", "POST"`)})

	for ref, want := range map[string]plumbing.Hash{"v1": first, "refs/tags/v1": first, first.String(): first, "main": second, "": second} {
		e, _, _, _ := gitEngine(t, policygit.Options{URL: "file://" + repo.bare, Ref: ref})
		if err := e.Load(context.Background()); err != nil {
			t.Fatalf("ref %q: %v", ref, err)
		}
		if e.Revision() != want.String() {
			t.Errorf("ref %q: revision %s, want %s", ref, e.Revision(), want)
		}
	}
}

// The repository is bounded: bytes stored by a fetch, files in its tree,
// and the policy files themselves.
func TestGitLimits(t *testing.T) {
	repo := newTestRepo(t)
	files := map[string]string{"authz.rego": gitPolicy(`"GET"`)}
	for i := range 20 {
		files[filepath.Join("docs", strings.Repeat("x", i+1)+".md")] = strings.Repeat("lorem ipsum ", 200*(i+1))
	}
	repo.commit("big", files)
	cases := []struct {
		opts policygit.Options
		want string
	}{
		{policygit.Options{MaxBytes: 2048}, "repository larger than 2048 bytes"},
		{policygit.Options{MaxFiles: 10}, "more than 10 files in the repository"},
		{policygit.Options{Dir: "nowhere"}, "has no directory nowhere"},
	}
	for _, c := range cases {
		c.opts.URL, c.opts.Ref = repo.bare, "main"
		e, _, _, _ := gitEngine(t, c.opts)
		if err := e.Load(context.Background()); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: Load = %v, want %q", c.opts, err, c.want)
		}
	}
	limits := policy.Limits{MaxFileBytes: 16}
	e, _ := policy.NewTestEngine(t, policy.Options{Remote: gitRemote(t, policygit.Options{URL: repo.bare}, limits), Limits: limits})
	if err := e.Load(context.Background()); err == nil || !strings.Contains(err.Error(), "larger than 16 bytes") {
		t.Errorf("policy file limit: %v", err)
	}
	e, _ = policy.NewTestEngine(t, policy.Options{Remote: gitRemote(t, policygit.Options{URL: repo.bare}, policy.Limits{})})
	if err := e.Load(context.Background()); err != nil {
		t.Fatalf("within the default limits: %v", err)
	}
}

// Settings travel with the commit: invalid ones refuse it.
func TestGitSettings(t *testing.T) {
	repo := newTestRepo(t)
	repo.commit("one", map[string]string{"authz.rego": "package envoy.http.public\n\nallow := true\n", policy.SettingsFile: "decisionPath: envoy/http/public/allow\n"})
	e, _, _, _ := gitEngine(t, policygit.Options{URL: repo.bare})
	if err := e.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := e.Status().Settings; st.From != policy.SettingsFile || st.DecisionPath != "data.envoy.http.public.allow" {
		t.Fatalf("settings = %+v", st)
	}
	bad := repo.commit("bad settings", map[string]string{policy.SettingsFile: "decisionPth: x\n"})
	var re *policy.RejectError
	if err := e.Load(context.Background()); err == nil || !errorsAs(err, &re) || re.Stage != "settings" || re.Revision != bad.String() {
		t.Fatalf("bad settings: %v", err)
	}
}

// Refresh (a push webhook) fetches at once, however long the poll interval.
func TestGitRefresh(t *testing.T) {
	repo := newTestRepo(t)
	first := repo.commit("one", map[string]string{"authz.rego": gitPolicy(`"GET"`)})
	e, _, _, _ := gitEngine(t, policygit.Options{URL: repo.bare, Poll: time.Hour})
	policy.StartEngine(t, e)
	policy.WaitFor(t, "the first fetch", func() bool { return e.Revision() == first.String() })
	second := repo.commit("two", map[string]string{"authz.rego": gitPolicy(`"POST"`)})
	hook := httptest.NewServer(e.RefreshHandler())
	defer hook.Close()
	resp, err := http.Post(hook.URL, "application/json", strings.NewReader(`{"ref": "refs/heads/main"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("webhook: %s", resp.Status)
	}
	policy.WaitFor(t, "the refreshed commit", func() bool { return e.Revision() == second.String() })
}

func TestGitOptionsChecked(t *testing.T) {
	for _, c := range []struct {
		opts policygit.Options
		want string
	}{
		{policygit.Options{}, "URL is required"},
		{policygit.Options{URL: "https://user:s3cret@example.com/p.git"}, "carries a password"},
		{policygit.Options{URL: "ssh://git@example.com/p.git", SSHKeyFile: "/k"}, "known hosts"},
		{policygit.Options{URL: "http://example.com/p.git", TokenFile: "/t"}, "plain http"},
		{policygit.Options{URL: "https://example.com/p.git", TokenFile: "/t", SSHKeyFile: "/k"}, "not both"},
	} {
		_, err := policygit.New(c.opts, policy.Limits{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.opts, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("error shows the password: %v", err)
		}
	}
	if _, err := policy.NewEngine(policy.Options{Dir: "x", Remote: gitRemote(t, policygit.Options{URL: "/x"}, policy.Limits{})}); err == nil {
		t.Error("Dir and Remote together accepted")
	}
}

func errorsAs(err error, target **policy.RejectError) bool { return errors.As(err, target) }

// Over https (a real TLS server on 127.0.0.1, Git's own smart-HTTP backend
// as the server): the token from its file is sent as basic auth, the CA
// file is trusted, the fetch is shallow, and the token is never logged.
func TestGitHTTPS(t *testing.T) {
	backend := "/usr/lib/git-core/git-http-backend"
	if _, err := os.Stat(backend); err != nil {
		t.Skip("git-http-backend not installed (a server for the test only)")
	}
	repo := newTestRepo(t)
	repo.commit("one", map[string]string{"authz.rego": gitPolicy(`"GET"`)})
	head := repo.commit("two", map[string]string{"authz.rego": gitPolicy(`"GET", "POST"`)})

	const token = "s3cret-t0ken"
	var deepened, failUpload atomic.Bool
	cgiHandler := &cgi.Handler{Path: backend, Env: []string{"GIT_PROJECT_ROOT=" + filepath.Dir(repo.bare), "GIT_HTTP_EXPORT_ALL=1"}}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if user, pass, ok := r.BasicAuth(); !ok || user != "git" || pass != token {
			w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		if strings.HasSuffix(r.URL.Path, "/git-upload-pack") {
			if failUpload.Swap(false) {
				http.Error(w, "try later", http.StatusServiceUnavailable)
				return
			}
			body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			if strings.Contains(string(body), "deepen 1") {
				deepened.Store(true)
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		cgiHandler.ServeHTTP(w, r)
	}))
	defer srv.Close()
	dir := t.TempDir()
	caFile, tokenFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "token")
	policy.WriteFiles(t, dir, map[string]string{
		"ca.pem": string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})),
		"token":  token + "\n",
	})
	url := srv.URL + "/policy.git"

	e, logs, _, _ := gitEngine(t, policygit.Options{URL: url, Ref: "main", CAFile: caFile})
	if err := e.Load(context.Background()); err == nil || !strings.Contains(err.Error(), "authentication required") {
		t.Fatalf("without the token: %v", err)
	}
	e, logs2, _, _ := gitEngine(t, policygit.Options{URL: url, Ref: "main", CAFile: caFile, TokenFile: tokenFile})
	// A transfer that fails is retried, though the ref has not moved.
	failUpload.Store(true)
	if err := e.Load(context.Background()); err == nil || !strings.Contains(err.Error(), "transfer failed") {
		t.Fatalf("failing transfer: %v", err)
	}
	if err := e.Load(context.Background()); err != nil {
		t.Fatalf("with the token: %v", err)
	}
	if e.Revision() != head.String() || !deepened.Load() {
		t.Fatalf("revision %s (want %s), shallow fetch %v", e.Revision(), head, deepened.Load())
	}
	e, _, _, _ = gitEngine(t, policygit.Options{URL: url, Ref: "main", TokenFile: tokenFile})
	if err := e.Load(context.Background()); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("without the CA: %v", err)
	}
	for _, l := range append(logs.All(), logs2.All()...) {
		for _, f := range l.Context {
			if strings.Contains(f.String, token) || strings.Contains(l.Message, token) {
				t.Fatalf("the token is logged: %+v", l)
			}
		}
	}
}
