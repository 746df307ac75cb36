-- requeue: put dead-lettered tasks back, due now, with a fresh attempt count.
-- KEYS:  the queue key set (see _lib.lua).
-- ARGV[1] limit: with no ids, examine up to this many dead tasks, oldest first...
-- ARGV[2] ...starting at this offset in the dead set
-- ARGV[3..] ids (none = the `limit` dead tasks from the offset)
-- Reply: {requeued, examined}. A dead task whose dedup key is now held by another live
--        task, or kept by one that finished (its key_ttl), stays dead (requeueing it would
--        run the same business event twice).
local limit, offset = tonumber(ARGV[1]), tonumber(ARGV[2])
local ids = {}
if #ARGV > 2 then
  for i = 3, #ARGV do ids[#ids + 1] = ARGV[i] end
else
  ids = redis.call('ZRANGE', K_DEAD, offset, offset + limit - 1)
end
local now = now_ms()
local old_head = head_score(K_DELAYED)
local new_min = nil
local moved = 0
-- Take the task's dedup key back; false if another task holds it, live or finished within
-- its key_ttl (the kept key's score: until when).
local function retake_key(id)
  local v = redis.call('HGET', K_TASKKEY, id)
  if not v then return true end
  local key = string.sub(v, string.find(v, '|', 1, true) + 1)
  local holder = redis.call('HGET', K_KEYMAP, key)
  if holder and holder ~= id then
    if redis.call('HEXISTS', K_TASKS, holder) == 1 then
      if not redis.call('ZSCORE', K_DEAD, holder) then return false end
    elseif tonumber(redis.call('ZSCORE', K_KEPT, key) or '0') > now then
      return false
    end
  end
  redis.call('HSET', K_KEYMAP, key, id)
  redis.call('ZREM', K_KEPT, key)
  return true
end

for _, id in ipairs(ids) do
  local s = redis.call('ZSCORE', K_DEAD, id)
  if s and retake_key(id) then
    redis.call('ZREM', K_DEAD, id)
    redis.call('HDEL', K_ATTEMPTS, id)
    local ns = score(now, slot_of(s))
    redis.call('ZADD', K_DELAYED, fmt(ns), id)
    if not new_min or ns < new_min then new_min = ns end
    moved = moved + 1
    hist_note(id, now, 'requeued', 'from the dead letters', 0)  -- [H]
  end
end
count('requeued', moved)
announce_if_earlier(new_min, old_head)
return {moved, #ids}
