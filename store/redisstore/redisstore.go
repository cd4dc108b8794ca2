package redisstore

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/coalesce"
	"github.com/idemgo/idem/internal/keypack"
	"github.com/idemgo/idem/store"
)

var (
	_ store.Store     = (*Store)(nil)
	_ store.Lister    = (*Store)(nil)
	_ store.Scanner   = (*Store)(nil)
	_ store.Unclaimer = (*Store)(nil)
)

//go:embed record.lua
var recordLua string

//go:embed acquire.lua
var acquireBody string

//go:embed owned.lua
var ownedBody string

//go:embed bucket.lua
var bucketLua string

//go:embed deleteupto.lua
var deleteUpToBody string

// Each script is the record encoding's functions, a transition's function,
// then a tail that calls it once (a lone call). A coalesced batch is one run
// of the batch script, which holds both transitions and calls one per call
// of the batch, each under pcall so an error answers its own call only
// (batchTail: as a string, which no call answers otherwise). A call is one
// key and five arguments, or with buckets (bucket.lua) two keys (the
// record's own and its bucket's) and six arguments (its field first); a
// batch's calls are packed in its one argument (scriptCall.appendPacked).
// Settles have scripts of their own besides, which may run on a full
// server (allowOOM).
var (
	acquireLua = recordLua + acquireBody + clockLua + oneTail("acquire", acquireArgs, plainCall)
	ownedLua   = recordLua + ownedBody + clockLua + oneTail("owned", ownedArgs, plainCall)
	batchLua   = recordLua + acquireBody + ownedBody + clockLua + batchTail(plainCall)

	bucketAcquireLua = recordLua + bucketLua + acquireBody + clockLua + oneTail("acquire", acquireArgs, bucketCall)
	bucketOwnedLua   = recordLua + bucketLua + ownedBody + clockLua + oneTail("owned", ownedArgs, bucketCall)
	bucketBatchLua   = recordLua + bucketLua + acquireBody + ownedBody + clockLua + batchTail(bucketCall)

	deleteUpToLua       = recordLua + deleteUpToBody + oneTail("deleteUpTo", deleteUpToArgs, plainCall)
	bucketDeleteUpToLua = recordLua + bucketLua + deleteUpToBody + oneTail("deleteUpTo", deleteUpToArgs, bucketCall)
	// Delete of a bucketed record: KEYS as a bucket call's, ARGV[1] the field.
	bucketDeleteLua = recordLua + bucketLua + "local i = 1\nremove(" + bucketCall.loc + ")\nreturn 1\n"

	// The settle scripts: heartbeats, completions, failures and releases
	// of claims the server already holds, alone and as a batch of them
	// only (it has no acquire function), flagged to run while the server
	// is over its maxmemory (allowOOM).
	settleLua            = allowOOM + ownedLua
	settleBatchLua       = allowOOM + recordLua + ownedBody + clockLua + batchTail(plainCall)
	bucketSettleLua      = allowOOM + bucketOwnedLua
	bucketSettleBatchLua = allowOOM + recordLua + bucketLua + ownedBody + clockLua + batchTail(bucketCall)
)

// allowOOM (Redis 7.0's script flags) lets a script write while the server
// is over its maxmemory. Under noeviction a full Redis refuses every write
// of a script without it — acquisitions, rightly (no new work starts
// without a claim), but also the completions of work already running,
// which would then run again once their leases end. So the settle scripts
// carry it and the acquire script does not: while Redis is full no new
// claim is taken, and what grows memory past the limit is bounded by the
// claims taken before (a result each). A server that refuses script flags
// (Redis before 7.0) gets the settle scripts without it (flagsRefused).
const allowOOM = "#!lua flags=allow-oom\n"

// clockLua reads the server's time once per script: now in ms, floor (the
// lowest new fence) in µs. (Each tonumber of a string is a strtod, about
// a thousand instructions in Redis: two, not four.)
const clockLua = `local t = rcall('TIME')
local sec, us = tonumber(t[1]), tonumber(t[2])
local now = sec * 1000 + math.floor(us / 1000)
local floor = sec * 1000000 + us
`

// The arguments of each function after the key, as read from ARGV (j is
// the index of the call's first argument less one).
const (
	acquireArgs = `ARGV[j + 1], tonumber(ARGV[j + 2]), tonumber(ARGV[j + 3]), tonumber(ARGV[j + 4]), ARGV[j + 5], now, floor`
	ownedArgs   = `ARGV[j + 1], ARGV[j + 2], tonumber(ARGV[j + 3]), ARGV[j + 4], ARGV[j + 5], now`
	// DeleteUpTo's one argument: the fence in decimal.
	deleteUpToArgs = `ARGV[j + 1]`
)

// callShape says where the i-th call of a script finds its keys and
// arguments: keys per call, the location its function gets, and j (the
// index of its first argument less one); in a batch, batchHead is run
// once before the calls, and batchLoc is the location, f the field read
// from the packed argument; libraryLoc is a lone call's location in a
// function library (functions.go), which runs batchHead once, at its load.
type callShape struct{ keys, loc, j, batchHead, batchLoc, libraryLoc string }

var (
	plainCall  = callShape{keys: "1", loc: "KEYS[i]", j: "(i - 1) * 5", batchLoc: "KEYS[i]", libraryLoc: "KEYS[i]"}
	bucketCall = callShape{keys: "2", loc: "{s = KEYS[2 * i - 1], b = KEYS[2 * i], f = ARGV[(i - 1) * 6 + 1]}", j: "(i - 1) * 6 + 1",
		batchHead: bucketBatchHead, batchLoc: "at(KEYS[2 * i - 1], KEYS[2 * i], f)",
		// A library makes the batch head once, for its lone calls too.
		libraryLoc: "at(KEYS[2 * i - 1], KEYS[2 * i], ARGV[(i - 1) * 6 + 1])"}
)

