package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"encoding/pem"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// What every image holds besides its binary (ko's static base, built here
// so that nothing depends on the building machine).
const (
	binDir       = "/usr/local/bin"
	caBundlePath = "etc/ssl/certs/ca-certificates.crt" // where Go and OpenSSL look first
	nonRootID    = 65532                               // distroless's and ko's "nonroot"
	passwd       = "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	group        = "root:x:0:\nnonroot:x:65532:\n"
)

// epoch is every file's modification time in the layers (ko's default
// SOURCE_DATE_EPOCH).
var epoch = time.Unix(0, 0).UTC()

// OCI annotation keys (image-spec annotations.md).
const (
	annotationSource   = "org.opencontainers.image.source"
	annotationRevision = "org.opencontainers.image.revision"
	annotationVersion  = "org.opencontainers.image.version"
	annotationCreated  = "org.opencontainers.image.created"
)

// meta is what the annotations and the image configuration say about the
// build. Every field comes from the commit, never from the clock, so that
// two builds of one commit are identical.
type meta struct {
	source, revision, version string
	created                   time.Time
}

func (m meta) annotations() map[string]string {
	a := map[string]string{annotationCreated: m.created.UTC().Format(time.RFC3339)}
	for k, v := range map[string]string{annotationSource: m.source, annotationRevision: m.revision, annotationVersion: m.version} {
		if v != "" {
			a[k] = v
		}
	}
	return a
}

// baseLayer is the layer below every binary: /etc/passwd and /etc/group
// with root and nonroot, the CA bundle, nonroot's home and /tmp.
func baseLayer() (v1.Layer, error) {
	return layer(func(w *layerWriter) {
		w.dir("etc", 0o755, 0)
		w.file("etc/passwd", 0o644, []byte(passwd))
		w.file("etc/group", 0o644, []byte(group))
		w.dir("etc/ssl", 0o755, 0)
		w.dir("etc/ssl/certs", 0o755, 0)
		w.file(caBundlePath, 0o644, caBundle())
		w.dir("home", 0o755, 0)
		w.dir("home/nonroot", 0o700, nonRootID)
		w.dir("tmp", 0o1777, 0)
	})
}

// caBundle is Mozilla's root store as the pinned golang.org/x/crypto
// x509roots/fallback module carries it, in PEM. Roots with a distrust-after
// date are left out: a PEM bundle cannot carry that constraint.
func caBundle() []byte {
	var b bytes.Buffer
	for r := range bundle.Roots() {
		if r.Constraint == nil {
			pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: r.Certificate})
		}
	}
	return b.Bytes()
}

// binaryLayer holds the executable content at /usr/local/bin/name.
func binaryLayer(name string, content []byte) (v1.Layer, error) {
	return layer(func(w *layerWriter) {
		w.dir("usr", 0o755, 0)
		w.dir("usr/local", 0o755, 0)
		w.dir("usr/local/bin", 0o755, 0)
		w.file(path.Join(strings.TrimPrefix(binDir, "/"), name), 0o755, content)
	})
}

// extraFile is a file added to an image: src's content at dest.
type extraFile struct{ dest, src string }

// filesLayer holds files for platform arch, each at its destination with
// its parent directories; a file is executable (0755) if its source is,
// else 0644, and an ELF executable must be static and built for arch.
func filesLayer(files []extraFile, arch string) (v1.Layer, error) {
	contents := make([][]byte, len(files))
	modes := make([]int64, len(files))
	for i, f := range files {
		st, err := os.Stat(f.src)
		if err != nil {
			return nil, fmt.Errorf("-file %s: %w", f.dest, err)
		}
		if !st.Mode().IsRegular() {
			return nil, fmt.Errorf("-file %s: %s is not a regular file", f.dest, f.src)
		}
		if contents[i], err = os.ReadFile(f.src); err != nil {
			return nil, fmt.Errorf("-file %s: %w", f.dest, err)
		}
		modes[i] = 0o644
		if st.Mode()&0o111 != 0 {
			modes[i] = 0o755
		}
		if bytes.HasPrefix(contents[i], []byte(elf.ELFMAG)) {
			if got, err := elfPlatform(contents[i]); err != nil {
				return nil, fmt.Errorf("-file %s: %s: %w", f.dest, f.src, err)
			} else if got != arch {
				return nil, fmt.Errorf("-file %s: %s is built for %s, not %s", f.dest, f.src, got, arch)
			}
		}
	}
	return layer(func(w *layerWriter) {
		made := map[string]bool{}
		for i, f := range files {
			rel := strings.TrimPrefix(f.dest, "/")
			var parent string
			for _, d := range strings.Split(path.Dir(rel), "/") {
				if d == "." {
					break
				}
				parent = path.Join(parent, d)
				if !made[parent] {
					made[parent] = true
					w.dir(parent, 0o755, 0)
				}
			}
			w.file(rel, modes[i], contents[i])
		}
	})
}

