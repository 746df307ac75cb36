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
local flow_seen = {}  -- [L] per call: which flow-control keys exist (see lease_ended)

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

-- [L] Flow control (issue #20): pause and limits. Their keys are derived from the queue's
-- own prefix (`prefix:{name}:` + role), so they share its hash tag and cluster slot.
local function flow_key(role) return string.sub(K_COUNTERS, 1, -9) .. role end

-- Which flow-control state the queue has (pause, limits, holds, gates, held slots, tasks'
-- limit keys), looked up once per call: one EXISTS for a queue that uses none of it.
local function flow_probe()
  if flow_seen.held ~= nil then return end
  local pause, lim, hold = flow_key('pause'), flow_key('lim'), flow_key('lim:hold')
  local gate, held, task = flow_key('lim:gate'), flow_key('lim:held'), flow_key('lim:task')
  if redis.call('EXISTS', pause, lim, hold, gate, held, task) == 0 then
    flow_seen.pause, flow_seen.lim, flow_seen.held, flow_seen.task = false, false, false, false
  else
    flow_seen.pause = redis.call('EXISTS', pause) == 1
    -- limits, a RateLimited hold or a parked key's gate: fetch takes the limited path
    flow_seen.lim = redis.call('EXISTS', lim, hold, gate) > 0
    flow_seen.held = redis.call('EXISTS', held) == 1
    flow_seen.task = redis.call('EXISTS', task) == 1
  end
end

-- Whether the queue is paused at now, and until when (0: until resumed). An unpaused queue
-- pays flow_probe's one EXISTS (shared with the limits). A timed pause that ran out ends
-- here, on the server's clock, whoever looks first.
local function queue_pause_state(now)
  flow_probe()
  if not flow_seen.pause then return false, nil end
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

-- Limits (see _core/limits.py for the encoding). Under the queue's prefix:
--   lim        HASH limit key -> 'rate|per_us|burst|concurrency|weight' ('' = none); '*' is
--              the whole queue, '~default' every key without its own. No hash: no limits.
--   lim:task   HASH task id -> its limit key (offer's limit_key)
--   lim:tat    HASH limit key -> GCRA theoretical arrival time, epoch us
--   lim:run    HASH limit key -> leases held ('*': all leases handed out under limits)
--   lim:held   HASH task id -> the limit key its lease holds a slot of ('' = only '*')
--   lim:w:<k>  ZSET parked task id -> its score in the delayed set (order kept)
--   lim:gate   ZSET limit key -> ms its parked head may run again (a rate limit's exact
--              retry-after; '*': when the queue may hand out again)
--   lim:full   SET limit keys at their concurrency cap with tasks waiting ('*' too)
--   lim:hold   HASH limit key -> ms until which a handler's RateLimited holds it ('*': a
--              task without a limit key raised it: the whole queue waits)
-- A key with parked tasks always has a way back: a gate time, or a place in lim:full that
-- the next lease to end takes up (one freed slot re-admits one waiter).
local function limit_of(spec)
  if not spec then return nil end
  local rate, per, burst, conc = string.match(spec, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|')
  local lim = {conc = tonumber(conc)}
  if rate ~= '' then
    lim.rate = tonumber(rate)
    lim.t = tonumber(per) / lim.rate  -- emission interval, us
    lim.tau = lim.t * (tonumber(burst) - 1)  -- how far ahead of now the TAT may run
    lim.burst = tonumber(burst)
  end
  return lim
end

local function parked_key(key) return flow_key('lim:w:' .. key) end

-- Put a parked key's first n waiters back in the delayed set, under their own scores (so
-- they come first, in their order): ids and scores.
local function readmit(key, n)
  local head = redis.call('ZPOPMIN', parked_key(key), n)
  if #head == 0 then return head end
  local fields = {}
  for i = 1, #head, 2 do
    fields[#fields + 1] = head[i + 1]
    fields[#fields + 1] = head[i]
  end
  redis.call('ZADD', K_DELAYED, unpack(fields))
  return head
end

local function wake_now(now)
  local sharded = redis.REDIS_VERSION_NUM and string.sub(K_EVENTS, -8) == ':sevents'
  redis.call(sharded and 'SPUBLISH' or 'PUBLISH', K_EVENTS, fmt(now))
end

-- [L] hook: the leases of ids ended (ack, nack/retry/release/reject, lease expiry, purge).
-- Frees their concurrency slots; a key (or '*') at its cap with tasks waiting re-admits one
-- waiter per freed slot, and the call sends one wake. One EXISTS for a queue without limits.
local function lease_ended(ids, now)
  flow_probe()
  if not flow_seen.held or #ids == 0 then return end
  local held_key, run, full = flow_key('lim:held'), flow_key('lim:run'), flow_key('lim:full')
  local keys = redis.call('HMGET', held_key, unpack(ids))
  local gone, wake = {}, false
  for k, id in ipairs(ids) do
    local key = keys[k]
    if key then
      gone[#gone + 1] = id
      local charged = {'*'}
      if key ~= '' then charged[2] = key end
      for _, c in ipairs(charged) do
        if redis.call('HINCRBY', run, c, -1) <= 0 then redis.call('HDEL', run, c) end
        if redis.call('SISMEMBER', full, c) == 1 then
          wake = true
          if c == '*' or #readmit(c, 1) == 0 or redis.call('EXISTS', parked_key(c)) == 0 then
            redis.call('SREM', full, c)
          end
        end
      end
    end
  end
  if #gone > 0 then redis.call('HDEL', held_key, unpack(gone)) end
  if wake then wake_now(now) end
end

-- [L] The fetch step of a queue with limits: the due tasks (id, score pairs, in order) that
-- may be handed out now, at most want. Over-limit ones are parked per key (behind that key's
-- earlier waiters: order kept) with the key gated until its exact retry-after, or listed in
-- lim:full; nothing is counted as an attempt. At most want + scan tasks are looked at.
-- Returns the pairs, the limit of each id handed (for limits_charge), and when the whole
-- queue ('*') may hand out next if it may not now (ms; -1: when a lease ends).
local function limited_due(want, scan, now_us, leased)
  flow_probe()
  local now = math.floor(now_us / 1000)
  local LIM, TAT, RUN = flow_key('lim'), flow_key('lim:tat'), flow_key('lim:run')
  local GATE, FULL = flow_key('lim:gate'), flow_key('lim:full')
  local specs, tats, runs, heads, changed, holds = {}, {}, {}, {}, {}, {}
  local HOLD = flow_key('lim:hold')
  local default = false
  local function limit_for(key)
    if specs[key] == nil then
      local spec = redis.call('HGET', LIM, key)
      if not spec and key ~= '*' and key ~= '' then
        if default == false then default = redis.call('HGET', LIM, '~default') or nil end
        spec = default
      end
      specs[key] = limit_of(spec) or false
    end
    return specs[key]
  end
  local function tat_of(key)
    if not tats[key] then tats[key] = tonumber(redis.call('HGET', TAT, key) or '0') end
    return tats[key] < now_us and now_us or tats[key]
  end
  local function running(key)
    if not runs[key] then runs[key] = tonumber(redis.call('HGET', RUN, key) or '0') end
    return runs[key]
  end
  local function held_until(key)
    if holds[key] == nil then
      local h = tonumber(redis.call('HGET', HOLD, key) or '0')
      if h > 0 and h <= now then
        redis.call('HDEL', HOLD, key)
        h = 0
      end
      holds[key] = h
    end
    return holds[key]
  end
  -- nil if key's limit lets one more start now, else 'full' or the retry-after (ms)
  local function refusal(key, lim)
    local hold = held_until(key)
    if hold > now then return hold end
    if not lim then return nil end
    if leased and lim.conc and running(key) >= lim.conc then return 'full' end
    if lim.rate then
      local allow = tat_of(key) - lim.tau
      if allow > now_us then return math.ceil(allow / 1000) end
    end
    return nil
  end
  local function take(key, lim)
    if not lim then return end
    if lim.rate then
      tats[key] = tat_of(key) + lim.t
      changed[key] = true
    end
    runs[key] = running(key) + 1
  end

  -- Keys whose gate time came: their first waiters go back to the delayed set, as many as
  -- the rate lets start now (at least one; the rest are gated anew).
  local opened = redis.call('ZRANGEBYSCORE', GATE, '-inf', now, 'LIMIT', 0, scan)
  for _, key in ipairs(opened) do
    local lim = limit_for(key)
    local n = scan  -- no limit to keep: a RateLimited hold ran out, or the limit is gone
    if lim and lim.rate then
      n = math.max(1, math.floor((now_us - (tat_of(key) - lim.tau)) / lim.t) + 1)
      if n > lim.burst then n = lim.burst end
    elseif lim and lim.conc then
      n = lim.conc
    end
    if key ~= '*' then readmit(key, n) end
    if key == '*' or redis.call('EXISTS', parked_key(key)) == 0 then
      redis.call('ZREM', GATE, key)
    elseif lim and lim.rate then  -- when the first one not let go now may start
      redis.call('ZADD', GATE, math.ceil((tat_of(key) + n * lim.t - lim.tau) / 1000), key)
    elseif lim and lim.conc then  -- the rest wait for slots: each lease that ends lets one go
      redis.call('ZREM', GATE, key)
      redis.call('SADD', FULL, key)
    else
      redis.call('ZADD', GATE, now, key)  -- no limit: the next look lets the next ones go
    end
  end

  local due = redis.call('ZRANGEBYSCORE', K_DELAYED, '-inf', fmt(score(now, 9)),
    'WITHSCORES', 'LIMIT', 0, want + scan)
  if #due == 0 then return due, {}, nil end
  local ids = {}
  for i = 1, #due, 2 do ids[#ids + 1] = due[i] end
  local keys = flow_seen.task and redis.call('HMGET', flow_key('lim:task'), unpack(ids)) or {}
  local picked, charged, moved = {}, {}, {}
  local parked_for = {rate = 0, concurrency = 0, queued = 0}  -- counted by reason
  local star = limit_for('*')
  local star_wait = nil
  for k, id in ipairs(ids) do
    if #picked >= 2 * want then break end
    local s, key = due[2 * k], keys[k] or ''
    local why = refusal('*', star)
    if why and why ~= 'full' and star and star.rate and held_until('*') <= now then
      -- Wake when a batch may start (the burst the limit allows anyway, no more than are
      -- due): the consumers woken then fetch batches, not one task per round trip each.
      local batch = math.min(star.burst, #ids - k + 1)
      if batch > 1 then why = math.ceil((tat_of('*') - star.tau + (batch - 1) * star.t) / 1000) end
    end
    if why then
      star_wait = why == 'full' and -1 or why
      if why == 'full' then redis.call('SADD', FULL, '*')
      else redis.call('ZADD', GATE, why, '*') end
      break
    end
    local lim = key ~= '' and limit_for(key) or false
    if key ~= '' and heads[key] == nil then
      heads[key] = head_score(parked_key(key)) or false
    end
    local behind = key ~= '' and heads[key] and heads[key] < tonumber(s)
    why = behind and 'behind' or refusal(key, lim)
    if why then
      redis.call('ZADD', parked_key(key), s, id)
      moved[#moved + 1] = id
      if not heads[key] or tonumber(s) < heads[key] then heads[key] = tonumber(s) end
      if why == 'full' then redis.call('SADD', FULL, key)
      elseif why ~= 'behind' then redis.call('ZADD', GATE, why, key) end
      local reason = why == 'full' and 'concurrency' or (why == 'behind' and 'queued' or 'rate')
      parked_for[reason] = parked_for[reason] + 1
    else
      take('*', star)
      take(key, lim)
      picked[#picked + 1] = id
      picked[#picked + 1] = s
      charged[id] = key
    end
  end
  if #moved > 0 then redis.call('ZREM', K_DELAYED, unpack(moved)) end
  for reason, n in pairs(parked_for) do count('throttled:' .. reason, n) end
  for key in pairs(changed) do redis.call('HSET', TAT, key, fmt(math.ceil(tats[key]))) end
  return picked, charged, star_wait
end

-- [L] After fetch handed tasks out under limits: each lease holds a slot of '*' and of its
-- key (the counts lease_ended gives back). At-most-once deliveries hold none.
local function limits_charge(reply, charged, leased)
  if not leased then return end
  local fields, per_key = {}, {}
  for r = 4, #reply, 6 do
    local id = reply[r]
    local key = charged[id] or ''
    fields[#fields + 1] = id
    fields[#fields + 1] = key
    per_key['*'] = (per_key['*'] or 0) + 1
    if key ~= '' then per_key[key] = (per_key[key] or 0) + 1 end
  end
  if #fields == 0 then return end
  redis.call('HSET', flow_key('lim:held'), unpack(fields))
  for key, n in pairs(per_key) do redis.call('HINCRBY', flow_key('lim:run'), key, n) end
end

-- [L] A handler raised RateLimited(delay): hold the task's limit key (none: the whole queue)
-- until now + delay and park the task in line for it under its own due time (due_ms), so it
-- keeps its place. Nothing counts an attempt.
local function throttle(id, slot, due_ms, now, delay)
  local key = redis.call('HGET', flow_key('lim:task'), id) or '*'
  local HOLD = flow_key('lim:hold')
  local until_ms = math.max(now + delay, tonumber(redis.call('HGET', HOLD, key) or '0'))
  redis.call('HSET', HOLD, key, until_ms)
  redis.call('ZADD', flow_key('lim:gate'), until_ms, key)
  local s = score(due_ms, slot)
  if key == '*' then
    redis.call('ZADD', K_DELAYED, fmt(s), id)  -- no key to park under: the queue waits
  else
    redis.call('ZADD', parked_key(key), fmt(s), id)
  end
  count('throttled:ratelimited', 1)
  wake_now(until_ms)  -- consumers asleep learn when the key (or queue) may start again
  return until_ms
end

-- [L] The limit keys of tasks leaving for good: drop their lim:task entries.
local function limit_keys_forget(ids)
  flow_probe()
  if flow_seen.task and #ids > 0 then redis.call('HDEL', flow_key('lim:task'), unpack(ids)) end
end

-- [L] A parked task's limit key and score, or nil: cancel, info and ttl expiry find it.
local function parked(id)
  flow_probe()
  if not flow_seen.task then return nil end
  local key = redis.call('HGET', flow_key('lim:task'), id)
  if not key then return nil end
  local s = redis.call('ZSCORE', parked_key(key), id)
  if not s then return nil end
  return key, s
end

-- [L] Take a parked task out of its key's waiting set; true if it was parked.
local function unpark(id)
  local key = parked(id)
  if not key then return false end
  redis.call('ZREM', parked_key(key), id)
  return true
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
  limit_keys_forget({id})
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
    lease_ended(done, now)
    redis.call('HDEL', K_LEASES, unpack(done))
    redis.call('HDEL', K_TASKS, unpack(done))
    redis.call('HDEL', K_ATTEMPTS, unpack(done))
    limit_keys_forget(done)
  end
  return reply, #done
end
