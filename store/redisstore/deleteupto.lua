-- idem delete of record k up to fence (in decimal, as written): the record
-- is removed if its fence is at most fence and kept if larger (a later
-- generation's, made after the caller read the one it deletes). Returns 1
-- when a record was removed, else 0.
local function deleteUpTo(k, fence)
  local r = load(k)
  if not r then return 0 end
  -- Compared as decimal strings (%d: tostring would round 16-digit numbers).
  local f = sformat('%d', r.f)
  if #f > #fence or (#f == #fence and f > fence) then return 0 end
  remove(k)
  return 1
end