// bucketBatchHead makes one location table (bucket.lua) for all the calls
// of a batch (in a function library, for all its calls: functions.go),
// each call's written into it by at: a table made per call,
// and grown as its load adds fields, is allocations that Lua's GC then
// frees (0.5–2% of a coalesced lifecycle's instructions, docs/benchmarks.md).
// Its fields are reset to false, never nil: Lua may drop a field set to
// nil, and adding it again grows the table.
const bucketBatchHead = `local loc = {s = false, b = false, f = false, inb = false, str = false, room = false}
local function at(s, b, f)
  local k = loc
  k.s, k.b, k.f, k.inb, k.str, k.room = s, b, f, false, false, false
  return k
end
`

func oneTail(fn, args string, c callShape) string {
	return "local i = 1\nlocal j = " + c.j + "\nreturn " + fn + "(" + c.loc + ", " + args + ")\n"
}

// batchTail runs the calls packed in ARGV[1] (scriptCall.appendPacked) in
// order, each on its keys. A call's error is answered as a string (an
// acquisition answers an array, a settle a number), not as an error
// element: go-redis (v9.23) stops reading an array at an element it reads
// as a typed error — OOM, NOREPLICAS, LOADING and the like — fails the
// whole command with it and drops the rest of the answer, so one
// acquisition refused by a full server would fail every call of its batch,
// the duplicates answered from their records included (TestFullServer).
func batchTail(c callShape) string {
	return c.batchHead + `local out, packed, pos = {}, ARGV[1], 1
for i = 1, #KEYS / ` + c.keys + ` do
  local ok, v, f
  if sbyte(packed, pos) == 97 then
    local fp, lease, keep, maxa, nonce
    f, fp, lease, keep, maxa, nonce, pos = sunpack('>I4c0I4c0i8i8i8c10', packed, pos + 1)
    ok, v = pcall(acquire, ` + c.batchLoc + `, fp, lease, keep, maxa, nonce, now, floor)
  else
    local op, fence, ms, result, nonce
    f, op, fence, ms, result, nonce, pos = sunpack('>I4c0c1Bc0i8I4c0c10', packed, pos + 1)
    ok, v = pcall(owned, ` + c.batchLoc + `, op, fence, ms, result, nonce, now)
  end
  if not ok or type(v) == 'table' and v.err then
    v = type(v) == 'table' and v.err or tostring(v)
  end
  out[i] = v
end
return out
`
}

var (
	// A key per record's transitions.
	plainScripts = newPlainScripts()

	// The bucketed store's transitions.
	bucketScripts = newBucketScripts()

	deleteUpToScript       = redis.NewScript(deleteUpToLua)
	bucketDeleteUpToScript = redis.NewScript(bucketDeleteUpToLua)
	bucketDeleteScript     = redis.NewScript(bucketDeleteLua)
	// peekScript reads a record of a bucketed store, KEYS and ARGV[1] as a
	// bucket call's, wherever it is (bucket.lua's load): it answers the
	// record packed (as stored), or false if there is none or it is past its
	// expiry.
	peekScript = redis.NewScript(recordLua + bucketLua + clockLua + "local i = 1\nlocal r = load(" + bucketCall.loc + `)
if not r or r.e <= now then return false end
return packed(r)
`)
)

// transitionScripts are a store's scripts of acquisitions and settles:
// each alone, and a batch of them (coalesced calls); and the function
// library that stands in for them where the server has functions
// (functions.go).
type transitionScripts struct {
	acquire, owned, batch, settle, settleBatch *redis.Script
	lib                                        *library
}

func newPlainScripts() transitionScripts {
	t := transitionScripts{redis.NewScript(acquireLua), redis.NewScript(ownedLua), redis.NewScript(batchLua),
		redis.NewScript(settleLua), redis.NewScript(settleBatchLua), nil}
	t.lib = newLibrary(recordLua+acquireBody+ownedBody, plainCall, t)
	return t
}

// newBucketScripts returns the bucketed store's transition scripts.
func newBucketScripts() transitionScripts {
	t := transitionScripts{redis.NewScript(bucketAcquireLua), redis.NewScript(bucketOwnedLua), redis.NewScript(bucketBatchLua),
		redis.NewScript(bucketSettleLua), redis.NewScript(bucketSettleBatchLua), nil}
	t.lib = newLibrary(recordLua+bucketLua+acquireBody+ownedBody, bucketCall, t)
	return t
}

// AcquireScript and OwnedScript are the Lua sources, for operators and
// benchmarks (redis-benchmark can run them with EVALSHA).
func AcquireScript() string { return acquireLua }

// FunctionLibrary returns the Redis function library a store with a key
// per record calls its transitions in (Config.NoFunctions), for FUNCTION
// LOAD, and the names of its functions of an acquisition and of a settle
// (heartbeat, complete, fail, release; flagged allow-oom), which take the
// scripts' keys and arguments: for operators and benchmarks.
func FunctionLibrary() (source, acquire, settle string) {
	l := plainScripts.lib
	return l.source, l.fn[plainScripts.acquire], l.fn[plainScripts.settle]
}

// OwnedScript is the Lua source of heartbeat, complete, fail and release,
// with its flags line (allowOOM; a server before Redis 7.0 gets it without).
func OwnedScript() string { return settleLua }

