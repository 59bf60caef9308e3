// Package atomicfile writes files so that no reader ever sees part of one:
// the content goes to a temporary file beside the target, is synced with
// its mode set, and only then takes the target's name.
package atomicfile

import (
	"bytes"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Replace writes r to path with mode, replacing the file there if any
// (rename): a reader opens the old content or the new, never a mix.
func Replace(path string, r io.Reader, mode fs.FileMode) error {
	tmp, err := writeTemp(path, r, mode)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	return os.Rename(tmp, path)
}

// Create writes data to path with mode, failing with an error matching
// fs.ErrExist when path exists (link: an existing file is never replaced,
// so of two concurrent writers exactly one wins).
func Create(path string, data []byte, mode fs.FileMode) error {
	tmp, err := writeTemp(path, bytes.NewReader(data), mode)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	return os.Link(tmp, path)
}

// writeTemp writes r durably, with mode, to a new temporary file in path's
// directory and returns its name; the caller removes it. The name starts
// with a dot and does not end in path's extension: what watches the
// directory for files of that kind (a container runtime its CNI
// configurations) passes over it.
func writeTemp(path string, r io.Reader, mode fs.FileMode) (string, error) {
	base := filepath.Base(path)
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+strings.TrimSuffix(base, filepath.Ext(base))+"-*.tmp")
	if err != nil {
		return "", err
	}
	err = fill(tmp, r, mode)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp.Name())
		return "", err
	}
	return tmp.Name(), nil
}

// fill sets f's mode before anything is written (the content may be a
// secret), then writes r and syncs.
func fill(f *os.File, r io.Reader, mode fs.FileMode) error {
	if err := f.Chmod(mode); err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		return err
	}
	return f.Sync()
}
