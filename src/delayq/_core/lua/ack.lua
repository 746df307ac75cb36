-- ack: finish tasks whose leases the caller still holds.
-- KEYS:  the queue key set (see _lib.lua), then KEYS[14]: this call's receipt
-- ARGV[1] ms to keep the receipt (this reply, for a resend of the same call)
-- ARGV[2..] pairs: id, lease token
-- Reply: one status per pair: 1 = acked; 0 = lease lost: expired, or the task was delivered
--        again (and maybe finished) by another consumer. A resent call gets the first reply.
local receipt, keep_ms = KEYS[14], tonumber(ARGV[1])
local earlier = stored_reply(receipt)
if earlier then return earlier end
local now = now_ms()
local ids, tokens = {}, {}
for i = 2, #ARGV, 2 do
  ids[#ids + 1] = ARGV[i]
  tokens[#tokens + 1] = ARGV[i + 1]
end
-- Read every lease at once, then remove the finished tasks with one command per structure.
local leases = redis.call('HMGET', K_LEASES, unpack(ids))
local expiries = redis.call('ZMSCORE', K_INFLIGHT, unpack(ids))
local reply, done, seen = {}, {}, {}
for k, id in ipairs(ids) do
  if leases[k] == tokens[k] and expiries[k] and ms_of(expiries[k]) >= now and not seen[id] then
    seen[id] = true
    done[#done + 1] = id
    reply[k] = 1
  else
    reply[k] = 0
  end
end
if #done > 0 then
  if redis.call('EXISTS', K_TASKKEY) == 1 then
    local keyed = redis.call('HMGET', K_TASKKEY, unpack(done))
    for k, id in ipairs(done) do
      if keyed[k] then release_key(id, now, true) end
    end
  end
  redis.call('ZREM', K_INFLIGHT, unpack(done))
  redis.call('HDEL', K_LEASES, unpack(done))
  redis.call('HDEL', K_TASKS, unpack(done))
  redis.call('HDEL', K_ATTEMPTS, unpack(done))
  -- Most queues keep no errors or ttls: skip the per-id work when the structure is empty.
  if redis.call('EXISTS', K_ERRORS) == 1 then redis.call('HDEL', K_ERRORS, unpack(done)) end
  if redis.call('EXISTS', K_EXPIRY) == 1 then redis.call('ZREM', K_EXPIRY, unpack(done)) end
end
count('acked', #done)
keep_reply(receipt, reply, keep_ms)
return reply
