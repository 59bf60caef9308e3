package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// maxVerifyFile bounds what verify reads of one file.
const maxVerifyFile = 32 << 20

// pinnedRef matches an image reference pinned by digest in YAML or text.
var pinnedRef = regexp.MustCompile(`[A-Za-z0-9][A-Za-z0-9._:/-]*@sha256:[0-9a-f]{64}`)

func verifyMain(ctx context.Context, args []string) error {
	var tag, caFile string
	fs := flag.NewFlagSet("images verify", flag.ContinueOnError)
	fs.StringVar(&tag, "tag", "", "the tag every pinned image must have in the registry, at that digest (required)")
	fs.StringVar(&caFile, "registry-ca", "", "PEM certificates trusted for the registry besides the system's")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return err
		}
		return usageError(err.Error())
	}
	if tag == "" || fs.NArg() == 0 {
		return usageError("usage: images verify -tag TAG FILE...")
	}
	opts, err := remoteOptions(ctx, caFile)
	if err != nil {
		return err
	}
	for _, file := range fs.Args() {
		refs, err := pinnedRefs(file)
		if err != nil {
			return err
		}
		for _, ref := range refs {
			if err := verifyRef(ref, tag, opts); err != nil {
				return fmt.Errorf("%s: %w", file, err)
			}
			fmt.Printf("%s: %s is %s:%s\n", file, ref, ref.Context(), tag)
		}
	}
	return nil
}

// pinnedRefs are the distinct digest references in file, in order.
func pinnedRefs(file string) ([]name.Digest, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxVerifyFile+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxVerifyFile {
		return nil, fmt.Errorf("%s is larger than %d bytes", file, maxVerifyFile)
	}
	var refs []name.Digest
	seen := map[string]bool{}
	for _, m := range pinnedRef.FindAllString(string(data), -1) {
		if seen[m] {
			continue
		}
		seen[m] = true
		d, err := name.NewDigest(m, name.StrictValidation)
		if err != nil {
			return nil, fmt.Errorf("%s: %q: %w", file, m, err)
		}
		refs = append(refs, d)
	}
	if len(refs) == 0 {
		return nil, fmt.Errorf("%s pins no image by digest", file)
	}
	return refs, nil
}

// verifyRef checks that the registry serves ref's digest as ref's
// repository at tag.
func verifyRef(ref name.Digest, tag string, opts []remote.Option) error {
	tagged := ref.Context().Tag(tag)
	desc, err := remote.Head(tagged, opts...)
	if err != nil {
		return fmt.Errorf("%s: %w", tagged, err)
	}
	if desc.Digest.String() != ref.DigestStr() {
		return fmt.Errorf("%s pins %s, but the registry's %s is %s", ref.Context(), ref.DigestStr(), tagged, desc.Digest)
	}
	return nil
}
