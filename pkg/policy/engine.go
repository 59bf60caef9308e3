package policy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/metrics"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/topdown"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Options configures an Engine.
type Options struct {
	// Dir is a directory of .rego files (and data.json/data.yaml documents),
	// e.g. a checkout kept current by git-sync. It may be a symlink.
	Dir string
	// EmptyDirIsAbsent makes an empty Dir (no file the engine reads, as
	// kubelet mounts an optional ConfigMap that does not exist) no policy
	// yet rather than a bad one: it is logged at Info once, not as a
	// rejection, and Load returns ErrEmptySource. Ready and Status still
	// say that no policy is active.
	EmptyDirIsAbsent bool
	// Remote, instead of Dir, is a source read every Remote.Poll() and at
	// once on Refresh: a Git repository (policygit.New).
	Remote Remote
	// Feed, if set, also loads policy from an OPA bundle service
	// (policybundle.New).
	Feed Feed
	// DecisionPath names the decision, "envoy/authz/allow" (default) or
	// "data.envoy.authz.allow". Input selects the optional parts of the
	// input (body parsing). Both, and the DecisionLog's mode, are defaults:
	// a policy directory's SettingsFile overrides them for its policy.
	DecisionPath string
	Input        InputOptions
	// SkipTests activates policy without running its *_test.rego tests
	// (meshctl policy eval only; the waypoint always runs them).
	SkipTests bool
	// TestTimeout bounds each Rego test (default 5s).
	TestTimeout time.Duration
	// EvalTimeout bounds each evaluation (default 1s, negative: only the
	// caller's context); a request whose policy takes longer is denied with 500.
	EvalTimeout time.Duration
	// Debounce groups file events before a reload (default 250ms); a
	// steady stream is read at most 10× it after its first event.
	Debounce time.Duration
	// RescanInterval rereads the directory even without events, as a fallback
	// for missed notifications (default 30s; negative disables).
	RescanInterval time.Duration
	// Limits bound the size of policy sources (for Git: the policy files;
	// policygit.Options bound the repository).
	Limits Limits
	// Logger receives load, rejection and evaluation-error logs.
	Logger *zap.Logger
	// DecisionLog, if set, receives every decision asynchronously.
	DecisionLog *DecisionLogger
	// Registerer, if set, registers the engine's metrics.
	Registerer prometheus.Registerer
	// NoDecisionCache evaluates every request on the whole input. By
	// default a policy's result is reused for requests that agree on every
	// input value the policy reads, and other requests are evaluated on
	// those values alone, when the policy allows it (see
	// Status().DecisionCache).
	NoDecisionCache bool
	// OnActivate, if set, is called (from the goroutine that activated it,
	// with no lock held) after a new policy set became active, e.g. to
	// hand its Content on.
	OnActivate func(revision string)
}

// Engine evaluates requests against the active policy set and replaces that
// set when its sources change. Decide is safe for concurrent use; an
// evaluation finishes on the policy it started with.
type Engine struct {
	opts     Options
	options  Settings  // the settings Options give, to which a SettingsFile applies
	defaults *settings // options resolved, for policies without a SettingsFile
	log      *zap.Logger
	metrics  *engineMetrics
	active   atomic.Pointer[compiled]
	primary  *source       // the directory or the Git repository; nil with only a bundle
	refresh  chan struct{} // Refresh's requests, one pending at most

	mu        sync.Mutex           // serializes offers; guards the fields below
	accepted  map[string]*Snapshot // per source, the content of the active set
	latest    map[string]*Snapshot // per source, the content last offered
	lastError *Rejection
	readErr   map[string]string // per source, why its last read failed ("" when it worked)
}

// source reads the current content of a polled source.
type source struct {
	name     string // as in snapshot.Name
	location string // the directory, or the repository URL@ref (dir)
	stage    string // the Rejection stage of a failed read
	read     func(context.Context) (*Snapshot, error)
	poll     time.Duration // a Remote: how often it is read
}

// Rejection records a policy set that was not activated.
type Rejection struct {
	Source      string    `json:"source"`
	Revision    string    `json:"revision,omitempty"`
	Stage       string    `json:"stage"`
	Reason      string    `json:"reason"`
	FailedTests []string  `json:"failed_tests,omitempty"`
	At          time.Time `json:"at"`
}