// Config configures a Store.
type Config struct {
	// Client is the Redis client (redis.NewClient, NewClusterClient,
	// NewFailoverClient, NewUniversalClient, or NewRing: each key's record
	// lives on its shard, and WaitReplicas is refused there, WAIT naming no
	// key; the store keeps a Ring of its own with the same options whose
	// shards are never taken out, so that a shard that is down fails its
	// keys' calls closed instead of handing them to another shard — see
	// steadyRing). Required. Set its MaxRetries
	// to -1: go-redis resends a command whose connection broke before the
	// answer came back, so a script may run twice for one call. Each call
	// carries a nonce, and a rerun that finds its own claim or settle
	// returns it; but a claim that expired and was taken over before the
	// resend stays invisible to the caller (it delays the next owner by one
	// lease). The store URLs (storeurl) turn the resend off.
	Client redis.UniversalClient
	// Prefix starts every key name. Defaults to "idem:".
	Prefix string
	// Limits bound what the store accepts.
	Limits store.Limits
	// CloseClient makes Close close Client too. Defaults to false.
	CloseClient bool
	// WaitReplicas makes every transition wait until this many replicas
	// acknowledged its write (WAIT, sent in the same round trip as the
	// script, to the key's master). Redis replicates asynchronously: without
	// it, a write acknowledged by a master that dies a moment later can be
	// lost in the failover. A shortfall is ErrReplicationShortfall: the
	// write is on the master but may not survive it (an Acquire's claim is
	// not handed out; a settle reports the error). Defaults to 0: no wait.
	WaitReplicas int
	// WaitTimeout bounds each WAIT. Defaults to 1s.
	WaitTimeout time.Duration
	// NoCoalesce sends every call's script alone. By default, calls that
	// arrive while earlier ones are in flight share the next round trip,
	// acquisitions and settles alike: on one server one run of the batch
	// script, on a Cluster one pipeline of their scripts per node, each
	// call deciding its own key as it would alone. A call that finds the
	// store idle is sent at once. With WaitReplicas, each round trip ends
	// with its WAIT (on a Cluster, one pipeline per master).
	NoCoalesce bool
	// NoFunctions sends the scripts by EVALSHA only. By default a store
	// calls its transitions as Redis functions (FCALL of a library it loads
	// on each server that lacks it: FUNCTION LOAD), which costs the server
	// 6–24% fewer instructions a lifecycle, and falls back to EVALSHA where
	// the server has no functions (before Redis 7.0) or the ACL denies
	// them (NOPERM). Not on a Ring: it sends EVALSHA. The store's user
	// needs FUNCTION LOAD and FCALL (the @scripting category), as it needs
	// EVALSHA.
	NoFunctions bool
	// Buckets > 0 keeps records in hashes, many records per hash (its
	// bucket), instead of a key per record: a completed record with a
	// compact key and a 28-byte result then takes ~95 bytes of Redis memory
	// instead of 257 (measured at 1,000,000 records, ~61 a bucket; a key
	// costs ~150 bytes before its value). There are 16,384 ×
	// ceil(Buckets / 16,384) buckets (one or more per cluster slot); size
	// them to the records kept at once ÷ 64 for the least memory, or ÷ 12
	// for speed: a bucket's transition runs more Lua than a key's, and
	// Redis searches and rewrites a bucket whole, so it costs more the more
	// records its bucket holds (docs/store-redis.md has the figures). A
	// bucket stays one compact listpack while its values are no longer than
	// the server's hash-max-listpack-value: such a record is 64 bytes, the
	// default; a longer result (up to 92 bytes) needs it raised to 128,
	// else it turns its bucket into a hash table (162 bytes per record). A
	// record that does not fit (a key over 63 bytes, a result over 92
	// bytes, over 255 attempts, a retention over 49 days) keeps a key of
	// its own.
	//
	// Redis 7.0 cannot expire a field: an expired record is absent to every
	// call, a bucket deletes its expired records when new records arrive a
	// minute or more after its last sweep (one new record in eight looks; a
	// few hundred fields per call), and the bucket's own TTL stays past its
	// latest record's expiry, so an idle bucket goes whole (at most three
	// retentions after its last write).
	//
	// Records written before buckets were turned on are read and moved
	// into their bucket by their next transition. A process without
	// buckets does not see bucketed records, so turn buckets on in every
	// process sharing the prefix at once, and never change the number
	// (like Prefix, it says where a key's record is). Needs Redis 7.0; not
	// on a Ring, and not with a "{" or "}" in Prefix.
	Buckets int
}

// ErrReplicationShortfall: fewer replicas than Config.WaitReplicas
// acknowledged a write within Config.WaitTimeout. It wraps
// idem.ErrStoreUnavailable (the call failed closed), and the write may or
// may not survive a failover.
var ErrReplicationShortfall = fmt.Errorf("%w: fewer replicas than required acknowledged the write", store.ErrUnavailable)

// Store is a Redis store.Store.
//
// Its scripts are safe to run twice for one call: go-redis resends a
// command whose connection broke before the answer came back (MaxRetries),
// and each call carries a nonce by which the second run recognizes the
// first one's claim or settle.
type Store struct {
	c       redis.UniversalClient // given, or for a Ring ownRing
	given   redis.UniversalClient // Config.Client
	ownRing *redis.Ring           // see steadyRing
	prefix  string
	limits  store.Limits
	close   bool

	nonces  atomic.Uint32
	process [6]byte // random, per Store: nonces of two processes never meet

	waitReplicas int
	waitTimeout  time.Duration

	bucketsPerSlot int // 0: a key per record

	acquireScript, ownedScript, batchScript *redis.Script
	settleScript, settleBatchScript         *redis.Script                       // ownedScript and a batch of it, with allowOOM
	flagsRefused                            atomic.Bool                         // the server refused allowOOM: settles go without it
	lib                                     *library                            // the scripts as functions (functions.go); nil: EVALSHA only
	noFunctions                             atomic.Bool                         // the server has no functions, or denies them: EVALSHA
	calls                                   *coalesce.Group[scriptCall, answer] // nil: not coalesced
}

