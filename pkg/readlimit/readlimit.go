// Package readlimit reads what comes from outside the process (files an
// operator points at, answers of admin endpoints, policy inputs) up to a
// size limit, so that an oversized or endless input is an error instead of
// exhausted memory.
package readlimit

import (
	"errors"
	"fmt"
	"io"
	"os"
)

// ErrTooLarge is matched (errors.Is) by the error for an input over its
// limit.
var ErrTooLarge = errors.New("input too large")

type tooLarge struct{ limit int64 }

func (e *tooLarge) Error() string        { return fmt.Sprintf("larger than %d bytes", e.limit) }
func (e *tooLarge) Is(target error) bool { return target == ErrTooLarge }

// All reads r to its end. More than limit bytes is an error ("larger than
// N bytes", matching ErrTooLarge); at most limit+1 bytes are read.
func All(r io.Reader, limit int64) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, &tooLarge{limit}
	}
	return data, nil
}

// File reads the file at path as All reads a reader.
func File(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return All(f, limit)
}
