package policy

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/open-policy-agent/opa/v1/tester"
	"github.com/open-policy-agent/opa/v1/topdown/print"
	"go.uber.org/zap"
)

// DefaultDecisionPath is OPA-Envoy's default decision: data.envoy.authz.allow.
const DefaultDecisionPath = "envoy/authz/allow"

// ParseDecisionPath turns "envoy/authz/allow" (OPA-Envoy's form) or
// "data.envoy.authz.allow" into a reference under data.
func ParseDecisionPath(p string) (ast.Ref, error) {
	p = strings.TrimSpace(p)
	if p == "" {
		p = DefaultDecisionPath
	}
	if strings.HasPrefix(p, "data.") || p == "data" {
		ref, err := ast.ParseRef(p)
		if err != nil {
			return nil, fmt.Errorf("decision path %q: %w", p, err)
		}
		if !ref.IsGround() || len(ref) < 2 {
			return nil, fmt.Errorf("decision path %q: must name a document under data", p)
		}
		return ref, nil
	}
	ref := ast.Ref{ast.DefaultRootDocument}
	for _, seg := range strings.Split(strings.Trim(p, "/"), "/") {
		if seg == "" {
			return nil, fmt.Errorf("decision path %q: empty segment", p)
		}
		ref = append(ref, ast.StringTerm(seg))
	}
	return ref, nil
}

// TestResult is the outcome of one Rego test.
type TestResult struct {
	Package  string        `json:"package"`
	Name     string        `json:"name"`
	Location string        `json:"location,omitempty"`
	Pass     bool          `json:"pass"`
	Skip     bool          `json:"skip,omitempty"`
	Error    string        `json:"error,omitempty"`
	Duration time.Duration `json:"duration_ns"`
	Output   string        `json:"output,omitempty"`
}

// FullName is package.rule, as `opa test` prints it.
func (t TestResult) FullName() string { return t.Package + "." + t.Name }

// RejectError is why a policy set was not activated.
type RejectError struct {
	Revision    string
	Stage       string   // "load", "parse", "compile", "test", "decision", "prepare"
	FailedTests []string // for Stage "test"
	Err         error
}

func (e *RejectError) Error() string {
	if e.Stage == "test" && len(e.FailedTests) > 0 {
		return fmt.Sprintf("policy %s rejected: failing tests: %s", e.Revision, strings.Join(e.FailedTests, ", "))
	}
	if e.Revision == "" {
		return fmt.Sprintf("policy rejected at %s: %v", e.Stage, e.Err)
	}
	return fmt.Sprintf("policy %s rejected at %s: %v", e.Revision, e.Stage, e.Err)
}

func (e *RejectError) Unwrap() error { return e.Err }

// compiled is an activated, ready-to-evaluate policy set.
type compiled struct {
	revision    string
	query       rego.PreparedEvalQuery
	path        string
	files       []string
	tests       int
	activatedAt time.Time
	cache       *decisionCache // nil: every decision is evaluated
	cacheStatus DecisionCacheStatus
	settings    *settings // how requests are put to it (set by Engine.build)
}

type compileConfig struct {
	decision    ast.Ref
	runTests    bool
	testTimeout time.Duration
	logger      *zap.Logger
	// decisionCache reuses results where the policy allows it (decisioncache.go).
	decisionCache bool
}

// parsedSet is the union of all sources, parsed.
type parsedSet struct {
	revision string
	modules  map[string]*ast.Module // every module, tests included
	prod     map[string]*ast.Module // without *_test.rego
	data     map[string]any
	files    []string
	tests    int
}

