package config

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

const podA = `
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: ns}
spec: {containers: [{name: c, image: i}]}
status: {podIP: 127.0.10.1}
`

const podB = `
apiVersion: v1
kind: Pod
metadata: {name: b, namespace: ns}
spec: {containers: [{name: c, image: i}]}
status: {podIP: 127.0.10.2}
`

const svcS = `
---
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns}
spec: {clusterIP: 127.0.20.1, ports: [{port: 80}]}
`

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestDirSourceLayout(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), podA)
	writeFile(t, filepath.Join(dir, "sub", "b.yml"), podB)
	writeFile(t, filepath.Join(dir, "README.md"), "not config")
	writeFile(t, filepath.Join(dir, ".hidden.yaml"), "this: [is not read")
	writeFile(t, filepath.Join(dir, ".git", "x.yaml"), "neither: [is this")
	// A ConfigMap volume: files are symlinks into a hidden directory.
	writeFile(t, filepath.Join(dir, "..data", "c.json"), `{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"ns"}}`)
	if err := os.Symlink(filepath.Join("..data", "c.json"), filepath.Join(dir, "c.json")); err != nil {
		t.Fatal(err)
	}
	s, err := NewDirSource(dir, DirOptions{}).Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Workloads) != 2 {
		t.Errorf("workloads %v", s.Workloads)
	}
	writeFile(t, filepath.Join(dir, "big.yaml"), strings.Repeat("#", MaxFileBytes+1))
	_, err = NewDirSource(dir, DirOptions{}).Load()
	wantProblem(t, err, filepath.Join(dir, "big.yaml"), "larger than")
}

func TestDirSourceRunKeepsLastGood(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), podA)
	core, logs := observer.New(zapcore.InfoLevel)
	rejected := make(chan error, 10)
	src := NewDirSource(dir, DirOptions{
		Logger: zap.New(core), Debounce: 20 * time.Millisecond, Rescan: time.Hour,
		OnRejected: func(err error) { rejected <- err },
	})
	snaps := make(chan *Snapshot, 10)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, func(s *Snapshot) { snaps <- s }) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	next := func(what string) *Snapshot {
		t.Helper()
		select {
		case s := <-snaps:
			return s
		case <-time.After(10 * time.Second):
			t.Fatalf("no snapshot: %s", what)
			return nil
		}
	}
	if s := next("initial"); len(s.Workloads) != 1 {
		t.Fatalf("initial: %v", s.Workloads)
	}
	writeFile(t, filepath.Join(dir, "b.yaml"), podB)
	if s := next("new file"); len(s.Workloads) != 2 {
		t.Fatalf("after adding b.yaml: %v", s.Workloads)
	}
	// A file that does not parse: the directory is not a configuration,
	// rejected as a whole, reported with the file, nothing emitted.
	writeFile(t, filepath.Join(dir, "b.yaml"), podB+"\n  bad: [indent\n")
	select {
	case err := <-rejected:
		wantProblem(t, err, filepath.Join(dir, "b.yaml"), "YAML")
	case <-time.After(10 * time.Second):
		t.Fatal("unparsable file not rejected")
	}
	var found bool
	for _, e := range logs.FilterMessage("configuration rejected; the last good configuration stays in force").All() {
		if e.ContextMap()["file"] == filepath.Join(dir, "b.yaml") {
			found = true
		}
	}
	if !found {
		t.Errorf("rejection not logged with its file: %v", logs.All())
	}
	select {
	case s := <-snaps:
		t.Fatalf("a rejected change emitted a snapshot: %v", s.Workloads)
	case <-time.After(200 * time.Millisecond):
	}
	// Same IP as pod a: both pods are refused (neither can be trusted with
	// the address), each logged with kind, namespace, name and reason; the
	// rest of the configuration is served.
	writeFile(t, filepath.Join(dir, "b.yaml"), strings.Replace(podB, "127.0.10.2", "127.0.10.1", 1)+svcS)
	s := next("duplicate address")
	if len(s.Workloads) != 0 || s.Services["ns/s"] == nil || len(RejectedByKind(s.Rejected)) != 1 || RejectedByKind(s.Rejected)["Pod"] != 2 {
		t.Fatalf("duplicate address: workloads %v, services %v, rejected %v", s.Workloads, s.Services, s.Rejected)
	}
	found = false
	for _, e := range logs.FilterMessage("object refused; it fails closed and the rest of the configuration is served").All() {
		m := e.ContextMap()
		if m["origin"] == filepath.Join(dir, "b.yaml") && m["kind"] == "Pod" && m["namespace"] == "ns" && m["name"] == "b" &&
			strings.Contains(m["reason"].(string), "duplicate address: pod IP 127.0.10.1") {
			found = true
		}
	}
	if !found {
		t.Errorf("refusal not logged with origin, kind, namespace, name and reason: %v", logs.All())
	}
	// Fixing the address brings both pods in.
	writeFile(t, filepath.Join(dir, "b.yaml"), podB+svcS)
	if s := next("fixed"); len(s.Workloads) != 2 || len(s.Rejected) != 0 {
		t.Fatalf("after the fix: workloads %v, rejected %v", s.Workloads, s.Rejected)
	}
	if logs.FilterMessage("object no longer refused").Len() != 2 {
		t.Errorf("the end of the refusals is not logged: %v", logs.FilterMessage("object no longer refused").All())
	}
	// Deleting the bad file restores a good configuration without pod b.
	if err := os.Remove(filepath.Join(dir, "b.yaml")); err != nil {
		t.Fatal(err)
	}
	if s := next("after removal"); len(s.Workloads) != 1 || s.Workloads["ns/a"] == nil {
		t.Fatalf("after removing b.yaml: %v", s.Workloads)
	}
	// New subdirectories are watched too.
	writeFile(t, filepath.Join(dir, "more", "b.yaml"), podB)
	if s := next("file in a new subdirectory"); len(s.Workloads) != 2 {
		t.Fatalf("after adding more/b.yaml: %v", s.Workloads)
	}
}

func TestDirSourceRescanCatchesMissedEvents(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), podA)
	// Debounce longer than the test: only the rescan can pick the change up.
	src := NewDirSource(dir, DirOptions{Debounce: time.Hour, Rescan: 50 * time.Millisecond})
	snaps := make(chan *Snapshot, 10)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = src.Run(ctx, func(s *Snapshot) { snaps <- s }) }()
	<-snaps
	writeFile(t, filepath.Join(dir, "b.yaml"), podB)
	select {
	case s := <-snaps:
		if len(s.Workloads) != 2 {
			t.Errorf("rescan: %v", s.Workloads)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("rescan did not pick up the change")
	}
}
