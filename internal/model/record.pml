/*
 * The record protocol: workers claiming keys in a store under leases,
 * heartbeating, settling or crashing, while a clock ends leases and
 * retentions and records are forgotten and swept. See README.md.
 *
 * Bounds (set with -D): N workers, K keys, C claims in all (the fences a
 * run hands out). Mutations (-D, one at a time) each break one rule the
 * code keeps; each must yield a counterexample:
 *   MUT_SETTLE_IGNORES_FENCE  a settle not conditioned on the fence
 *   MUT_SETTLE_ANY_STATE      a settle not conditioned on the record being
 *                             in flight
 *   MUT_NO_FENCE_FLOOR        a new generation's fence counted from zero
 *                             once the row is gone (no fence floor)
 *   MUT_HEARTBEAT_ANY_STATE   a heartbeat that revives a settled record
 *   MUT_REPLAY_UNSETTLED      a replay of a record in flight
 *   MUT_LEASE_NEVER_ENDS      a clock that never ends a lease
 */

#ifndef N
#define N 2
#endif
#ifndef K
#define K 1
#endif
#ifndef C
#define C 4
#endif
#define HEARTBEATS 1 /* heartbeats a worker sends per claim, at most */

/* store.State */
#define INFLIGHT  1
#define COMPLETED 2
#define FAILED    3
#define RELEASED  5

/* The store's records, one per key (store.Record), as every backend keeps
 * them: each field is what its script or statement reads and writes.
 *   ex    the row exists (Delete/Forget and Sweep remove it)
 *   st    State
 *   fe    Fence
 *   live  the lease has not ended (lease_until > now)
 *   ret   the retention has not ended (expires_at > now): a record past it
 *         is not there for any call, though its row may be
 *   val   the settled result: the fence of the claim that settled it
 */
bool ex[K];
byte st[K];
byte fe[K];
bool live[K];
bool ret[K];
byte val[K];

/* floor[k] is store.FenceFloor as the stores apply it: a value above every
 * fence handed out for the key, whatever became of its row (a time-based
 * floor: the clock's microseconds at the claim, above every earlier fence;
 * pgstore's and sqlitestore's floorAtExecution, redisstore's TIME in its
 * scripts, dynamostore's FenceSequence). */
byte floor[K];

byte claims; /* fences handed out so far, across keys */

/* Ghost state, for the properties. */
int settles[K];  /* bit f: a settle (complete, fail, release) under fence f succeeded */
int values[K];   /* bit f: a result settled under fence f */
byte hk[N];      /* the key worker w holds a claim of, K for none */
byte hf[N];      /* the fence of that claim */
byte top[K];     /* the highest fence handed out for the key */
bool completed[K];    /* the record's generation was completed */

inline nextfence(k, f) {
#ifdef MUT_NO_FENCE_FLOOR
	if
	:: ex[k] -> f = fe[k] + 1
	:: else -> f = 1
	fi;
#else
	if
	:: ex[k] && fe[k] >= floor[k] -> f = fe[k] + 1
	:: else -> f = floor[k] + 1
	fi;
#endif
	/* a fence is never handed out twice for a key, and grows across
	 * delete, sweep and expiry */
	assert(f > top[k]);
	top[k] = f;
	if
	:: f > floor[k] -> floor[k] = f
	:: else
	fi;
	claims++
}

/* Acquire: one atomic step, as each backend's acquire statement or script.
 * res: 1 acquired (new generation or taken over), 2 in progress, 3 replayed. */
inline acquire(w, k, res) {
	atomic {
		if
		:: !ex[k] || !ret[k] ->  /* absent, or past its retention: a new generation */
			nextfence(k, hf[w]);
			ex[k] = true; st[k] = INFLIGHT; fe[k] = hf[w]; live[k] = true; ret[k] = true; val[k] = 0; completed[k] = false;
			hk[w] = k; res = 1
		:: else ->
			if
			:: st[k] == INFLIGHT && live[k] -> res = 2
#ifdef MUT_REPLAY_UNSETTLED
			:: st[k] == INFLIGHT && live[k] -> res = 3;
				/* a replay returns only a value that was settled */
				assert(val[k] != 0 && (values[k] & (1 << val[k])))
#endif
			:: st[k] == COMPLETED || st[k] == FAILED -> res = 3;
				/* a replay returns only a value that was settled */
				assert(val[k] != 0 && (values[k] & (1 << val[k])))
			:: (st[k] == INFLIGHT && !live[k]) || st[k] == RELEASED ->  /* taken over */
				/* work completed within its retention never runs again */
				assert(!completed[k]);
				nextfence(k, hf[w]);
				st[k] = INFLIGHT; fe[k] = hf[w]; live[k] = true;
				hk[w] = k; res = 1
			fi
		fi
	}
}

/* owned: the condition of every write by the holder of fence f (the fenced
 * writes: heartbeat, complete, fail, release). */
#ifdef MUT_SETTLE_IGNORES_FENCE
#define owned(k, f) (ex[k] && ret[k] && st[k] == INFLIGHT)
#elif defined(MUT_SETTLE_ANY_STATE)
#define owned(k, f) (ex[k] && ret[k] && fe[k] == f)
#else
#define owned(k, f) (ex[k] && ret[k] && st[k] == INFLIGHT && fe[k] == f)
#endif

