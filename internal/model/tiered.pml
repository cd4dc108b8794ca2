/*
 * The tiered store (store/tieredstore): a hot tier taking the claims in
 * front of a cold tier keeping settled records, one key, N workers. The
 * hot tier may lose writes (a restart that loses everything, a failover to
 * a replica that lags), the cold tier may be unreachable for a while, and
 * an archive may be applied after its caller was told it failed. See
 * README.md.
 *
 * Bounds (set with -D): N workers, C claims in all (the fences a run
 * hands out), LOSS: the hot tier loses its writes once (a restart or a
 * failover to a lagging replica). Mutations (-D, one at a time) each break
 * one rule the code keeps; each must yield a counterexample:
 *   MUT_NO_COLD_READ          a hot claim handed out without asking the
 *                             cold tier whether the key is settled there
 *   MUT_COLD_FAILS_OPEN       a cold tier that cannot answer taken as
 *                             holding nothing
 *   MUT_HOT_BEFORE_ARCHIVE    Complete settles the hot tier first and
 *                             archives after
 *   MUT_NO_LEASE_EXTENSION    Complete archives without first extending
 *                             the owner's lease past the archive
 *   MUT_NO_AWAIT_ARCHIVES     the claim's cold read does not wait for the
 *                             archives under way
 *   MUT_NO_CLAIM_RECHECK      a claim handed out without the fenced
 *                             heartbeat after the cold read
 *   MUT_NO_FENCE_FLOOR        a new generation's fence counted from zero
 *                             once the hot tier lost the record
 *   MUT_ARCHIVE_FAILS_OPEN    an archive the cold tier refused taken as
 *                             done: the hot settle follows
 *   MUT_TOMBSTONE_AS_SETTLED  an acquisition takes a tombstone in the
 *                             cold tier for a settled record
 *   MUT_TAKEOVER_LIVE_LEASE   the hot tier's acquire takes over a claim
 *                             whose lease has not ended
 *
 * With FAILOVER and WAITED, the hot tier is redisstore with WaitReplicas:
 * a write is acknowledged only once the replica has it (WAIT in the same
 * round trip), and a write the replica did not acknowledge in time is
 * answered with an error (ErrReplicationShortfall) while it stands on the
 * primary, where the failover may or may not lose it. A failover then
 * loses no acknowledged write, and every property holds, mutual exclusion
 * included. MUT_NO_WAIT (with WAITED) acknowledges writes before the
 * replica has them.
 */

#ifndef N
#define N 2
#endif
#ifndef C
#define C 3
#endif
#define HEARTBEATS 1 /* heartbeats a worker sends per claim, at most */
#define OUTAGES 1    /* times the cold tier becomes unreachable */
#define LATE 1       /* archives applied after their caller gave up */

/* store.State */
#define INFLIGHT  1
#define COMPLETED 2
#define RELEASED  5

/* The hot tier's record (store.Record in redisstore or memstore):
 *   hex   the record exists
 *   hst   State, hfe Fence
 *   hlive the lease has not ended
 *   hret  the retention has not ended (a settled copy's is HotRetention)
 *   hval  the settled result: the fence of the claim whose work made it
 * The replica's copy (r*) is what a failover brings back. */
bool hex, hlive, hret;
byte hst, hfe, hval;
bool rex, rlive, rret;
byte rst, rfe, rval;

/* The cold tier's record (pgstore, sqlitestore, memstore as an Archiver):
 * settled (COMPLETED) or a tombstone (RELEASED) of fence cfe. */
bool cex, cret;
byte cst, cfe, cval;

/* An archive under way (pgstore's ArchiveStored: its advisory lock taken
 * before its deadline, its commit late): fence and result. */
bool pend;
byte pf;

bool down;    /* the cold tier does not answer */
byte outages, lates, losses, failovers;

/* store.FenceFloor, time-based: above every fence handed out, whatever the
 * hot tier lost (redisstore's TIME in its scripts). */
byte floor;
byte claims;

