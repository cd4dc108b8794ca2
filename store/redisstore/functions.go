package redisstore

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Redis 7's functions. A transition's script sent by EVALSHA runs its
// whole chunk on every call: the record encoding's and the transition's
// definitions (~20 closures for a bucket, 9 for a key per record) before
// the one call it makes. A library (FUNCTION LOAD) makes those once, when
// the server loads it, and each call (FCALL) runs only its function: a
// lifecycle then costs redis-server 6% fewer instructions coalesced and 15%
// fewer alone with a key per record, 12% and 24% in buckets
// (scripts/redis-instructions.sh; docs/benchmarks.md). The library is the
// scripts' own Lua, the functions named after a digest of it, so each
// version of the scripts (and the bucket layout) has a library of its own
// beside the others'.
//
// A server that does not have the library (never loaded, FUNCTION FLUSH, a
// replica promoted before it was replicated) answers "Function not found":
// the store loads it on that node and calls again, as go-redis sends a
// script's source after NOSCRIPT. A server without functions (before 7.0)
// or a user the ACL denies them gets EVALSHA from then on. And where the
// server refuses a function before it runs — over maxmemory (OOM), a
// replica (READONLY), too few replicas (NOREPLICAS), a failed save
// (MISCONF) — the call is sent again as EVALSHA: a script without flags
// is refused only at its first write, so a duplicate is still answered
// from its record while the server is full, as it was before functions.
// Calling a transition twice is harmless: a second run of the same call
// answers what the first did (the call's nonce, record.lua).

// library is the Redis function library of one set of transition scripts.
type library struct {
	source string
	fn     map[*redis.Script]string // the function standing in for each script
}

// newLibrary makes the library of scripts: defs are the scripts' shared
// definitions (the record encoding and the transitions), c their shape.
// Its name, and so its functions', carries a digest of all the rest of it.
func newLibrary(defs string, c callShape, scripts transitionScripts) *library {
	// The server loads a library where only redis.register_function
	// exists: the library functions the scripts keep as locals are taken
	// by the first call instead (record.lua's two lines; they stay the
	// same functions for as long as the library is loaded).
	for _, line := range [2]string{
		"local sbyte, ssub, schar, sformat = string.byte, string.sub, string.char, string.format\n",
		"local spack, sunpack, rcall = struct.pack, struct.unpack, redis.call\n",
	} {
		if strings.Count(defs, line) != 1 {
			panic("idem/redisstore: record.lua does not have the line " + line)
		}
		defs = strings.Replace(defs, line, "", 1)
	}
	const unnamed = "IDEM_LIBRARY"
	var b strings.Builder
	b.WriteString("local sbyte, ssub, schar, sformat, spack, sunpack, rcall\n")
	b.WriteString(defs)
	b.WriteString(c.batchHead)
	fns := map[*redis.Script]string{}
	register := func(script *redis.Script, fn, body string, allowOOM bool) {
		fns[script] = fn
		b.WriteString("redis.register_function{function_name = '" + unnamed + "_" + fn + "', callback = function(KEYS, ARGV)\n")
		b.WriteString("if not rcall then\n")
		b.WriteString("  sbyte, ssub, schar, sformat = string.byte, string.sub, string.char, string.format\n")
		b.WriteString("  spack, sunpack, rcall = struct.pack, struct.unpack, redis.call\n")
		b.WriteString("end\n")
		b.WriteString(clockLua)
		b.WriteString(body)
		b.WriteString("end")
		if allowOOM {
			b.WriteString(", flags = {'allow-oom'}")
		}
		b.WriteString("}\n")
	}
	batch := strings.TrimPrefix(batchTail(c), c.batchHead)
	lone := c
	lone.loc = c.libraryLoc
	register(scripts.acquire, "acquire", oneTail("acquire", acquireArgs, lone), false)
	register(scripts.owned, "owned", oneTail("owned", ownedArgs, lone), false)
	register(scripts.batch, "batch", batch, false)
	register(scripts.settle, "settle", oneTail("owned", ownedArgs, lone), true)
	register(scripts.settleBatch, "settle_batch", batch, true)
	sum := sha1.Sum([]byte(b.String()))
	name := "idem_" + hex.EncodeToString(sum[:10])
	lib := &library{source: "#!lua name=" + name + "\n" + strings.ReplaceAll(b.String(), unnamed+"_", name+"_"), fn: fns}
	for script, fn := range fns {
		fns[script] = name + "_" + fn
	}
	return lib
}