// parseSources parses every module of every source with Rego v1 syntax and
// merges their data.
func parseSources(snaps []*Snapshot) (*parsedSet, error) {
	ps := &parsedSet{modules: map[string]*ast.Module{}, prod: map[string]*ast.Module{}, data: map[string]any{}}
	var revs []string
	var errs []string
	for _, s := range snaps {
		revs = append(revs, s.Name+"="+s.Revision+s.Digest)
		for _, f := range s.Modules {
			name := s.Name + ":" + f.Path
			m, err := ast.ParseModuleWithOpts(name, string(f.Content), ast.ParserOptions{RegoVersion: ast.RegoV1})
			if err != nil {
				errs = append(errs, err.Error())
				continue
			}
			if m == nil {
				errs = append(errs, name+": empty module")
				continue
			}
			ps.modules[name] = m
			ps.files = append(ps.files, name)
			if isTestFile(f.Path) {
				ps.tests++
			} else {
				ps.prod[name] = m
			}
		}
		if err := mergeData(ps.data, nil, deepCopyData(s.Data)); err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", s.Name, err))
		}
	}
	sort.Strings(revs)
	if len(snaps) == 1 {
		ps.revision = snaps[0].Revision
	} else {
		ps.revision = revisionOf([]File{{Path: "sources", Content: []byte(strings.Join(revs, "\n"))}})
	}
	if len(errs) > 0 {
		return ps, errors.New(strings.Join(errs, "; "))
	}
	if len(ps.prod) == 0 {
		return ps, errNoModules
	}
	return ps, nil
}

// deepCopyData copies nested maps, so merging sources never changes a
// snapshot that a later compilation reuses.
func deepCopyData(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		if vm, ok := v.(map[string]any); ok {
			out[k] = deepCopyData(vm)
		} else {
			out[k] = v
		}
	}
	return out
}

func copyModules(in map[string]*ast.Module) map[string]*ast.Module {
	out := make(map[string]*ast.Module, len(in))
	for k, m := range in {
		out[k] = m.Copy()
	}
	return out
}

// runTests runs every test rule of the set (OPA's tester) against its data.
// The error is for tests that could not run at all (compile errors).
func runTests(ctx context.Context, ps *parsedSet, timeout time.Duration) ([]TestResult, error) {
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	store := inmem.NewFromObjectWithOpts(deepCopyData(ps.data), inmem.OptRoundTripOnWrite(false))
	runner := tester.NewRunner().
		SetDefaultRegoVersion(ast.RegoV1).
		SetStore(store).
		SetModules(copyModules(ps.modules)).
		SetTimeout(timeout).
		SetParallel(2).
		CapturePrintOutput(true).
		RaiseBuiltinErrors(true)
	ch, err := runner.RunTests(ctx, nil)
	if err != nil {
		return nil, err
	}
	var out []TestResult
	for r := range ch {
		tr := TestResult{
			Package:  strings.TrimPrefix(r.Package, "data."),
			Name:     r.Name,
			Pass:     r.Pass(),
			Skip:     r.Skip,
			Duration: r.Duration,
			Output:   string(r.Output),
		}
		if r.Location != nil {
			tr.Location = r.Location.String()
		}
		if r.Error != nil {
			tr.Error = r.Error.Error()
		}
		out = append(out, tr)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].FullName() < out[j].FullName() })
	return out, nil
}

// Test runs the Rego tests of the policy in opts.Dir or opts.Git the way
// the engine does before activating it (Rego v1, the policy's data
// documents, opts.Limits and opts.TestTimeout), and returns every result
// sorted by name. The error is for a policy that cannot be read, parsed or
// compiled.
func Test(ctx context.Context, opts Options) ([]TestResult, error) {
	src, err := newSource(opts)
	if err != nil {
		return nil, err
	}
	if src == nil {
		return nil, errors.New("policy: no directory or Git repository to test")
	}
	snap, err := src.read(ctx)
	if err != nil {
		return nil, err
	}
	ps, err := parseSources([]*Snapshot{snap})
	if err != nil && !errors.Is(err, errNoModules) {
		return nil, err
	}
	return runTests(ctx, ps, opts.TestTimeout)
}

