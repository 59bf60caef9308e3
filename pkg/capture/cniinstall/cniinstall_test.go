package cniinstall

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
)

var update = flag.Bool("update", false, "rewrite the golden files")

var entry = map[string]any{"type": PluginType, "agent_socket": "/var/run/causeway/cni.sock"}

// TestChainGolden: each testdata/*.in chained is its .golden: the entry
// last, a single plugin's .conf turned into a conflist, an older entry of
// ours replaced in place of being repeated.
func TestChainGolden(t *testing.T) {
	ins, err := filepath.Glob("testdata/*.in")
	if err != nil || len(ins) == 0 {
		t.Fatalf("no inputs: %v", err)
	}
	for _, in := range ins {
		raw, err := os.ReadFile(in)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Chain(raw, entry)
		if err != nil {
			t.Errorf("%s: %v", in, err)
			continue
		}
		golden := strings.TrimSuffix(in, ".in") + ".golden"
		if *update {
			os.WriteFile(golden, got, 0o644)
			continue
		}
		want, err := os.ReadFile(golden)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s:\n%s\nwant (%s):\n%s", in, got, golden, want)
		}
		again, err := Chain(got, entry)
		if err != nil || !bytes.Equal(again, got) {
			t.Errorf("%s: chaining the result again changed it (%v):\n%s", in, err, again)
		}
	}
}

func TestChainErrors(t *testing.T) {
	for _, tc := range []struct{ name, conf string }{
		{"not JSON", `{"plugins":`},
		{"empty plugins", `{"name":"n","plugins":[]}`},
		{"plugins not a list", `{"name":"n","plugins":{}}`},
		{"no type, no plugins", `{"name":"n","cniVersion":"1.0.0"}`},
		{"no name", `{"cniVersion":"1.0.0","plugins":[{"type":"bridge"}]}`},
	} {
		if out, err := Chain([]byte(tc.conf), entry); err == nil {
			t.Errorf("%s: chained to %s", tc.name, out)
		}
	}
	if _, err := Chain([]byte(`{"name":"n","plugins":[{"type":"bridge"}]}`), map[string]any{"type": "other"}); err == nil {
		t.Error("an entry of another type was chained")
	}
}

func newInstaller(t *testing.T) *Installer {
	dir := t.TempDir()
	in := &Installer{ConfDir: filepath.Join(dir, "net.d"), BinDir: filepath.Join(dir, "bin"), Entry: entry}
	for _, d := range []string{in.ConfDir, in.BinDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return in
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func listDir(t *testing.T, dir string) string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return strings.Join(names, " ")
}

// TestInstallFollowUninstall: the chained copy sorts first and follows
// the primary (not the files runtimes ignore); no primary, no copy;
// uninstall leaves the primary alone and removes our file and binary.
func TestInstallFollowUninstall(t *testing.T) {
	in := newInstaller(t)
	src := filepath.Join(t.TempDir(), "plugin")
	writeFile(t, src, "#!binary")
	if err := CopyBinary(src, in.BinDir); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(in.BinDir, PluginType)); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("binary: %v %v", fi, err)
	}
	if changed, err := in.Write(); err != nil || changed {
		t.Fatalf("Write without a primary = %v, %v", changed, err)
	}
	writeFile(t, filepath.Join(in.ConfDir, "README"), "not a configuration")
	writeFile(t, filepath.Join(in.ConfDir, "20-later.conf"), `{"cniVersion":"1.0.0","name":"later","type":"ptp"}`)
	primary := filepath.Join(in.ConfDir, "10-bridge.conflist")
	writeFile(t, primary, `{"cniVersion":"1.0.0","name":"k8s","plugins":[{"type":"bridge"}]}`)
	if changed, err := in.Write(); err != nil || !changed {
		t.Fatalf("Write = %v, %v", changed, err)
	}
	ours := filepath.Join(in.ConfDir, DefaultConfName)
	got, _ := os.ReadFile(ours)
	if !strings.Contains(string(got), `"name": "k8s"`) || !strings.Contains(string(got), PluginType) {
		t.Errorf("ours:\n%s", got)
	}
	if changed, err := in.Write(); err != nil || changed {
		t.Errorf("second Write = %v, %v; want no change", changed, err)
	}
	if l := listDir(t, in.ConfDir); l != DefaultConfName+" 10-bridge.conflist 20-later.conf README" {
		t.Errorf("directory: %s", l)
	}
	writeFile(t, primary, `{"cniVersion":"1.0.0","name":"k8s-v2","plugins":[{"type":"bridge"}]}`)
	if changed, err := in.Write(); err != nil || !changed {
		t.Fatalf("Write after the primary changed = %v, %v", changed, err)
	}
	if got, _ := os.ReadFile(ours); !strings.Contains(string(got), "k8s-v2") {
		t.Errorf("ours did not follow the primary:\n%s", got)
	}
	if err := in.Uninstall(); err != nil {
		t.Fatal(err)
	}
	if l := listDir(t, in.ConfDir); l != "10-bridge.conflist 20-later.conf README" {
		t.Errorf("after uninstall: %s", l)
	}
	if l := listDir(t, in.BinDir); l != "" {
		t.Errorf("binaries after uninstall: %s", l)
	}
	if err := in.Uninstall(); err != nil {
		t.Errorf("second Uninstall: %v", err)
	}
}

func TestWriteRefuses(t *testing.T) {
	in := newInstaller(t)
	writeFile(t, filepath.Join(in.ConfDir, "00-multus.conf"), `{"cniVersion":"1.0.0","name":"m","type":"multus"}`)
	if _, err := in.Write(); err == nil || !strings.Contains(err.Error(), "sorts before") {
		t.Errorf("Write with a primary sorting first = %v", err)
	}
	in = newInstaller(t)
	writeFile(t, filepath.Join(in.ConfDir, "10-bad.conflist"), `{"name":`)
	if _, err := in.Write(); err == nil {
		t.Error("Write chained a broken primary")
	}
	if l := listDir(t, in.ConfDir); l != "10-bad.conflist" {
		t.Errorf("directory: %s", l)
	}
}

// TestKeep: a running Keep rewrites ours when the primary changes and when
// ours is deleted, and removes ours when the primary goes.
func TestKeep(t *testing.T) {
	in := newInstaller(t)
	primary := filepath.Join(in.ConfDir, "10-bridge.conflist")
	writeFile(t, primary, `{"cniVersion":"1.0.0","name":"one","plugins":[{"type":"bridge"}]}`)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- in.Keep(ctx, zap.NewNop()) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	ours := filepath.Join(in.ConfDir, DefaultConfName)
	waitFor := func(what string, cond func(string, error) bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			b, err := os.ReadFile(ours)
			if cond(string(b), err) {
				return
			}
		}
		t.Fatalf("timed out waiting for %s", what)
	}
	waitFor("the first write", func(s string, err error) bool { return strings.Contains(s, `"one"`) })
	writeFile(t, primary, `{"cniVersion":"1.0.0","name":"two","plugins":[{"type":"bridge"}]}`)
	waitFor("the primary's change", func(s string, err error) bool { return strings.Contains(s, `"two"`) })
	os.Remove(ours)
	waitFor("ours to come back", func(s string, err error) bool { return strings.Contains(s, `"two"`) })
	os.Remove(primary)
	waitFor("ours to go with the primary", func(_ string, err error) bool { return os.IsNotExist(err) })
}
