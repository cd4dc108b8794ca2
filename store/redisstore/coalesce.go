package redisstore

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/coalesce"
)

// maxBatch bounds the calls of one shared round trip.
const maxBatch = 64

// The round trips out at once, and when a call goes alone (see
// coalesce.Config). Redis runs one script at a time however many arrive,
// so a batch in flight costs the server nothing while the client forms the
// next, and where the cores are the limit a lone call costs a whole round
// trip for one call: while 16 calls or more are in the store, at most two
// lone calls are out, and a queue of eight goes out at once if a slot is
// free. With fewer calls in the store (a few callers, or a distant server
// where each round trip is long) a call goes alone whenever one of the 8
// slots is free. The numbers were chosen by alternating runs of idem bench
// against Redis on the same host and through the delaying proxy of
// BenchmarkRemote: fewer slots kept too few calls out over a slow link.
const (
	maxInFlight  = 8
	loneInFlight = 2
	loadedAt     = 16
	minBatch     = 8
)

// While the store's round trips take under a millisecond on average (a
// server on the same host or network: a trip costs the client and the
// server more work than waiting for one costs time), calls are held back
// harder (coalesce.Config.Fast): while 8 calls or more are in the store, a
// call goes alone only when no trip is in flight, and the queue goes out
// at 16 calls if a slot is free, or when a trip ends — and from 24 calls
// in the store, only when the last trip out ends (the batches, about half
// the calls each, take turns: one runs in Redis while the client answers
// the other's callers). Slower trips (a distant server) keep the settings
// above, under which the calls of a few callers go out at once.
//
// Chosen as the settings above: holding calls from fewer than 8 in the
// store lost throughput where the cores were not the limit, and gathering
// at any load lost it at 16 workers, where a queue that cannot fill a
// batch waits for nothing.
const (
	fastTrip     = time.Millisecond
	fastLoadedAt = 8
	fastMinBatch = 16
	fastGatherAt = 24
)

// scriptCall is one transition of one record: the script that runs it
// alone, the record's keys (and with buckets its field) and the
// transition's arguments, typed: a lone call sends them as its script's
// ARGV (args), a batch packs every call's into its one argument
// (appendPacked).
type scriptCall struct {
	one     *redis.Script
	keys    []string
	field   string
	nonce   [10]byte
	acquire bool
	// An acquisition's.
	fp          string
	lease, keep int64
	maxAttempts int
	// A heartbeat's or a settle's.
	op     string
	fence  uint64
	ms     int64
	result []byte
}

// args returns the call's ARGV for its script alone: with buckets the
// field first, then the transition's five arguments.
func (c *scriptCall) args() []any {
	a := make([]any, 0, 6)
	if len(c.keys) > 1 {
		a = append(a, c.field)
	}
	nonce := string(c.nonce[:])
	if c.acquire {
		return append(a, c.fp, c.lease, c.keep, c.maxAttempts, nonce)
	}
	return append(a, c.op, c.fence, c.ms, c.result, nonce)
}

// appendPacked appends the call as the batch script reads it (batchTail):
// 'a', I4 field length, field, I4 fingerprint length, fingerprint, i8
// lease, i8 retention, i8 max attempts, c10 nonce; or 'o', I4 field
// length, field, c1 op, B fence length, the fence in decimal (compared as
// written, like a lone call's), i8 ms, I4 result length, result, c10
// nonce. Big-endian.
func (c *scriptCall) appendPacked(b []byte) []byte {
	str := func(b []byte, s string) []byte {
		return append(binary.BigEndian.AppendUint32(b, uint32(len(s))), s...)
	}
	if c.acquire {
		b = str(append(b, 'a'), c.field)
		b = str(b, c.fp)
		b = binary.BigEndian.AppendUint64(b, uint64(c.lease))
		b = binary.BigEndian.AppendUint64(b, uint64(c.keep))
		b = binary.BigEndian.AppendUint64(b, uint64(int64(c.maxAttempts)))
		return append(b, c.nonce[:]...)
	}
	b = str(append(b, 'o'), c.field)
	b = append(b, c.op[0])
	at := len(b)
	b = strconv.AppendUint(append(b, 0), c.fence, 10)
	b[at] = byte(len(b) - at - 1)
	b = binary.BigEndian.AppendUint64(b, uint64(c.ms))
	b = append(binary.BigEndian.AppendUint32(b, uint32(len(c.result))), c.result...)
	return append(b, c.nonce[:]...)
}

