package main

import (
	"context"
	"fmt"
	"strconv"
)

// doComparisons replays typed results cycling through 4,096 completed keys:
// more keys than idem.Do's decode cache holds, so most replays decode.
func doComparisons(_ context.Context, cfg config) ([]comparison, error) {
	const keys = 4096
	n := cfg.ops(1_000_000)
	ir, pr, err := pair(newIdemMemory, newPeerMemory)
	if err != nil {
		return nil, err
	}
	ids := make([]string, keys)
	ctx := context.Background()
	for i := range ids {
		ids[i] = "do-" + strconv.Itoa(i)
		if _, err := ir.do(ctx, ids[i]); err != nil {
			return nil, err
		}
		if _, err := pr.do(ctx, ids[i]); err != nil {
			return nil, err
		}
	}
	typed := func(name string, r runner, workers int) side {
		return side{name: name, round: func() (measured, error) {
			return drive(workers, n, func(i int) error {
				p, err := r.do(ctx, ids[i%keys])
				if err == nil && p.Amount != 100 {
					err = fmt.Errorf("replayed %+v", p)
				}
				return err
			})
		}}
	}
	var comps []comparison
	for _, workers := range []int{1, 8} {
		comps = append(comps, comparison{
			name: fmt.Sprintf("typed replay over %d keys, %d goroutine(s)", keys, workers),
			sides: []side{
				typed("idem.Do", ir, workers),
				typed("peer Runner.Run+Unmarshal", pr, workers),
			},
		})
	}
	comps[len(comps)-1].close = func() { ir.close(); pr.close() }
	return comps, nil
}