// nonce returns 10 bytes unique to one call of this Store: its random
// process id and a counter (unique for 2^32 calls, and it matters only
// between the runs of one call on one record).
func (s *Store) nonce() (b [10]byte) {
	copy(b[:], s.process[:])
	binary.BigEndian.PutUint32(b[6:], s.nonces.Add(1))
	return b
}

// New returns a store on cfg.Client.
func New(cfg Config) (*Store, error) {
	if cfg.Client == nil {
		return nil, errors.New("idem/redisstore: Config.Client is required")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "idem:"
	}
	if cfg.WaitReplicas < 0 || cfg.WaitTimeout < 0 {
		return nil, errors.New("idem/redisstore: Config.WaitReplicas and Config.WaitTimeout must not be negative")
	}
	if _, ring := cfg.Client.(*redis.Ring); ring && cfg.WaitReplicas > 0 {
		// WAIT names no key: a Ring would send it to one shard, not to the
		// shard that ran the script.
		return nil, errors.New("idem/redisstore: Config.WaitReplicas is not supported on a Ring (WAIT would reach one shard only)")
	}
	if cfg.Buckets < 0 {
		return nil, errors.New("idem/redisstore: Config.Buckets must not be negative")
	}
	if _, ring := cfg.Client.(*redis.Ring); ring && cfg.Buckets > 0 {
		// A record's own key and its bucket must be on one server: a
		// Ring places them by their names' hashes, apart.
		return nil, errors.New("idem/redisstore: Config.Buckets is not supported on a Ring")
	}
	if cfg.Buckets > 0 && strings.ContainsAny(cfg.Prefix, "{}") {
		return nil, errors.New("idem/redisstore: Config.Buckets needs a Prefix without { or } (the hash tag that places a bucket)")
	}
	if cfg.WaitTimeout == 0 {
		cfg.WaitTimeout = time.Second
	}
	client := cfg.Client
	var own *redis.Ring
	if ring, ok := cfg.Client.(*redis.Ring); ok {
		own = steadyRing(ring)
		client = own
	}
	s := &Store{c: client, given: cfg.Client, ownRing: own, prefix: cfg.Prefix, limits: cfg.Limits.WithDefaults(), close: cfg.CloseClient,
		waitReplicas: cfg.WaitReplicas, waitTimeout: cfg.WaitTimeout,
		bucketsPerSlot: (cfg.Buckets + clusterSlots - 1) / clusterSlots}
	if _, err := rand.Read(s.process[:]); err != nil {
		return nil, fmt.Errorf("idem/redisstore: %w", err)
	}
	scripts := plainScripts
	if s.bucketsPerSlot > 0 {
		scripts = bucketScripts
	}
	s.acquireScript, s.ownedScript, s.batchScript = scripts.acquire, scripts.owned, scripts.batch
	s.settleScript, s.settleBatchScript = scripts.settle, scripts.settleBatch
	if _, ring := client.(*redis.Ring); !ring && !cfg.NoFunctions {
		s.lib = scripts.lib
	}
	if !cfg.NoCoalesce {
		s.calls = s.newGroup()
	}
	return s, nil
}

// Client returns the client the store calls through: Config.Client, or for
// a Ring the store's own (see steadyRing), to which hooks (tracing,
// metrics) are added.
func (s *Store) Client() redis.UniversalClient { return s.c }

// KeyName returns the Redis key of a storage key: prefix + "{" + key + "}".
func (s *Store) KeyName(key string) string {
	return s.prefix + "{" + key + "}"
}

func (s *Store) storageKey(name string) string {
	return strings.TrimSuffix(strings.TrimPrefix(name, s.prefix+"{"), "}")
}

// wrap maps go-redis errors to idem's: context errors pass through; anything
// else (connection refused, timeouts, LOADING, CLUSTERDOWN …) is
// ErrStoreUnavailable.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if errors.Is(err, redis.ErrClosed) {
		return fmt.Errorf("%w: redis %s: %w", store.ErrClosed, op, err)
	}
	return fmt.Errorf("%w: redis %s: %w", store.ErrUnavailable, op, err)
}

func toInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}

func toStr(v any) string {
	s, _ := v.(string)
	return s
}

