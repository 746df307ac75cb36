-- Shared preamble, prepended to every script by scripts.py.
--
-- KEYS is the same for every script: the queue's key set in keys.py order, all under one
-- {hash tag} so each script touches a single cluster slot.
--
-- Scores of the delayed, inflight and dead sorted sets pack two numbers:
--   score = milliseconds * 10 + slot,  slot = 9 - priority
-- so tasks due in the same millisecond come out highest priority first, and a task's priority
-- travels with it from set to set without another lookup. string.format('%.0f') writes scores:
-- Lua's tostring keeps only 14 significant digits and a score has 15.
local K_DELAYED, K_TASKS, K_INFLIGHT, K_LEASES, K_ATTEMPTS, K_DEAD, K_ERRORS,
      K_EXPIRY, K_KEYMAP, K_TASKKEY, K_KEPT, K_COUNTERS, K_EVENTS = unpack(KEYS)

local SLOTS = 10

-- One clock for everybody: the server's. Returns now in whole ms and, second, the next whole
-- ms: a positive delay counts from there, so a task is never due before now + delay.
local function now_ms()
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  return now, now + ((tonumber(t[2]) % 1000 > 0) and 1 or 0)
end

local function fmt(n) return string.format('%.0f', n) end
local function score(ms, slot) return ms * SLOTS + slot end
local function ms_of(s) return math.floor(tonumber(s) / SLOTS) end
local function slot_of(s) return tonumber(s) % SLOTS end

local function head_score(key)
  local head = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if head[2] then return tonumber(head[2]) end
  return nil
end

-- Wake sleeping consumers only when the earliest due time moved earlier; the message is a
-- hint (consumers also re-check on their own), so losing it delays but never stalls.
-- On a cluster the channel is a shard channel (its name ends in ':sevents', see keys.py):
-- SPUBLISH reaches only the slot's node, where PUBLISH goes to every node. Redis 6.2 has no
-- sharded pub/sub (nor REDIS_VERSION_NUM), and its subscribers fall back to SUBSCRIBE.
local function announce_if_earlier(new_min, old_head)
  if new_min and (not old_head or new_min < old_head) then
    local sharded = redis.REDIS_VERSION_NUM and string.sub(K_EVENTS, -8) == ':sevents'
    redis.call(sharded and 'SPUBLISH' or 'PUBLISH', K_EVENTS, fmt(ms_of(new_min)))
  end
end

local function backoff_ms(attempts, base, cap, factor)
  local d = base * 2 ^ math.max(attempts - 1, 0)
  if d > cap then d = cap end
  return math.floor(d * factor)
end

-- A call's receipt (KEYS[14]) holds its reply for a while: a resend of the same call (same
-- nonce, so the same receipt key) answers from it instead of acting twice.
local function stored_reply(receipt)
  local stored = redis.call('GET', receipt)
  if not stored then return nil end
  local reply = {}
  for i = 1, #stored do reply[i] = string.byte(stored, i) - 48 end
  return reply
end

-- The reply of ack or cancel (statuses 0-9) as one string of digits: cheaper than a list.
local function keep_reply(receipt, reply, ms)
  if #reply > 0 then
    redis.call('SET', receipt, table.concat(reply), 'PX', ms)
  end
end

local function count(field, n)
  if n ~= 0 then redis.call('HINCRBY', K_COUNTERS, field, n) end
end

-- Drop the dedup-key mapping of a task; with remember, keep the key blocked for key_ttl ms.
local function release_key(id, now, remember)
  local v = redis.call('HGET', K_TASKKEY, id)
  if not v then return end
  redis.call('HDEL', K_TASKKEY, id)
  local sep = string.find(v, '|', 1, true)
  local key_ttl = tonumber(string.sub(v, 1, sep - 1))
  local key = string.sub(v, sep + 1)
  if redis.call('HGET', K_KEYMAP, key) ~= id then return end
  if remember and key_ttl > 0 then
    redis.call('ZADD', K_KEPT, fmt(now + key_ttl), key)
  else
    redis.call('HDEL', K_KEYMAP, key)
  end
end