/* protect is the fence of a claim whose owner extended its lease for its
 * settle (Store.settle's heartbeat of SettleTimeout) and has not returned:
 * no clock ends that lease while the archive is in flight. */
byte protect;
byte settling; /* owners between their lease extension and their return:
                * no cold retention ends under a settle */

/* Ghost state, for the properties. */
int values;     /* bit f: a result of the claim under fence f was archived */
bool durable;   /* a Complete returned nil and the cold record's retention has not ended */
bool hk[N];     /* worker w holds a claim handed out to it */
byte hf[N];     /* the fence of that claim */
byte top;       /* the highest fence handed out */

/* ACK: a hot write's answer, once the replica acknowledged it. Redis
 * replicates in order: the replica then holds every write before it too. */
#if defined(WAITED) && !defined(MUT_NO_WAIT)
#define ACK rex = hex; rst = hst; rfe = hfe; rlive = hlive; rret = hret; rval = hval
#else
#define ACK skip
#endif

inline nextfence(f) {
#ifdef MUT_NO_FENCE_FLOOR
	if
	:: hex -> f = hfe + 1
	:: else -> f = 1
	fi;
#else
	if
	:: hex && hfe >= floor -> f = hfe + 1
	:: else -> f = floor + 1
	fi;
#endif
	/* a fence is never handed out twice, and grows across the hot tier's
	 * losses and expiries */
	assert(f > top);
	top = f;
	if
	:: f > floor -> floor = f
	:: else
	fi;
	claims++
}

/* The hot store's fenced writes (heartbeat, complete, release, unclaim):
 * in flight under fence f, within the retention. */
#define owned(f) (hex && hret && hst == INFLIGHT && hfe == f)
/* The cold tier holds a settled record. */
#define coldSettled (cex && cret && cst == COMPLETED)
/* What an acquisition takes for a settled cold record (Store.answer:
 * State Completed or Failed). */
#ifdef MUT_TOMBSTONE_AS_SETTLED
#define coldAnswer (cex && cret)
#else
#define coldAnswer coldSettled
#endif
/* No worker holds a claim handed out under a fence above f. */
#define noLaterHolder(f) ((!hk[0] || hf[0] <= f) && (N < 2 || !hk[1] || hf[1] <= f) && (N < 3 || !hk[2] || hf[2] <= f))
/* Claims exclude one another: no claim stands beside one handed out
 * later. A hot tier that loses acknowledged writes (a restart, a failover
 * to a replica that lags) gives that up, as any store that loses them does:
 * a claim it forgot is handed out again. What holds then is below: the
 * other properties. */
#define exclusive(f) (losses > 0 || noLaterHolder(f))

/* Archiver.ArchiveStored of the settled result of fence f (one atomic
 * statement): a live record of a larger fence, or of the same fence, is
 * kept; anything else is replaced. */
inline archive(f, stored) {
	if
	:: cex && cret && cfe >= f -> stored = false
	:: else ->
		/* Without a loss of the hot tier's writes, an archive never lands
		 * beside a claim handed out after its owner's (the lease extension
		 * and the awaiting cold read keep it so): the settle's outcome is
		 * never uncertain. */
		assert(exclusive(f));
		cex = true; cret = true; cst = COMPLETED; cfe = f; cval = f;
		values = values | (1 << f); stored = true
	fi
}

/* Store.withdraw: a tombstone of fence f over the archive (a larger
 * fence's record stays), and the hot copy of this settle dropped. */
inline withdraw(f) {
	atomic {
		if
		:: cex && cret && cfe > f
		:: else -> cex = true; cret = true; cst = RELEASED; cfe = f; cval = 0  /* a tombstone: no result */
		fi
	};
	atomic {
		if
		:: hex && hret && hst == COMPLETED && hval == f -> hex = false; ACK /* dropClaim: DeleteUpTo */
		:: hex && hret && hst == COMPLETED && hval == f -> hex = false /* its WAIT short */
		:: else
		fi
	}
}