func msTime(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// run runs script on key: alone, or with Config.WaitReplicas followed by
// WAIT in one pipeline on the key's master (one round trip).
func (s *Store) run(ctx context.Context, script *redis.Script, keys []string, args ...any) *redis.Cmd {
	cmd := s.runOnce(ctx, script, keys, args...)
	if err := cmd.Err(); err != nil && ctx.Err() == nil {
		if cc, ok := s.c.(*redis.ClusterClient); ok && !isReply(err) {
			// A node did not answer: it may be dead and its replica promoted.
			// go-redis learns new slot owners from MOVED answers, which a
			// dead node never gives: ask the cluster again (the calls fail
			// closed until then).
			cc.ReloadState(ctx)
		}
	}
	return cmd
}

// Scan implements store.Scanner: SCAN on each node (each master of a
// cluster, each shard of a ring, in address order), continuing from the
// cursor, then one
// pipeline reading the page's records. The cursor names every node and its
// SCAN cursor; if a cluster's masters change during a walk (a failover),
// Scan says so and the walk starts again. So it does if a cluster's slots
// move during a walk (a reshard: a record moved from a master not walked
// yet to one walked would be missed), or are moving when a page starts or
// ends: the cursor keeps the slots each master serves (slotLayout).
func (s *Store) Scan(ctx context.Context, cursor string, limit int) ([]store.Record, string, error) {
	if limit <= 0 {
		limit = 1000
	}
	nodes := map[string]redis.Cmdable{}
	var addrs []string
	if _, single := s.c.(*redis.Client); single {
		nodes[""], addrs = s.c, []string{""} // "" in the cursor, as before Cluster and Ring support
	} else {
		var mu sync.Mutex
		err := s.forEachNode(ctx, func(ctx context.Context, c *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			nodes[c.Options().Addr] = c
			addrs = append(addrs, c.Options().Addr)
			return nil
		})
		if err != nil {
			return nil, "", wrap("scan", err)
		}
		sort.Strings(addrs)
	}
	// The cursor: "addr=cursor" per node, ";"-separated; "-" marks a node
	// whose scan is done; on a cluster, "slots=" the layout of its slots.
	layout, err := s.slotLayout(ctx, nodes)
	if err != nil {
		return nil, "", wrap("scan", err)
	}
	cursors := map[string]string{}
	if cursor != "" {
		for _, part := range strings.Split(cursor, ";") {
			addr, c, ok := strings.Cut(part, "=")
			if !ok {
				return nil, "", fmt.Errorf("idem/redisstore: scan: malformed cursor %q", cursor)
			}
			if addr == "slots" {
				if c != layout {
					return nil, "", errSlotsMoved
				}
				continue
			}
			if _, known := nodes[addr]; !known {
				return nil, "", fmt.Errorf("%w: idem/redisstore: scan: node %s is no longer a master (a failover during the walk): start again", store.ErrUnavailable, addr)
			}
			cursors[addr] = c
		}
		if len(cursors) != len(addrs) {
			return nil, "", fmt.Errorf("%w: idem/redisstore: scan: the cluster's masters changed during the walk: start again", store.ErrUnavailable)
		}
	}
	pattern := escapeGlob(s.prefix) + "{*"
	var keys []string
	var buckets []store.Record // the records of the buckets met
	for _, addr := range addrs {
		c := cursors[addr]
		for c != "-" && len(keys)+len(buckets) < limit {
			pos, _ := strconv.ParseUint(c, 10, 64)
			found, next, err := nodes[addr].Scan(ctx, pos, pattern, int64(limit)).Result()
			if err != nil {
				return nil, "", wrap("scan", err)
			}
			var names []string // the buckets met
			for _, name := range found {
				if s.bucketsPerSlot > 0 && s.isBucket(name) {
					names = append(names, name)
				} else {
					keys = append(keys, s.storageKey(name))
				}
			}
			if len(names) > 0 {
				recs, err := s.bucketRecords(ctx, nodes[addr], names)
				if err != nil {
					return nil, "", wrap("scan", err)
				}
				buckets = append(buckets, recs...)
			}
			c = strconv.FormatUint(next, 10)
			if next == 0 {
				c = "-"
			}
		}
		cursors[addr] = c
	}
	// Slots that moved while this page was walked may have taken records
	// from a master not walked yet to one walked.
	if after, err := s.slotLayout(ctx, nodes); err != nil || after != layout {
		if err == nil {
			err = errSlotsMoved
		}
		return nil, "", wrap("scan", err)
	}
	next := make([]string, 0, len(addrs)+1)
	done := true
	for _, addr := range addrs {
		c := cursors[addr]
		if c == "" {
			c = "0"
		}
		done = done && c == "-"
		next = append(next, addr+"="+c)
	}
	if layout != "" {
		next = append(next, "slots="+layout)
	}
	recs, err := s.read(ctx, keys)
	recs = append(recs, buckets...)
	if err != nil || done {
		return recs, "", err
	}
	return recs, strings.Join(next, ";"), nil
}

// errSlotsMoved: a cluster's slots moved during a Scan walk.
var errSlotsMoved = fmt.Errorf("%w: idem/redisstore: scan: the cluster's slots moved between masters during the walk (a reshard): start again", store.ErrUnavailable)

// slotLayout returns the slots each master of a cluster serves, as one
// string ("" for one server or a ring), read from each master's own
// line of CLUSTER NODES (concurrently: one round trip). A slot being
// moved (a reshard under way: its keys are on their way from one master
// to the other) is an error: a walk cannot tell where they are.
func (s *Store) slotLayout(ctx context.Context, nodes map[string]redis.Cmdable) (string, error) {
	if _, ok := s.c.(*redis.ClusterClient); !ok {
		return "", nil
	}
	var mu sync.Mutex
	var parts []string
	var wg sync.WaitGroup
	var firstErr error
	for addr, node := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			part, err := ownSlots(ctx, node)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			parts = append(parts, addr+" "+part)
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return "", firstErr
	}
	sort.Strings(parts)
	h := fnv.New64a()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{'\n'})
	}
	return strconv.FormatUint(h.Sum64(), 36), nil
}

// ownSlots returns the slots the node serves, as its CLUSTER NODES line
// says (ranges, space-separated), or an error if one of them is being
// moved to or from it ("[slot->-id]", "[slot-<-id]").
func ownSlots(ctx context.Context, node redis.Cmdable) (string, error) {
	out, err := node.ClusterNodes(ctx).Result()
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 8 || !strings.Contains(f[2], "myself") {
			continue
		}
		for _, slot := range f[8:] {
			if strings.HasPrefix(slot, "[") {
				return "", fmt.Errorf("%w: idem/redisstore: scan: slot %s is moving between masters (a reshard): walk again once it is done", store.ErrUnavailable, slot)
			}
		}
		return strings.Join(f[8:], " "), nil
	}
	return "", errors.New("idem/redisstore: CLUSTER NODES names no node as myself")
}

