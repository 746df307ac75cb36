-- ack: finish tasks whose leases the caller still holds.
-- KEYS:  the queue key set (see _lib.lua).
-- ARGV[1] ms to remember an ack's token, so that the same ack resent after a lost reply
--         (by delayq or by the redis client's own retry) is recognised
-- ARGV[2..] pairs: id, lease token
-- Reply: one status per pair: 1 = acked; 2 = this token acked it already (a resent ack);
--        0 = lease lost: expired, or the task was delivered again (and maybe finished) by
--        another consumer
local window = tonumber(ARGV[1])
local now = now_ms()
local ids, tokens = {}, {}
for i = 2, #ARGV, 2 do
  ids[#ids + 1] = ARGV[i]
  tokens[#tokens + 1] = ARGV[i + 1]
end
-- Read every lease at once, then remove the finished tasks with one command per structure.
local leases = redis.call('HMGET', K_LEASES, unpack(ids))
local expiries = redis.call('ZMSCORE', K_INFLIGHT, unpack(ids))
local reply, done, receipts, seen = {}, {}, {}, {}
for k, id in ipairs(ids) do
  if leases[k] == tokens[k] and expiries[k] and ms_of(expiries[k]) >= now and not seen[id] then
    seen[id] = true
    done[#done + 1] = id
    receipts[#receipts + 1] = now
    receipts[#receipts + 1] = tokens[k]
    reply[k] = 1
  elseif seen[id] or redis.call('ZSCORE', K_ACKED, tokens[k]) then
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
  redis.call('ZADD', K_ACKED, unpack(receipts))
end
redis.call('ZREMRANGEBYSCORE', K_ACKED, '-inf', '(' .. fmt(now - window))
count('acked', #done)
return reply