/* Complete returns nil (in the same atomic step as the read that decides
 * it): the result is durable in the cold tier — unless an overlapping
 * claim's (a hot tier that lost writes) replaced it under a larger fence —
 * and no claim was handed out after its owner's. From here on, no claim is
 * handed out while the cold record lasts. */
inline returnsSettled(f) {
	assert(coldSettled && (cfe == f && cval == f || losses > 0 && cfe > f));
	assert(exclusive(f));
	durable = true
}

/* A replay returns only a result that was archived: durable in the cold
 * tier when it was first seen. */
#define replayed(v) assert(v != 0 && (values & (1 << v)))

proctype worker(byte w) {
	byte f, res, v, beats, tries;
	bool stored, insettle;
idle:
	atomic {
		if
		:: protect != 0 && protect == f -> protect = 0
		:: else
		fi;
		if
		:: insettle -> settling--
		:: else
		fi;
		hk[w] = false; hf[w] = 0; f = 0; res = 0; v = 0; beats = 0; tries = 0; stored = false; insettle = false
	};
	do
	:: claims < C -> break
	:: claims >= C -> goto done
	od;
	/* Acquire: the hot tier, without MaxAttempts (one script). */
	atomic {
		if
		:: !hex || !hret -> nextfence(f); hex = true; hst = INFLIGHT; hfe = f; hlive = true; hret = true; hval = 0; res = 1; ACK
		:: hex && hret && hst == INFLIGHT && hlive -> res = 2
		:: hex && hret && hst == COMPLETED -> replayed(hval); res = 3
#ifdef MUT_TAKEOVER_LIVE_LEASE
		:: hex && hret && hst == INFLIGHT && hlive -> nextfence(f); hfe = f; res = 1
#endif
		:: hex && hret && ((hst == INFLIGHT && !hlive) || hst == RELEASED) ->
			nextfence(f); hst = INFLIGHT; hfe = f; hlive = true; res = 1; ACK
#ifdef WAITED
		/* the claim written, its WAIT short: the acquisition fails */
		:: !hex || !hret -> nextfence(f); hex = true; hst = INFLIGHT; hfe = f; hlive = true; hret = true; hval = 0; res = 3
		:: hex && hret && ((hst == INFLIGHT && !hlive) || hst == RELEASED) ->
			nextfence(f); hst = INFLIGHT; hfe = f; hlive = true; res = 3
#endif
		fi
	};
	if
	:: res == 3 -> goto idle
	:: res == 2 ->
		/* In progress: the hot record may be a momentary claim of a key
		 * the cold tier holds settled (Store.answer, cold.Get). */
		atomic {
			if
			:: !down && coldAnswer -> replayed(cval)
			:: else
			fi
		};
		goto idle
	:: res == 1
	fi;
	/* The claim's cold read (coldReadAwaiting): it waits for the archives
	 * under way, within half the lease, or fails. */
	atomic {
		if
#ifdef MUT_NO_COLD_READ
		:: true -> res = 0
#else
#ifdef MUT_COLD_FAILS_OPEN
		:: down -> res = 0
#else
		:: down -> res = 4
#endif
#ifdef MUT_NO_AWAIT_ARCHIVES
		:: !down && coldSettled -> res = 5; v = cval
		:: !down && !coldSettled -> res = 0
#else
		:: pend -> res = 4  /* the wait ended at half the lease */
		:: !down && !pend && coldAnswer -> res = 5; v = cval
		:: !down && !pend && !coldAnswer -> res = 0
#endif
#endif
		fi
	};
	if
	:: res == 4 ->  /* fail closed: give the claim back (Unclaim) */
		atomic { if :: owned(f) -> hst = RELEASED; hlive = false; ACK :: owned(f) -> hst = RELEASED; hlive = false :: else fi };
		goto idle
	:: res == 5 ->  /* settled in the cold tier: re-warm the hot tier, replay */
		atomic {
			if
			:: owned(f) -> hst = COMPLETED; hval = v; hlive = false; ACK
			:: owned(f) -> hst = COMPLETED; hval = v; hlive = false  /* its WAIT short */
			:: owned(f) -> hst = RELEASED; hlive = false; ACK  /* too close to its expiry to re-warm */
			:: else
			fi
		};
		replayed(v);
		goto idle
	:: res == 0
	fi;
	/* The claim must still stand: a fenced heartbeat, then it is handed out. */
	atomic {
#ifdef MUT_NO_CLAIM_RECHECK
		if
		:: true ->
#else
		if
		:: owned(f) -> hlive = true; ACK;
#endif
			/* completed work never runs again: no claim while a Complete's
			 * result is durable */
			assert(!durable);
			/* and no claim beside one handed out later */
			assert(exclusive(f));
			hk[w] = true; hf[w] = f
#ifdef WAITED
		:: owned(f) -> hlive = true; goto idle  /* its WAIT short: not handed out */
#endif
		:: else -> goto idle  /* deleted or taken over meanwhile: unavailable */
		fi
	};
	/* Holding the claim: the work runs. */
	do
	:: beats < HEARTBEATS -> beats++;
		atomic {
			if
			:: owned(f) -> hlive = true; ACK
#ifdef WAITED
			:: owned(f) -> hlive = true; goto idle  /* its WAIT short: the Guard stops the work */
#endif
			:: else -> goto idle  /* the claim is lost: the Guard stops the work */
			fi
		}
	:: break  /* Complete */
	:: atomic { if :: owned(f) -> hst = RELEASED; hlive = false; ACK :: owned(f) -> hst = RELEASED; hlive = false :: else fi }; goto idle  /* Release */
	:: goto idle  /* a crash, or Hold */
	od;
	/* Complete (Store.settle), tried again once when its answer was lost. */
complete:
	tries++;
#ifdef MUT_HOT_BEFORE_ARCHIVE
	atomic {
		if
		:: owned(f) -> hst = COMPLETED; hval = f; hlive = false;
			values = values | (1 << f) /* visible to replays */
		:: else -> goto idle
		fi
	};
	atomic {
		if
		:: down -> goto idle
		:: else -> archive(f, stored); returnsSettled(f)
		fi
	};
	goto again;
#endif
	/* The hot read: the claim must be this one's, in flight. */
	atomic {
		if
		:: !hex || !hret || (hst == COMPLETED && hfe != f) -> res = 6
		:: hex && hret && hst == INFLIGHT && hfe == f -> res = 0
		:: else -> res = 7
		fi
	};
	if
	:: res == 7 -> goto idle  /* ErrStaleFence */
	:: res == 6 ->  /* staleUnlessLanded: an earlier try landed? */
		atomic {
			if
			:: !down && coldSettled && cfe == f && cval == f -> returnsSettled(f); goto settled
			:: else -> goto idle
			fi
		}
	:: res == 0
	fi;
	/* The lease extended past the archive: no takeover while it is in
	 * flight. */
#ifndef MUT_NO_LEASE_EXTENSION
	atomic {
		if
		:: owned(f) -> hlive = true; protect = f; ACK;
			if
			:: !insettle -> settling++; insettle = true
			:: else
			fi
#ifdef WAITED
		:: owned(f) -> hlive = true; goto retry  /* its WAIT short: Complete fails, nothing archived */
#endif
		:: else -> goto idle
		fi
	};
#else
	atomic { if :: !insettle -> settling++; insettle = true :: else fi };
#endif
	/* The archive: refused while the cold tier is down, applied late
	 * (its caller told it failed), or applied. */
	if
#ifdef MUT_ARCHIVE_FAILS_OPEN
	:: atomic { down -> skip }  /* the refusal taken as an archive */
#else
	:: atomic { down -> goto idle }
#endif
	:: atomic { !down && !pend && lates < LATE -> pend = true; pf = f; lates++; goto idle }
	:: atomic { !down -> archive(f, stored) }
	:: goto idle  /* a crash between the archive and the hot settle */
	fi;
	/* The hot settle, fenced. */
	atomic {
		if
		:: owned(f) -> hst = COMPLETED; hval = f; hlive = false; ACK; returnsSettled(f); goto settled
#ifdef WAITED
		:: owned(f) -> hst = COMPLETED; hval = f; hlive = false; goto retry  /* its WAIT short: Complete fails, the archive stands */
#endif
		:: else
		fi
	};
	/* settleRefused: the hot settle was refused after the archive. A claim
	 * older than this one in flight: the hot tier went back (a failover);
	 * the archive stands, the outcome is uncertain. */
	atomic {
		if
		:: hex && hret && hst == INFLIGHT && hfe < f -> res = 9; goto uncertain
		:: else
		fi
	};
	atomic {
		if
		:: hex && hret && hst == INFLIGHT && hfe != f && hlive -> skip /* awaitClaim: waited for, or not */
		:: true -> skip
		fi
	};
	atomic {
		if
		:: hex && hret && hst == COMPLETED && hval == f -> returnsSettled(f); goto settled  /* a duplicate re-warmed it */
		:: else
		fi;
		if
		:: !stored -> res = 7
		:: stored && (!hex || !hret || hst == RELEASED) && cex && cret && cfe == f && cst == COMPLETED -> returnsSettled(f); goto settled
		:: stored && cex && cret && cfe > f && cst == COMPLETED -> res = 9   /* ErrSettleUncertain */
		:: stored && cex && cret && cfe == f && cst == COMPLETED && hex && hret && hst == INFLIGHT -> res = 10  /* withdraw, uncertain */
		:: else -> res = 7
		fi
	};
	if
	:: res == 10 -> withdraw(f); res = 9
	:: res == 7 -> withdraw(f)
	:: else
	fi;
uncertain:
	/* The settle's outcome uncertain happens only when the hot tier lost
	 * writes (or the owner stalled past SettleTimeout, not modelled). */
	assert(res != 9 || losses > 0);
	goto idle;
settled:
#ifdef MUT_HOT_BEFORE_ARCHIVE
again:
#endif
retry:
	/* the answer was lost, or was an error the Guard tries again on
	 * (ErrStoreUnavailable): Complete again */
	if
	:: tries < 2 -> goto complete
	:: goto idle
	fi;
done:
	hk[w] = false
}

