package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/causeway-mesh/causeway/pkg/config"
	"github.com/causeway-mesh/causeway/pkg/localmesh"
)

func init() {
	register("up", "run a local mesh from a configuration directory (DIR)", runUp)
	register("exec", "run a command as a pod of a running local mesh (POD -- CMD...)", runExec)
}

// planFile is where `up` records the running mesh for `exec`.
const planFile = "mesh.json"

type meshFlags struct {
	state    string
	policies string
	gitRepo  bool
	bin      string
	basePort int
	noApps   bool
}

func (m *meshFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&m.state, "state", ".causeway-local", "directory for CA files, tokens and logs")
	fs.StringVar(&m.policies, "policies", "", "Rego policy directory for the waypoints (default DIR/policies)")
	fs.BoolVar(&m.gitRepo, "policies-git", true, "keep the policies in a Git repository created at start from --policies (STATE/policy-repo): the waypoints activate each commit of its main branch; false: they watch --policies itself")
	fs.StringVar(&m.bin, "bin", "", "directory holding controlplane, nodeproxy, waypoint and echo (default: meshctl's own)")
	fs.IntVar(&m.basePort, "base-port", 16000, "first of the 127.0.0.1 ports given to admin, status and SOCKS5 listeners")
	fs.BoolVar(&m.noApps, "no-apps", false, "start no app, not even for pods annotated "+config.AnnotationLocalApp+" (run your own on their app addresses)")
}

// plan lays out the mesh of dir.
func (m *meshFlags) plan(dir string) (*localmesh.Plan, error) {
	snap, err := config.NewDirSource(dir, config.DirOptions{}).Load()
	if err != nil {
		return nil, fmt.Errorf("configuration %s: %w", dir, err)
	}
	plan, err := localmesh.NewPlan(snap, m.basePort)
	if err != nil {
		return nil, err
	}
	if m.noApps {
		plan.Apps = nil
	}
	return plan, nil
}

// startMesh plans and starts the mesh of dir.
func (m *meshFlags) startMesh(ctx context.Context, dir string) (*localmesh.Mesh, error) {
	plan, err := m.plan(dir)
	if err != nil {
		return nil, err
	}
	if m.bin == "" {
		self, err := os.Executable()
		if err != nil {
			return nil, err
		}
		m.bin = filepath.Dir(self)
	}
	if m.policies == "" {
		m.policies = filepath.Join(dir, "policies")
	}
	state, err := filepath.Abs(m.state)
	if err != nil {
		return nil, err
	}
	sets, err := connectionPolicySets(filepath.Join(dir, "connection-policies"))
	if err != nil {
		return nil, err
	}
	o := localmesh.Options{BinDir: m.bin, ConfigDir: dir, PolicyDir: m.policies, StateDir: state, ControlPlaneArgs: sets}
	if m.gitRepo {
		o.PolicyRepo = filepath.Join(state, "policy-repo")
	}
	mesh, err := localmesh.Start(ctx, plan, o)
	if err != nil {
		return nil, err
	}
	data, err := json.MarshalIndent(plan, "", "  ")
	if err == nil {
		err = os.WriteFile(filepath.Join(state, planFile), data, 0o600)
	}
	if err != nil {
		mesh.Stop()
		return nil, fmt.Errorf("record the mesh: %w", err)
	}
	return mesh, nil
}

func runUp(args []string) error {
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	var m meshFlags
	m.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("usage: meshctl up [flags] DIR")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	mesh, err := m.startMesh(ctx, fs.Arg(0))
	if err != nil {
		return err
	}
	defer mesh.Stop()
	printPlan(os.Stdout, mesh)
	fmt.Println()
	if try := tryLine(mesh.Plan, m.state); try != "" {
		fmt.Println(try)
	}
	fmt.Println("Ctrl-C stops the mesh.")
	select {
	case <-ctx.Done():
		fmt.Println("\nstopping the mesh")
		return nil
	case died := <-mesh.Died:
		return errors.New(died)
	}
}

