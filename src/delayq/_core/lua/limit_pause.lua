-- limit_pause: pause a queue, resume it, or read its pause.
-- KEYS:  the queue key set (see _lib.lua); besides, the derived key `prefix:{name}:pause`
--        (HASH until = epoch ms or 0 for "until resumed", since = epoch ms, note).
-- ARGV[1] 'pause', 'resume' or 'read'
-- ARGV[2] pause: '' (until resumed), 'd' .. ms from now or 'a' .. epoch ms
-- ARGV[3] pause: the note ('' = none)
-- ARGV[4] pause, optional: the epoch ms it began, if not paused already (a reshard carrying
--         a pause to the new layout's sub-queues keeps its start)
-- Reply: {status, until_ms, since_ms, note}: pause and read: status 1 = paused, 0 = not
--        paused, 2 = refused: the pause's end is not after the server's now; resume: 1 = it
--        was paused and is no more, 0 = it was not paused. until_ms is 0 for a pause until
--        resumed, -1 when not paused.
-- A pause hands out nothing (fetch.lua) but lets leases run and acks land. Paused consumers
-- sleep until the pause's end (fetch's next wake) or for news: resume sends one message
-- announcing "due now", a timed pause one announcing its end (for consumers already asleep).
-- Pausing again keeps the first pause's since.
local op = ARGV[1]
local now, later = now_ms()
local key = flow_key('pause')
local function wake_at(ms)
  local sharded = redis.REDIS_VERSION_NUM and string.sub(K_EVENTS, -8) == ':sevents'
  redis.call(sharded and 'SPUBLISH' or 'PUBLISH', K_EVENTS, fmt(ms))
end
if op == 'pause' then
  local until_arg = ARGV[2]
  local until_ms = 0
  if until_arg ~= '' then
    until_ms = tonumber(string.sub(until_arg, 2))
    if string.byte(until_arg, 1) == 100 then until_ms = later + until_ms end  -- 'd'
    if until_ms <= now then return {2, until_ms, now, ''} end
  end
  local since = redis.call('HGET', key, 'since') or tonumber(ARGV[4] or '') or now
  redis.call('HSET', key, 'until', fmt(until_ms), 'since', since, 'note', ARGV[3])
  if until_ms > 0 then wake_at(until_ms) end  -- sleepers learn when the pause ends
  return {1, until_ms, tonumber(since), ARGV[3]}
end
local paused, until_ms = queue_pause_state(now)
if not paused then return {0, -1, -1, ''} end
local state = redis.call('HMGET', key, 'since', 'note')
if op == 'resume' then
  redis.call('DEL', key)
  wake_at(now)
  return {1, -1, -1, ''}
end
return {1, until_ms, tonumber(state[1]), state[2] or ''}