// How a transition's script is sent, tried in this order.
type sendMode int

const (
	byFunction sendMode = iota // FCALL of its function in the store's library
	bySHA                      // EVALSHA
	bySource                   // EVAL with its source: the server did not know the SHA
)

// sending is where a call is in the order of sendMode.
type sending struct {
	mode   sendMode
	loaded bool // the library was loaded for this call
}

// firstMode is how script goes first: as a function where the store has
// a library the server takes.
func (s *Store) firstMode(script *redis.Script) sending {
	if s.lib != nil && !s.noFunctions.Load() {
		if _, ok := s.lib.fn[script]; ok {
			return sending{mode: byFunction}
		}
	}
	return sending{mode: bySHA}
}

// send queues (on a pipeline) or runs script on c as st says.
func (s *Store) send(ctx context.Context, c redis.Cmdable, st sending, script *redis.Script, keys []string, args []any) *redis.Cmd {
	switch st.mode {
	case byFunction:
		return c.FCall(ctx, s.lib.fn[script], keys, args...)
	case bySHA:
		return script.EvalSha(ctx, c, keys, args...)
	}
	return script.Eval(ctx, c, keys, args...)
}

// again says whether a call answered err as st says goes again, and how
// (st changed); load loads the library where the call went.
func (s *Store) again(st *sending, err error, load func() error) bool {
	if err == nil || !isReply(err) {
		return false
	}
	msg := err.Error()
	switch st.mode {
	case byFunction:
		notFound := strings.HasPrefix(msg, "ERR Function not found")
		switch {
		case notFound && !st.loaded:
			st.loaded = true
			lerr := load()
			if lerr == nil {
				return true
			}
			if functionsUnavailable(lerr) {
				s.noFunctions.Store(true)
			}
		case functionsUnavailable(err):
			s.noFunctions.Store(true)
		case !notFound && !refusedBeforeRun(msg):
			return false
		}
		st.mode = bySHA
		return true
	case bySHA:
		if strings.HasPrefix(msg, "NOSCRIPT") {
			st.mode = bySource
			return true
		}
	}
	return false
}

// loadLibrary loads the store's library where keys are served.
func (s *Store) loadLibrary(ctx context.Context, node redis.Cmdable, keys []string) error {
	if cc, ok := node.(*redis.ClusterClient); ok {
		m, err := cc.MasterForKey(ctx, keys[0])
		if err != nil {
			return err
		}
		node = m
	}
	err := node.FunctionLoad(ctx, s.lib.source).Err()
	if err != nil && strings.Contains(err.Error(), "already exists") {
		return nil // loaded meanwhile by another call
	}
	return err
}

// functionsUnavailable: the server has no functions (before Redis 7.0, or
// the command renamed away), or the ACL denies them to the store's user.
func functionsUnavailable(err error) bool {
	msg := err.Error()
	return isReply(err) && (strings.HasPrefix(msg, "ERR unknown command") || strings.HasPrefix(msg, "NOPERM"))
}

// refusedBeforeRun: the server refused a function (not flagged allow-oom,
// or flagged and still refused) that it would have let a script without
// flags start, refusing that script only at its first write.
func refusedBeforeRun(msg string) bool {
	for _, p := range [...]string{"OOM ", "READONLY ", "NOREPLICAS ", "MISCONF "} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// runScript runs script on c (the store's client, or a node's): as a
// function, else by its SHA, else with its source (see above).
func (s *Store) runScript(ctx context.Context, c redis.Cmdable, script *redis.Script, keys []string, args []any) *redis.Cmd {
	st := s.firstMode(script)
	for {
		cmd := s.send(ctx, c, st, script, keys, args)
		if !s.again(&st, cmd.Err(), func() error { return s.loadLibrary(ctx, c, keys) }) {
			return cmd
		}
	}
}

// LoadFunctions loads the store's function library on every node that
// holds records (each master of a Cluster), where it is not loaded yet: so
// that processes whose user may call functions (FCALL) but not load them
// (FUNCTION LOAD) call them all the same. idem migrate runs it. The store
// loads the library itself wherever a call finds it missing; nil where the
// store calls no functions (Config.NoFunctions, a Ring).
func (s *Store) LoadFunctions(ctx context.Context) error {
	if s.lib == nil {
		return nil
	}
	return s.forEachNode(ctx, func(ctx context.Context, c *redis.Client) error {
		return s.loadLibrary(ctx, c, nil)
	})
}