// tryLine suggests the plan's example request, "" when it has none.
func tryLine(p *localmesh.Plan, state string) string {
	if p.Example == nil {
		return ""
	}
	return fmt.Sprintf("Try: meshctl exec --state %s %s -- curl -s %s", state, p.Example.Client, p.Example.URL)
}

func printPlan(w io.Writer, mesh *localmesh.Mesh) {
	p := mesh.Plan
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "COMPONENT\tLISTENS\tADMIN\tREADY/METRICS\tSOCKS5")
	fmt.Fprintf(tw, "controlplane\t%s (xDS, CA)\t-\t%s\t-\n", p.ControlPlane.GRPC, p.ControlPlane.Status)
	for _, n := range p.Nodes {
		fmt.Fprintf(tw, "nodeproxy %s\tpod IPs of %s\t%s\t%s\t%s\n", n.Node, n.Node, n.Admin, n.Status, n.SOCKS5)
	}
	for _, wp := range p.Waypoints {
		if wp.Ingress {
			fmt.Fprintf(tw, "ingress %s/%s\t%s (its listeners' ports)\t%s\t%s\t-\n", wp.Namespace, wp.Name, wp.IP, wp.Admin, wp.Status)
			continue
		}
		fmt.Fprintf(tw, "waypoint %s/%s\t%s (HBONE)\t%s\t%s\t-\n", wp.Namespace, wp.Name, wp.HBONE, wp.Admin, wp.Status)
	}
	for _, a := range p.Apps {
		fmt.Fprintf(tw, "app %s/%s (%s)\t%v\t-\t-\t-\n", a.Namespace, a.Name, a.Command, a.Listen)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nState and logs: %s\n", mesh.Opts.StateDir)
	if r := mesh.Policies; r != nil {
		fmt.Fprintf(w, "Policies: Git repository %s (branch %s); the waypoints activate each commit that passes its tests\n", r.Path, localmesh.PolicyBranch)
	}
}

func runExec(args []string) error {
	fs := flag.NewFlagSet("exec", flag.ContinueOnError)
	state := fs.String("state", ".causeway-local", "state directory of the running mesh (meshctl up --state)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	rest := fs.Args()
	if len(rest) < 3 || rest[1] != "--" {
		return errors.New("usage: meshctl exec [--state DIR] POD -- CMD [ARGS...]")
	}
	data, err := os.ReadFile(filepath.Join(*state, planFile))
	if err != nil {
		return fmt.Errorf("no running mesh recorded in %s (start one with meshctl up): %w", *state, err)
	}
	var plan localmesh.Plan
	if err := json.Unmarshal(data, &plan); err != nil {
		return fmt.Errorf("%s: %w", planFile, err)
	}
	pod, err := plan.Pod(rest[0])
	if err != nil {
		return err
	}
	cmdArgs := rest[2:]
	// curl can be told to leave from the pod's IP and use its node's
	// SOCKS5; other commands get the same through the environment.
	if filepath.Base(cmdArgs[0]) == "curl" {
		extra := []string{"--interface", pod.IP}
		if pod.SOCKS5 != "" {
			extra = append(extra, "--socks5-hostname", pod.SOCKS5)
		}
		cmdArgs = append([]string{cmdArgs[0]}, append(extra, cmdArgs[1:]...)...)
	}
	cmd := exec.Command(cmdArgs[0], cmdArgs[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), pod.Env()...)
	err = cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		os.Exit(ee.ExitCode())
	}
	return err
}

// connectionPolicySets gives the control plane each sub-directory of dir
// as the connection policy set of its name (--connection-policy
// NAME=dir:PATH); no dir, no sets.
func connectionPolicySets(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("connection policies: %w", err)
	}
	var args []string
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		abs, err := filepath.Abs(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		args = append(args, "--connection-policy", e.Name()+"=dir:"+abs)
	}
	return args, nil
}