// bucketRecords reads the live records of buckets on node: one pipeline
// of their HGETALLs, with the server's TIME.
func (s *Store) bucketRecords(ctx context.Context, node redis.Cmdable, buckets []string) ([]store.Record, error) {
	pipe := node.Pipeline()
	now := pipe.Time(ctx)
	all := make([]*redis.MapStringStringCmd, len(buckets))
	for i, b := range buckets {
		all[i] = pipe.HGetAll(ctx, b)
	}
	_, _ = pipe.Exec(ctx)
	if err := now.Err(); err != nil {
		return nil, err
	}
	var recs []store.Record
	for _, cmd := range all {
		if err := cmd.Err(); err != nil {
			return nil, err
		}
		for f, v := range cmd.Val() {
			key := keypack.Key(f)
			if key == "" {
				continue // the time of the next sweep (bucket.lua)
			}
			if rec, ok := decodeRecord(key, v); ok && rec.ExpiresAt.After(now.Val()) {
				recs = append(recs, rec)
			}
		}
	}
	return recs, nil
}

// decodeGet reads the answer of a GET of key: found is false when the key
// is gone.
func (s *Store) decodeGet(key, v string, err error) (rec store.Record, found bool, _ error) {
	switch {
	case errors.Is(err, redis.Nil):
		return store.Record{}, false, nil
	case err != nil:
		return store.Record{}, false, err
	}
	if rec, found = decodeRecord(key, v); !found {
		return store.Record{}, false, fmt.Errorf("%s is not an idem record", s.KeyName(key)) // wrap makes it ErrStoreUnavailable
	}
	return rec, true, nil
}

// read gets the records of keys in one pipeline, skipping those gone (a
// record that expired since a scan).
func (s *Store) read(ctx context.Context, keys []string) ([]store.Record, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	if s.bucketsPerSlot > 0 {
		return s.peekAll(ctx, keys)
	}
	gets := make([]*redis.StringCmd, len(keys))
	pipe := s.c.Pipeline()
	for i, k := range keys {
		gets[i] = pipe.Get(ctx, s.KeyName(k))
	}
	_, _ = pipe.Exec(ctx)
	recs := make([]store.Record, len(keys)) // Key "" where none was found
	for i, k := range keys {
		rec, found, err := s.decodeGet(k, gets[i].Val(), gets[i].Err())
		switch {
		case err != nil:
			return nil, wrap("read", err)
		case found:
			recs[i] = rec
		}
	}
	out := recs[:0]
	for _, rec := range recs {
		if rec.Key != "" {
			out = append(out, rec)
		}
	}
	return out, nil
}

// peekAll reads the records of keys of a bucketed store in one pipeline,
// skipping those gone.
func (s *Store) peekAll(ctx context.Context, keys []string) ([]store.Record, error) {
	cmds := make([]*redis.Cmd, len(keys))
	for try := 0; ; try++ {
		pipe := s.c.Pipeline()
		for i, k := range keys {
			names, field := s.locate(k)
			if try == 0 {
				cmds[i] = peekScript.EvalSha(ctx, pipe, names, field)
			} else {
				cmds[i] = peekScript.Eval(ctx, pipe, names, field) // with its source
			}
		}
		_, _ = pipe.Exec(ctx)
		if try > 0 || !slices.ContainsFunc(cmds, func(c *redis.Cmd) bool {
			return c.Err() != nil && strings.HasPrefix(c.Err().Error(), "NOSCRIPT")
		}) {
			break
		}
	}
	out := make([]store.Record, 0, len(keys))
	for i, k := range keys {
		rec, found, err := s.decodePeek(k, cmds[i])
		if err != nil {
			return nil, wrap("read", err)
		}
		if found {
			out = append(out, rec)
		}
	}
	return out, nil
}

// isReply: err is an answer of the server (a script error, NOSCRIPT…), not
// a failure to reach it.
func isReply(err error) bool {
	_, ok := errors.AsType[redis.Error](err)
	return ok
}

func (s *Store) runOnce(ctx context.Context, script *redis.Script, keys []string, args ...any) *redis.Cmd {
	if s.waitReplicas == 0 {
		return s.runScript(ctx, s.c, script, keys, args)
	}
	var node redis.Cmdable = s.c
	if cc, ok := s.c.(*redis.ClusterClient); ok {
		m, err := cc.MasterForKey(ctx, keys[0])
		if err != nil {
			cmd := redis.NewCmd(ctx)
			cmd.SetErr(err)
			return cmd
		}
		node = m
	}
	out := []*redis.Cmd{nil}
	s.sendPipeline(ctx, node, func(int) (*redis.Script, []string, []any) { return script, keys, args }, []int{0}, out, false, 0)
	return out[0]
}

// locate returns the keys of key's record as a script takes them: its own
// key, and with buckets its bucket, then its field (the first argument).
func (s *Store) locate(key string) (keys []string, field string) {
	if s.bucketsPerSlot == 0 {
		return []string{s.KeyName(key)}, ""
	}
	name, bucket, field := s.locateInBucket(key)
	return []string{name, bucket}, field
}

// transition runs c (a transition of key's record, its arguments set) on
// the record, through the store's group. A settle script the server
// refused to load for its flag (it did not run) is sent again without it,
// as every settle of this store is from then on.
func (s *Store) transition(ctx context.Context, key string, c scriptCall) answer {
	c.keys, c.field = s.locate(key)
	c.nonce = s.nonce()
	cmd := s.call(ctx, c)
	if c.one == s.settleScript && flagsRefused(cmd.Err()) {
		s.flagsRefused.Store(true)
		c.one = s.ownedScript
		cmd = s.call(ctx, c)
	}
	return cmd
}

