package main

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// staticBinary builds the pause command statically, a real binary to pack.
func staticBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "pause")
	cmd := exec.Command("go", "build", "-o", bin, "./pause")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// readArchive reads an image archive back as an OCI layout.
func readArchive(t *testing.T, archive string) (v1.ImageIndex, *v1.IndexManifest) {
	t.Helper()
	idx, err := unpack(t, archive).ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	return idx, im
}

// unpack extracts an image archive into a directory.
func unpack(t *testing.T, archive string) layout.Path {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dir := t.TempDir()
	eachEntry(t, f, func(h *tar.Header, data []byte) {
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	})
	return layout.Path(dir)
}

// eachEntry calls fn with every entry of the tar stream r and its content.
func eachEntry(t *testing.T, r io.Reader, fn func(*tar.Header, []byte)) {
	t.Helper()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		fn(h, data)
	}
}

func TestArchiveIsANamedOCILayoutRunningTheBinary(t *testing.T) {
	bin := staticBinary(t)
	out := t.TempDir()
	file, err := writeImage(out, "causeway.dev/pause:dev", bin, "amd64")
	if err != nil {
		t.Fatal(err)
	}
	if file != filepath.Join(out, "pause.tar") {
		t.Fatalf("archive %s, want pause.tar in %s", file, out)
	}
	idx, im := readArchive(t, file)
	if len(im.Manifests) != 1 {
		t.Fatalf("%d manifests, want 1", len(im.Manifests))
	}
	desc := im.Manifests[0]
	if desc.Annotations[annotationImageName] != "causeway.dev/pause:dev" || desc.Annotations[annotationRefName] != "dev" {
		t.Fatalf("annotations %v", desc.Annotations)
	}
	if desc.Platform == nil || desc.Platform.OS != "linux" || desc.Platform.Architecture != "amd64" {
		t.Fatalf("platform %+v", desc.Platform)
	}
	img, err := idx.Image(desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	// Digests, sizes and diff IDs agree with the blobs.
	if err := validate.Image(img); err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.Config.Entrypoint, " "); got != "/usr/local/bin/pause" {
		t.Fatalf("entrypoint %q", got)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %v, %v; want one", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	want, _ := os.ReadFile(bin)
	entries := map[string]int64{}
	eachEntry(t, rc, func(h *tar.Header, data []byte) {
		entries[h.Name] = h.Mode
		if h.Name == "usr/local/bin/pause" && !bytes.Equal(data, want) {
			t.Fatal("the layer's binary differs from the input")
		}
	})
	if entries["usr/local/bin/pause"] != 0o755 || entries["tmp/"] != 0o1777 {
		t.Fatalf("layer entries (name: mode) %v", entries)
	}
}

func TestSameBinarySameDigest(t *testing.T) {
	bin := staticBinary(t)
	digest := func() string {
		file, err := writeImage(t.TempDir(), "causeway.dev/pause:dev", bin, "amd64")
		if err != nil {
			t.Fatal(err)
		}
		_, im := readArchive(t, file)
		return im.Manifests[0].Digest.String()
	}
	first := digest()
	// A second apart, so a timestamp taken from the clock would show.
	time.Sleep(1100 * time.Millisecond)
	if a, b := first, digest(); a != b {
		t.Fatalf("digests %s and %s of the same binary", a, b)
	}
}

func TestRejectsBadInput(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "run.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ ref, bin, want string }{
		{"causeway.dev/x:dev", script, "not a statically linked ELF"},
		{"causeway.dev/x:dev", filepath.Join(dir, "missing"), "no such file"},
		{"Not A Ref", script, "image reference"},
	} {
		_, err := writeImage(dir, tc.ref, tc.bin, "amd64")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("writeImage(%q, %q): %v, want an error mentioning %q", tc.ref, tc.bin, err, tc.want)
		}
	}
	if entries, _ := filepath.Glob(filepath.Join(dir, "*.tar")); len(entries) != 0 {
		t.Errorf("archives left behind: %v", entries)
	}
}