// summary is the rejection in one line.
func (r *Rejection) summary() string {
	s := r.Source
	if r.Revision != "" {
		s += " revision " + r.Revision
	}
	s += " rejected at " + r.Stage + ": " + r.Reason
	if len(r.FailedTests) > 0 {
		s += " (failing: " + strings.Join(r.FailedTests, ", ") + ")"
	}
	return s
}

// Status describes the active policy for admin dumps (/config_dump "policies").
type Status struct {
	Revision     string `json:"revision,omitempty"`
	DecisionPath string `json:"decision_path"`
	// Settings are the active policy's (the defaults before one is active).
	Settings      Settings                `json:"settings"`
	ActivatedAt   *time.Time              `json:"activated_at,omitempty"`
	Files         []string                `json:"files,omitempty"`
	Tests         int                     `json:"tests_passed"`
	Sources       map[string]SourceStatus `json:"sources,omitempty"`
	LastRejection *Rejection              `json:"last_rejection,omitempty"`
	// DecisionCache is nil before a policy is active.
	DecisionCache *DecisionCacheStatus `json:"decision_cache,omitempty"`
}

// SourceStatus is one source's part of the active policy and the state of
// its reads.
type SourceStatus struct {
	// Revision is the source's active revision ("" when none is active).
	Revision string `json:"revision,omitempty"`
	// Commit describes a Git revision.
	Commit *CommitInfo `json:"commit,omitempty"`
	// Location is the directory, the repository (URL@ref) or the bundle.
	Location string `json:"location,omitempty"`
	// ReadError says why the source's last read failed; the active
	// revision stays.
	ReadError string `json:"read_error,omitempty"`
}

// newSource builds the source Options name: the directory or the remote,
// nil for neither.
func newSource(opts Options) (*source, error) {
	switch {
	case opts.Dir != "" && opts.Remote != nil:
		return nil, errors.New("policy: set Dir or Remote, not both")
	case opts.Dir != "":
		dir, limits := opts.Dir, opts.Limits
		return &source{name: "dir", location: dir, stage: "load", read: func(context.Context) (*Snapshot, error) { return readDir(dir, limits) }}, nil
	case opts.Remote != nil:
		r := opts.Remote
		return &source{name: r.Name(), location: r.String(), stage: "fetch", read: r.Read, poll: r.Poll()}, nil
	}
	return nil, nil
}

// Remote is a policy source that is polled rather than watched: a Git
// repository (package policygit, kept apart so that the node proxy does
// not link go-git).
type Remote interface {
	// Name names the source in statuses, rejections and logs (GitSource).
	Name() string
	// String is where it reads, without credentials.
	String() string
	// Poll is how often it is read.
	Poll() time.Duration
	// Read returns its current content; it is called from one goroutine
	// at a time.
	Read(ctx context.Context) (*Snapshot, error)
}

// NewEngine checks the options and builds an engine with no active policy:
// call Load (or Run) before expecting anything but denials.
func NewEngine(opts Options) (*Engine, error) {
	primary, err := newSource(opts)
	if err != nil {
		return nil, err
	}
	if primary == nil && opts.Feed == nil {
		return nil, errors.New("policy: no source (set Dir, Remote or Feed)")
	}
	return newEngine(opts, primary)
}

// newEngine builds an engine reading primary (nil: none, or a bundle only).
func newEngine(opts Options, primary *source) (*Engine, error) {
	defaults := Settings{DecisionPath: opts.DecisionPath, ParseBody: opts.Input.ParseBody,
		MaxBodyBytes: opts.Input.MaxBodyBytes, From: "defaults"}
	if opts.DecisionLog != nil {
		defaults.DecisionLog = opts.DecisionLog.mode
	}
	resolved, err := resolveSettings(defaults)
	if err != nil {
		return nil, err
	}
	if opts.EvalTimeout == 0 {
		opts.EvalTimeout = time.Second
	}
	if opts.Debounce <= 0 {
		opts.Debounce = 250 * time.Millisecond
	}
	if opts.RescanInterval == 0 {
		opts.RescanInterval = 30 * time.Second
	}
	opts.Limits = opts.Limits.WithDefaults()
	logger := opts.Logger
	if logger == nil {
		logger = zap.NewNop()
	}
	m, err := newEngineMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	return &Engine{
		opts:     opts,
		options:  defaults,
		defaults: resolved,
		log:      logger.Named("policy"),
		metrics:  m,
		primary:  primary,
		refresh:  make(chan struct{}, 1),
		accepted: map[string]*Snapshot{},
		latest:   map[string]*Snapshot{},
		readErr:  map[string]string{},
	}, nil
}

