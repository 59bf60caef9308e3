//go:build !linux

package hbone

import "io"

// rawSocketReader is the Linux readiness-based reader; elsewhere reads hold
// their buffer while they wait.
func rawSocketReader(io.Reader) func() (*[]byte, int, error) { return nil }
