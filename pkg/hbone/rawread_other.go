//go:build !linux

package hbone

import (
	"errors"
	"io"
	"syscall"
)

var errWouldBlock = errors.New("hbone: nothing to read yet")

// rawConnOf is nil: the readiness-based reads are Linux's; elsewhere reads
// hold their buffer while they wait, and joined pairs keep a goroutine per
// direction.
func rawConnOf(any) syscall.RawConn { return nil }

func rawSocketReader(io.Reader) func() (*[]byte, int, error) { return nil }

func readPooled(syscall.RawConn, bool, bool) (*[]byte, int, error) { return nil, 0, errWouldBlock }

func readFD(uintptr, bool) (*[]byte, int, error) { return nil, 0, errWouldBlock }

// rawRead and rawWrite are never called: rawConnOf is nil here.
func rawRead(uintptr, []byte) (int, error)  { return 0, errWouldBlock }
func rawWrite(uintptr, []byte) (int, error) { return 0, errWouldBlock }

func writeNoWait(syscall.RawConn, [][]byte) (int, error) { return 0, errWouldBlock }
