-- offer_one: schedule one plain task (no key, ttl or priority): offer.lua's common case with
-- the fewest commands, because a single offer is on every producer's hot path.
-- (standalone: no shared preamble; it gets its own short KEYS list)
-- KEYS[1] delayed   KEYS[2] tasks   KEYS[3] counters   KEYS[4] events (channel)
-- ARGV[1] id   ARGV[2] due: 'd' .. ms from now, or 'a' .. absolute epoch ms   ARGV[3] envelope
-- Reply: status 1 = created, 0 = this very task exists (the same call resent after a lost
-- reply: the queue reports it as created), 3 = another task holds the id (two producers drew
-- the same id: draw again), 5 = the queue keeps task histories: nothing written, offer it
-- with offer.lua (which records them); error LAYOUT_RETIRED as offer.lua's. Only queue-drawn
-- ids come here; caller ids go through offer.lua.
local id, due_arg = ARGV[1], ARGV[2]
local flags = redis.call('HMGET', KEYS[3], 'retired', 'hist')
if flags[1] then  -- see offer.lua
  return redis.error_reply('LAYOUT_RETIRED this layout of the queue was resharded away')
end
if flags[2] then return 5 end  -- [H] see _lib.lua
if redis.call('HSETNX', KEYS[2], id, ARGV[3]) == 0 then
  return redis.call('HGET', KEYS[2], id) == ARGV[3] and 0 or 3
end
local t = redis.call('TIME')
local due = tonumber(string.sub(due_arg, 2))
if string.byte(due_arg, 1) == 100 then  -- 'd': relative to the server's clock
  -- A positive delay counts from the next whole ms: never due before the server's now + delay.
  local ms = tonumber(t[2]) / 1000
  due = due + tonumber(t[1]) * 1000 + (due > 0 and math.ceil(ms) or math.floor(ms))
end
local score = due * 10 + 9  -- slot 9: priority 0 (see _lib.lua)
redis.call('ZADD', KEYS[1], string.format('%.0f', score), id)
redis.call('HINCRBY', KEYS[3], 'offered', 1)
-- the new head: ZRANK after the write costs less than reading the old head's score before
if redis.call('ZRANK', KEYS[1], id) == 0 then
  -- a shard channel on a cluster (see announce_if_earlier in _lib.lua)
  local sharded = redis.REDIS_VERSION_NUM and string.sub(KEYS[4], -8) == ':sevents'
  redis.call(sharded and 'SPUBLISH' or 'PUBLISH', KEYS[4], string.format('%.0f', due))
end
return 1