/* settle: Complete (COMPLETED) or Release (RELEASED) by worker w under
 * its fence; ok tells whether the store took it. Fail is Complete with
 * another state: the same write, the same condition, replayed alike — the
 * model takes Complete for both. */
inline settle(w, to, ok) {
	atomic {
		if
		:: owned(hk[w], hf[w]) ->
			/* at most one settle succeeds per claim */
			assert(!(settles[hk[w]] & (1 << hf[w])));
			settles[hk[w]] = settles[hk[w]] | (1 << hf[w]);
			/* only by the holder of the current fence: no worker holds the
			 * key under a later claim */
			o = 0;
			do
			:: o < N -> assert(o == w || hk[o] != hk[w] || hf[o] <= hf[w]); o++
			:: else -> break
			od;
			st[hk[w]] = to; live[hk[w]] = false;
			if
			:: to != RELEASED -> val[hk[w]] = hf[w]; values[hk[w]] = values[hk[w]] | (1 << hf[w]); completed[hk[w]] = true
			:: else
			fi;
			ok = true
		:: else -> ok = false
		fi
	}
}

inline heartbeat(w, ok) {
	atomic {
#ifdef MUT_HEARTBEAT_ANY_STATE
		if
		:: ex[hk[w]] && fe[hk[w]] == hf[w] -> st[hk[w]] = INFLIGHT; live[hk[w]] = true; ret[hk[w]] = true; ok = true
		:: else -> ok = false
		fi
#else
		if
		:: owned(hk[w], hf[w]) -> live[hk[w]] = true; ok = true
		:: else -> ok = false
		fi
#endif
	}
}

proctype worker(byte w) {
	byte k, res, beats, o;
	bool ok;
idle:
	atomic { hk[w] = K; hf[w] = 0; k = 0; res = 0; beats = 0; o = 0; ok = false };
	do
	:: claims < C ->
		/* pick a key */
		k = 0;
		do
		:: k < K - 1 -> k++
		:: break
		od;
		acquire(w, k, res);
		if
		:: res == 1 -> goto holding
		:: else
		fi
	:: claims >= C -> goto done
	od;
holding:
	res = 0;
	do
	:: beats < HEARTBEATS -> beats++; heartbeat(w, ok);
		if
		:: !ok -> goto idle  /* the claim is lost: the Guard stops the work */
		:: else
		fi
	:: skip; settle(w, COMPLETED, ok); res = COMPLETED; goto settled
	:: skip; settle(w, RELEASED, ok); res = RELEASED; goto settled
	:: goto idle  /* hold (an ambiguous outcome: the claim is left to its lease), or a crash */
	od;
settled:
	if
	:: heartbeat(w, ok)         /* a heartbeat sent before the settle, reaching the store after it */
	:: skip; settle(w, res, ok)  /* the settle sent again: its answer was lost */
	:: skip
	fi;
	goto idle;
done:
	hk[w] = K
}

/* The clock of key k ends its record's lease and retention; the retention
 * of a record never ends before its lease (expires_at >= lease_until). One
 * process per key, so that weak fairness reaches every key. */
proctype clock(byte k) {
	do
	:: atomic {
			if
#ifndef MUT_LEASE_NEVER_ENDS
			:: ex[k] && st[k] == INFLIGHT && live[k] -> live[k] = false
#endif
			:: ex[k] && ret[k] && !(st[k] == INFLIGHT && live[k]) -> ret[k] = false
			:: else -> skip
			fi
		}
	od
}

/* Forget (Delete) removes a record at any time (an operator's act, left
 * out of the liveness check: -DNO_FORGET); the sweeper removes those past
 * their retention. */
proctype janitor() {
	byte k;
	do
	:: k = 0;
		do
		:: k < K - 1 -> k++
		:: break
		od;
		atomic {
			if
#ifndef NO_FORGET
			:: ex[k] -> ex[k] = false  /* Forget; a Sweep (past retention) is one of these */
#endif
			:: ex[k] && !ret[k] -> ex[k] = false  /* Sweep */
			:: else -> skip
			fi
		}
	od
}

init {
	byte i;
	atomic {
		i = 0;
		do
		:: i < K -> ex[i] = false; floor[i] = 0; i++
		:: else -> break
		od;
		i = 0;
		do
		:: i < N -> hk[i] = K; run worker(i); i++
		:: else -> break
		od;
		i = 0;
		do
		:: i < K -> run clock(i); i++
		:: else -> break
		od;
		run janitor()
	}
}

/* Liveness: no key stays claimed for good — a record in flight under a
 * live lease eventually is not (its lease ends, or it is settled), so every
 * key is eventually claimable. Checked with weak fairness. */
#if K == 1
ltl claimable { [] <> !(ex[0] && st[0] == INFLIGHT && live[0]) }
#else
ltl claimable { [] <> !(ex[0] && st[0] == INFLIGHT && live[0]) && [] <> !(ex[1] && st[1] == INFLIGHT && live[1]) }
#endif
