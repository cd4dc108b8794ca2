package redisstore

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/coalesce"
)

// maxBatch bounds the scripts of one shared pipeline.
const maxBatch = 64

// scriptCall is one script run: its key and arguments.
type scriptCall struct {
	key  string
	args []any
}

func (s *Store) newGroup(script *redis.Script) *coalesce.Group[scriptCall, *redis.Cmd] {
	return coalesce.New(coalesce.Config[scriptCall]{MaxBatch: maxBatch},
		func(ctx context.Context, c scriptCall) (*redis.Cmd, error) {
			return s.run(ctx, script, c.key, c.args...), nil
		},
		func(ctx context.Context, calls []scriptCall, out []*redis.Cmd, _ []error) {
			s.runMany(ctx, script, calls, out)
		})
}

// call runs script on key through group (alone when group is nil).
func (s *Store) call(ctx context.Context, group *coalesce.Group[scriptCall, *redis.Cmd], script *redis.Script, key string, args ...any) *redis.Cmd {
	if group == nil {
		return s.run(ctx, script, key, args...)
	}
	cmd, err := group.Do(ctx, scriptCall{key: key, args: args})
	if err != nil { // the caller's context ended while the call waited
		cmd = redis.NewCmd(ctx)
		cmd.SetErr(err)
	}
	return cmd
}

// runMany sends the scripts of calls in one pipeline (go-redis splits a
// Cluster's by node), then WAIT when Config.WaitReplicas asks for it — on a
// Cluster, one pipeline per master, each ending with its WAIT, sent at
// once. A script the server does not know yet (NOSCRIPT: it did not run) is
// sent again with its source. Each call gets its own answer or error; a
// pipeline that could not be sent fails every call of it, as a lone call
// would fail.
func (s *Store) runMany(ctx context.Context, script *redis.Script, calls []scriptCall, out []*redis.Cmd) {
	cc, cluster := s.c.(*redis.ClusterClient)
	if !cluster || s.waitReplicas == 0 {
		all := make([]int, len(calls))
		for i := range all {
			all[i] = i
		}
		s.runPipeline(ctx, s.c, script, calls, all, out)
	} else {
		byMaster := map[*redis.Client][]int{}
		for i, c := range calls {
			m, err := cc.MasterForKey(ctx, c.key)
			if err != nil {
				out[i] = redis.NewCmd(ctx)
				out[i].SetErr(err)
				continue
			}
			byMaster[m] = append(byMaster[m], i)
		}
		var wg sync.WaitGroup
		for m, idx := range byMaster {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.runPipeline(ctx, m, script, calls, idx, out)
			}()
		}
		wg.Wait()
	}
	for _, c := range out {
		if err := c.Err(); err != nil && ctx.Err() == nil && !isReply(err) {
			if cluster {
				cc.ReloadState(ctx) // see run
			}
			break
		}
	}
}

// runPipeline sends the calls at idx through node (see runMany).
func (s *Store) runPipeline(ctx context.Context, node redis.Cmdable, script *redis.Script, calls []scriptCall, idx []int, out []*redis.Cmd) {
	pending := idx
	for try := 0; ; try++ {
		pipe := node.Pipeline()
		for _, i := range pending {
			if try == 0 {
				out[i] = script.EvalSha(ctx, pipe, []string{calls[i].key}, calls[i].args...)
			} else {
				out[i] = script.Eval(ctx, pipe, []string{calls[i].key}, calls[i].args...) // with its source
			}
		}
		var wait *redis.Cmd
		if s.waitReplicas > 0 {
			wait = pipe.Do(ctx, "WAIT", s.waitReplicas, s.waitTimeout.Milliseconds())
		}
		_, _ = pipe.Exec(ctx)
		var again []int
		for _, i := range pending {
			if err := out[i].Err(); err != nil && try == 0 && strings.HasPrefix(err.Error(), "NOSCRIPT") {
				again = append(again, i)
			}
		}
		if wait != nil {
			s.checkWait(wait, out, pending, again)
		}
		if len(again) == 0 {
			return
		}
		pending = again
	}
}

// checkWait turns a WAIT that fell short into ErrReplicationShortfall for
// the calls of its pipeline that ran (not those to be sent again).
func (s *Store) checkWait(wait *redis.Cmd, out []*redis.Cmd, sent, again []int) {
	n, err := wait.Int64()
	if err == nil && int(n) >= s.waitReplicas {
		return
	}
	if err == nil {
		err = fmt.Errorf("%w (%d of %d within %v)", ErrReplicationShortfall, n, s.waitReplicas, s.waitTimeout)
	}
	resent := map[int]bool{}
	for _, i := range again {
		resent[i] = true
	}
	for _, i := range sent {
		if !resent[i] && out[i].Err() == nil {
			out[i].SetErr(err)
		}
	}
}

// CoalesceStats returns how many shared round trips (pipelines) the store
// sent and how many calls they carried (zeros when not coalesced).
func (s *Store) CoalesceStats() (trips, calls int64) {
	if s.acquires == nil {
		return 0, 0
	}
	return coalesce.Sum(s.acquires, s.owneds)
}
