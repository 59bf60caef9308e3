package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// The variables -ldflags -X stamps (pkg/version).
const (
	versionVar  = "github.com/causeway-mesh/causeway/pkg/version.version"
	revisionVar = "github.com/causeway-mesh/causeway/pkg/version.revision"
)

type pushOptions struct {
	registry, tag, refsFile, caFile string
	platforms                       []v1.Platform
	meta                            meta
	packages, binaries              []string
	// files are added to every image (-file DEST=SRC).
	files []extraFile
}

func parsePush(args []string) (pushOptions, error) {
	var o pushOptions
	var platforms, created string
	var binaries, files stringList
	fs := flag.NewFlagSet("images push", flag.ContinueOnError)
	fs.StringVar(&o.registry, "registry", "", "registry and optional path the images are pushed under: HOST[:PORT][/PATH] (required)")
	fs.StringVar(&o.tag, "tag", "dev", "tag of every image")
	fs.StringVar(&platforms, "platforms", "linux/amd64,linux/arm64", "comma-separated OS/ARCH the packages are built for")
	fs.StringVar(&o.meta.version, "version", "", "version stamped into the binaries and the annotations (empty: the go command's)")
	fs.StringVar(&o.meta.revision, "revision", "", "source revision stamped into the binaries and the annotations")
	fs.StringVar(&o.meta.source, "source", "", "source repository URL for the annotations")
	fs.StringVar(&created, "created", "1970-01-01T00:00:00Z", "creation time in the configuration and annotations, RFC 3339 (the commit's time, never the clock's)")
	fs.StringVar(&o.refsFile, "refs", "", "file the pushed references are written to, one \"NAME REF@DIGEST\" per line")
	fs.StringVar(&o.caFile, "registry-ca", "", "PEM certificates trusted for the registry besides the system's")
	fs.Var(&binaries, "binary", "a static executable built elsewhere, pushed as an image of its own platform (repeatable)")
	fs.Var(&files, "file", "DEST=SRC: the file SRC added to every image at the absolute path DEST, executable if SRC is (e.g. a second program the image's users exec, or a certificate it reads); an ELF executable must be static and built for each platform (repeatable)")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return o, err
		}
		return o, usageError(err.Error())
	}
	o.packages, o.binaries = fs.Args(), binaries
	switch {
	case o.registry == "":
		return o, usageError("-registry is required")
	case len(o.packages)+len(o.binaries) == 0:
		return o, usageError("nothing to build: give packages or -binary")
	}
	if _, err := name.NewRepository(o.registry+"/x", name.StrictValidation); err != nil {
		return o, usageError(fmt.Sprintf("-registry %q: %v", o.registry, err))
	}
	if _, err := name.NewTag(o.registry+"/x:"+o.tag, name.StrictValidation); err != nil {
		return o, usageError(fmt.Sprintf("-tag %q: %v", o.tag, err))
	}
	for _, f := range files {
		dest, src, ok := strings.Cut(f, "=")
		if !ok || !path.IsAbs(dest) || path.Clean(dest) != dest || dest == "/" || src == "" {
			return o, usageError(fmt.Sprintf("-file %q: want DEST=SRC with DEST a clean absolute path", f))
		}
		o.files = append(o.files, extraFile{dest: dest, src: src})
	}
	t, err := time.Parse(time.RFC3339, created)
	if err != nil {
		return o, usageError(fmt.Sprintf("-created: %v", err))
	}
	o.meta.created = t
	for _, p := range strings.Split(platforms, ",") {
		pl, err := v1.ParsePlatform(p)
		if err != nil || pl.OS != "linux" || pl.Architecture != "amd64" && pl.Architecture != "arm64" {
			return o, usageError(fmt.Sprintf("-platforms: %q is not linux/amd64 or linux/arm64", p))
		}
		o.platforms = append(o.platforms, *pl)
	}
	seen := map[string]bool{}
	for _, n := range o.names() {
		if seen[n] {
			return o, usageError(fmt.Sprintf("two images would be named %q", n))
		}
		seen[n] = true
	}
	return o, nil
}

