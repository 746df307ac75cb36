-- purge: delete up to LIMIT tasks in the given states, every trace of them.
-- KEYS:  the queue key set (see _lib.lua).
-- ARGV[1] limit: most tasks deleted by this call (the client loops: each call stays short)
-- ARGV[2..] states: 'ready', 'delayed', 'inflight' (live leases), 'expired' (leases that ran
--           out), 'dead' (at least one)
-- Reply: {deleted}; fewer than limit means nothing is left in those states.
-- Dedup keys held by a deleted task are released at once (not kept for key_ttl): a purged
-- task did not run. Deleting an in-flight task takes its lease away: its consumer's ack,
-- nack or extend then finds no lease (LeaseLost). Resending after a lost reply is harmless
-- (it deletes what is left), though the lost reply's count is then missing from the total.
local limit = tonumber(ARGV[1])
local now = now_ms()
local want = {}
for i = 2, #ARGV do want[ARGV[i]] = true end
local due = fmt(score(now, 9))
local deleted = 0

local function purge(key, ids)
  if #ids == 0 then return end
  redis.call('ZREM', key, unpack(ids))
  if key == K_INFLIGHT then lease_ended(ids, now) end
  for _, id in ipairs(ids) do forget(id, now, false) end
  task_ended(ids, now, 'purged')
  deleted = deleted + #ids
end

if want['ready'] and want['delayed'] then
  purge(K_DELAYED, redis.call('ZRANGE', K_DELAYED, 0, limit - 1))
elseif want['ready'] then
  purge(K_DELAYED, redis.call('ZRANGEBYSCORE', K_DELAYED, '-inf', due, 'LIMIT', 0, limit))
elseif want['delayed'] then
  purge(K_DELAYED,
    redis.call('ZRANGEBYSCORE', K_DELAYED, '(' .. due, '+inf', 'LIMIT', 0, limit))
end
local lapsed = '(' .. fmt(score(now, 0))
if want['inflight'] and want['expired'] and deleted < limit then
  purge(K_INFLIGHT, redis.call('ZRANGE', K_INFLIGHT, 0, limit - deleted - 1))
elseif want['inflight'] and deleted < limit then
  purge(K_INFLIGHT, redis.call('ZRANGEBYSCORE', K_INFLIGHT, fmt(score(now, 0)), '+inf',
    'LIMIT', 0, limit - deleted))
elseif want['expired'] and deleted < limit then
  purge(K_INFLIGHT, redis.call('ZRANGEBYSCORE', K_INFLIGHT, '-inf', lapsed,
    'LIMIT', 0, limit - deleted))
end
if want['dead'] and deleted < limit then
  purge(K_DEAD, redis.call('ZRANGE', K_DEAD, 0, limit - deleted - 1))
end
count('purged', deleted)
return {deleted}
