// Command images packs static binaries into OCI image tarballs without Docker
// or a registry, for the test cluster's containerd (`ctr images import`).
// It is a build tool, not part of Causeway.
//
//	images -out DIR REF=BINARY...
//
// Each REF=BINARY becomes DIR/<last path element of REF's repository>.tar: an
// OCI image layout archive holding one single-layer linux image whose only
// content is BINARY at /usr/local/bin/<its file name> (plus an empty /tmp),
// with that file as the entrypoint. Timestamps are fixed, so the same binary
// always gives the same image digest.
package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// epoch is every timestamp in the images (as ko does with SOURCE_DATE_EPOCH=0).
var epoch = time.Unix(0, 0).UTC()

// Annotations on the index entry: containerd takes the image name from the
// first, the OCI layout convention puts the tag in the second.
const (
	annotationImageName = "io.containerd.image.name"
	annotationRefName   = "org.opencontainers.image.ref.name"
)

func main() {
	out := flag.String("out", "", "directory the image tarballs are written to")
	arch := flag.String("arch", runtime.GOARCH, "architecture recorded in the images")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: images -out DIR REF=BINARY...")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *out == "" || flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
	for _, arg := range flag.Args() {
		ref, bin, ok := strings.Cut(arg, "=")
		if !ok || ref == "" || bin == "" {
			fmt.Fprintf(os.Stderr, "images: %q is not REF=BINARY\n", arg)
			os.Exit(2)
		}
		file, err := writeImage(*out, ref, bin, *arch)
		if err != nil {
			fmt.Fprintf(os.Stderr, "images: %s: %v\n", ref, err)
			os.Exit(1)
		}
		fmt.Printf("%s\t%s\n", ref, file)
	}
}

// writeImage builds the image of bin named ref and writes its archive into
// dir, through a temporary file so a failed run leaves no partial archive.
func writeImage(dir, ref, bin, arch string) (string, error) {
	tag, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		return "", fmt.Errorf("image reference: %w", err)
	}
	img, err := binaryImage(bin, arch)
	if err != nil {
		return "", err
	}
	file := filepath.Join(dir, path.Base(tag.RepositoryStr())+".tar")
	tmp, err := os.CreateTemp(dir, ".image-*.tar")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if err := writeLayout(tmp, img, tag); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	return file, os.Rename(tmp.Name(), file)
}

// binaryImage is a single-layer image running bin as its entrypoint.
func binaryImage(bin, arch string) (v1.Image, error) {
	content, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	if !isStaticELF(content) {
		return nil, fmt.Errorf("%s is not a statically linked ELF executable (build it with CGO_ENABLED=0)", bin)
	}
	target := "/usr/local/bin/" + filepath.Base(bin)
	layerTar, err := layerArchive(target, content)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", arch
	cfg.Created = v1.Time{Time: epoch}
	cfg.Config.Entrypoint = []string{target}
	cfg.Config.Env = []string{"PATH=/usr/local/bin"}
	return mutate.ConfigFile(img, cfg)
}

// layerArchive is the layer's uncompressed tar: the directories down to
// target, target itself, and /tmp.
func layerArchive(target string, content []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dir := func(name string, mode int64) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, ModTime: epoch, Format: tar.FormatPAX})
	}
	parts := strings.Split(strings.Trim(path.Dir(target), "/"), "/")
	for i := range parts {
		if err := dir(strings.Join(parts[:i+1], "/"), 0o755); err != nil {
			return nil, err
		}
	}
	if err := dir("tmp", 0o1777); err != nil {
		return nil, err
	}
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(target, "/"), Mode: 0o755,
		Size: int64(len(content)), ModTime: epoch, Format: tar.FormatPAX}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, err
	}
	if _, err := tw.Write(content); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// writeLayout writes img as an OCI image layout archive (oci-layout,
// index.json, blobs/sha256/...) whose index names it tag.
func writeLayout(w io.Writer, img v1.Image, tag name.Tag) error {
	desc, err := partial.Descriptor(img)
	if err != nil {
		return err
	}
	manifest, err := img.RawManifest()
	if err != nil {
		return err
	}
	cfgName, err := img.ConfigName()
	if err != nil {
		return err
	}
	config, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	cfgFile, err := img.ConfigFile()
	if err != nil {
		return err
	}
	desc.Platform = &v1.Platform{OS: cfgFile.OS, Architecture: cfgFile.Architecture}
	desc.Annotations = map[string]string{
		annotationImageName: tag.Name(),
		annotationRefName:   tag.TagStr(),
	}
	index := v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex, Manifests: []v1.Descriptor{*desc}}
	indexJSON, err := json.Marshal(index)
	if err != nil {
		return err
	}

	tw := tar.NewWriter(w)
	file := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644,
			Size: int64(len(data)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	blob := func(h v1.Hash, data []byte) error { return file("blobs/"+h.Algorithm+"/"+h.Hex, data) }
	if err := file("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := file("index.json", indexJSON); err != nil {
		return err
	}
	if err := blob(desc.Digest, manifest); err != nil {
		return err
	}
	if err := blob(cfgName, config); err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		h, err := l.Digest()
		if err != nil {
			return err
		}
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		data, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return err
		}
		if err := blob(h, data); err != nil {
			return err
		}
	}
	return tw.Close()
}

// isStaticELF reports whether b is an ELF executable without a program
// interpreter, i.e. one that runs in an image holding nothing else.
func isStaticELF(b []byte) bool {
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil || f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return false
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false
		}
	}
	return true
}