/* The world: clocks ending leases and retentions, the sweeper, the cold
 * tier's outages, late archives landing, the hot tier's replica and its
 * loss. */
proctype world() {
	bool stored;
end:
	do
	:: atomic { hex && hret && hst == INFLIGHT && hlive && protect != hfe -> hlive = false }
	:: atomic { hex && hret && !(hst == INFLIGHT && hlive) -> hret = false }
	:: atomic { cex && cret && settling == 0 && !pend -> cret = false; durable = false }
	:: atomic { hex && !hret -> hex = false }  /* the sweeper */
	:: atomic { !down && outages < OUTAGES -> down = true; outages++ }
	:: atomic { down -> down = false }
	:: atomic { pend -> archive(pf, stored); pend = false }
#ifdef RESTART
	:: atomic { losses == 0 -> hex = false; losses++; protect = 0 }  /* a restart: everything lost */
#endif
#ifdef FAILOVER
	:: atomic { losses == 0 && failovers == 0 -> rex = hex; rst = hst; rfe = hfe; rlive = hlive; rret = hret; rval = hval }  /* the replica catches up */
#ifdef WAITED
	/* a failover that loses no acknowledged write: the owners' leases and
	 * extensions stand */
	:: atomic { failovers == 0 -> hex = rex; hst = rst; hfe = rfe; hlive = rlive; hret = rret; hval = rval; failovers++ }
#else
	:: atomic { losses == 0 -> hex = rex; hst = rst; hfe = rfe; hlive = rlive; hret = rret; hval = rval; losses++; protect = 0 }  /* a failover */
#endif
#endif
	od
}

init {
	byte i;
	atomic {
		i = 0;
		do
		:: i < N -> run worker(i); i++
		:: else -> break
		od;
		run world()
	}
}
