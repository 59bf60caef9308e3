package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/util"

	"github.com/causeway-mesh/causeway/pkg/policy"
	"github.com/causeway-mesh/causeway/pkg/policy/policygit"
	"github.com/causeway-mesh/causeway/pkg/readlimit"
)

func init() {
	register("policy", "test and evaluate Rego policies (test, check, eval)", runPolicy)
}

// maxPolicyInput bounds the input document meshctl policy eval reads.
const maxPolicyInput = 16 << 20

const policyUsage = `usage:
  meshctl policy test [--timeout D] [-v] [GIT FLAGS] SOURCE
      run the policy's *_test.rego tests; exit status 1 if any fails
  meshctl policy check [--path P] [GIT FLAGS] SOURCE
      compile the policy and run its tests as a waypoint does before
      activating it
  meshctl policy eval --input FILE [--path P] [GIT FLAGS] SOURCE
      evaluate the decision for the OPA-Envoy input document in FILE (- for
      stdin) and print it as JSON

SOURCE is a policy directory, or a Git repository and ref as URL@REF
(https://…, ssh://…, user@host:path, file://… or the path of a local
repository; REF a branch, tag or commit), fetched as a waypoint's
--policy-git-url does. GIT FLAGS: --git-dir SUBDIR (the policy's
directory in the repository), --git-token-file FILE, --git-ssh-key-file FILE,
--git-known-hosts FILE, --git-ca-file FILE.

The decision is the policy's causeway-policy.yaml decisionPath, else P
(default envoy/authz/allow), as for a waypoint.`

func runPolicy(args []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	return policyCommand(ctx, args, os.Stdout)
}

func policyCommand(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New(policyUsage)
	}
	switch args[0] {
	case "test":
		return policyTest(ctx, args[1:], out)
	case "check":
		return policyCheck(ctx, args[1:], out)
	case "eval":
		return policyEval(ctx, args[1:], out)
	case "-h", "--help", "help":
		fmt.Fprintln(out, policyUsage)
		return nil
	default:
		return fmt.Errorf("unknown policy subcommand %q\n%s", args[0], policyUsage)
	}
}

// policySource is the SOURCE argument and the flags saying how to fetch it.
type policySource struct {
	arg string
	git policygit.Options
}

func (p *policySource) register(fs *flag.FlagSet) {
	fs.StringVar(&p.git.Dir, "git-dir", "", "the policy's sub-directory in the Git repository")
	fs.StringVar(&p.git.TokenFile, "git-token-file", "", "file holding a token for an https repository")
	fs.StringVar(&p.git.SSHKeyFile, "git-ssh-key-file", "", "file holding a private key for an ssh repository")
	fs.StringVar(&p.git.KnownHostsFile, "git-known-hosts", "", "known_hosts file for an ssh repository")
	fs.StringVar(&p.git.CAFile, "git-ca-file", "", "PEM certificates trusted for an https repository")
}

// options sets the source in o: a directory, or URL@REF (the last "@"
// that leaves a Git URL or an existing directory before it).
func (p *policySource) options(o policy.Options) (policy.Options, error) {
	if i := strings.LastIndex(p.arg, "@"); i > 0 && i < len(p.arg)-1 && !isDir(p.arg) && isGitURL(p.arg[:i]) {
		g := p.git
		g.URL, g.Ref = p.arg[:i], p.arg[i+1:]
		r, err := policygit.New(g, o.Limits)
		if err != nil {
			return o, err
		}
		o.Remote = r
		return o, nil
	}
	o.Dir = p.arg
	return o, nil
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

// isGitURL: a URL with a scheme, scp-like user@host:path, or a directory.
func isGitURL(s string) bool {
	if strings.Contains(s, "://") || isDir(s) {
		return true
	}
	at, colon := strings.Index(s, "@"), strings.Index(s, ":")
	return at > 0 && colon > at && !strings.Contains(s[:colon], "/")
}

// parsePolicyFlags parses flags before and after the one SOURCE argument.
func parsePolicyFlags(fs *flag.FlagSet, args []string) (*policySource, error) {
	src := &policySource{}
	src.register(fs)
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("%w\n%s", err, policyUsage)
	}
	rest := fs.Args()
	if len(rest) == 0 {
		return nil, fmt.Errorf("missing policy source (a directory or URL@REF)\n%s", policyUsage)
	}
	src.arg = rest[0]
	if err := fs.Parse(rest[1:]); err != nil {
		return nil, fmt.Errorf("%w\n%s", err, policyUsage)
	}
	if len(fs.Args()) > 0 {
		return nil, fmt.Errorf("unexpected arguments %q\n%s", fs.Args(), policyUsage)
	}
	return src, nil
}