// settle is the script of heartbeats and settles: the one with allowOOM,
// unless the server refused it.
func (s *Store) settle() *redis.Script {
	if s.flagsRefused.Load() {
		return s.ownedScript
	}
	return s.settleScript
}

// flagsRefused: err is a server's refusal to load a script for its flags
// line — Redis before 7.0 does not know it ("unexpected symbol near '#'"),
// a later one names a flag it does not know ("… shebang …").
func flagsRefused(err error) bool {
	if err == nil || !isReply(err) {
		return false
	}
	msg := err.Error()
	return strings.Contains(msg, "near '#'") || strings.Contains(msg, "shebang")
}

// Acquire implements store.Store with one script.
func (s *Store) Acquire(ctx context.Context, req store.AcquireRequest) (store.Acquisition, error) {
	if err := s.limits.CheckAcquire(req); err != nil {
		return store.Acquisition{}, err
	}
	if err := ctx.Err(); err != nil {
		return store.Acquisition{}, err
	}
	v, err := s.transition(ctx, req.Key, scriptCall{one: s.acquireScript, acquire: true, fp: keypack.Fingerprint(req.Fingerprint),
		lease: req.Lease.Milliseconds(), keep: max(req.Retention, req.Lease).Milliseconds(), maxAttempts: req.MaxAttempts}).Slice()
	if err != nil {
		return store.Acquisition{}, wrap("acquire", err)
	}
	var rec store.Record
	ok := len(v) == 2
	if ok {
		rec, ok = decodeRecord(req.Key, toStr(v[1]))
	}
	if !ok {
		return store.Acquisition{}, fmt.Errorf("%w: redis acquire: unexpected reply %q", store.ErrUnavailable, v)
	}
	a := store.Acquisition{Outcome: store.Outcome(toInt(v[0])), Record: rec}
	if a.Outcome.Owns() {
		a.Fence = rec.Fence
	}
	return a, nil
}

func (s *Store) owned(ctx context.Context, op, code string, key string, fence uint64, ms int64, result []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	n, err := s.transition(ctx, key, scriptCall{one: s.settle(), op: code, fence: fence, ms: ms, result: result}).Int()
	if err != nil {
		return wrap(op, err)
	}
	if n == 0 {
		return store.ErrStaleFence
	}
	return nil
}

// Heartbeat implements store.Store.
func (s *Store) Heartbeat(ctx context.Context, key string, fence uint64, lease time.Duration) error {
	if err := s.limits.CheckHeartbeat(key, lease); err != nil {
		return err
	}
	return s.owned(ctx, "heartbeat", "h", key, fence, lease.Milliseconds(), nil)
}

// Complete implements store.Store.
func (s *Store) Complete(ctx context.Context, key string, fence uint64, result []byte, retention time.Duration) error {
	if err := s.limits.CheckSettle(key, result, retention); err != nil {
		return err
	}
	return s.owned(ctx, "complete", "c", key, fence, retention.Milliseconds(), result)
}

// Fail implements store.Store.
func (s *Store) Fail(ctx context.Context, key string, fence uint64, result []byte, retention time.Duration) error {
	if err := s.limits.CheckSettle(key, result, retention); err != nil {
		return err
	}
	return s.owned(ctx, "fail", "f", key, fence, retention.Milliseconds(), result)
}

// Release implements store.Store.
func (s *Store) Release(ctx context.Context, key string, fence uint64) error {
	if err := store.ValidateKey(key); err != nil {
		return err
	}
	return s.owned(ctx, "release", "x", key, fence, 0, nil)
}

// Unclaim implements store.Unclaimer with one script.
func (s *Store) Unclaim(ctx context.Context, key string, fence uint64) error {
	if err := store.ValidateKey(key); err != nil {
		return err
	}
	return s.owned(ctx, "unclaim", "u", key, fence, 0, nil)
}

// PoisonClaim implements store.Unclaimer with one script.
func (s *Store) PoisonClaim(ctx context.Context, key string, fence uint64) error {
	if err := store.ValidateKey(key); err != nil {
		return err
	}
	return s.owned(ctx, "poison claim", "p", key, fence, 0, nil)
}

// Get implements store.Store (one GET; an expired record is gone by TTL).
func (s *Store) Get(ctx context.Context, key string) (store.Record, error) {
	if err := store.ValidateKey(key); err != nil {
		return store.Record{}, err
	}
	if err := ctx.Err(); err != nil {
		return store.Record{}, err
	}
	if s.bucketsPerSlot > 0 {
		keys, field := s.locate(key)
		rec, found, err := s.decodePeek(key, peekScript.Run(ctx, s.c, keys, field))
		if err != nil {
			return store.Record{}, wrap("get", err)
		}
		if !found {
			return store.Record{}, store.ErrNotFound
		}
		return rec, nil
	}
	v, err := s.c.Get(ctx, s.KeyName(key)).Result()
	rec, found, err := s.decodeGet(key, v, err)
	if err != nil {
		return store.Record{}, wrap("get", err)
	}
	if !found {
		return store.Record{}, store.ErrNotFound
	}
	return rec, nil
}

// Delete implements store.Store.
func (s *Store) Delete(ctx context.Context, key string) error {
	if s.bucketsPerSlot == 0 {
		return wrap("delete", s.c.Del(ctx, s.KeyName(key)).Err())
	}
	keys, field := s.locate(key)
	return wrap("delete", s.run(ctx, bucketDeleteScript, keys, field).Err())
}