// Load reads the directory (or fetches the Git ref) once and activates it
// if it compiles and its tests pass. It returns why it was rejected (a
// *RejectError), or nil when that content is active (also when it already
// was).
func (e *Engine) Load(ctx context.Context) error {
	return e.reload(ctx, true)
}

// reload reads the primary source and offers its content; a failed read
// keeps the active policy and is recorded once per distinct reason. Unless
// retry is set, content already offered is a no-op, so a rescan or poll
// costs one read.
func (e *Engine) reload(ctx context.Context, retry bool) error {
	src := e.primary
	if src == nil {
		return errors.New("policy: no directory or Git repository configured")
	}
	snap, err := src.read(ctx)
	e.mu.Lock()
	if err != nil {
		defer e.mu.Unlock()
		if e.readErr[src.name] != err.Error() || retry {
			e.readErr[src.name] = err.Error()
			e.metrics.readFailed.Inc()
			e.recordRejection(&Rejection{Source: src.name, Stage: src.stage, Reason: err.Error(), At: time.Now()}, false)
		}
		return &RejectError{Stage: src.stage, Err: err}
	}
	delete(e.readErr, src.name)
	e.mu.Unlock()
	return e.offer(ctx, snap, retry)
}

// Refresh asks a running engine (Run) to read its Git repository now, as a
// push webhook would; requests made while one is pending are merged.
func (e *Engine) Refresh() {
	select {
	case e.refresh <- struct{}{}:
	default:
	}
}

// RefreshHandler serves a push webhook: any request calls Refresh and gets
// 202. Nothing it carries is read or trusted: it only moves the next check
// of the ref forward, and calls in a burst cost one fetch.
func (e *Engine) RefreshHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		e.Refresh()
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprintln(w, "policy refresh requested")
	})
}

// offer activates snap, the new content of one source, together with the
// other sources: first with their latest content (one of them may have been
// waiting for this one), then with their active content. On success the new
// set becomes active atomically; otherwise the active set stays and the
// reason is logged. Unless retry is set, content already offered is a no-op,
// so rescans neither recompile nor log again.
func (e *Engine) offer(ctx context.Context, snap *Snapshot, retry bool) error {
	revision, err := e.offerLocked(ctx, snap, retry)
	if revision != "" && e.opts.OnActivate != nil {
		e.opts.OnActivate(revision)
	}
	return err
}

// offerLocked is offer under e.mu; it returns the revision it activated.
func (e *Engine) offerLocked(ctx context.Context, snap *Snapshot, retry bool) (string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if prev := e.latest[snap.Name]; prev.same(snap) && !retry {
		return "", nil
	}
	if cur := e.accepted[snap.Name]; cur.same(snap) && e.active.Load() != nil {
		e.latest[snap.Name] = snap
		return "", nil
	}
	e.latest[snap.Name] = snap
	if e.opts.EmptyDirIsAbsent && snap.Name == "dir" && snap.empty() {
		// Said once, not logged as a rejection: nothing is wrong.
		if e.lastError == nil || e.lastError.Reason != ErrEmptySource.Error() {
			e.log.Info("no policy provided: the directory is empty; the active policy, if any, stays", zap.String("dir", e.opts.Dir))
		}
		e.lastError = &Rejection{Source: snap.Name, Revision: snap.Revision, Stage: "load", Reason: ErrEmptySource.Error(), At: time.Now()}
		return "", &RejectError{Revision: snap.Revision, Stage: "load", Err: ErrEmptySource}
	}

	var sets [][]*Snapshot
	latest, fallback := e.setWith(snap, e.latest), e.setWith(snap, e.accepted)
	sets = append(sets, latest)
	if !sameSet(latest, fallback) {
		sets = append(sets, fallback)
	}
	start := time.Now()
	var err error
	for _, set := range sets {
		var c *compiled
		if c, err = e.build(ctx, set); err == nil {
			e.activate(c, set, snap.Name, start)
			return c.revision, nil
		}
	}
	// The last attempt isolates snap best: the others as they are active.
	var re *RejectError
	if !errors.As(err, &re) {
		re = &RejectError{Stage: "compile", Err: err}
	}
	re.Revision = snap.Revision
	rej := &Rejection{Source: snap.Name, Revision: snap.Revision, Stage: re.Stage, FailedTests: re.FailedTests, At: time.Now()}
	if re.Err != nil {
		rej.Reason = re.Err.Error()
	}
	e.recordRejection(rej, true)
	return "", re
}