// answer is a script's answer to one call: its value, or its error.
type answer struct {
	val any
	err error
}

// answerOf takes cmd's value or error.
func answerOf(cmd *redis.Cmd) answer { return answer{cmd.Val(), cmd.Err()} }

// Err returns the call's error.
func (a answer) Err() error { return a.err }

// Slice returns the answer as an array, as redis.Cmd's Slice does.
func (a answer) Slice() ([]any, error) {
	if a.err != nil {
		return nil, a.err
	}
	v, ok := a.val.([]any)
	if !ok {
		return nil, fmt.Errorf("redis: unexpected type=%T for Slice", a.val)
	}
	return v, nil
}

// Int returns the answer as an integer, as redis.Cmd's Int does.
func (a answer) Int() (int, error) {
	if a.err != nil {
		return 0, a.err
	}
	switch v := a.val.(type) {
	case int64:
		return int(v), nil
	case string:
		return strconv.Atoi(v)
	}
	return 0, fmt.Errorf("redis: unexpected type=%T for Int", a.val)
}

// newGroup coalesces the store's transitions, acquisitions and settles
// alike: a batch is one run of the batch script, which holds both.
func (s *Store) newGroup() *coalesce.Group[scriptCall, answer] {
	return coalesce.New(coalesce.Config[scriptCall]{
		MaxBatch: maxBatch, MaxInFlight: maxInFlight, LoneInFlight: loneInFlight, LoadedAt: loadedAt, MinBatch: minBatch,
		FastTrip: fastTrip, Fast: coalesce.Hold{LoneInFlight: 1, LoadedAt: fastLoadedAt, MinBatch: fastMinBatch, GatherAt: fastGatherAt}},
		func(ctx context.Context, c scriptCall) (answer, error) {
			return answerOf(s.run(ctx, c.one, c.keys, c.args()...)), nil
		},
		func(ctx context.Context, calls []scriptCall, out []answer, _ []error) {
			s.runMany(ctx, calls, out)
		})
}

// call runs c through the store's group (alone when not coalesced).
func (s *Store) call(ctx context.Context, c scriptCall) answer {
	if s.calls == nil {
		return answerOf(s.run(ctx, c.one, c.keys, c.args()...))
	}
	a, err := s.calls.Do(ctx, c)
	if err != nil { // the caller's context ended while the call waited
		a = answer{err: err}
	}
	return a
}

