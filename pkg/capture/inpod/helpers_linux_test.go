package inpod_test

import (
	"os"

	"github.com/causeway-mesh/causeway/pkg/capture/internal/netnstest"
)

func openNetns(p *netnstest.Pod) (*os.File, error) { return os.Open(p.Path()) }
