package main

import (
	"context"

	"github.com/faustbrian/go-idempotency/memory"
	"github.com/idemgo/idem/store/memstore"
)

func newIdemMemory() (runner, error) {
	s := memstore.New(memstore.Config{})
	return idemRunner(s, func() { s.Close() })
}

func newPeerMemory() (runner, error) {
	s, err := memory.New(memory.Options{Clock: wallClock{}, OwnerTokens: ownerTokens(), MaxRecords: memory.MaxRecordCapacity})
	if err != nil {
		return runner{}, err
	}
	return peerRunner(s, func() {})
}

func memoryComparisons(_ context.Context, cfg config) ([]comparison, error) {
	return runComparisons("memory", 8, cfg.ops(200_000), cfg.ops(1_000_000), newIdemMemory, newPeerMemory, func() {})
}
