-- info: one task's state and data, read in one consistent step.
-- KEYS:  the queue key set (see _lib.lua).
-- ARGV[1] id
-- Reply: {now, state, score or '', attempts, envelope or '', last error or '', ttl deadline
--        or ''}; state is 'delayed', 'inflight', 'expired' (a lease that ran out, not yet
--        reclaimed by a fetch), 'dead' or '' (unknown); the score's time is the due time
--        (delayed), lease expiry (inflight, expired) or time of death (dead). [H] An unknown
--        task adds its history's last event, or '' (a task that ended: how, while its
--        history lasts).
local id = ARGV[1]
local now = now_ms()
local state, s = '', redis.call('ZSCORE', K_DELAYED, id)
if s then state = 'delayed' else
  s = redis.call('ZSCORE', K_INFLIGHT, id)
  if s then
    state = 'inflight'
    if tonumber(s) < score(now, 0) then state = 'expired' end
  else
    s = redis.call('ZSCORE', K_DEAD, id)
    if s then state = 'dead' end
  end
end
if state == '' then  -- [L] parked by a limit: waiting, with its place in the delayed order
  local _, parked_score = parked(id)
  if parked_score then state, s = 'delayed', parked_score end
end
if state == '' then
  local last = redis.call('LRANGE', flow_key('hist:' .. id), -1, -1)[1]  -- [H]
  return {now, '', '', 0, '', '', '', last or ''}
end
return {
  now, state, s,
  tonumber(redis.call('HGET', K_ATTEMPTS, id) or '0'),
  redis.call('HGET', K_TASKS, id) or '',
  redis.call('HGET', K_ERRORS, id) or '',
  redis.call('ZSCORE', K_EXPIRY, id) or '',
}
