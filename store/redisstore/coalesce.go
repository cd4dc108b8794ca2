package redisstore

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/coalesce"
)

// maxBatch bounds the calls of one shared round trip.
const maxBatch = 64

// maxInFlight bounds the shared round trips of one kind out at once. Redis
// runs one script at a time however many arrive, so a batch in flight costs
// the server nothing while the client forms the next: measured (2 cores, 32
// workers, idem bench lifecycles on one Redis), 1 in flight made 27,000–31,000
// lifecycles/s, 2 made 33,000, 4 made 38,000–40,000 and 8 made 33,000.
const maxInFlight = 4

// scriptCall is one script run: its keys and arguments.
type scriptCall struct {
	keys []string
	args []any
}

// newGroup coalesces the calls of script; many is its form that runs a
// batch in one script run.
func (s *Store) newGroup(script, many *redis.Script) *coalesce.Group[scriptCall, *redis.Cmd] {
	return coalesce.New(coalesce.Config[scriptCall]{MaxBatch: maxBatch, MaxInFlight: maxInFlight},
		func(ctx context.Context, c scriptCall) (*redis.Cmd, error) {
			return s.run(ctx, script, c.keys, c.args...), nil
		},
		func(ctx context.Context, calls []scriptCall, out []*redis.Cmd, _ []error) {
			s.runMany(ctx, script, many, calls, out)
		})
}

// call runs script on keys through group (alone when group is nil).
func (s *Store) call(ctx context.Context, group *coalesce.Group[scriptCall, *redis.Cmd], script *redis.Script, keys []string, args ...any) *redis.Cmd {
	if group == nil {
		return s.run(ctx, script, keys, args...)
	}
	cmd, err := group.Do(ctx, scriptCall{keys: keys, args: args})
	if err != nil { // the caller's context ended while the call waited
		cmd = redis.NewCmd(ctx)
		cmd.SetErr(err)
	}
	return cmd
}

// runMany runs a batch of calls. On one server (a *redis.Client: a single
// Redis, or Sentinel's master through a failover client) the batch is one
// run of many, the script's batch form, with WAIT after it in the same
// round trip when Config.WaitReplicas asks for it. On a Cluster, whose keys
// live on many nodes, or a Ring, it is one pipeline of script calls (go-redis
// splits it by node or shard) — on a Cluster with WAIT, one pipeline per
// master, each ending with its WAIT, sent at once. A script the server does
// not know yet (NOSCRIPT: it did not run) is sent again with its source.
// Each call gets its own answer or error; a round trip that could not be
// made fails every call of it, as a lone call would fail.
func (s *Store) runMany(ctx context.Context, script, many *redis.Script, calls []scriptCall, out []*redis.Cmd) {
	if _, oneServer := s.c.(*redis.Client); oneServer {
		s.runBatchScript(ctx, many, calls, out)
		return
	}
	// A Cluster, or a client that shards keys itself (a Ring): a script may
	// touch the keys of one node only, so the calls travel as separate
	// scripts, which the client routes key by key.
	cc, cluster := s.c.(*redis.ClusterClient)
	switch {
	case !cluster || s.waitReplicas == 0:
		s.runPipeline(ctx, s.c, script, calls, indexes(len(calls)), out)
	default:
		byMaster := map[*redis.Client][]int{}
		for i, c := range calls {
			m, err := cc.MasterForKey(ctx, c.keys[0])
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

// runBatchScript runs calls as one run of many (see runMany) and hands each
// call its element of the answer.
func (s *Store) runBatchScript(ctx context.Context, many *redis.Script, calls []scriptCall, out []*redis.Cmd) {
	keys := make([]string, 0, len(calls)*len(calls[0].keys))
	args := make([]any, 0, len(calls)*len(calls[0].args))
	for _, c := range calls {
		keys = append(keys, c.keys...)
		args = append(args, c.args...)
	}
	var cmd, wait *redis.Cmd
	for try := 0; ; try++ {
		run := many.EvalSha
		if try > 0 {
			run = many.Eval // with its source
		}
		if s.waitReplicas == 0 {
			cmd = run(ctx, s.c, keys, args...)
		} else {
			pipe := s.c.Pipeline()
			cmd = run(ctx, pipe, keys, args...)
			wait = pipe.Do(ctx, "WAIT", s.waitReplicas, s.waitTimeout.Milliseconds())
			_, _ = pipe.Exec(ctx)
		}
		if err := cmd.Err(); err == nil || try > 0 || !strings.HasPrefix(err.Error(), "NOSCRIPT") {
			break
		}
	}
	answers, err := cmd.Slice()
	if err == nil && len(answers) != len(calls) {
		err = fmt.Errorf("idem: a batch of %d calls answered %d times", len(calls), len(answers))
	}
	for i := range out {
		out[i] = redis.NewCmd(ctx)
		if err != nil {
			out[i].SetErr(err)
		} else if e, ok := answers[i].(error); ok {
			out[i].SetErr(e) // this call's own error (see manyTail)
		} else {
			out[i].SetVal(answers[i])
		}
	}
	if wait != nil && err == nil {
		s.checkWait(wait, out, indexes(len(calls)), nil)
	}
}

// runPipeline sends the calls at idx through node (see runMany).
func (s *Store) runPipeline(ctx context.Context, node redis.Cmdable, script *redis.Script, calls []scriptCall, idx []int, out []*redis.Cmd) {
	pending := idx
	for try := 0; ; try++ {
		pipe := node.Pipeline()
		for _, i := range pending {
			if try == 0 {
				out[i] = script.EvalSha(ctx, pipe, calls[i].keys, calls[i].args...)
			} else {
				out[i] = script.Eval(ctx, pipe, calls[i].keys, calls[i].args...) // with its source
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

// indexes returns 0, 1, …, n-1.
func indexes(n int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	return idx
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