// DeleteUpTo implements store.FencedDeleter: one script reads the record
// (its own key or its bucket's field) and removes it if its fence is at
// most fence.
func (s *Store) DeleteUpTo(ctx context.Context, key string, fence uint64) error {
	keys, field := s.locate(key)
	script, args := deleteUpToScript, []any{strconv.FormatUint(fence, 10)}
	if s.bucketsPerSlot > 0 {
		script, args = bucketDeleteUpToScript, []any{field, args[0]}
	}
	return wrap("delete", s.run(ctx, script, keys, args...).Err())
}

// decodePeek reads the answer of peekScript for key.
func (s *Store) decodePeek(key string, cmd *redis.Cmd) (rec store.Record, found bool, _ error) {
	v, err := cmd.Result()
	switch {
	case errors.Is(err, redis.Nil):
		return store.Record{}, false, nil
	case err != nil:
		return store.Record{}, false, err
	}
	switch v := v.(type) {
	case string:
		if rec, found = decodeRecord(key, v); !found {
			return store.Record{}, false, fmt.Errorf("%s is not an idem record", s.KeyName(key))
		}
		return rec, true, nil
	}
	return store.Record{}, false, fmt.Errorf("%s: unexpected answer %v", s.KeyName(key), v)
}

// Sweep implements store.Store. Redis expires every record by its TTL (with
// Config.Buckets, each bucket deletes its expired records itself and
// expires after its last one), so there is nothing to sweep: it returns 0.
func (s *Store) Sweep(ctx context.Context, limit int) (int, error) {
	return 0, ctx.Err()
}

// List implements store.Lister with SCAN over the prefix (on every master of
// a Cluster). It reads the whole key space of the prefix: for operators.
func (s *Store) List(ctx context.Context, after string, limit int) ([]store.Record, error) {
	// Redis keeps no order: every page scans the prefix (on a cluster or a
	// ring, each master or shard separately) and keeps the smallest
	// keys after the cursor; the records are then read in one pipeline.
	pattern := escapeGlob(s.prefix) + "{*"
	scan := func(ctx context.Context, c redis.Cmdable) ([]string, error) {
		var keys []string
		var buckets []string
		it := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for it.Next(ctx) {
			if s.bucketsPerSlot > 0 && s.isBucket(it.Val()) {
				buckets = append(buckets, it.Val())
			} else if k := s.storageKey(it.Val()); k > after {
				keys = append(keys, k)
			}
		}
		if err := it.Err(); err != nil {
			return nil, err
		}
		for len(buckets) > 0 { // their fields, a pipeline of 1,000 buckets at a time
			batch := buckets[:min(len(buckets), 1000)]
			buckets = buckets[len(batch):]
			cmds := make([]*redis.StringSliceCmd, len(batch))
			pipe := c.Pipeline()
			for i, b := range batch {
				cmds[i] = pipe.HKeys(ctx, b)
			}
			_, _ = pipe.Exec(ctx) // each command's error below
			for _, cmd := range cmds {
				if err := cmd.Err(); err != nil {
					return nil, err
				}
				for _, f := range cmd.Val() {
					if k := keypack.Key(f); k > after {
						keys = append(keys, k)
					}
				}
			}
		}
		return keys, nil
	}
	var keys []string
	var err error
	var mu sync.Mutex
	err = s.forEachNode(ctx, func(ctx context.Context, c *redis.Client) error {
		found, err := scan(ctx, c)
		mu.Lock()
		keys = append(keys, found...)
		mu.Unlock()
		return err
	})
	if err != nil {
		return nil, wrap("list", err)
	}
	sort.Strings(keys)
	keys = slices.Compact(keys) // a key met twice while a slot migrates
	if limit > 0 && len(keys) > limit {
		keys = keys[:limit]
	}
	out, err := s.read(ctx, keys)
	if err != nil {
		return nil, err
	}
	if len(out) == 0 && limit > 0 && len(keys) == limit {
		return s.List(ctx, keys[len(keys)-1], limit) // the whole page expired meanwhile: the next one
	}
	return out, nil
}

// forEachNode calls fn, concurrently, with a client of every node that
// holds records: each master of a Cluster, each shard of a Ring, or the one
// server.
func (s *Store) forEachNode(ctx context.Context, fn func(ctx context.Context, c *redis.Client) error) error {
	switch c := s.c.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, fn)
	case *redis.Ring:
		return c.ForEachShard(ctx, fn)
	case *redis.Client:
		return fn(ctx, c)
	}
	return fmt.Errorf("idem/redisstore: cannot list the nodes of a %T", s.c)
}

func escapeGlob(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`)
	return r.Replace(s)
}

// Close closes the client if Config.CloseClient was set, once the shared
// round trips still in flight have ended (a batch whose callers all gave up
// runs to its end; closing the client under it would break its connection).
func (s *Store) Close() error {
	if !s.close && s.ownRing == nil {
		return nil
	}
	if s.calls != nil {
		s.calls.Wait()
	}
	var err error
	if s.ownRing != nil {
		err = s.ownRing.Close()
	}
	if s.close {
		err = errors.Join(err, s.given.Close())
	}
	return err
}

// steadyRing returns a Ring of the store's own, made with ring's options
// but whose shards are never taken out. A go-redis Ring takes a shard that
// misses three heartbeats (1.5 s by default) out of its hash and sends that
// shard's keys to the others, where a duplicate would find no record and
// run again (and, once the shard is back, the records written meanwhile
// would be hidden again). Through the store's Ring, calls on a shard that
// is down fail closed, as calls on a Cluster's dead master do, and a Scan
// walk fails rather than skip it.
func steadyRing(ring *redis.Ring) *redis.Ring {
	o := *ring.Options()
	o.HeartbeatFn = func(context.Context, *redis.Client) bool { return true }
	return redis.NewRing(&o)
}