// compileSet compiles a parsed set for production, runs its tests first when
// asked, checks that the decision exists and prepares the decision query.
// Nothing here runs on the request path.
func compileSet(ctx context.Context, ps *parsedSet, cfg compileConfig) (*compiled, []TestResult, error) {
	reject := func(stage string, err error) (*compiled, []TestResult, error) {
		return nil, nil, &RejectError{Revision: ps.revision, Stage: stage, Err: err}
	}
	var results []TestResult
	if cfg.runTests && ps.tests > 0 {
		var err error
		results, err = runTests(ctx, ps, cfg.testTimeout)
		if err != nil {
			return reject("compile", err)
		}
		var failed []string
		for _, r := range results {
			if !r.Pass && !r.Skip {
				name := r.FullName()
				if r.Error != "" {
					name += " (" + r.Error + ")"
				}
				failed = append(failed, name)
			}
		}
		if len(failed) > 0 {
			return nil, results, &RejectError{Revision: ps.revision, Stage: "test", FailedTests: failed,
				Err: fmt.Errorf("%d of %d tests failed", len(failed), len(results))}
		}
	}

	compiler := ast.NewCompiler().
		WithDefaultRegoVersion(ast.RegoV1).
		WithEnablePrintStatements(true)
	compiler.Compile(copyModules(ps.prod))
	if compiler.Failed() {
		return reject("compile", compiler.Errors)
	}

	store := inmem.NewFromObjectWithOpts(ps.data, inmem.OptRoundTripOnWrite(false))
	if !decisionDefined(ctx, compiler, store, cfg.decision) {
		return reject("decision", fmt.Errorf("no rule or data defines %s", cfg.decision))
	}

	logger := cfg.logger
	if logger == nil {
		logger = zap.NewNop()
	}
	pq, err := rego.New(
		rego.ParsedQuery(ast.NewBody(ast.NewExpr(ast.NewTerm(cfg.decision)))),
		rego.Compiler(compiler),
		rego.Store(store),
		rego.EnablePrintStatements(true),
		// Results stay ast values: interpret reads them directly and the
		// decision logger converts them off the request path.
		rego.GenerateJSON(func(t *ast.Term, _ *rego.EvalContext) (any, error) { return t.Value, nil }),
		rego.PrintHook(printHook{logger: logger.With(zap.String("revision", ps.revision))}),
	).PrepareForEval(ctx)
	if err != nil {
		return reject("prepare", err)
	}
	c := &compiled{
		revision:    ps.revision,
		query:       pq,
		path:        cfg.decision.String(),
		files:       ps.files,
		tests:       len(results),
		activatedAt: time.Now(),
		cacheStatus: DecisionCacheStatus{Reason: "disabled by configuration"},
	}
	if cfg.decisionCache {
		var reason string
		if c.cache, reason = newDecisionCache(compiler.Modules); c.cache != nil {
			c.cacheStatus = c.cache.status()
		} else {
			c.cacheStatus.Reason = reason
		}
	}
	return c, results, nil
}

// decisionDefined reports whether a rule or a data document can produce the
// decision, so a renamed package is rejected instead of denying everything.
func decisionDefined(ctx context.Context, c *ast.Compiler, store storage.Store, ref ast.Ref) bool {
	if len(c.GetRules(ref)) > 0 || len(c.GetRulesDynamic(ref)) > 0 {
		return true
	}
	path, err := storage.NewPathForRef(ref)
	if err != nil {
		return false
	}
	_, err = storage.ReadOne(ctx, store, path)
	return err == nil
}

// printHook sends Rego print() output to the debug log.
type printHook struct{ logger *zap.Logger }

func (h printHook) Print(pctx print.Context, msg string) error {
	loc := ""
	if pctx.Location != nil {
		loc = pctx.Location.String()
	}
	h.logger.Debug("rego print", zap.String("location", loc), zap.String("message", msg))
	return nil
}
