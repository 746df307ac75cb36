-- nack: give a leased task back: deliver it again later, or dead-letter it.
-- KEYS:  the queue key set (see _lib.lua).
-- ARGV[1] id   ARGV[2] lease token
-- ARGV[3] outcome: 'retry' (counts as a failed attempt; dead-letters after max_attempts),
--         'release' (hand back unused, e.g. on shutdown: the attempt is not counted),
--         [L] 'throttle' (the handler raised RateLimited: its limit key, or the whole queue,
--         waits ARGV[4] ms and the task waits first in line for it; not counted),
--         'dead' (dead-letter now), 'undecodable' (dead-letter now, counted as decode failure)
-- ARGV[4] delay ms before the next delivery; -1 = the backoff policy
-- ARGV[5] error text ('' = none)   ARGV[6] max_attempts
-- ARGV[7] backoff base ms   ARGV[8] backoff cap ms   ARGV[9] backoff factor (jitter draw)
-- ARGV[10] [L] throttle: the task's due ms, its place in its key's line ('' otherwise)
-- ARGV[11] [H] the error's gist (its last line) for the task's history, '' = none
-- Reply: {status, ms}: 1 = scheduled again, ms its due time; 2 = dead-lettered, ms now;
--        3 = this token already gave the task back (a resent call), ms now;
--        0 = lease lost, ms now
-- The leases entry keeps '~' .. token after a give-back until the next delivery overwrites it,
-- so a call resent after a lost reply is recognised as done rather than as a lost lease.
local id, token, outcome = ARGV[1], ARGV[2], ARGV[3]
local delay = tonumber(ARGV[4])
local err = ARGV[5]
local max_attempts = tonumber(ARGV[6])
local base, cap, factor = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local now = now_ms()

local lease = held_lease(id, token, now)
if not lease then
  if redis.call('HGET', K_LEASES, id) == '~' .. token then return {3, now} end
  return {0, now}
end
local slot = slot_of(lease)
redis.call('ZREM', K_INFLIGHT, id)
lease_ended({id}, now)
redis.call('HSET', K_LEASES, id, '~' .. token)
if err ~= '' then redis.call('HSET', K_ERRORS, id, err) end

local attempts = tonumber(redis.call('HGET', K_ATTEMPTS, id) or '0')
if (outcome == 'release' or outcome == 'throttle') and attempts > 0 then
  attempts = redis.call('HINCRBY', K_ATTEMPTS, id, -1)
end
local why = ARGV[11] or ''
if outcome == 'throttle' then
  hist_note(id, now, 'throttled', 'rate limited, again in ' .. hist_span(delay), attempts)
  return {1, throttle(id, slot, tonumber(ARGV[10]), now, delay)}
end

if outcome == 'dead' or outcome == 'undecodable'
    or (outcome == 'retry' and attempts >= max_attempts) then
  if outcome == 'retry' then
    why = 'attempt ' .. attempts .. ' of ' .. max_attempts .. (why ~= '' and ': ' .. why or '')
  end
  bury(id, slot, now, err, why)
  if outcome == 'undecodable' then count('decode_failures', 1) end
  return {2, now}
end

if delay < 0 then delay = backoff_ms(attempts, base, cap, factor) end
local old_head = head_score(K_DELAYED)
local s = score(now + delay, slot)
redis.call('ZADD', K_DELAYED, fmt(s), id)
if outcome == 'retry' then count('retried', 1) end
hist_note(id, now, outcome == 'retry' and 'retried' or 'released', why, attempts)
announce_if_earlier(s, old_head)
return {1, now + delay}
