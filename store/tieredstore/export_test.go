package tieredstore

// SetAfterArchive installs a hook that runs between the cold archive and the
// hot settle of Complete and Fail (a test kills the process there).
func SetAfterArchive(s *Store, f func()) { s.afterArchive = f }

// SetBeforeArchive installs a hook that runs in Complete and Fail after the
// hot tier's lease check and before the cold archive.
func SetBeforeArchive(s *Store, f func()) { s.beforeArchive = f }

// SetDuringDelete installs a hook that runs in Delete between the cold
// tombstone and the hot removal.
func SetDuringDelete(s *Store, f func()) { s.duringDelete = f }

// SetAfterDeleteReads installs a hook that runs in Delete after it read
// both tiers.
func SetAfterDeleteReads(s *Store, f func()) { s.afterDeleteReads = f }

// SetAfterColdSettled installs a hook that runs in Acquire after the cold
// read that found a settled record, before the hot tier is re-warmed with
// it (or, for another fingerprint, the claim dropped).
func SetAfterColdSettled(s *Store, f func()) { s.afterColdSettled = f }

// SetDeleteLockHeld installs a hook that runs each time a Delete finds its
// key's delete lock held by another Delete.
func SetDeleteLockHeld(s *Store, f func()) { s.deleteLockHeld = f }

// DeletingMark is the result of a Delete's tombstone while it is under way.
const DeletingMark = deletingMark

// SetAwaitingClaim installs a hook that runs when a refused settle finds
// another claim in flight in the hot tier.
func SetAwaitingClaim(s *Store, f func()) { s.awaitingClaim = f }