-- Remove every trace of a task except its place in delayed/inflight/dead (the caller's job).
local function forget(id, now, remember_key)
  redis.call('HDEL', K_TASKS, id)
  redis.call('HDEL', K_LEASES, id)
  redis.call('HDEL', K_ATTEMPTS, id)
  redis.call('HDEL', K_ERRORS, id)
  redis.call('ZREM', K_EXPIRY, id)
  release_key(id, now, remember_key)
end

-- Dead-letter a task. Its dedup key is freed for new offers, but the task keeps its key record
-- (taskkeys) so that requeue can take the key back.
local function bury(id, slot, now, err)
  redis.call('ZADD', K_DEAD, fmt(score(now, slot)), id)
  if err and err ~= '' then redis.call('HSET', K_ERRORS, id, err) end
  redis.call('ZREM', K_EXPIRY, id)
  local v = redis.call('HGET', K_TASKKEY, id)
  if v then
    local key = string.sub(v, string.find(v, '|', 1, true) + 1)
    if redis.call('HGET', K_KEYMAP, key) == id then redis.call('HDEL', K_KEYMAP, key) end
  end
  count('dead_lettered', 1)
end

-- The lease score if token holds an unexpired lease on id, else nil.
local function held_lease(id, token, now)
  if redis.call('HGET', K_LEASES, id) ~= token then return nil end
  local s = redis.call('ZSCORE', K_INFLIGHT, id)
  if not s or ms_of(s) < now then return nil end
  return tonumber(s)
end

local function drop_lease(id)
  redis.call('ZREM', K_INFLIGHT, id)
  redis.call('HDEL', K_LEASES, id)
end

-- The ids and lease tokens of the (id, token) pairs in ARGV from position ``from`` on.
local function id_token_pairs(from)
  local ids, tokens = {}, {}
  for i = from, #ARGV, 2 do
    ids[#ids + 1] = ARGV[i]
    tokens[#tokens + 1] = ARGV[i + 1]
  end
  return ids, tokens
end

-- Finish the tasks whose leases the caller holds (ids[k] with tokens[k]): one status per
-- pair, 1 = finished, 0 = lease lost; and how many were finished.
local function finish(ids, tokens, now)
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
    -- Most queues keep no dedup keys, errors or ttls: one look tells, and the per-id work on
    -- those structures is skipped.
    if redis.call('EXISTS', K_TASKKEY, K_ERRORS, K_EXPIRY) > 0 then
      if redis.call('EXISTS', K_TASKKEY) == 1 then
        local keyed = redis.call('HMGET', K_TASKKEY, unpack(done))
        for k, id in ipairs(done) do
          if keyed[k] then release_key(id, now, true) end
        end
      end
      if redis.call('EXISTS', K_ERRORS) == 1 then redis.call('HDEL', K_ERRORS, unpack(done)) end
      if redis.call('EXISTS', K_EXPIRY) == 1 then redis.call('ZREM', K_EXPIRY, unpack(done)) end
    end
    redis.call('ZREM', K_INFLIGHT, unpack(done))
    redis.call('HDEL', K_LEASES, unpack(done))
    redis.call('HDEL', K_TASKS, unpack(done))
    redis.call('HDEL', K_ATTEMPTS, unpack(done))
  end
  return reply, #done
end

-- [L] Flow control (issue #20): pause and limits. Their keys are derived from the queue's
-- own prefix (`prefix:{name}:` + role), so they share its hash tag and cluster slot.
local function flow_key(role) return string.sub(K_COUNTERS, 1, -9) .. role end

-- Whether the queue is paused at now, and until when (0: until resumed). One HGET of a key
-- that does not exist is all an unpaused queue pays. A timed pause that ran out ends here,
-- on the server's clock, whoever looks first.
local function queue_pause_state(now)
  local key = flow_key('pause')
  local until_ms = redis.call('HGET', key, 'until')
  if not until_ms then return false, nil end
  until_ms = tonumber(until_ms)
  if until_ms > 0 and until_ms <= now then
    redis.call('DEL', key)
    return false, nil
  end
  return true, until_ms
end
