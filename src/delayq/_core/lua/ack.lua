-- ack: finish tasks whose leases the caller still holds.
-- KEYS:  the queue key set (see _lib.lua).
-- ARGV:  pairs: id, lease token
-- Reply: one status per pair: 1 = acked; 2 = the task no longer exists (acked already: by this
--        call's first try whose reply was lost, or by the consumer it was redelivered to);
--        0 = lease lost: the task is still there but no longer ours (lease expired, delivered
--        to another consumer, back in the queue, or dead)
-- Being a no-op on a finished task makes ack safe to resend after a lost reply, whoever
-- resends it (delayq or the redis client's own retry).
local now = now_ms()
local ids, tokens = {}, {}
for i = 1, #ARGV, 2 do
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
  elseif seen[id] or redis.call('HEXISTS', K_TASKS, id) == 0 then
    reply[k] = 2
  else
    reply[k] = 0
  end
end
if #done > 0 then
  local keyed = redis.call('HMGET', K_TASKKEY, unpack(done))
  for k, id in ipairs(done) do
    if keyed[k] then release_key(id, now, true) end
  end
  redis.call('ZREM', K_INFLIGHT, unpack(done))
  redis.call('HDEL', K_LEASES, unpack(done))
  redis.call('HDEL', K_TASKS, unpack(done))
  redis.call('HDEL', K_ATTEMPTS, unpack(done))
  redis.call('HDEL', K_ERRORS, unpack(done))
  redis.call('ZREM', K_EXPIRY, unpack(done))
end
count('acked', #done)
return reply