func policyTest(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("policy test", flag.ContinueOnError)
	timeout := fs.Duration("timeout", 5*time.Second, "timeout per test")
	verbose := fs.Bool("v", false, "print the output (print()) of every test")
	src, err := parsePolicyFlags(fs, args)
	if err != nil {
		return err
	}
	opts, err := src.options(policy.Options{TestTimeout: *timeout})
	if err != nil {
		return err
	}
	results, err := policy.Test(ctx, opts)
	if err != nil {
		return err
	}
	if len(results) == 0 {
		return fmt.Errorf("no tests in %s (test rules are named test_* in *_test.rego files)", src.arg)
	}
	failed, skipped := 0, 0
	for _, r := range results {
		outcome := "PASS"
		switch {
		case r.Skip:
			outcome = "SKIP"
			skipped++
		case !r.Pass && r.Error != "":
			outcome = "ERROR"
			failed++
		case !r.Pass:
			outcome = "FAIL"
			failed++
		}
		fmt.Fprintf(out, "%-5s %s (%s)\n", outcome, r.FullName(), r.Duration.Round(time.Microsecond))
		if r.Error != "" {
			fmt.Fprintf(out, "      %s\n", r.Error)
		}
		if r.Location != "" && outcome != "PASS" && outcome != "SKIP" {
			fmt.Fprintf(out, "      at %s\n", r.Location)
		}
		if r.Output != "" && (*verbose || outcome == "FAIL" || outcome == "ERROR") {
			for _, line := range strings.Split(strings.TrimRight(r.Output, "\n"), "\n") {
				fmt.Fprintf(out, "      | %s\n", line)
			}
		}
	}
	passed := len(results) - failed - skipped
	fmt.Fprintf(out, "--------------------------------------------------------------------------------\n")
	fmt.Fprintf(out, "PASS: %d/%d", passed, len(results))
	if skipped > 0 {
		fmt.Fprintf(out, ", SKIP: %d", skipped)
	}
	if failed > 0 {
		fmt.Fprintf(out, ", FAIL: %d", failed)
	}
	fmt.Fprintln(out)
	if failed > 0 {
		return fmt.Errorf("%d of %d tests failed", failed, len(results))
	}
	return nil
}

func policyCheck(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("policy check", flag.ContinueOnError)
	path := fs.String("path", policy.DefaultDecisionPath, "decision path unless the policy's "+policy.SettingsFile+" sets one")
	src, err := parsePolicyFlags(fs, args)
	if err != nil {
		return err
	}
	opts, err := src.options(policy.Options{DecisionPath: *path})
	if err != nil {
		return err
	}
	e, err := policy.NewEngine(opts)
	if err != nil {
		return err
	}
	if err := e.Load(ctx); err != nil {
		return err
	}
	st := e.Status()
	fmt.Fprintf(out, "ok: %s, %d modules, %d tests passed, decision %s\n",
		e.Describe(), len(st.Files), st.Tests, st.DecisionPath)
	return nil
}

func policyEval(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("policy eval", flag.ContinueOnError)
	inputFile := fs.String("input", "", "OPA-Envoy input document (JSON; - for stdin)")
	path := fs.String("path", policy.DefaultDecisionPath, "decision path unless the policy's "+policy.SettingsFile+" sets one")
	src, err := parsePolicyFlags(fs, args)
	if err != nil {
		return err
	}
	if *inputFile == "" {
		return fmt.Errorf("--input is required\n%s", policyUsage)
	}
	input, err := readPolicyInput(*inputFile)
	if err != nil {
		return err
	}
	// Authors evaluate work in progress: tests are `policy test`'s job.
	opts, err := src.options(policy.Options{DecisionPath: *path, SkipTests: true})
	if err != nil {
		return err
	}
	e, err := policy.NewEngine(opts)
	if err != nil {
		return err
	}
	if err := e.Load(ctx); err != nil {
		return err
	}
	d := e.DecideInput(ctx, input)
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(d)
}

func readPolicyInput(name string) (ast.Value, error) {
	var r io.Reader = os.Stdin
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return nil, fmt.Errorf("input: %w", err)
		}
		defer f.Close()
		r = f
	}
	b, err := readlimit.All(r, maxPolicyInput)
	if err != nil {
		return nil, fmt.Errorf("input: %w", err)
	}
	var x any
	if err := util.UnmarshalJSON(b, &x); err != nil {
		return nil, fmt.Errorf("input %s: %w", name, err)
	}
	v, err := ast.InterfaceToValue(x)
	if err != nil {
		return nil, fmt.Errorf("input %s: %w", name, err)
	}
	return v, nil
}