// binaryImage is the image running the static executable at bin as
// nonroot, for platform p, with files added.
func binaryImage(name, bin string, p v1.Platform, m meta, files []extraFile) (v1.Image, error) {
	content, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	if got, err := elfPlatform(content); err != nil {
		return nil, fmt.Errorf("%s: %w", bin, err)
	} else if got != p.Architecture {
		return nil, fmt.Errorf("%s is built for %s, not %s", bin, got, p.Architecture)
	}
	base, err := baseLayer()
	if err != nil {
		return nil, err
	}
	app, err := binaryLayer(name, content)
	if err != nil {
		return nil, err
	}
	layers := []v1.Layer{base, app}
	if len(files) > 0 {
		extra, err := filesLayer(files, p.Architecture)
		if err != nil {
			return nil, err
		}
		layers = append(layers, extra)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	if img, err = mutate.AppendLayers(img, layers...); err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture, cfg.Variant = p.OS, p.Architecture, p.Variant
	cfg.Created = v1.Time{Time: m.created.UTC()}
	cfg.Config.Entrypoint = []string{path.Join(binDir, name)}
	cfg.Config.Env = []string{"PATH=" + binDir}
	cfg.Config.User = fmt.Sprintf("%d:%d", nonRootID, nonRootID)
	cfg.Config.WorkingDir = "/"
	cfg.Config.Labels = m.annotations() // `docker inspect`-style tools read labels
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return nil, err
	}
	return mutate.Annotations(img, m.annotations()).(v1.Image), nil
}

// imageIndex is the multi-platform index of imgs (one per platform, in
// the order given).
func imageIndex(imgs []v1.Image, platforms []v1.Platform, m meta) v1.ImageIndex {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for i, img := range imgs {
		p := platforms[i]
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &p}})
	}
	return mutate.Annotations(idx, m.annotations()).(v1.ImageIndex)
}

// layerWriter writes a layer's tar with fixed times and owners; the first
// error sticks and is returned by layer.
type layerWriter struct {
	tw  *tar.Writer
	err error
}

func (w *layerWriter) header(h *tar.Header, content []byte) {
	if w.err != nil {
		return
	}
	h.ModTime, h.Format = epoch, tar.FormatPAX
	if w.err = w.tw.WriteHeader(h); w.err == nil && content != nil {
		_, w.err = w.tw.Write(content)
	}
}

func (w *layerWriter) dir(name string, mode int64, owner int) {
	w.header(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, Uid: owner, Gid: owner}, nil)
}

func (w *layerWriter) file(name string, mode int64, content []byte) {
	w.header(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(content))}, content)
}

// layer is the gzip-compressed OCI layer of what fill writes.
func layer(fill func(*layerWriter)) (v1.Layer, error) {
	var buf bytes.Buffer
	w := &layerWriter{tw: tar.NewWriter(&buf)}
	fill(w)
	if w.err == nil {
		w.err = w.tw.Close()
	}
	if w.err != nil {
		return nil, w.err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// elfPlatform is the GOARCH of a statically linked ELF executable (one
// without a program interpreter, which runs in an image holding nothing
// else), or an error saying why content is not one.
func elfPlatform(content []byte) (string, error) {
	f, err := elf.NewFile(bytes.NewReader(content))
	if err != nil || f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return "", fmt.Errorf("not an ELF executable")
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return "", fmt.Errorf("not statically linked (build it with CGO_ENABLED=0)")
		}
	}
	switch f.Machine {
	case elf.EM_X86_64:
		return "amd64", nil
	case elf.EM_AARCH64:
		return "arm64", nil
	}
	return "", fmt.Errorf("ELF machine %s is not amd64 or arm64", f.Machine)
}