// runMany runs a batch of calls. On one server (a *redis.Client: a single
// Redis, or Sentinel's master through a failover client) the batch is one
// run of the batch script, with WAIT after it in the same round trip when
// Config.WaitReplicas asks for it. On a Cluster, whose keys live on many
// nodes, or a Ring, it is one pipeline of the calls' own scripts (go-redis
// splits it by node or shard) — on a Cluster with WAIT, one pipeline per
// master, each ending with its WAIT, sent at once. A script the server does
// not know yet (NOSCRIPT: it did not run) is sent again with its source.
// Each call gets its own answer or error; a round trip that could not be
// made fails every call of it, as a lone call would fail.
func (s *Store) runMany(ctx context.Context, calls []scriptCall, answers []answer) {
	if _, oneServer := s.c.(*redis.Client); oneServer {
		s.runBatchScript(ctx, calls, answers)
		return
	}
	out := make([]*redis.Cmd, len(calls))
	defer func() {
		for i, cmd := range out {
			answers[i] = answerOf(cmd)
		}
	}()
	// A Cluster, or a client that shards keys itself (a Ring): a script may
	// touch the keys of one node only, so the calls travel as separate
	// scripts, which the client routes key by key.
	cc, cluster := s.c.(*redis.ClusterClient)
	switch {
	case !cluster || s.waitReplicas == 0:
		s.runPipeline(ctx, s.c, calls, indexes(len(calls)), out)
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
				s.runPipeline(ctx, m, calls, idx, out)
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

// batchArgs holds a batch script's keys and packed argument, reused from
// one batch to the next: go-redis holds neither past the command's answer.
type batchArgs struct {
	keys   []string
	packed []byte
}

var batchArgsPool = sync.Pool{New: func() any { return new(batchArgs) }}

// reuse puts b back, unless a large result grew it past what is worth
// keeping.
func (b *batchArgs) reuse() {
	if cap(b.packed) > 64<<10 {
		return
	}
	clear(b.keys)
	b.keys, b.packed = b.keys[:0], b.packed[:0]
	batchArgsPool.Put(b)
}

// runBatchScript runs calls as one run of the batch script (see runMany)
// and hands each call its element of the answer.
func (s *Store) runBatchScript(ctx context.Context, calls []scriptCall, out []answer) {
	buf := batchArgsPool.Get().(*batchArgs)
	defer buf.reuse()
	for i := range calls {
		buf.keys = append(buf.keys, calls[i].keys...)
		buf.packed = calls[i].appendPacked(buf.packed)
	}
	keys, args := buf.keys, []any{buf.packed}
	many := s.batchScript
	settlesOnly := !slices.ContainsFunc(calls, func(c scriptCall) bool { return c.acquire })
	if settlesOnly && !s.flagsRefused.Load() {
		many = s.settleBatchScript
	}
	var cmd, wait *redis.Cmd
	for st := s.firstMode(many); ; {
		if s.waitReplicas == 0 {
			cmd = s.send(ctx, s.c, st, many, keys, args)
		} else {
			pipe := s.c.Pipeline()
			cmd = s.send(ctx, pipe, st, many, keys, args)
			wait = pipe.Do(ctx, "WAIT", s.waitReplicas, s.waitTimeout.Milliseconds())
			_, _ = pipe.Exec(ctx)
		}
		if !s.again(&st, cmd.Err(), func() error { return s.loadLibrary(ctx, s.c, keys) }) {
			break
		}
	}
	answers, err := cmd.Slice()
	if err == nil && len(answers) != len(calls) {
		err = fmt.Errorf("idem: a batch of %d calls answered %d times", len(calls), len(answers))
	}
	for i := range out {
		if err != nil {
			out[i] = answer{err: err}
		} else if e, ok := answers[i].(string); ok {
			out[i] = answer{err: callError(e)} // this call's own error (see batchTail)
		} else {
			out[i] = answer{val: answers[i]}
		}
	}
	if wait != nil && err == nil {
		if err := s.waitShortfall(wait); err != nil {
			for i := range out {
				if out[i].err == nil {
					out[i].err = err
				}
			}
		}
	}
	if many == s.batchScript && !s.flagsRefused.Load() {
		s.settleAgainIfFull(ctx, calls, out)
	}
}

// settleAgainIfFull sends the settles of a batch with acquisitions that a
// full server refused (OOM) again, as a batch of settles (allowOOM),
// which a full server takes. A settle refused for OOM
// changed nothing: Redis refuses a script without the flag only at its
// first write (after one, it lets the script finish), so nothing of the
// batch had been written.
func (s *Store) settleAgainIfFull(ctx context.Context, calls []scriptCall, out []answer) {
	var idx []int
	for i := range calls {
		if !calls[i].acquire && redis.IsOOMError(out[i].Err()) {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return
	}
	again, answers := make([]scriptCall, len(idx)), make([]answer, len(idx))
	for j, i := range idx {
		again[j] = calls[i]
	}
	s.runBatchScript(ctx, again, answers)
	for j, i := range idx {
		out[i] = answers[j]
	}
}

// callError is a call's own error in a batch's answer (see batchTail),
// the server's words: an answer of the server, as a lone call's error is.
type callError string

func (e callError) Error() string { return string(e) }

// RedisError makes it a redis.Error (isReply).
func (callError) RedisError() {}

// pipelined is what a pipeline sends for call i: its script, keys and
// ARGV.
type pipelined func(i int) (script *redis.Script, keys []string, args []any)

// callsOf sends calls[i].
func callsOf(calls []scriptCall) pipelined {
	return func(i int) (*redis.Script, []string, []any) { return calls[i].one, calls[i].keys, calls[i].args() }
}

// runPipeline sends the calls at idx through node (see runMany).
func (s *Store) runPipeline(ctx context.Context, node redis.Cmdable, calls []scriptCall, idx []int, out []*redis.Cmd) {
	s.sendPipeline(ctx, node, callsOf(calls), idx, out, false, 0)
}

// sendPipeline sends the calls at idx through node in one pipeline, each
// after ASKING when asking, followed by WAIT with Config.WaitReplicas; a
// script node does not know yet is sent again with its source, and on a
// Cluster, calls answered with a redirection are sent where it says
// (followRedirects; redirects is how many were followed to get here).
func (s *Store) sendPipeline(ctx context.Context, node redis.Cmdable, send pipelined, idx []int, out []*redis.Cmd, asking bool, redirects int) {
	pending := idx
	sts := make([]sending, len(out)) // how each call goes (functions.go)
	// The library is loaded on node once, however many of its calls found
	// it missing (cur: the call at hand).
	var loaded bool
	var loadErr error
	var cur int
	load := func() error {
		if !loaded {
			_, keys, _ := send(cur)
			loaded, loadErr = true, s.loadLibrary(ctx, node, keys)
		}
		return loadErr
	}
	for round := 0; ; round++ {
		pipe := node.Pipeline()
		for _, i := range pending {
			script, keys, args := send(i)
			if asking {
				pipe.Do(ctx, "ASKING")
			}
			if round == 0 {
				sts[i] = s.firstMode(script)
			}
			out[i] = s.send(ctx, pipe, sts[i], script, keys, args)
		}
		var wait *redis.Cmd
		if s.waitReplicas > 0 {
			wait = pipe.Do(ctx, "WAIT", s.waitReplicas, s.waitTimeout.Milliseconds())
		}
		_, _ = pipe.Exec(ctx)
		var again []int
		for _, i := range pending {
			cur = i
			if s.again(&sts[i], out[i].Err(), load) {
				again = append(again, i)
			}
		}
		if wait != nil {
			s.checkWait(wait, out, pending, again)
		}
		if len(again) == 0 {
			break
		}
		pending = again
	}
	s.followRedirects(ctx, node, send, idx, out, asking, redirects)
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
	err := s.waitShortfall(wait)
	if err == nil {
		return
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

// waitShortfall returns the error of a WAIT that fell short, or nil.
func (s *Store) waitShortfall(wait *redis.Cmd) error {
	n, err := wait.Int64()
	if err == nil && int(n) >= s.waitReplicas {
		return nil
	}
	if err == nil {
		err = fmt.Errorf("%w (%d of %d within %v)", ErrReplicationShortfall, n, s.waitReplicas, s.waitTimeout)
	}
	return err
}

// CoalesceStats returns how many shared round trips (pipelines) the store
// sent and how many calls they carried (zeros when not coalesced).
func (s *Store) CoalesceStats() (trips, calls int64) {
	if s.calls == nil {
		return 0, 0
	}
	return s.calls.Stats()
}