// setWith is snap plus, for every other source, its snapshot in from.
func (e *Engine) setWith(snap *Snapshot, from map[string]*Snapshot) []*Snapshot {
	names := make([]string, 0, len(from))
	for n := range from {
		if n != snap.Name {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	set := make([]*Snapshot, 0, len(names)+1)
	for _, n := range names {
		set = append(set, from[n])
	}
	return append(set, snap)
}

func sameSet(a, b []*Snapshot) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name || !a[i].same(b[i]) {
			return false
		}
	}
	return true
}

func (e *Engine) activate(c *compiled, set []*Snapshot, trigger string, start time.Time) {
	prev := e.active.Swap(c)
	e.accepted = make(map[string]*Snapshot, len(set))
	for _, s := range set {
		e.accepted[s.Name] = s
	}
	e.metrics.activated.Inc()
	if prev != nil {
		e.metrics.revision.DeleteLabelValues(prev.revision)
	}
	e.metrics.revision.WithLabelValues(c.revision).Set(1)
	fields := []zap.Field{
		zap.String("source", trigger),
		zap.String("revision", c.revision),
		zap.Int("modules", len(c.files)),
		zap.Int("tests_passed", c.tests),
		zap.String("decision", c.path),
		zap.String("settings", c.settings.From),
		zap.Duration("took", time.Since(start)),
	}
	if prev != nil {
		fields = append(fields, zap.String("previous_revision", prev.revision))
	}
	if ci := set[len(set)-1].Commit; ci != nil && set[len(set)-1].Name == trigger {
		fields = append(fields, zap.String("ref", ci.Ref), zap.Time("committed_at", ci.Time), zap.String("subject", ci.Subject))
	}
	e.log.Info("policy activated", fields...)
}

func (e *Engine) build(ctx context.Context, set []*Snapshot) (*compiled, error) {
	st := e.defaults
	for _, s := range set {
		if s.Settings == nil {
			continue
		}
		var err error
		if st, err = parseSettings(s.Settings, e.options); err != nil {
			return nil, &RejectError{Stage: "settings", Err: err}
		}
	}
	ps, err := parseSources(set)
	if err != nil {
		return nil, &RejectError{Stage: "parse", Err: err}
	}
	c, _, err := compileSet(ctx, ps, compileConfig{
		decision:    st.decision,
		runTests:    !e.opts.SkipTests,
		testTimeout: e.opts.TestTimeout,
		logger:      e.log,

		decisionCache: !e.opts.NoDecisionCache,
	})
	if err != nil {
		return nil, err
	}
	c.settings = st
	return c, nil
}

// settingsOf is what c is evaluated with: its own settings, or the
// defaults while no policy is active.
func (e *Engine) settingsOf(c *compiled) *settings {
	if c == nil {
		return e.defaults
	}
	return c.settings
}

// ErrEmptySource is why an empty directory is not activated when
// Options.EmptyDirIsAbsent is set: nothing was provided, nothing is wrong.
var ErrEmptySource = errors.New("the policy directory is empty: no policy provided")

// recordRejection logs why a policy set was refused; the active set stays.
func (e *Engine) recordRejection(r *Rejection, count bool) {
	e.lastError = r
	if count {
		e.metrics.rejected.Inc()
	}
	fields := []zap.Field{
		zap.String("source", r.Source),
		zap.String("revision", r.Revision),
		zap.String("stage", r.Stage),
		zap.String("reason", r.Reason),
	}
	if len(r.FailedTests) > 0 {
		fields = append(fields, zap.Strings("failed_tests", r.FailedTests))
	}
	if a := e.active.Load(); a != nil {
		fields = append(fields, zap.String("active_revision", a.revision))
	} else {
		fields = append(fields, zap.String("active_revision", "none"))
	}
	e.log.Error("policy rejected, keeping the active policy", fields...)
}

