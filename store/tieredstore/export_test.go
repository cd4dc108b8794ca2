package tieredstore

// SetAfterArchive installs a hook that runs between the cold archive and the
// hot settle of Complete and Fail (a test kills the process there).
func SetAfterArchive(s *Store, f func()) { s.afterArchive = f }
