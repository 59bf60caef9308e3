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
	// Same IP as pod a: rejected, reported with the file, nothing emitted.
	writeFile(t, filepath.Join(dir, "b.yaml"), strings.Replace(podB, "127.0.10.2", "127.0.10.1", 1))
	select {
	case err := <-rejected:
		wantProblem(t, err, filepath.Join(dir, "b.yaml"), "duplicate address")
	case <-time.After(10 * time.Second):
		t.Fatal("duplicate IP not rejected")
	}
	var found bool
	for _, e := range logs.FilterMessage("configuration rejected; the last good configuration stays in force").All() {
		m := e.ContextMap()
		if m["file"] == filepath.Join(dir, "b.yaml") && strings.Contains(m["reason"].(string), "127.0.10.1") && m["object"] == "Pod ns/b" {
			found = true
		}
	}
	if !found {
		t.Errorf("rejection not logged with file, object and reason: %v", logs.All())
	}
	select {
	case s := <-snaps:
		t.Fatalf("a rejected change emitted a snapshot: %v", s.Workloads)
	case <-time.After(200 * time.Millisecond):
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