// Ready returns nil when a policy set is active, otherwise why none is:
// the last rejection (a missing directory, a compile error, failing tests).
func (e *Engine) Ready() error {
	if e.active.Load() != nil {
		return nil
	}
	e.mu.Lock()
	r := e.lastError
	e.mu.Unlock()
	if r == nil {
		return errors.New("no policy loaded yet")
	}
	return fmt.Errorf("no policy active: %s", r.summary())
}

// Describe says which policy is active, for readiness: its revision and,
// for a Git revision, the ref and commit time.
func (e *Engine) Describe() string {
	c := e.active.Load()
	if c == nil {
		return "no policy active"
	}
	s := "policy revision " + c.revision
	e.mu.Lock()
	defer e.mu.Unlock()
	if p := e.primary; p != nil {
		if snap := e.accepted[p.name]; snap != nil && snap.Commit != nil {
			s += fmt.Sprintf(" (%s, committed %s)", snap.Commit.Ref, snap.Commit.Time.Format(time.RFC3339))
		}
	}
	return s
}

// Revision returns the active policy's revision, "" when none.
func (e *Engine) Revision() string {
	if c := e.active.Load(); c != nil {
		return c.revision
	}
	return ""
}

// Status describes the active policy and the last rejection.
func (e *Engine) Status() Status {
	c := e.active.Load()
	settings := e.settingsOf(c)
	st := Status{DecisionPath: settings.DecisionPath, Settings: settings.Settings}
	if c != nil {
		st.Revision = c.revision
		at := c.activatedAt
		st.ActivatedAt = &at
		st.Files = append([]string(nil), c.files...)
		st.Tests = c.tests
		cs := c.cacheStatus
		st.DecisionCache = &cs
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	st.Sources = map[string]SourceStatus{}
	for n, s := range e.accepted {
		st.Sources[n] = SourceStatus{Revision: s.Revision, Commit: s.Commit}
	}
	for n, reason := range e.readErr {
		ss := st.Sources[n]
		ss.ReadError = reason
		st.Sources[n] = ss
	}
	if p := e.primary; p != nil {
		ss := st.Sources[p.name]
		ss.Location = p.location
		st.Sources[p.name] = ss
	}
	if len(st.Sources) == 0 {
		st.Sources = nil
	}
	if e.lastError != nil {
		r := *e.lastError
		st.LastRejection = &r
	}
	return st
}

// Decide builds the input for req and evaluates the active policy. It never
// fails open: a request whose input cannot be built gets 400, no policy or
// an evaluation error gets 500, an undefined decision 403.
func (e *Engine) Decide(ctx context.Context, req *Request) Decision {
	start := time.Now()
	c := e.active.Load() // the whole decision uses this policy set
	doc, err := newInputDoc(req, e.settingsOf(c).input())
	if err != nil {
		status := http.StatusInternalServerError
		var bre *BadRequestError
		if errors.As(err, &bre) {
			status = bre.StatusCode()
			e.metrics.badRequest.Inc()
		} else {
			e.metrics.errorDeny.Inc()
		}
		d := deny(status, err.Error())
		d.ID = newDecisionID()
		if c != nil {
			d.Revision = c.revision
		}
		e.logDecision(c, d, nil, nil, start)
		return d
	}
	return e.decide(ctx, c, doc, start)
}

// DecideInput evaluates an input document built elsewhere (meshctl policy
// eval, tests).
func (e *Engine) DecideInput(ctx context.Context, input ast.Value) Decision {
	return e.decide(ctx, e.active.Load(), astInput{input}, time.Now())
}

// policyInput is an input the engine can key a decision on, evaluate and
// log: a request's *inputDoc, or an ast value built elsewhere.
type policyInput interface {
	// find is value().Find(path), ok false where that fails.
	find(path ast.Ref) (ast.Value, bool)
	// appendKey appends the cache key encoding of the value at l.path
	// (appendKeyValue of find).
	appendKey(b []byte, l *inputLookup) []byte
	value() ast.Value
}

type astInput struct{ v ast.Value }

func (in astInput) find(path ast.Ref) (ast.Value, bool) {
	v, err := in.v.Find(path)
	return v, err == nil
}

func (in astInput) appendKey(b []byte, l *inputLookup) []byte {
	v, found := in.find(l.path)
	return appendKeyValue(b, v, found)
}

func (in astInput) value() ast.Value { return in.v }

func (e *Engine) decide(ctx context.Context, c *compiled, input policyInput, start time.Time) Decision {
	var result any
	d := e.evaluate(ctx, c, input, &result, start)
	d.ID = newDecisionID()
	if c != nil {
		d.Revision = c.revision
	}
	switch {
	case d.Allowed:
		e.metrics.allow.Inc()
	case !d.Allowed && ctx.Err() != nil:
		// The caller gave up (its client went away, its timeout passed):
		// denied all the same, but no fault of the policy.
		e.metrics.cancelled.Inc()
	case d.Status == http.StatusInternalServerError:
		e.metrics.errorDeny.Inc()
		e.log.Warn("policy evaluation failed, denying",
			zap.String("decision_id", d.ID), zap.String("revision", d.Revision), zap.String("reason", d.Reason))
	default:
		e.metrics.deny.Inc()
	}
	e.logDecision(c, d, input, result, start)
	return d
}

func (e *Engine) evaluate(ctx context.Context, c *compiled, in policyInput, result *any, now time.Time) (d Decision) {
	if c == nil {
		return deny(http.StatusInternalServerError, "no policy loaded")
	}
	// OPA is not expected to panic, but a request must never take the
	// waypoint down nor slip through: a panic is a 500 deny.
	defer func() {
		if r := recover(); r != nil {
			d = deny(http.StatusInternalServerError, fmt.Sprintf("policy evaluation panicked: %v", r))
		}
	}()
	var key []byte
	cacheable := false
	if c.cache != nil {
		kb := keyBufs.Get().(*[]byte)
		defer func() {
			if cap(key) <= 2*maxCacheKey {
				*kb = key[:0]
				keyBufs.Put(kb)
			}
		}()
		if key, cacheable = c.cache.key((*kb)[:0], in); cacheable {
			if hit, ok := c.cache.get(key, now); ok {
				e.metrics.cacheHit.Inc()
				setResult(hit.rs, result)
				return hit.decided()
			}
			e.metrics.cacheMiss.Inc()
		}
	}
	// Cancellation without OPA's per-evaluation goroutine: the caller's
	// context and the evaluation timeout both trip one topdown.Cancel.
	cancel := topdown.NewCancel()
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, cancel.Cancel)
		defer stop()
	}
	if e.opts.EvalTimeout > 0 {
		t := time.AfterFunc(e.opts.EvalTimeout, cancel.Cancel)
		defer t.Stop()
	}
	// OPA's per-evaluation metrics (timers) are never read: NoOp skips them.
	var input ast.Value
	if c.cache != nil {
		input = c.cache.prune(in)
	}
	if input == nil {
		input = in.value()
	}
	rs, err := c.query.Eval(ctx, rego.EvalParsedInput(input), rego.EvalExternalCancel(cancel), rego.EvalMetrics(metrics.NoOp()))
	if err != nil && ctx.Err() != nil {
		return deny(http.StatusInternalServerError, "policy evaluation cancelled: "+ctx.Err().Error())
	}
	if err != nil {
		return deny(http.StatusInternalServerError, "policy evaluation error: "+err.Error())
	}
	setResult(rs, result)
	d = interpret(rs)
	if cacheable {
		c.cache.put(key, rs, d, now)
	}
	return d
}

// setResult hands the raw result to the decision log.
func setResult(rs rego.ResultSet, result *any) {
	if len(rs) == 1 && len(rs[0].Expressions) == 1 {
		*result = rs[0].Expressions[0].Value
	}
}

func (e *Engine) logDecision(c *compiled, d Decision, input policyInput, result any, start time.Time) {
	settings := e.settingsOf(c)
	if e.opts.DecisionLog == nil || !settings.DecisionLog.wants(d) {
		return
	}
	ev := DecisionEvent{
		Decision: d,
		Path:     settings.DecisionPath,
		Result:   result,
		Time:     start,
		Duration: time.Since(start),
	}
	switch in := input.(type) {
	case *inputDoc:
		in.detach()
		ev.doc = in // written without building its value
	case astInput:
		ev.Input = in.v
	}
	e.opts.DecisionLog.Log(ev)
}
