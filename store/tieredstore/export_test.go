package tieredstore

// SetAfterArchive installs a hook that runs between the cold archive and the
// hot settle of Complete and Fail (a test kills the process there).
func SetAfterArchive(s *Store, f func()) { s.afterArchive = f }

// SetBeforeArchive installs a hook that runs in Complete and Fail after the
// hot tier's lease check and before the cold archive.
func SetBeforeArchive(s *Store, f func()) { s.beforeArchive = f }