// names are the images' names, packages first.
func (o pushOptions) names() []string {
	var n []string
	for _, p := range o.packages {
		n = append(n, path.Base(p))
	}
	for _, b := range o.binaries {
		n = append(n, filepath.Base(b))
	}
	return n
}

func pushMain(ctx context.Context, args []string) error {
	o, err := parsePush(args)
	if err != nil {
		return err
	}
	opts, err := remoteOptions(ctx, o.caFile)
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "images-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	indexes, err := buildIndexes(ctx, o, work)
	if err != nil {
		return err
	}
	var refs strings.Builder
	for i, n := range o.names() {
		tag, _ := name.NewTag(o.registry+"/"+n+":"+o.tag, name.StrictValidation)
		if err := remote.WriteIndex(tag, indexes[i], opts...); err != nil {
			return fmt.Errorf("push %s: %w", tag, err)
		}
		digest, err := indexes[i].Digest()
		if err != nil {
			return err
		}
		fmt.Printf("%s@%s\n", tag, digest)
		fmt.Fprintf(&refs, "%s %s@%s\n", n, tag, digest)
	}
	if o.refsFile == "" {
		return nil
	}
	return writeFileAtomic(o.refsFile, []byte(refs.String()))
}

// buildIndexes builds the packages for every platform and packs every
// image, one index per name in o.names() order.
func buildIndexes(ctx context.Context, o pushOptions, work string) ([]v1.ImageIndex, error) {
	var indexes []v1.ImageIndex
	if len(o.packages) > 0 {
		var perPlatform [][]v1.Image
		for _, p := range o.platforms {
			dir := filepath.Join(work, p.OS+"_"+p.Architecture)
			if err := goBuild(ctx, dir, p, o.meta, o.packages); err != nil {
				return nil, err
			}
			var imgs []v1.Image
			for _, pkg := range o.packages {
				n := path.Base(pkg)
				img, err := binaryImage(n, filepath.Join(dir, n), p, o.meta, o.files)
				if err != nil {
					return nil, fmt.Errorf("%s for %s: %w", pkg, p, err)
				}
				imgs = append(imgs, img)
			}
			perPlatform = append(perPlatform, imgs)
		}
		for i := range o.packages {
			var imgs []v1.Image
			for _, byPkg := range perPlatform {
				imgs = append(imgs, byPkg[i])
			}
			indexes = append(indexes, imageIndex(imgs, o.platforms, o.meta))
		}
	}
	for _, b := range o.binaries {
		content, err := os.ReadFile(b)
		if err != nil {
			return nil, err
		}
		arch, err := elfPlatform(content)
		if err != nil {
			return nil, fmt.Errorf("-binary %s: %w", b, err)
		}
		p := v1.Platform{OS: "linux", Architecture: arch}
		img, err := binaryImage(filepath.Base(b), b, p, o.meta, o.files)
		if err != nil {
			return nil, err
		}
		indexes = append(indexes, imageIndex([]v1.Image{img}, []v1.Platform{p}, o.meta))
	}
	return indexes, nil
}

// goBuild builds pkgs for p into dir, static and without paths of this
// machine, with m's version and revision stamped when given.
func goBuild(ctx context.Context, dir string, p v1.Platform, m meta, pkgs []string) error {
	ldflags := "-s -w"
	if m.version != "" {
		ldflags += " -X " + versionVar + "=" + m.version
	}
	if m.revision != "" {
		ldflags += " -X " + revisionVar + "=" + m.revision
	}
	args := append([]string{"build", "-trimpath", "-ldflags", ldflags, "-o", dir + "/"}, pkgs...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Architecture)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build for %s: %w", p, err)
	}
	return nil
}

// writeFileAtomic writes data to file through a temporary file in its
// directory, so a reader never sees half of it.
func writeFileAtomic(file string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(file), ".images-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), file)
}
